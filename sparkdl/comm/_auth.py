"""Mutual HMAC-SHA256 challenge-response for every sparkdl TCP connection.

Acceptor                                   Connector
  -- MAGIC | nonce_a (32) -------------------->
  <-- MAGIC | ident (8) | nonce_c (32) | HMAC(secret, "C" | ctx | ident | nonce_a | nonce_c)
  -- HMAC(secret, "A" | ctx | ident | nonce_a | nonce_c) -->

``ctx`` names the purpose (ring or store) and ``ident`` the connector's claimed identity (its rank
and the world size). No payload is read before the connector's MAC has been verified, and the
connector sends no payload before it has verified the acceptor's MAC.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import socket
import struct
import time
from dataclasses import dataclass
from typing import Any

from sparkdl.errors import CommunicationError, ConfigurationError

MAGIC = b"SDLA1\x00"
NONCE_BYTES = 32
MAC_BYTES = 32
_IDENT = struct.Struct("<II")  # connector rank, world size
CONNECTOR_REPLY_BYTES = len(MAGIC) + _IDENT.size + NONCE_BYTES + MAC_BYTES
HANDSHAKE_BYTES_ACCEPTOR = len(MAGIC) + NONCE_BYTES + MAC_BYTES
TAG_BYTES = 16
"""Length of a :class:`RecordMac` tag (truncated HMAC-SHA256)."""
_RECV_CHUNK = 1 << 20


class AuthenticationError(CommunicationError):
    """The other end of a connection failed the challenge-response."""


@dataclass(frozen=True, repr=False)
class Session:
    """An authenticated connection: the connector's verified identity and per-direction keys
    for frame MACs, derived from the job secret and this handshake's transcript (so they
    differ on every connection and in each direction)."""

    rank: int
    world: int
    key_c2a: bytes
    """Key for MACs on what the connector sends."""
    key_a2c: bytes
    """Key for MACs on what the acceptor sends."""


def _session(secret: bytes, ctx: bytes, ident: bytes, na: bytes, nc: bytes) -> Session:
    root = hashlib.blake2b(secret, digest_size=64, person=b"sparkdl-mac-root").digest()
    transcript = ctx + b"\0" + ident + na + nc

    def key(direction: bytes) -> bytes:
        return hashlib.blake2b(direction + transcript, key=root, digest_size=32).digest()

    rank, world = _IDENT.unpack(ident)
    return Session(rank, world, key(b"C2A"), key(b"A2C"))


class RecordMac:
    """Keyed tags for one direction of one connection (a :class:`Session` key): HMAC-SHA256
    (OpenSSL's, hardware-accelerated where the CPU has SHA extensions: measured faster than
    keyed BLAKE2b here), truncated to ``TAG_BYTES``. The record counter is part of every tag,
    so a replayed, reordered, dropped or injected record fails verification. The ring
    (:mod:`sparkdl.comm.tcp`) and the event channel (:mod:`sparkdl.comm.channel`) use it."""

    __slots__ = ("base", "count")

    def __init__(self, key: bytes) -> None:
        self.base = hmac.new(key, digestmod="sha256")
        self.count = 0

    def hasher(self) -> Any:
        """A keyed hash already fed with the next record number; its truncated digest is the
        record's tag."""
        h = self.base.copy()
        h.update(self.count.to_bytes(8, "little"))
        self.count += 1
        return h


def check_secret(secret: bytes) -> bytes:
    """Validate a per-job secret (at least 16 bytes)."""
    if not isinstance(secret, bytes | bytearray) or len(secret) < 16:
        raise ConfigurationError(
            "secret: expected at least 16 bytes (e.g. secrets.token_bytes(32)), "
            f"got {type(secret).__name__} of length {len(secret) if secret is not None else 0}"
        )
    return bytes(secret)


def _mac(secret: bytes, role: bytes, ctx: bytes, ident: bytes, na: bytes, nc: bytes) -> bytes:
    return hmac.new(secret, role + ctx + ident + na + nc, hashlib.sha256).digest()


def recv_exact(sock: socket.socket, n: int, deadline: float) -> bytes:
    """Blocking read of exactly ``n`` bytes before ``deadline`` (monotonic). Memory grows with
    the bytes that arrive, never with ``n`` alone (a peer may declare any length)."""
    buf = bytearray()
    while len(buf) < n:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError(f"timed out after receiving {len(buf)} of {n} bytes")
        sock.settimeout(remaining)
        chunk = sock.recv(min(n - len(buf), _RECV_CHUNK))
        if not chunk:
            raise ConnectionError(f"connection closed after {len(buf)} of {n} bytes")
        buf += chunk
    return bytes(buf)


def send_all(sock: socket.socket, data: bytes, deadline: float) -> None:
    """Blocking send of ``data`` before ``deadline`` (monotonic)."""
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        raise TimeoutError("timed out before sending")
    sock.settimeout(remaining)
    sock.sendall(data)


def authenticate_acceptor(
    sock: socket.socket, secret: bytes, ctx: bytes, deadline: float
) -> tuple[int, int]:
    """Run the acceptor side; returns the connector's verified ``(rank, world_size)``."""
    session = accept_session(sock, secret, ctx, deadline)
    return session.rank, session.world


def accept_session(sock: socket.socket, secret: bytes, ctx: bytes, deadline: float) -> Session:
    """Run the acceptor side; returns the :class:`Session` (the connector's verified identity).

    Raises :class:`AuthenticationError` on a bad MAC or malformed reply, and ``OSError`` /
    ``TimeoutError`` on I/O failure.
    """
    nonce_a = secrets.token_bytes(NONCE_BYTES)
    send_all(sock, MAGIC + nonce_a, deadline)
    reply = recv_exact(sock, CONNECTOR_REPLY_BYTES, deadline)
    if not reply.startswith(MAGIC):
        raise AuthenticationError("bad handshake magic (not a sparkdl peer)")
    pos = len(MAGIC)
    ident = reply[pos : pos + _IDENT.size]
    pos += _IDENT.size
    nonce_c = reply[pos : pos + NONCE_BYTES]
    mac = reply[pos + NONCE_BYTES :]
    if not hmac.compare_digest(mac, _mac(secret, b"C", ctx, ident, nonce_a, nonce_c)):
        raise AuthenticationError("HMAC mismatch (wrong secret or tampered handshake)")
    send_all(sock, _mac(secret, b"A", ctx, ident, nonce_a, nonce_c), deadline)
    return _session(secret, ctx, ident, nonce_a, nonce_c)


def authenticate_connector(
    sock: socket.socket, secret: bytes, ctx: bytes, rank: int, world_size: int, deadline: float
) -> Session:
    """Run the connector side, proving ``(rank, world_size)`` and verifying the acceptor;
    returns the :class:`Session`."""
    hello = recv_exact(sock, len(MAGIC) + NONCE_BYTES, deadline)
    if not hello.startswith(MAGIC):
        raise AuthenticationError("bad handshake magic from acceptor (not a sparkdl peer)")
    nonce_a = hello[len(MAGIC) :]
    nonce_c = secrets.token_bytes(NONCE_BYTES)
    ident = _IDENT.pack(rank, world_size)
    mac = _mac(secret, b"C", ctx, ident, nonce_a, nonce_c)
    send_all(sock, MAGIC + ident + nonce_c + mac, deadline)
    answer = recv_exact(sock, MAC_BYTES, deadline)
    if not hmac.compare_digest(answer, _mac(secret, b"A", ctx, ident, nonce_a, nonce_c)):
        raise AuthenticationError("acceptor failed to prove the job secret")
    return _session(secret, ctx, ident, nonce_a, nonce_c)
