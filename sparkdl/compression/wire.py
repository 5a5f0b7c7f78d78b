"""Wire format v1 of an encoded update: a fixed 44-byte little-endian header, then the payload.

=========== ======= =====================================================
field       type    meaning
=========== ======= =====================================================
magic       4s      ``b"SDLU"``
version     uint8   :data:`FORMAT_VERSION` (1)
encoding    uint8   :class:`~sparkdl.compression.encoding.Encoding`
reserved    uint16  0
job_id      uint64  training job the frame belongs to
rank        uint32  sender rank
step        uint64  training step
num_elements uint32 length of the (flattened) model update
payload_nbytes uint32 bytes after the header
tau         float32 threshold every encoded element carries
crc32       uint32  ``zlib.crc32`` of the payload
=========== ======= =====================================================

Nothing is unpickled or evaluated; :func:`unpack_frame` checks every field before the payload
is used and never allocates from a declared size.
"""

from __future__ import annotations

import math
import struct
import zlib
from dataclasses import dataclass

from sparkdl.compression.encoding import EncodedUpdate, Encoding, bitmap_nbytes
from sparkdl.errors import CommunicationError, ConfigurationError

__all__ = ["FORMAT_VERSION", "HEADER", "MAGIC", "FrameHeader", "pack_frame", "unpack_frame"]

MAGIC = b"SDLU"
FORMAT_VERSION = 1
HEADER = struct.Struct("<4sBBHQIQIIfI")

_U32 = (1 << 32) - 1
_U64 = (1 << 64) - 1


@dataclass(frozen=True)
class FrameHeader:
    """The decoded header fields of one frame."""

    magic: bytes
    version: int
    encoding: Encoding
    reserved: int
    job_id: int
    rank: int
    step: int
    num_elements: int
    payload_nbytes: int
    tau: float
    crc32: int


def _field(name: str, value: int, limit: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= limit:
        raise ConfigurationError(f"{name} must be an integer in [0, {limit}], got {value!r}")
    return value


def pack_frame(update: EncodedUpdate, *, job_id: int, rank: int, step: int) -> bytes:
    """Header plus payload of ``update`` as one ``bytes`` object."""
    payload = update.payload
    nbytes = len(payload)
    header = HEADER.pack(
        MAGIC,
        FORMAT_VERSION,
        int(Encoding(update.encoding)),
        0,
        _field("job_id", job_id, _U64),
        _field("rank", rank, _U32),
        _field("step", step, _U64),
        _field("num_elements", update.num_elements, _U32),
        _field("payload_nbytes", nbytes, _U32),
        update.tau,
        zlib.crc32(payload),
    )
    return header + payload


def unpack_frame(
    frame: bytes | memoryview,
    *,
    job_id: int,
    num_elements: int,
    world_size: int | None = None,
    step: int | None = None,
) -> tuple[FrameHeader, memoryview]:
    """Validate ``frame`` and return its header and a zero-copy view of its payload.

    Checks: length, magic, version, encoding, reserved, job id, rank (``< world_size`` when
    given), step (when given), ``num_elements`` (the expected model size), payload length
    (declared == actual, and consistent with the encoding: sparse a multiple of 4 and at most
    the bitmap size; bitmap exactly ``ceil(n / 4)``), tau (finite, > 0) and the CRC-32.
    Any violation raises :class:`CommunicationError` naming the field, expected vs got, and
    the sender rank when the header could be read.
    """
    try:
        view = memoryview(frame)
    except TypeError:
        raise CommunicationError(f"frame must be bytes-like, got {type(frame).__name__}") from None
    if not view.c_contiguous:
        raise CommunicationError("frame must be a contiguous buffer")
    if view.format != "B" or view.ndim != 1:
        view = view.cast("B")
    if view.nbytes < HEADER.size:
        raise CommunicationError(
            f"frame too short: {view.nbytes} bytes, the header alone is {HEADER.size}"
        )
    fields = HEADER.unpack_from(view)
    magic, version, encoding, reserved, f_job, f_rank, f_step, f_n, f_nbytes, f_tau, f_crc = fields

    def bad(field: str, expected: object, got: object) -> CommunicationError:
        return CommunicationError(
            f"bad frame from rank {f_rank} (as declared): {field} expected {expected}, got {got}"
        )

    if magic != MAGIC:
        raise bad("magic", MAGIC, magic)
    if version != FORMAT_VERSION:
        raise bad("format version", FORMAT_VERSION, version)
    if encoding not in (Encoding.SPARSE, Encoding.BITMAP):
        raise bad("encoding", [int(e) for e in Encoding], encoding)
    kind = Encoding(encoding)
    if reserved != 0:
        raise bad("reserved", 0, reserved)
    if f_job != job_id:
        raise bad("job_id", job_id, f_job)
    if world_size is not None and f_rank >= world_size:
        raise bad("rank", f"< {world_size}", f_rank)
    if step is not None and f_step != step:
        raise bad("step", step, f_step)
    if f_n != num_elements:
        raise bad("num_elements", num_elements, f_n)
    actual = view.nbytes - HEADER.size
    if f_nbytes != actual:
        raise bad("payload_nbytes", f"{actual} (bytes present)", f_nbytes)
    limit = bitmap_nbytes(num_elements)
    if kind is Encoding.BITMAP:
        if f_nbytes != limit:
            raise bad("payload_nbytes", f"{limit} for a bitmap of {num_elements}", f_nbytes)
    elif f_nbytes % 4 or f_nbytes > limit:
        raise bad("payload_nbytes", f"a multiple of 4 and <= {limit} for sparse entries", f_nbytes)
    if not (math.isfinite(f_tau) and f_tau > 0):
        raise bad("tau", "finite and > 0", f_tau)
    payload = view[HEADER.size :]
    crc = zlib.crc32(payload)
    if crc != f_crc:
        raise bad("crc32", f"{crc:#010x} (computed)", f"{f_crc:#010x}")
    header = FrameHeader(
        magic, version, kind, reserved, f_job, f_rank, f_step, f_n, f_nbytes, f_tau, f_crc
    )
    return header, payload
