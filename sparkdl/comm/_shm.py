"""Same-host shared-memory links for the TCP ring (the intra-node path of NCCL, Gloo, Horovod).

After the HMAC handshake, on the still-authenticated connection ``me -> next``, both ends say
whether they want shared memory and send a digest of their host identity (boot id and host
name). If both want it and the digests match, the connector (the sender of data on that link)
creates a randomly named 0600 file in ``/dev/shm``, reserves its pages, writes a random nonce
in it and sends the name; the acceptor opens and maps it, unlinks it and echoes the nonce it
read; the connector checks the echo and confirms. The link is used only when the memory is
really shared. The name is unlinked as soon as both sides have mapped it (the acceptor unlinks
right after opening, the connector after the echo or on any failure), so nothing is left in
``/dev/shm`` even if a process is killed with SIGKILL afterwards. The connector waits at most
``ECHO_S`` for the echo. A connector killed *during* the setup cannot unlink its segment, so
names carry the creator's pid (and pid namespace): every connector first sweeps segments whose
creator is dead (:func:`sweep_stale`).

Wire messages of the negotiation (all after authentication)::

    C -> A  OFFER  b"SHM1" | want (1) | host digest (32)
    A -> C  REPLY  want (1) | host digest (32)
    -- only if both want and the digests match --
    C -> A  NAME   name length (2) | name | segment bytes (8)     (length 0: creation failed)
    A -> C  ECHO   nonce read from the segment (32; zeros if it could not be opened)
    C -> A  CONFIRM  1 if the echo matched, else 0
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import mmap
import os
import re
import secrets
import socket
import stat
import struct
import time

import numpy as np

from sparkdl.comm._auth import recv_exact, send_all

log = logging.getLogger("sparkdl.comm")

SHM_DIR = "/dev/shm"
HEADER_BYTES = 4096
"""The segment starts with one page holding the nonce; slots follow, page-aligned."""
NONCE_BYTES = 32
_OFFER_MAGIC = b"SHM1"
_NAME = struct.Struct("<H")
_SIZE = struct.Struct("<Q")
_ZERO_NONCE = bytes(NONCE_BYTES)
ECHO_S = 5.0
"""How long the creator of a segment waits for the peer's echo (within the ring deadline)."""
_TAGGED = re.compile(r"sparkdl-p(\d+)n(\d+)-[0-9a-f]{32}")


def _pid_namespace() -> int:
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return 0


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # EPERM: it exists (another user's)
        return True
    return True


def sweep_stale() -> list[str]:
    """Unlink our user's segments in ``/dev/shm`` whose creating process (in our pid
    namespace) is dead; returns their names. Other names are left alone."""
    ns = _pid_namespace()
    swept: list[str] = []
    try:
        names = os.listdir(SHM_DIR)
    except OSError:
        return swept
    for name in names:
        m = _TAGGED.fullmatch(name)
        if m is None or int(m.group(2)) != ns or _alive(int(m.group(1))):
            continue
        path = os.path.join(SHM_DIR, name)
        try:
            st = os.lstat(path)
            if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
                continue
            os.unlink(path)
        except OSError:
            continue
        swept.append(name)
    if swept:
        log.info("ring: removed %d shared-memory segment(s) of dead processes", len(swept))
    return swept


def enabled(requested: bool) -> bool:
    """Whether shared memory may be used: ``requested`` and ``SPARKDL_SHM`` is not ``0``."""
    env = os.environ.get("SPARKDL_SHM", "1").strip().lower()
    return bool(requested) and env not in ("0", "false", "no", "off")


def host_identity() -> bytes:
    """SHA-256 of the kernel boot id and the host name (equal digests: maybe the same host)."""
    try:
        with open("/proc/sys/kernel/random/boot_id", "rb") as fh:
            boot = fh.read().strip()
    except OSError:
        boot = b""
    return hashlib.sha256(boot + b"\0" + socket.gethostname().encode()).digest()


class ShmLink:
    """One direction of one ring link in shared memory: ``slots`` page-aligned slots of
    ``slot_bytes`` each. The sender fills slot ``i % slots`` and notifies over TCP; the
    receiver consumes it in order and acknowledges over TCP (one credit per slot)."""

    def __init__(self, mm: mmap.mmap, slots: int, slot_bytes: int) -> None:
        self._mm: mmap.mmap | None = mm
        self.slots = slots
        self.slot_bytes = slot_bytes
        self.array: np.ndarray = np.frombuffer(mm, np.uint8)
        self.view = self.array.data
        self.index = 0  # next slot to fill (sender) or consume (receiver), counting from 0
        self.credits = slots  # sender only: slots free to fill

    def offset(self, index: int) -> int:
        return HEADER_BYTES + (index % self.slots) * self.slot_bytes

    def close(self) -> None:
        """Unmap the segment (its name was unlinked when the link was set up)."""
        mm, self._mm = self._mm, None
        if mm is None:
            return
        self.view.release()
        del self.array
        with contextlib.suppress(BufferError, ValueError):
            mm.close()  # a slice still referenced elsewhere keeps it mapped until collected


def _segment_bytes(slots: int, slot_bytes: int) -> int:
    return HEADER_BYTES + slots * slot_bytes


def _unlink(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def _create(size: int) -> tuple[str, mmap.mmap, bytes]:
    """Create, reserve and map a fresh 0600 segment; returns (name, mapping, nonce)."""
    sweep_stale()
    name = f"sparkdl-p{os.getpid()}n{_pid_namespace()}-{secrets.token_hex(16)}"
    path = os.path.join(SHM_DIR, name)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        try:
            os.fchmod(fd, 0o600)
            os.posix_fallocate(fd, 0, size)  # ENOSPC now rather than SIGBUS later
            mm = mmap.mmap(fd, size)
        except BaseException:
            _unlink(path)
            raise
    finally:
        os.close(fd)
    nonce = secrets.token_bytes(NONCE_BYTES)
    mm[:NONCE_BYTES] = nonce
    return name, mm, nonce


def _open(name: str, size: int) -> mmap.mmap:
    """Open and map a segment created by the peer, then unlink its name."""
    if not name.startswith("sparkdl-") or "/" in name or name in (".", ".."):
        raise OSError(f"bad shared-memory name {name!r}")
    path = os.path.join(SHM_DIR, name)
    fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_size != size:
            raise OSError(f"shared-memory segment {name!r} has unexpected owner, type or size")
        mm = mmap.mmap(fd, size)
    finally:
        os.close(fd)
        _unlink(path)
    return mm


def negotiate_connector(
    sock: socket.socket, want: bool, slots: int, slot_bytes: int, deadline: float
) -> tuple[ShmLink | None, int, int]:
    """Connector side (sender of data on this link); returns (link or None, bytes sent,
    bytes received)."""
    ident = host_identity()
    send_all(sock, _OFFER_MAGIC + bytes([1 if want else 0]) + ident, deadline)
    sent = len(_OFFER_MAGIC) + 1 + len(ident)
    reply = recv_exact(sock, 1 + len(ident), deadline)
    received = len(reply)
    if not (want and reply[0] == 1 and reply[1:] == ident):
        return None, sent, received
    size = _segment_bytes(slots, slot_bytes)
    created: tuple[str, mmap.mmap, bytes] | None = None
    try:
        created = _create(size)
    except OSError as exc:
        log.info("ring: no shared memory (cannot create a segment: %s); using TCP", exc)
    link: ShmLink | None = None
    try:
        if created is None:
            send_all(sock, _NAME.pack(0), deadline)
            return None, sent + _NAME.size, received
        name, mm, nonce = created
        raw = name.encode()
        send_all(sock, _NAME.pack(len(raw)) + raw + _SIZE.pack(size), deadline)
        sent += _NAME.size + len(raw) + _SIZE.size
        echo = recv_exact(sock, NONCE_BYTES, min(deadline, time.monotonic() + ECHO_S))
        received += len(echo)
        ok = echo == nonce
        _unlink(os.path.join(SHM_DIR, name))
        send_all(sock, bytes([1 if ok else 0]), deadline)
        sent += 1
        if not ok:
            log.info("ring: the peer could not map our shared memory; using TCP")
            mm.close()
            return None, sent, received
        link = ShmLink(mm, slots, slot_bytes)
        return link, sent, received
    finally:
        if created is not None:
            _unlink(os.path.join(SHM_DIR, created[0]))
            if link is None and not created[1].closed:
                created[1].close()


def negotiate_acceptor(
    sock: socket.socket, want: bool, slots: int, slot_bytes: int, deadline: float
) -> tuple[ShmLink | None, int, int]:
    """Acceptor side (receiver of data on this link); returns (link or None, bytes sent,
    bytes received). The segment geometry is checked against ``slots`` and ``slot_bytes``."""
    ident = host_identity()
    offer = recv_exact(sock, len(_OFFER_MAGIC) + 1 + len(ident), deadline)
    received = len(offer)
    if not offer.startswith(_OFFER_MAGIC):
        raise OSError("bad shared-memory offer from the peer")
    send_all(sock, bytes([1 if want else 0]) + ident, deadline)
    sent = 1 + len(ident)
    peer_want, peer_ident = offer[len(_OFFER_MAGIC)], offer[len(_OFFER_MAGIC) + 1 :]
    if not (want and peer_want == 1 and peer_ident == ident):
        return None, sent, received
    (length,) = _NAME.unpack(recv_exact(sock, _NAME.size, deadline))
    received += _NAME.size
    if length == 0:
        return None, sent, received
    name = recv_exact(sock, length, deadline).decode("ascii", "replace")
    (size,) = _SIZE.unpack(recv_exact(sock, _SIZE.size, deadline))
    received += length + _SIZE.size
    mm: mmap.mmap | None = None
    try:
        if size != _segment_bytes(slots, slot_bytes):
            raise OSError(f"segment of {size} bytes, expected {_segment_bytes(slots, slot_bytes)}")
        mm = _open(name, size)
        echo = bytes(mm[:NONCE_BYTES])
    except OSError as exc:
        log.info("ring: cannot map the peer's shared memory (%s); using TCP", exc)
        echo = _ZERO_NONCE
    try:
        send_all(sock, echo, deadline)
        sent += len(echo)
        confirm = recv_exact(sock, 1, deadline)
        received += 1
    except BaseException:
        if mm is not None:
            mm.close()
        raise
    if confirm != b"\x01" or mm is None:
        if mm is not None:
            mm.close()
        return None, sent, received
    return ShmLink(mm, slots, slot_bytes), sent, received
