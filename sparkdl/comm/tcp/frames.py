"""The ring's frames: the header and its ops, shared-memory notices and credits, the send
queues (with a MAC per record under ``wire_integrity="mac"``) and the receive steps of one
collective (:mod:`sparkdl.comm.tcp` describes the protocol)."""

from __future__ import annotations

import contextlib
import logging
import socket
import struct
from collections import deque
from collections.abc import Callable
from typing import Any

import numpy as np

from sparkdl.comm import _auth
from sparkdl.comm.communicator import (
    check_reduce_op,
)
from sparkdl.errors import CommunicationError, ConfigurationError

log = logging.getLogger("sparkdl.comm")


_HDR = struct.Struct("<BBHIQ")  # magic, op, step, sequence number, payload length
_MAGIC = 0xD7
_OP_ALLREDUCE_F32 = 1
_OP_ALLREDUCE_F64 = 2
_OP_ALLGATHER = 3
_OP_BROADCAST = 4
_OP_NAMES = {
    1: "allreduce(float32)",
    2: "allreduce(float64)",
    3: "allgather",
    4: "broadcast",
    # The log-depth collectives of :mod:`sparkdl.comm.mesh`, over links of this class.
    5: "mesh allgather",
    6: "mesh broadcast",
    7: "mesh allreduce(float32)",
    8: "mesh allreduce(float64)",
    9: "allreduce(bfloat16)",
}
_OP_ALLREDUCE_BF16 = 9
_DTYPE_OPS = {np.dtype(np.float32): _OP_ALLREDUCE_F32, np.dtype(np.float64): _OP_ALLREDUCE_F64}
try:  # bfloat16 (ml_dtypes, installed with TensorFlow and JAX): the dense exchange's wire
    import ml_dtypes

    _DTYPE_OPS[np.dtype(ml_dtypes.bfloat16)] = _OP_ALLREDUCE_BF16
except ImportError:  # pragma: no cover - without it bfloat16 arrays cannot exist
    pass
_SHM_FLAG = 0x80  # in a header's op: the payload follows as shared-memory notices
_NOTE = struct.Struct("<BBHI")  # magic, 0, slot number (low 16 bits), payload bytes in the slot
_NOTE_MAGIC = 0xC5
_ACK = 0xA5  # one byte back per consumed slot

SOCKET_BUFFER_BYTES = 4 << 20
"""SO_SNDBUF / SO_RCVBUF requested for ring sockets (the kernel may cap it)."""
REDUCE_BLOCK_BYTES = 256 << 10
"""Received data is reduced and forwarded in blocks of this size (pipelining)."""
MAX_MESSAGE_BYTES = 1 << 36
SHM_SLOTS = 3
"""Slots in each same-host shared-memory link (credits the sender may run ahead by)."""
SHM_SLOT_BYTES = 2 << 20
"""Bytes per shared-memory slot (a multiple of the page size)."""
SHM_MIN_BYTES = 32 << 10
"""Payloads shorter than this go over the socket even on a shared-memory link (latency)."""
HANDSHAKE_S = 10.0
"""Bound on one connection's authentication and shared-memory negotiation (within the ring's
own deadline), so idle connections cannot hold a handshake slot for long."""
_MAX_IOV = 64
WIRE_INTEGRITY = ("none", "mac")
MAC_BYTES = _auth.TAG_BYTES
"""Length of the tag (truncated HMAC-SHA256) after every record with ``wire_integrity="mac"``."""
MAC_RECORD_BYTES = REDUCE_BLOCK_BYTES
"""Payload bytes per MAC'd record (a frame's payload is cut into records of this size)."""
_RING_CTX = b"sparkdl-ring-v1:"


class _Peer:
    __slots__ = ("host", "port", "rank")

    def __init__(self, rank: int, host: str, port: int) -> None:
        self.rank, self.host, self.port = rank, host, port

    def __str__(self) -> str:
        return f"rank {self.rank} ({self.host}:{self.port})"


class _ShmData:
    """Payload queued for the shared-memory link (bytes not yet copied into a slot)."""

    __slots__ = ("view",)

    def __init__(self, view: memoryview) -> None:
        self.view = view


class _Out(deque):  # type: ignore[type-arg]
    """What is queued for the next rank: memoryviews (socket bytes) and :class:`_ShmData`."""

    def header(self, hdr: memoryview, length: int) -> None:
        self.append(hdr)

    data = deque.append
    """Queue payload bytes for the socket."""


_Mac = _auth.RecordMac


def _tag(h: Any) -> bytes:
    digest: bytes = h.digest()
    return digest[:MAC_BYTES]


class _MacOut(_Out):
    """A send queue that cuts every frame into records (the header, then payload pieces of up
    to ``MAC_RECORD_BYTES``) and queues each record's tag right after it."""

    def __init__(self, mac: _Mac) -> None:
        super().__init__()
        self._mac = mac
        self._h: Any = None
        self._record_left = 0
        self._frame_left = 0

    def header(self, hdr: memoryview, length: int) -> None:
        assert self._frame_left == 0, "a frame header queued inside another frame"
        h = self._mac.hasher()
        h.update(hdr)
        self.append(hdr)
        self.append(memoryview(_tag(h)))
        self._frame_left = length
        self._next_record()

    def _next_record(self) -> None:
        if self._frame_left:
            self._record_left = min(MAC_RECORD_BYTES, self._frame_left)
            self._h = self._mac.hasher()

    def data(self, view: memoryview) -> None:
        while len(view):
            take = min(len(view), self._record_left)
            if not take:
                raise CommunicationError("internal error: payload queued past its frame")
            piece = view[:take]
            self._h.update(piece)
            self.append(piece)
            self._record_left -= take
            self._frame_left -= take
            view = view[take:]
            if self._record_left == 0:
                self.append(memoryview(_tag(self._h)))
                self._next_record()


def _chunk_of(chunks: list[memoryview], index: int) -> Callable[[int], memoryview]:
    """A receive target that is always ``chunks[index]`` (whatever length is announced)."""
    return lambda _length: chunks[index]


def _reduce_code(op: str, dtype: np.dtype) -> int:
    """The frame op that sums ``dtype``; a clear error for another ``op`` or dtype."""
    check_reduce_op(op)
    code = _DTYPE_OPS.get(dtype)
    if code is None:
        raise ConfigurationError(
            f"allreduce dtype: expected float32, float64 or bfloat16, got {dtype}"
        )
    return code


class _RecvStep:
    """One framed message expected from the previous rank."""

    __slots__ = (
        "length", "on_data", "on_done", "on_header", "on_shm", "step", "store", "target"
    )

    def __init__(
        self,
        step: int,
        length: int | None,
        target: Callable[[int], memoryview] | None,
        on_header: Callable[[int], None] | None = None,
        on_data: Callable[[memoryview, int, int], None] | None = None,
        on_done: Callable[[], None] | None = None,
        on_shm: Callable[[np.ndarray, int, int], None] | None = None,
        store: Callable[[bytearray], None] | None = None,
    ) -> None:
        self.step = step
        # The collective implies the length: the payload goes straight into target(length).
        # None: any length (from the header), received into a buffer that grows with the
        # bytes that really arrive and is handed to store() at the end.
        self.length = length
        self.target = target
        self.store = store
        self.on_header = on_header
        self.on_data = on_data
        self.on_done = on_done
        # Consumes payload bytes [lo, hi) straight from a shared-memory slot; when None they
        # are copied into the target and on_data is called.
        self.on_shm = on_shm


def _header(op: int, step: int, seq: int, length: int) -> memoryview:
    return memoryview(_HDR.pack(_MAGIC, op, step & 0xFFFF, seq, length))


def _tune(sock: socket.socket) -> None:
    for opt in (socket.SO_SNDBUF, socket.SO_RCVBUF):
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, opt, SOCKET_BUFFER_BYTES)
