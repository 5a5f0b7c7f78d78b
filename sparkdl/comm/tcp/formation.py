"""Forming a ring: every rank listens, publishes its address, connects to the next rank and
accepts the previous one, authenticated and with shared memory negotiated per link."""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time
from collections.abc import Callable

from sparkdl.comm import _auth, _shm
from sparkdl.comm._accept import RESOURCE_ERRNOS, AcceptLoop
from sparkdl.comm.communicator import (
    TrafficCounters,
)
from sparkdl.comm.network import listen_on, split_host_port
from sparkdl.comm.tcp.frames import (
    _RING_CTX,
    HANDSHAKE_S,
    SHM_SLOT_BYTES,
    SHM_SLOTS,
    WIRE_INTEGRITY,
    _Peer,
    _tune,
)
from sparkdl.comm.tcp.ring import (
    TcpRingCommunicator,
)
from sparkdl.errors import CommunicationError, ConfigurationError

log = logging.getLogger("sparkdl.comm")


class _Acceptor:
    """Accepts connections in the background until the expected peer authenticates."""

    def __init__(
        self,
        listener: socket.socket,
        secret: bytes,
        ctx: bytes,
        expected: tuple[int, int],
        deadline: float,
        shared_memory: bool = False,
    ) -> None:
        self._shared_memory = shared_memory
        self.shm: _shm.ShmLink | None = None
        self.handshake_bytes = (0, 0)  # shared-memory negotiation bytes (sent, received)
        self.session: _auth.Session | None = None
        self._secret = secret
        self._ctx = ctx
        self._expected = expected
        self._deadline = deadline
        self._lock = threading.Lock()
        self._result: socket.socket | None = None
        self._claimed = False
        self._done = threading.Event()
        self._stopped = False
        self._loop = AcceptLoop(listener, self._handshake, what="ring", deadline=deadline)

    def start(self) -> None:
        self._loop.start()

    def _handshake(self, conn: socket.socket, addr: tuple[object, ...]) -> None:
        ok = False
        deadline = min(self._deadline, time.monotonic() + HANDSHAKE_S)
        try:
            session = _auth.accept_session(conn, self._secret, self._ctx, deadline)
            self._loop.authenticated(conn)
            if (session.rank, session.world) != self._expected:
                raise _auth.AuthenticationError(
                    f"authenticated as rank {session.rank} of {session.world}, expected rank "
                    f"{self._expected[0]} of {self._expected[1]}"
                )
            with self._lock:
                if self._result is not None or self._stopped or self._claimed:
                    return
                self._claimed = True  # one authenticated peer goes on to negotiate
            try:
                link, sent, received = _shm.negotiate_acceptor(
                    conn, self._shared_memory, SHM_SLOTS, SHM_SLOT_BYTES, deadline
                )
            except BaseException:
                with self._lock:
                    self._claimed = False
                raise
            with self._lock:
                if self._result is None and not self._stopped:
                    self._loop.detach(conn)  # before wait() can return and stop() shut it
                    self._result = conn
                    self.shm = link
                    self.session = session
                    self.handshake_bytes = (sent, received)
                    ok = True
                    self._done.set()
                elif link is not None:
                    link.close()
        except (OSError, CommunicationError) as exc:
            log.warning(
                "ring: rejected connection from %s:%s: %s", addr[0], addr[1], exc or type(exc)
            )
        finally:
            if not ok:
                with contextlib.suppress(OSError):
                    conn.close()

    def wait(self) -> socket.socket | None:
        self._done.wait(max(0.0, self._deadline - time.monotonic()))
        with self._lock:
            return self._result

    def stop(self) -> None:
        with self._lock:
            self._stopped = True
        self._loop.stop()


def _parse_hostport(text: str, rank: int) -> tuple[str, int]:
    try:
        return split_host_port(text)
    except ValueError:
        raise CommunicationError(f"rank {rank} published a bad address {text!r}") from None


def _connect(
    host: str,
    port: int,
    peer_rank: int,
    rank: int,
    world: int,
    secret: bytes,
    deadline: float,
    shared_memory: bool = False,
    ctx: bytes | None = None,
) -> tuple[socket.socket, _shm.ShmLink | None, int, int, _auth.Session]:
    """Connect to and authenticate with the next rank, then negotiate shared memory; returns
    (socket, link or None, negotiation bytes sent, received, session). A connection that is
    reset or closed before the handshake completes (the peer's listener shedding a flood) is
    retried until ``deadline``; a failed authentication is not."""
    delay = 0.01
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    last: BaseException | None = None
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise CommunicationError(
                f"rank {rank}: could not connect to rank {peer_rank} ({host}:{port}) in time"
                + (f" (last error: {last})" if last else "")
            )
        sock: socket.socket | None = None
        try:
            sock = socket.socket(family, socket.SOCK_STREAM)
            _tune(sock)
            sock.settimeout(remaining)
            sock.connect((host, port))
        except OSError as exc:
            if sock is not None:
                sock.close()
            if isinstance(exc, TimeoutError):
                continue
            if not isinstance(exc, ConnectionRefusedError | ConnectionResetError) and (
                exc.errno not in RESOURCE_ERRNOS
            ):
                raise CommunicationError(
                    f"rank {rank}: cannot connect to rank {peer_rank} ({host}:{port}): {exc}"
                ) from exc
            last = exc
            time.sleep(min(delay, max(0.0, deadline - time.monotonic())))
            delay = min(2 * delay, 0.5)
            continue
        try:
            context = ctx if ctx is not None else _RING_CTX + str(peer_rank).encode()
            session = _auth.authenticate_connector(sock, secret, context, rank, world, deadline)
            link, sent, received = _shm.negotiate_connector(
                sock, shared_memory, SHM_SLOTS, SHM_SLOT_BYTES, deadline
            )
        except ConnectionError as exc:
            sock.close()
            last = exc
            time.sleep(min(delay, max(0.0, deadline - time.monotonic())))
            delay = min(2 * delay, 0.5)
            continue
        except (OSError, CommunicationError) as exc:
            sock.close()
            raise CommunicationError(
                f"rank {rank}: handshake with rank {peer_rank} ({host}:{port}) failed: {exc}"
            ) from exc
        return sock, link, sent, received, session


def connect_ring(
    rank: int,
    world_size: int,
    exchange: Callable[[str], list[str]],
    *,
    secret: bytes,
    timeout_s: float = 60.0,
    bind_host: str = "127.0.0.1",
    advertise_host: str | None = None,
    port_range: tuple[int, int] | None = None,
    shared_memory: bool = True,
    wire_integrity: str = "none",
) -> TcpRingCommunicator:
    """Form the ring: listen, publish ``host:port`` through ``exchange``, connect to the next
    rank and accept the previous one, each connection authenticated with ``secret``.

    With ``shared_memory`` (and unless the environment sets ``SPARKDL_SHM=0``), neighbours
    that prove they share a host move large payloads through shared memory; the sockets stay
    the control channel (see :mod:`sparkdl.comm._shm`).

    ``wire_integrity="mac"`` appends a keyed MAC (HMAC-SHA256, per-connection and per-direction
    keys from ``secret`` and the handshake, with a record counter) to every record of the
    stream and verifies it before the bytes are used; shared memory is then not used, so that
    every payload byte is covered. With ``"none"`` (the default) frames are authenticated
    only by the connection's handshake: bytes injected into or altered in an established
    stream are not detected."""
    if world_size < 1 or not 0 <= rank < world_size:
        raise ConfigurationError(
            f"rank/world_size: expected 0 <= rank < world_size, got {rank}/{world_size}"
        )
    if timeout_s <= 0:
        raise ConfigurationError(f"timeout_s: expected > 0, got {timeout_s}")
    if wire_integrity not in WIRE_INTEGRITY:
        raise ConfigurationError(
            f"wire_integrity: expected one of {list(WIRE_INTEGRITY)}, got {wire_integrity!r}"
        )
    secret = _auth.check_secret(secret)
    if world_size == 1:
        return TcpRingCommunicator(rank, 1, None, None, None, None, timeout_s=timeout_s)
    mac = wire_integrity == "mac"
    deadline = time.monotonic() + timeout_s
    listener = listen_on(bind_host, port_range, configure=_tune)
    port = listener.getsockname()[1]
    host = advertise_host or bind_host
    if host in ("0.0.0.0", "::", ""):
        host = socket.gethostbyname(socket.gethostname())
    prev_rank, next_rank = (rank - 1) % world_size, (rank + 1) % world_size
    use_shm = _shm.enabled(shared_memory) and not mac
    acceptor = _Acceptor(
        listener,
        secret,
        _RING_CTX + str(rank).encode(),
        (prev_rank, world_size),
        deadline,
        shared_memory=use_shm,
    )
    acceptor.start()
    next_sock: socket.socket | None = None
    tx_shm: _shm.ShmLink | None = None
    try:
        try:
            addresses = exchange(f"{host}:{port}")
        except CommunicationError:
            raise
        except Exception as exc:
            raise CommunicationError(f"rank {rank}: address exchange failed: {exc}") from exc
        if len(addresses) != world_size:
            raise CommunicationError(
                f"rank {rank}: address exchange returned {len(addresses)} entries, "
                f"expected {world_size}"
            )
        nh, np_ = _parse_hostport(addresses[next_rank], next_rank)
        ph, pp = _parse_hostport(addresses[prev_rank], prev_rank)
        next_sock, tx_shm, tx_sent, tx_received, tx_session = _connect(
            nh, np_, next_rank, rank, world_size, secret, deadline, use_shm
        )
        prev_sock = acceptor.wait()
        if prev_sock is None:
            raise CommunicationError(
                f"rank {rank}: rank {prev_rank} ({ph}:{pp}) did not connect and authenticate "
                f"within {timeout_s:.1f} s"
            )
    except BaseException:
        if next_sock is not None:
            next_sock.close()
        if tx_shm is not None:
            tx_shm.close()
        raise
    finally:
        acceptor.stop()
    handshake = _auth.CONNECTOR_REPLY_BYTES + _auth.HANDSHAKE_BYTES_ACCEPTOR
    rx_sent, rx_received = acceptor.handshake_bytes
    counters = TrafficCounters(
        bytes_sent=handshake + tx_sent + rx_sent,
        bytes_received=handshake + tx_received + rx_received,
    )
    return TcpRingCommunicator(
        rank,
        world_size,
        prev_sock,
        next_sock,
        _Peer(prev_rank, ph, pp),
        _Peer(next_rank, nh, np_),
        timeout_s=timeout_s,
        counters=counters,
        rx_shm=acceptor.shm,
        tx_shm=tx_shm,
        tx_mac_key=tx_session.key_c2a if mac else None,
        rx_mac_key=acceptor.session.key_c2a if mac and acceptor.session else None,
    )
