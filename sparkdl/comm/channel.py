"""An authenticated message channel from training workers to the driver, with replies.

The driver runs a :class:`ChannelServer` for the length of a fit; a worker (rank 0) opens a
:class:`ChannelClient` to it. Every connection first passes the mutual challenge-response of
:mod:`sparkdl.comm._auth` (context ``b"events"``, the per-job secret), so nothing unauthenticated
ever reaches the driver's callbacks. Then both sides exchange frames:

========  =======  ===============================================================
offset    size     field
========  =======  ===============================================================
0         4        magic ``b"SDLE"``
4         4        JSON length ``J`` (big-endian uint32, at most 1 MiB)
8         4        blob length ``B`` (big-endian uint32, at most the server's ``max_blob``)
12        J        a UTF-8 JSON object (never pickle)
12 + J    B        opaque bytes (e.g. the model's weights as ``.npz``)
========  =======  ===============================================================

A worker frame whose JSON has ``"reply": true`` gets exactly one frame back (blob empty);
other frames are one-way. Every read and write has a deadline.
"""

from __future__ import annotations

import contextlib
import json
import logging
import queue
import socket
import struct
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from sparkdl.comm._auth import (
    authenticate_acceptor,
    authenticate_connector,
    check_secret,
    recv_exact,
    send_all,
)
from sparkdl.comm.network import listen_on
from sparkdl.errors import CommunicationError

log = logging.getLogger("sparkdl.comm")

CONTEXT = b"events"
MAGIC = b"SDLE"
_HEADER = struct.Struct(">4sII")
MAX_JSON = 1 << 20
MAX_CONNECTIONS = 4


def _send_frame(sock: socket.socket, data: dict[str, Any], blob: bytes, deadline: float) -> None:
    text = json.dumps(data, allow_nan=True).encode("utf-8")
    if len(text) > MAX_JSON:
        raise CommunicationError(f"event message of {len(text)} bytes exceeds {MAX_JSON}")
    send_all(sock, _HEADER.pack(MAGIC, len(text), len(blob)) + text + bytes(blob), deadline)


def _recv_frame(
    sock: socket.socket, max_blob: int, timeout_s: float, idle_s: float | None = None
) -> tuple[dict[str, Any], bytes]:
    """Read one frame: its header within ``idle_s`` (an idle channel is normal between
    epochs) or ``timeout_s``, the rest within ``timeout_s`` of the header."""
    header = recv_exact(sock, _HEADER.size, time.monotonic() + (idle_s or timeout_s))
    deadline = time.monotonic() + timeout_s
    magic, json_len, blob_len = _HEADER.unpack(header)
    if magic != MAGIC:
        raise CommunicationError(f"bad event frame magic {magic!r}")
    if json_len > MAX_JSON or blob_len > max_blob:
        raise CommunicationError(
            f"event frame too large: JSON {json_len} bytes (max {MAX_JSON}), "
            f"blob {blob_len} bytes (max {max_blob})"
        )
    try:
        data = json.loads(recv_exact(sock, json_len, deadline).decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise CommunicationError(f"event frame is not UTF-8 JSON: {exc}") from None
    if not isinstance(data, dict):
        raise CommunicationError(f"event frame holds {type(data).__name__}, not an object")
    return data, recv_exact(sock, blob_len, deadline) if blob_len else b""


@dataclass
class Message:
    """One frame a worker sent; :meth:`reply` answers it when it asked for a reply."""

    data: dict[str, Any]
    blob: bytes = b""
    _sock: socket.socket | None = field(default=None, repr=False)
    _lock: threading.Lock | None = field(default=None, repr=False)
    _timeout_s: float = 30.0

    @property
    def wants_reply(self) -> bool:
        return bool(self.data.get("reply"))

    def reply(self, data: dict[str, Any]) -> None:
        """Send the answer (best effort: a worker that is gone fails on its own)."""
        if self._sock is None or self._lock is None:
            return
        try:
            with self._lock:
                _send_frame(self._sock, data, b"", time.monotonic() + self._timeout_s)
        except (OSError, TimeoutError, CommunicationError) as exc:
            log.warning("could not answer a worker's event: %s", exc)


class ChannelServer:
    """Accepts authenticated worker connections and queues their messages for the driver.

    Args:
        secret: the per-job secret (at least 16 bytes) the workers also hold.
        bind_host: the address to listen on (``"0.0.0.0"`` for every interface).
        advertise_host: the address workers connect to (e.g. ``spark.driver.host``).
        port_range: ``(low, high)`` ports to try, or ``None`` for any free port.
        timeout_s: the bound on every handshake, read and write.
        max_blob: the largest blob a worker may send.
    """

    def __init__(
        self,
        secret: bytes,
        *,
        bind_host: str = "0.0.0.0",
        advertise_host: str = "127.0.0.1",
        port_range: tuple[int, int] | None = None,
        timeout_s: float = 120.0,
        max_blob: int = 1 << 30,
    ) -> None:
        self._secret = check_secret(secret)
        self._timeout_s = float(timeout_s)
        self._max_blob = int(max_blob)
        self.inbox: queue.Queue[Message] = queue.Queue()
        self._closed = threading.Event()
        self._slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        self._connections: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._listener = listen_on(bind_host, port_range, backlog=16)
        self.address = f"{advertise_host}:{self._listener.getsockname()[1]}"
        self._thread = threading.Thread(target=self._accept_loop, name="sparkdl-events",
                                        daemon=True)
        self._thread.start()

    def _accept_loop(self) -> None:
        self._listener.settimeout(0.2)
        while not self._closed.is_set():
            try:
                sock, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError as exc:
                if self._closed.is_set():
                    return
                log.warning("event channel: accept failed (%s); retrying", exc)
                time.sleep(0.1)
                continue
            if not self._slots.acquire(blocking=False):
                sock.close()  # more concurrent connections than a fit ever needs
                continue
            threading.Thread(target=self._serve, args=(sock,), daemon=True,
                             name="sparkdl-events-conn").start()

    def _serve(self, sock: socket.socket) -> None:
        write_lock = threading.Lock()
        try:
            authenticate_acceptor(sock, self._secret, CONTEXT,
                                  time.monotonic() + min(self._timeout_s, 30.0))
            with self._lock:
                self._connections.add(sock)
            while not self._closed.is_set():
                try:
                    data, blob = _recv_frame(sock, self._max_blob, self._timeout_s, idle_s=3600)
                except TimeoutError:
                    continue
                self.inbox.put(Message(data, blob, sock, write_lock, self._timeout_s))
        except (OSError, ConnectionError, CommunicationError) as exc:
            if not self._closed.is_set() and not isinstance(exc, ConnectionError):
                log.debug("event connection ended: %s", exc)
        finally:
            with self._lock:
                self._connections.discard(sock)
            sock.close()
            self._slots.release()

    def close(self) -> None:
        """Stop accepting and close every connection. Idempotent."""
        self._closed.set()
        with contextlib.suppress(OSError):
            self._listener.close()
        with self._lock:
            for sock in list(self._connections):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
        self._thread.join(timeout=5)

    def __enter__(self) -> ChannelServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class ChannelClient:
    """A worker's connection to the driver's :class:`ChannelServer`."""

    def __init__(self, address: str, secret: bytes, *, timeout_s: float = 120.0) -> None:
        host, _, port = address.rpartition(":")
        self._timeout_s = float(timeout_s)
        deadline = time.monotonic() + self._timeout_s
        try:
            self._sock = socket.create_connection((host, int(port)), timeout=self._timeout_s)
            self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            authenticate_connector(self._sock, check_secret(secret), CONTEXT, 0, 1, deadline)
        except (OSError, ValueError) as exc:
            raise CommunicationError(
                f"cannot reach the driver's event listener at {address}: {exc}"
            ) from None

    def send(self, data: dict[str, Any], blob: bytes = b"") -> None:
        """Send a one-way message."""
        self._write({**data, "reply": False}, blob)

    def request(self, data: dict[str, Any], blob: bytes = b"") -> dict[str, Any]:
        """Send a message and wait (at most ``timeout_s``) for the driver's answer."""
        self._write({**data, "reply": True}, blob)
        try:
            answer, _ = _recv_frame(self._sock, 0, self._timeout_s)
        except (OSError, TimeoutError) as exc:
            raise CommunicationError(
                f"the driver did not answer the {data.get('kind')!r} event within "
                f"{self._timeout_s:g} s: {exc}"
            ) from None
        return answer

    def _write(self, data: dict[str, Any], blob: bytes) -> None:
        try:
            _send_frame(self._sock, data, blob, time.monotonic() + self._timeout_s)
        except (OSError, TimeoutError) as exc:
            raise CommunicationError(f"lost the driver's event listener: {exc}") from None

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._sock.close()

