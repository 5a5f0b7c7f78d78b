"""A small authenticated key/value rendezvous for plain processes (tests, benchmarks,
single-machine training): every rank posts one string per round and receives all of them.

On Spark the same role is played by ``BarrierTaskContext.allGather``; this module gives plain
processes an ``exchange`` function with the same contract.
"""

from __future__ import annotations

import json
import logging
import socket
import struct
import threading
import time
from collections.abc import Callable
from typing import Any

from sparkdl.comm import _auth
from sparkdl.comm._accept import RESOURCE_ERRNOS, AcceptLoop
from sparkdl.comm.network import split_host_port
from sparkdl.errors import CommunicationError, ConfigurationError

log = logging.getLogger("sparkdl.comm")

_CTX = b"sparkdl-store-v1"
_LEN = struct.Struct("<I")
_MAX_FRAME = 1 << 30
_HANDSHAKE_S = 10.0


def _send_frame(sock: socket.socket, obj: dict[str, Any], deadline: float) -> None:
    data = json.dumps(obj, separators=(",", ":")).encode()
    _auth.send_all(sock, _LEN.pack(len(data)) + data, deadline)


def _recv_frame(sock: socket.socket, deadline: float) -> dict[str, Any]:
    (n,) = _LEN.unpack(_auth.recv_exact(sock, _LEN.size, deadline))
    if n > _MAX_FRAME:
        raise ValueError(f"frame of {n} bytes exceeds the limit of {_MAX_FRAME}")
    obj = json.loads(_auth.recv_exact(sock, n, deadline))
    if not isinstance(obj, dict):
        raise ValueError("frame is not a JSON object")
    return obj


class _Round:
    def __init__(self, world: int) -> None:
        self.world = world
        self.values: dict[int, str] = {}
        self.fetched: set[int] = set()


class TcpStoreServer:
    """Authenticated rendezvous server; ranks reach it through :func:`store_exchange`.

    ``start=False`` binds and listens without serving yet (call :meth:`start`), which lets a
    launcher fork workers before any thread exists.
    """

    def __init__(
        self, secret: bytes, host: str = "127.0.0.1", port: int = 0, *, start: bool = True
    ) -> None:
        self._secret = _auth.check_secret(secret)
        self._listener = socket.create_server((host, port), backlog=128)
        self._host = host
        self._port = self._listener.getsockname()[1]
        self._rounds: dict[tuple[str, int], _Round] = {}
        self._cond = threading.Condition()
        self._closed = False
        self._accept = AcceptLoop(self._listener, self._handle, what="store")
        self._started = False
        if start:
            self.start()

    @property
    def address(self) -> str:
        """``host:port`` that clients pass to :func:`store_exchange`."""
        return f"{self._host}:{self._port}"

    def start(self) -> None:
        """Start serving in a daemon thread (idempotent)."""
        if not self._started:
            self._started = True
            self._accept.start()

    def close(self) -> None:
        """Stop accepting connections and wake every waiting request."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._accept.stop(live=False)

    def __enter__(self) -> TcpStoreServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _handle(self, conn: socket.socket, peer: tuple[Any, ...]) -> None:
        with conn:
            try:
                deadline = time.monotonic() + _HANDSHAKE_S
                _auth.authenticate_acceptor(conn, self._secret, _CTX, deadline)
                self._accept.authenticated(conn)
                req = _recv_frame(conn, deadline)
                key, rnd = str(req["key"]), int(req["round"])
                rank, world = int(req["rank"]), int(req["world"])
                value, timeout_s = str(req["value"]), float(req["timeout"])
            except (OSError, ValueError, KeyError, TypeError, CommunicationError) as exc:
                log.warning("store: rejected connection from %s:%s: %s", peer[0], peer[1], exc)
                return
            try:
                reply = self._join(key, rnd, rank, world, value, timeout_s)
                _send_frame(conn, reply, time.monotonic() + _HANDSHAKE_S)
            except OSError as exc:
                log.warning("store: rank %d (%s) went away: %s", rank, peer[0], exc)

    def _join(
        self, key: str, rnd: int, rank: int, world: int, value: str, timeout_s: float
    ) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        with self._cond:
            state = self._rounds.setdefault((key, rnd), _Round(world))
            if state.world != world or not 0 <= rank < world:
                return {
                    "error": f"rank {rank} of world {world} joined round {rnd} of key {key!r} "
                    f"that has world size {state.world}"
                }
            if rank in state.values:
                return {"error": f"rank {rank} joined round {rnd} of key {key!r} twice"}
            state.values[rank] = value
            self._cond.notify_all()
            while len(state.values) < world and not self._closed:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    missing = sorted(set(range(world)) - set(state.values))
                    del state.values[rank]
                    return {
                        "error": f"ranks {missing} did not join round {rnd} of key {key!r} "
                        f"within {timeout_s:.1f} s"
                    }
                self._cond.wait(remaining)
            if len(state.values) < world:
                return {"error": "store server closed"}
            state.fetched.add(rank)
            values = [state.values[r] for r in range(world)]
            if len(state.fetched) == world:
                del self._rounds[(key, rnd)]
            return {"values": values}


def _parse_address(address: str) -> tuple[str, int]:
    try:
        return split_host_port(address)
    except ValueError as exc:
        raise ConfigurationError(f"store address: {exc}") from None


def store_exchange(
    address: str,
    rank: int,
    world_size: int,
    *,
    key: str = "",
    secret: bytes,
    timeout_s: float,
) -> Callable[[str], list[str]]:
    """Return ``exchange(value) -> [value of rank 0, ..., value of rank world_size-1]``.

    Each call is one round; every rank must call it the same number of times. A round that
    does not complete within ``timeout_s`` raises :class:`CommunicationError` naming the
    missing ranks.
    """
    host, port = _parse_address(address)
    secret = _auth.check_secret(secret)
    if not 0 <= rank < world_size:
        raise ConfigurationError(f"rank: expected 0 <= rank < {world_size}, got {rank}")
    if timeout_s <= 0:
        raise ConfigurationError(f"timeout_s: expected > 0, got {timeout_s}")
    counter = [0]

    def exchange(value: str) -> list[str]:
        rnd = counter[0]
        counter[0] += 1
        start = time.monotonic()
        deadline = start + timeout_s + 5.0
        try:
            sock = _connect(host, port, start + timeout_s)
            with sock:
                _auth.authenticate_connector(sock, secret, _CTX, rank, world_size, deadline)
                request = {
                    "key": key,
                    "round": rnd,
                    "rank": rank,
                    "world": world_size,
                    "value": value,
                    "timeout": max(0.1, timeout_s - (time.monotonic() - start)),
                }
                _send_frame(sock, request, deadline)
                reply = _recv_frame(sock, deadline)
        except (OSError, ValueError) as exc:
            raise CommunicationError(
                f"rendezvous store {address}: rank {rank} round {rnd} failed: {exc}"
            ) from exc
        if "error" in reply:
            raise CommunicationError(f"rendezvous store {address}: {reply['error']}")
        values = reply.get("values")
        if not isinstance(values, list) or len(values) != world_size:
            raise CommunicationError(f"rendezvous store {address}: malformed reply")
        return [str(v) for v in values]

    return exchange


def _connect(host: str, port: int, deadline: float) -> socket.socket:
    delay = 0.01
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError(f"could not connect to {host}:{port}")
        try:
            return socket.create_connection((host, port), timeout=min(remaining, 5.0))
        except OSError as exc:
            if not isinstance(
                exc, TimeoutError | ConnectionRefusedError | ConnectionResetError
            ) and exc.errno not in RESOURCE_ERRNOS:
                raise
            time.sleep(min(delay, max(0.0, deadline - time.monotonic())))
            delay = min(delay * 2, 0.5)
