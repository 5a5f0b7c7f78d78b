"""An authenticated message channel from training workers to the driver, with replies.

The driver runs a :class:`ChannelServer` for the length of a fit; a worker (rank 0) opens a
:class:`ChannelClient` to it. Every connection first passes the mutual challenge-response of
:mod:`sparkdl.comm._auth` (context ``b"events"``, the per-job secret), so nothing unauthenticated
ever reaches the driver's callbacks. Connections are accepted by the flood-resistant
:class:`~sparkdl.comm._accept.AcceptLoop` the ring and the store use: idle connections that
never complete the handshake are bounded (oldest dropped first) and time out, so they cannot
keep rank 0 out. Then both sides exchange frames, each made of two records, and every record
is followed by a tag:

========  =======  ===============================================================
offset    size     field
========  =======  ===============================================================
0         4        magic ``b"SDLM"``
4         4        JSON length ``J`` (big-endian uint32, at most 1 MiB)
8         4        blob length ``B`` (big-endian uint32, at most the server's ``max_blob``)
12        16       tag of the header record (bytes 0-11)
28        J        a UTF-8 JSON object (never pickle)
28 + J    B        opaque bytes (e.g. the model's weights as ``.npz``)
28 + J+B  16       tag of the body record (JSON and blob)
========  =======  ===============================================================

A tag is HMAC-SHA256 truncated to 16 bytes (:class:`~sparkdl.comm._auth.RecordMac`) over the
record's number on its connection and direction (0, 1, 2, ...) and its bytes, keyed by the
handshake's per-connection, per-direction key. The header's tag is verified before its lengths
are used, the body's before the JSON is parsed, so bytes altered, injected, replayed, reordered
or dropped on the wire end the connection with a :class:`CommunicationError` ("failed its
MAC") and never reach the driver's callbacks or the worker's decisions. Frames are always
MAC'd, whatever ``cluster.wire_integrity`` says: the channel carries the driver's decisions
(learning rate, stop) that every rank applies, and little traffic (an event per epoch or per
``log_every_steps``, the weights once an epoch when a callback reads them), so one format with
no unauthenticated mode is simpler and costs little.

A worker frame whose JSON has ``"reply": true`` gets exactly one frame back (blob empty);
other frames are one-way. Every read and write has a deadline.

The server also gathers (:meth:`ChannelClient.gather`): every rank of a stage attempt sends
its message for a round, and each gets every rank's message back as soon as the last one
arrives. Spark's barrier ``allGather`` does the same, but its tasks look for the answer once a
second (``BarrierTaskContext.runBarrier`` sleeps 1 s between checks), so each round costs a
second however close together the tasks arrive. Gathers are answered on the connection's own
thread, never queued for the driver's callbacks.
"""

from __future__ import annotations

import contextlib
import hmac
import json
import logging
import queue
import select
import socket
import struct
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from sparkdl.comm._accept import AcceptLoop
from sparkdl.comm._auth import (
    TAG_BYTES,
    AuthenticationError,
    RecordMac,
    accept_session,
    authenticate_connector,
    check_secret,
    recv_exact,
    send_all,
)
from sparkdl.comm.network import listen_on, split_host_port
from sparkdl.errors import CommunicationError

log = logging.getLogger("sparkdl.comm")

CONTEXT = b"events"
MAGIC = b"SDLM"
_HEADER = struct.Struct(">4sII")
MAX_JSON = 1 << 20
HANDSHAKE_S = 10.0
"""Bound on one connection's authentication, so idle connections give their slot up soon."""
_JOIN_BELOW = 64 << 10  # frames with a shorter blob go out in one send


def _tag(h: Any) -> bytes:
    digest: bytes = h.digest()
    return digest[:TAG_BYTES]


class _Writer:
    """Frames out on one connection's direction, each record tagged; thread-safe."""

    def __init__(self, sock: socket.socket, key: bytes, timeout_s: float) -> None:
        assert sock is not None
        self._sock = sock
        self._mac = RecordMac(key)
        self._lock = threading.Lock()
        self.timeout_s = timeout_s

    def send(self, data: dict[str, Any], blob: bytes = b"") -> None:
        text = json.dumps(data, allow_nan=True).encode("utf-8")
        if len(text) > MAX_JSON:
            raise CommunicationError(f"event message of {len(text)} bytes exceeds {MAX_JSON}")
        header = _HEADER.pack(MAGIC, len(text), len(blob))
        with self._lock:
            deadline = time.monotonic() + self.timeout_s
            h = self._mac.hasher()
            h.update(header)
            head = header + _tag(h)
            h = self._mac.hasher()
            h.update(text)
            h.update(blob)
            if len(blob) < _JOIN_BELOW:
                send_all(self._sock, b"".join((head, text, blob, _tag(h))), deadline)
            else:
                send_all(self._sock, head + text, deadline)
                send_all(self._sock, blob, deadline)
                send_all(self._sock, _tag(h), deadline)


class _Reader:
    """Frames in on one connection's direction; every tag is verified before the bytes it
    covers are used. ``sender`` names the other end in errors."""

    def __init__(self, sock: socket.socket, key: bytes, max_blob: int, sender: str) -> None:
        assert sock is not None
        self._sock = sock
        self._mac = RecordMac(key)
        self._max_blob = max_blob
        self._sender = sender

    def _verify(self, tag: bytes, *parts: bytes, what: str) -> None:
        h = self._mac.hasher()
        for part in parts:
            h.update(part)
        if not hmac.compare_digest(_tag(h), tag):
            raise CommunicationError(
                f"an event frame's {what} from {self._sender} failed its MAC (bytes altered, "
                "injected, replayed or reordered on the wire)"
            )

    def recv(self, timeout_s: float) -> tuple[dict[str, Any], bytes]:
        """Read one frame within ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        record = recv_exact(self._sock, _HEADER.size + TAG_BYTES, deadline)
        header = record[: _HEADER.size]
        magic, json_len, blob_len = _HEADER.unpack(header)
        if magic != MAGIC:
            raise CommunicationError(f"bad event frame magic {magic!r}")
        self._verify(record[_HEADER.size :], header, what="header")
        if json_len > MAX_JSON or blob_len > self._max_blob:
            raise CommunicationError(
                f"event frame too large: JSON {json_len} bytes (max {MAX_JSON}), "
                f"blob {blob_len} bytes (max {self._max_blob})"
            )
        text = recv_exact(self._sock, json_len, deadline)
        blob = recv_exact(self._sock, blob_len, deadline) if blob_len else b""
        self._verify(recv_exact(self._sock, TAG_BYTES, deadline), text, blob, what="body")
        try:
            data = json.loads(text.decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as exc:
            raise CommunicationError(f"event frame is not UTF-8 JSON: {exc}") from None
        if not isinstance(data, dict):
            raise CommunicationError(f"event frame holds {type(data).__name__}, not an object")
        return data, blob


@dataclass
class Message:
    """One frame a worker sent; :meth:`reply` answers it when it asked for a reply."""

    data: dict[str, Any]
    blob: bytes = b""
    _writer: _Writer | None = field(default=None, repr=False)

    @property
    def wants_reply(self) -> bool:
        return bool(self.data.get("reply"))

    def reply(self, data: dict[str, Any]) -> None:
        """Send the answer (best effort: a worker that is gone fails on its own)."""
        if self._writer is None:
            return
        try:
            self._writer.send(data)
        except (OSError, CommunicationError) as exc:
            log.warning("could not answer a worker's event: %s", exc)


GATHER = "gather"


class _Gathers:
    """The rounds of gathers under way, by stage attempt and round; each answered when its
    last rank arrives."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._rounds: dict[tuple[int, int], dict[int, tuple[str, _Writer]]] = {}

    def add(self, data: dict[str, Any], writer: _Writer) -> None:
        try:
            key = (int(data["attempt"]), int(data["round"]))
            rank, world, message = int(data["rank"]), int(data["world"]), str(data["message"])
        except (KeyError, TypeError, ValueError):
            log.warning("ignoring a malformed gather from a worker: %s", sorted(data))
            return
        with self._lock:
            arrived = self._rounds.setdefault(key, {})
            arrived[rank] = (message, writer)
            if len(arrived) < world:
                return
            del self._rounds[key]
        messages = [arrived[r][0] if r in arrived else "" for r in range(world)]
        for _, rank_writer in arrived.values():
            try:
                rank_writer.send({"messages": messages})
            except (OSError, CommunicationError) as exc:
                log.warning("could not answer a worker's gather: %s", exc)


class ChannelServer:
    """Accepts authenticated worker connections and queues their messages for the driver.

    Args:
        secret: the per-job secret (at least 16 bytes) the workers also hold.
        bind_host: the address to listen on (``"0.0.0.0"`` for every interface).
        advertise_host: the address workers connect to (e.g. ``spark.driver.host``).
        port_range: ``(low, high)`` ports to try, or ``None`` for any free port.
        timeout_s: the bound on every read and write (and, at most ``HANDSHAKE_S``, on the
            handshake).
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
        self._gathers = _Gathers()
        self._closed = threading.Event()
        self._listener = listen_on(bind_host, port_range, backlog=16)
        self.address = f"{advertise_host}:{self._listener.getsockname()[1]}"
        self._accept = AcceptLoop(self._listener, self._serve, what="events")
        self._accept.start()

    def _serve(self, sock: socket.socket, addr: Any) -> None:
        peer = f"{addr[0]}:{addr[1]}" if isinstance(addr, tuple) else str(addr)
        try:
            deadline = time.monotonic() + min(self._timeout_s, HANDSHAKE_S)
            session = accept_session(sock, self._secret, CONTEXT, deadline)
            self._accept.authenticated(sock)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            writer = _Writer(sock, session.key_a2c, self._timeout_s)
            reader = _Reader(sock, session.key_c2a, self._max_blob, f"the worker at {peer}")
            poller = select.poll()
            poller.register(sock, select.POLLIN)
            while not self._closed.is_set():
                if not poller.poll(1000):  # an idle channel is normal between epochs
                    continue
                data, blob = reader.recv(self._timeout_s)
                if data.get("kind") == GATHER:
                    self._gathers.add(data, writer)
                else:
                    self.inbox.put(Message(data, blob, writer))
        except ConnectionError:
            pass  # the worker hung up (or the flood guard dropped an idle connection)
        except (OSError, CommunicationError) as exc:
            if not self._closed.is_set():
                log.warning("event channel: dropped the connection from %s: %s", peer, exc)
        finally:
            sock.close()

    def close(self) -> None:
        """Stop accepting and close every connection. Idempotent."""
        self._closed.set()
        self._accept.stop()

    def __enter__(self) -> ChannelServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class ChannelClient:
    """A worker's connection to the driver's :class:`ChannelServer`.

    A connection closed or reset during the handshake (the driver's listener shedding a flood
    of idle connections) is retried until ``timeout_s``; a failed authentication is not."""

    def __init__(self, address: str, secret: bytes, *, timeout_s: float = 120.0) -> None:
        try:
            host, port = split_host_port(address)
        except ValueError as exc:
            raise CommunicationError(f"the driver's event channel address: {exc}") from None
        self._timeout_s = float(timeout_s)
        deadline = time.monotonic() + self._timeout_s
        secret = check_secret(secret)
        delay = 0.01
        while True:
            sock: socket.socket | None = None
            try:
                remaining = max(0.001, deadline - time.monotonic())
                sock = socket.create_connection((host, port), timeout=remaining)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                session = authenticate_connector(sock, secret, CONTEXT, 0, 1, deadline)
                break
            except ConnectionError as exc:
                if sock is not None:
                    sock.close()
                if isinstance(exc, ConnectionRefusedError) or time.monotonic() + delay > deadline:
                    raise CommunicationError(
                        f"cannot reach the driver's event listener at {address}: {exc}"
                    ) from None
                time.sleep(delay)
                delay = min(2 * delay, 0.5)
            except (OSError, ValueError, AuthenticationError) as exc:
                if sock is not None:
                    sock.close()
                raise CommunicationError(
                    f"cannot reach the driver's event listener at {address}: {exc}"
                ) from None
        assert sock is not None
        self._sock = sock
        self._writer = _Writer(sock, session.key_c2a, self._timeout_s)
        self._reader = _Reader(sock, session.key_a2c, 0, f"the driver at {address}")

    def send(self, data: dict[str, Any], blob: bytes = b"") -> None:
        """Send a one-way message."""
        self._write({**data, "reply": False}, blob)

    def request(self, data: dict[str, Any], blob: bytes = b"") -> dict[str, Any]:
        """Send a message and wait (at most ``timeout_s``) for the driver's answer."""
        kind = data.get("kind")
        self._write({**data, "reply": True}, blob)
        try:
            answer, _ = self._reader.recv(self._timeout_s)
        except OSError as exc:
            raise CommunicationError(
                f"the driver did not answer the {kind!r} event within "
                f"{self._timeout_s:g} s: {exc}"
            ) from None
        except CommunicationError as exc:
            raise CommunicationError(f"the driver's answer to the {kind!r} event: {exc}") from None
        return answer

    def gather(self, attempt: int, round_: int, rank: int, world: int,
               message: str) -> list[str]:
        """Every rank's ``message`` for this round of the stage attempt ``attempt``, by rank,
        once all ``world`` ranks have sent theirs (at most ``timeout_s``)."""
        answer = self.request({"kind": GATHER, "attempt": attempt, "round": round_,
                               "rank": rank, "world": world, "message": message})
        messages = answer.get("messages")
        if not isinstance(messages, list) or len(messages) != world:
            raise CommunicationError(f"the driver's answer to a gather of {world} ranks: "
                                     f"{answer!r:.200}")
        return [str(m) for m in messages]

    def _write(self, data: dict[str, Any], blob: bytes) -> None:
        try:
            self._writer.send(data, blob)
        except OSError as exc:
            raise CommunicationError(f"lost the driver's event listener: {exc}") from None

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._sock.close()
