"""Threshold encoding of a residual vector into ±tau messages, and decoding them.

Two encodings share one meaning: a set of elements, each carrying ``+tau`` or ``-tau``.

``SPARSE``
    A little-endian int32 array, one entry per encoded element in strictly increasing element
    order. The entry is ``index + 1`` for ``+tau`` and ``-(index + 1)`` for ``-tau``; the
    offset by one gives element 0 a sign (there is no ``-0`` in two's complement), so the
    value 0 never occurs.
``BITMAP``
    Two bits per element, four elements per byte, little-endian: element ``i`` sits in bits
    ``2*(i % 4)`` and ``2*(i % 4) + 1`` of byte ``i // 4``. Code 0 is zero, 1 is ``+tau``,
    2 is ``-tau``; code 3 is invalid and unused bits of the last byte must be zero.

The encoder uses ``SPARSE`` unless its payload (``4 * nnz`` bytes) would be larger than the
bitmap (``ceil(n / 4)`` bytes), i.e. it switches to ``BITMAP`` at about ``nnz > n / 16``.

Exactness. All arithmetic is float32 with ``tau`` rounded to float32. An element ``s`` with
``|s| >= tau`` is encoded as ``t = ±tau`` and its residual becomes ``fl(s - t)``, but only if
``fl(fl(s - t) + t) == s``; otherwise it is left alone (not sent this step). So for every
element, ``decoded + new_residual == old_residual`` holds exactly in float32, which is what
lets a receiver that adds the message to zeros reproduce the sender's bookkeeping bit for bit.
The check fails only in rare rounding ties (``s - t`` exactly half-way between two float32
values); such an element is sent on a later step once its residual has changed. When ``|s|``
is so large relative to ``tau`` that ``fl(s - t) == s``, the element is still sent (the
identity holds) but its residual does not shrink: it is sent as ``±tau`` on every step, like
DL4J, which is what residual clipping exists for.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from sparkdl.compression.pieces import Pieces
from sparkdl.errors import CommunicationError, ConfigurationError, NonFiniteError

__all__ = [
    "CHUNK_ELEMENTS",
    "EncodedUpdate",
    "Encoding",
    "bitmap_nbytes",
    "decode_into",
    "sparse_entries",
    "threshold_encode",
]

#: Elements processed per step of the encode/decode sweep (256 KiB of float32: fits in L2).
CHUNK_ELEMENTS = 1 << 16
_MAX_ELEMENTS = (1 << 31) - 1  # sparse entries are int32 index + 1
# A float32's bits without the sign: ordered as |x| for finite x; inf's are the smallest
# non-finite ones (every NaN's are larger).
_MAGNITUDE = np.int32(0x7FFFFFFF)
_INF_BITS = np.int32(0x7F800000)
_CHUNK_BYTES = CHUNK_ELEMENTS // 4


class Encoding(enum.IntEnum):
    """Payload layout of an :class:`EncodedUpdate`."""

    SPARSE = 1
    BITMAP = 2


@dataclass(frozen=True)
class EncodedUpdate:
    """One threshold-encoded message: ``nnz`` of ``num_elements`` elements carry ``±tau``.

    ``payload`` is the raw little-endian body described in the module docstring; ``tau`` is
    the float32 value (as a Python float) that every element carries.
    """

    encoding: Encoding
    num_elements: int
    tau: float
    nnz: int
    payload: bytes


def bitmap_nbytes(num_elements: int) -> int:
    """Size in bytes of a BITMAP payload for ``num_elements`` elements: ``ceil(n / 4)``."""
    return (num_elements + 3) // 4


def _float32_tau(tau: float, error: type[Exception]) -> np.float32:
    try:
        value = float(tau)
    except (TypeError, ValueError):
        raise error(f"tau must be a positive finite number, got {tau!r}") from None
    t = np.float32(value) if math.isfinite(value) and abs(value) < 3.5e38 else np.float32(0)
    if not (math.isfinite(value) and value > 0 and np.isfinite(t) and t > 0):
        raise error(f"tau must be a positive finite float32 number, got {tau!r}")
    return t


def _check_vector(name: str, array: object, writable: bool) -> np.ndarray:
    if not isinstance(array, np.ndarray) or array.dtype != np.float32 or array.ndim != 1:
        got = (
            f"{array.dtype} array of shape {array.shape}"
            if isinstance(array, np.ndarray)
            else type(array).__name__
        )
        raise ConfigurationError(f"{name} must be a 1-D float32 numpy array, got {got}")
    if writable and not array.flags.writeable:
        raise ConfigurationError(f"{name} must be writable")
    return array


def _pack_sparse(bitmap: np.ndarray, index: np.ndarray, negative: np.ndarray) -> None:
    """OR the 2-bit codes of the elements ``index`` (signs ``negative``) into ``bitmap``."""
    codes = negative.astype(np.uint8)
    codes += 1
    codes <<= (2 * (index & 3)).astype(np.uint8)
    np.bitwise_or.at(bitmap, index >> 2, codes)


_SIGN_BIT = np.int32(-(1 << 31))


def _signed_tau(values: np.ndarray, t: np.float32) -> np.ndarray:
    """``copysign(t, values)`` as int32 bit patterns (integer ops are vectorised, fast)."""
    bits = np.bitwise_and(values.view(np.int32), _SIGN_BIT)
    bits |= np.asarray(t).view(np.int32)
    return bits


def _encode_dense(
    chunk: np.ndarray, mask: np.ndarray, t: np.float32, code_buf: np.ndarray, target: np.ndarray
) -> int:
    """Bitmap phase, one chunk: subtract ``±t`` where ``mask`` (``|r| >= t``) and exact, write
    the packed codes into ``target``; return how many were encoded."""
    delta_bits = _signed_tau(chunk, t)
    delta_bits *= mask  # +0.0 where not encoded, so ``x - delta`` keeps x (even -0.0)
    delta = delta_bits.view(np.float32)
    updated = chunk - delta
    exact = (updated + delta) == chunk
    if not exact.all():
        mask &= exact
        delta_bits *= mask
        np.subtract(chunk, delta, out=updated)
    chunk[:] = updated
    length = chunk.size
    view = code_buf[: 4 * target.size]
    view[length:] = 0
    np.left_shift(mask.view(np.uint8), np.signbit(delta).view(np.uint8), out=view[:length])
    word = view.view("<u4")
    packed = word | (word >> 6)
    packed |= word >> 12
    packed |= word >> 18
    target[:] = packed  # keeps the low byte
    return int(np.count_nonzero(mask))


def _chunks(r: np.ndarray | Pieces) -> Iterator[tuple[int, np.ndarray, bool]]:
    """``(start, chunk, staged)`` over the encode sweep's chunks (see :meth:`Pieces.chunks`)."""
    if isinstance(r, Pieces):
        yield from r.chunks(CHUNK_ELEMENTS)
        return
    for start in range(0, r.size, CHUNK_ELEMENTS):
        yield start, r[start : start + CHUNK_ELEMENTS], False


def _subtract_exact(
    r: np.ndarray | Pieces, index: np.ndarray, t: np.float32, check_finite: bool = False
) -> tuple[np.ndarray, np.ndarray]:
    """Subtract ``±t`` from ``r[index]`` (all ``|r| >= t``) where that is exact (see module
    docstring); return the kept indices and their signs (True = negative). ``check_finite``:
    first raise :class:`NonFiniteError` if one of the values is not finite."""
    values = r.take(index) if isinstance(r, Pieces) else r[index]
    if check_finite:
        _check_finite_values(values, index)
    signed = _signed_tau(values, t).view(np.float32)
    updated = values - signed
    exact = (updated + signed) == values
    negative = np.signbit(signed)
    if not exact.all():
        index, updated, negative = index[exact], updated[exact], negative[exact]
    if isinstance(r, Pieces):
        r.put(index, updated)
    else:
        r[index] = updated
    return index, negative


def _check_finite_values(values: np.ndarray, index: np.ndarray) -> None:
    """Raise :class:`NonFiniteError` naming the first non-finite ``values[i]`` (element
    ``index[i]`` of the residual)."""
    bad = np.flatnonzero(~np.isfinite(values))
    if bad.size:
        i = int(bad[0])
        raise NonFiniteError(
            f"residual element {int(index[i])} is {float(values[i])} ({bad.size} non-finite "
            f"among {values.size} checked); nothing was encoded"
        )


def _check_finite_from(r: np.ndarray | Pieces, start: int, buffer: np.ndarray) -> None:
    """Raise :class:`NonFiniteError` if an element of ``r`` from ``start`` (a chunk boundary)
    on is not finite; ``buffer``: int32 scratch of a chunk's length (the sweep's own)."""
    for begin, chunk, _ in _chunks(r):
        if begin < start:
            continue
        bits = np.bitwise_and(chunk.view(np.int32), _MAGNITUDE, out=buffer[: chunk.size])
        if bits.max() >= _INF_BITS:
            local = np.flatnonzero(bits >= _INF_BITS)
            _check_finite_values(chunk[local], local + begin)


def threshold_encode(
    residual: np.ndarray | Pieces, tau: float, *, add: np.ndarray | None = None,
    check_finite: bool = False,
) -> EncodedUpdate:
    """Encode every element with ``|r| >= tau`` as ``sign(r) * tau`` and subtract it in place.

    ``residual`` is a 1-D float32 array that already holds ``old_residual + update``; with
    ``add`` given (same shape, float32) the sum ``residual += add`` is done first, chunk by
    chunk in the same sweep. Elements for which the float32 subtraction would break
    ``decoded + residual == old`` are skipped this step (see the module docstring). The
    encoding is chosen from the number of candidates (``|r| >= tau``): SPARSE while
    ``4 * candidates <= ceil(n / 4)``, else BITMAP. Raises :class:`ConfigurationError` for a
    bad array or ``tau``.

    ``residual`` may also be :class:`~sparkdl.compression.pieces.Pieces` (the vector held in
    separate buffers, e.g. one per model variable; no ``add``): the same message and the same
    bits as for their concatenation, without concatenating them.

    ``check_finite`` (no ``add``): raise :class:`~sparkdl.errors.NonFiniteError`, naming the
    element, if the residual holds NaN or an infinity, and leave it unchanged; without it a
    NaN is never encoded and an infinity is sent as ``±tau`` on every step. The check costs no
    pass of its own: the sweep compares the magnitudes as integer bit patterns, under which
    every non-finite element reaches ``tau``, so it is among the candidates, whose values are
    read before anything is subtracted (past the switch to the bitmap, one more read pass
    over the rest of the vector checks it first).
    """
    r: np.ndarray | Pieces
    if isinstance(residual, Pieces):
        if add is not None:
            raise ConfigurationError("add needs the residual as one array, not Pieces")
        r = residual
    else:
        r = _check_vector("residual", residual, writable=True)
    if add is not None:
        if check_finite:
            raise ConfigurationError("check_finite needs the residual alone, without add")
        _check_vector("add", add, writable=False)
        if add.shape != (r.size,):
            raise ConfigurationError(f"add has {add.size} elements, residual has {r.size}")
    t = _float32_tau(tau, ConfigurationError)
    n = r.size
    if n > _MAX_ELEMENTS:
        raise ConfigurationError(f"at most {_MAX_ELEMENTS} elements, got {n}")
    bm_nbytes = bitmap_nbytes(n)
    max_sparse = bm_nbytes // 4  # most candidates whose sparse payload is not larger
    width = min(n, CHUNK_ELEMENTS)
    # the magnitudes: as float32, or (check_finite) as int32 bit patterns compared with tau's
    abs_buf = np.empty(width, np.int32 if check_finite else np.float32)
    limit = t.view(np.int32) if check_finite else t
    mask_buf = np.empty(width, np.bool_)
    # Sparse phase: only collect candidate indices per chunk (cheap); the subtraction is done
    # once, vectorised, over all of them. Past max_sparse candidates switch to the bitmap
    # phase, which processes and packs each chunk as it goes.
    found: list[np.ndarray] = []
    candidates = 0
    bitmap: np.ndarray | None = None
    code_buf = np.empty(0, np.uint8)
    nnz = 0
    with np.errstate(over="ignore", invalid="ignore"):
        for start, chunk, staged in _chunks(r):
            length = chunk.size
            if add is not None:
                np.add(chunk, add[start : start + length], out=chunk)
            if check_finite:
                a = np.bitwise_and(chunk.view(np.int32), _MAGNITUDE, out=abs_buf[:length])
            else:
                a = np.abs(chunk, out=abs_buf[:length])
            m = np.greater_equal(a, limit, out=mask_buf[:length])
            if bitmap is None:
                local = m.nonzero()[0]
                if local.size == 0:
                    continue
                candidates += local.size
                if candidates <= max_sparse:
                    if start:
                        local += start
                    found.append(local)
                    continue
                # Switch: flush the earlier chunks' candidates into a new bitmap; this chunk
                # and the rest are encoded densely (checked first: the rest is written as
                # the sweep goes).
                if check_finite:  # the chunk's magnitudes are spent: their buffer serves
                    _check_finite_from(r, start, abs_buf)
                bitmap = np.zeros(bm_nbytes, np.uint8)
                code_buf = np.empty(4 * bitmap_nbytes(width), np.uint8)
                if found:
                    index, negative = _subtract_exact(r, np.concatenate(found), t,
                                                      check_finite)
                    found.clear()
                    nnz += index.size
                    _pack_sparse(bitmap, index, negative)
            elif not m.any():  # the bitmap phase needs no indices
                continue
            nnz += _encode_dense(
                chunk, m, t, code_buf, bitmap[start // 4 : start // 4 + bitmap_nbytes(length)]
            )
            if staged:
                assert isinstance(r, Pieces)
                r.write(start, chunk)
        if bitmap is not None:
            return EncodedUpdate(Encoding.BITMAP, n, float(t), nnz, bitmap.tobytes())
        if not found:
            return EncodedUpdate(Encoding.SPARSE, n, float(t), 0, b"")
        index, negative = _subtract_exact(r, np.concatenate(found), t, check_finite)
    # entry = (index + 1), negated for -tau: c -> (c ^ m) - m with m = -1 where negative.
    codes = index.astype("<i4")
    codes += 1
    flip = negative.astype("<i4")
    np.negative(flip, out=flip)
    codes ^= flip
    codes -= flip
    return EncodedUpdate(Encoding.SPARSE, n, float(t), int(index.size), codes.tobytes())


def _bitmap_table(t: np.float32) -> np.ndarray:
    """The four float32 element values each bitmap byte decodes to, as 256 16-byte items
    (so that one 1-D gather expands a byte into four floats)."""
    codes = (np.arange(256, dtype=np.uint8)[:, None] >> np.array([0, 2, 4, 6], np.uint8)) & 3
    table = np.zeros((256, 4), np.float32)
    table[codes == 1] = t
    table[codes == 2] = -t
    return table.view(np.complex128).reshape(256)


def _as_bytes_view(payload: object) -> memoryview:
    try:
        view = memoryview(payload)  # type: ignore[arg-type]
    except TypeError:
        raise CommunicationError(
            f"payload must be bytes-like, got {type(payload).__name__}"
        ) from None
    if not view.c_contiguous:
        raise CommunicationError("payload must be a contiguous buffer")
    return view.cast("B") if view.format != "B" or view.ndim != 1 else view


def sparse_entries(
    payload: bytes | memoryview, num_elements: int, tau: float
) -> tuple[np.ndarray, np.ndarray]:
    """The ``(index, value)`` pairs of one SPARSE payload: int32 indices, strictly
    increasing, and their float32 ``±tau``. A malformed payload raises
    :class:`CommunicationError` (see :func:`decode_into`)."""
    n = int(num_elements)
    t = _float32_tau(tau, CommunicationError)
    data = _as_bytes_view(payload)
    nbytes = data.nbytes
    if nbytes % 4:
        raise CommunicationError(f"sparse payload of {nbytes} bytes is not a multiple of 4")
    if nbytes // 4 > n:
        raise CommunicationError(f"sparse payload has {nbytes // 4} entries for {n} elements")
    if nbytes == 0:
        return np.zeros(0, np.int32), np.zeros(0, np.float32)
    codes = np.frombuffer(data, dtype="<i4")
    index = np.abs(codes)  # wraps for -2**31, then index - 1 == 2**31 - 1 >= n
    index -= 1
    # Valid iff strictly increasing from index[0] >= 0 to index[-1] < n (a 0 entry becomes
    # -1, which breaks one or the other); only a bad payload is examined further, for the
    # error message.
    if not (
        index[0] >= 0
        and index[-1] < n
        and (index.size == 1 or bool(np.all(index[1:] > index[:-1])))
    ):
        low, high = int(codes.min()), int(codes.max())
        if low < -n or high > n or np.count_nonzero(codes) != codes.size:
            raise CommunicationError(
                f"sparse entry out of range (min {low}, max {high}, expected 1..{n} by"
                " magnitude, never 0)"
            )
        raise CommunicationError("sparse indices are not strictly increasing")
    # +t or -t from the sign bit of each entry
    return index, _signed_tau(codes.view(np.float32), t).view(np.float32)


def decode_into(
    encoding: Encoding,
    payload: bytes | memoryview,
    num_elements: int,
    tau: float,
    out: np.ndarray,
) -> None:
    """Add the decoded ``±tau`` values of one message into the float32 vector ``out``.

    Summing several messages is repeated ``decode_into`` on the same ``out`` (in a fixed order
    for bit-identical results). A malformed message (unknown encoding, bad ``tau``, sparse
    index out of range / zero / not strictly increasing, bitmap of the wrong length, code 3 or
    non-zero padding bits) raises :class:`CommunicationError` before ``out`` is modified.
    Temporary memory is O(``num_elements``). A wrong ``out`` raises
    :class:`ConfigurationError`. (A bitmap adds ``+0.0`` to its zero elements, which leaves
    every value unchanged except that a ``-0.0`` in ``out`` becomes ``+0.0``.)
    """
    if not isinstance(num_elements, (int, np.integer)) or not 0 <= num_elements <= _MAX_ELEMENTS:
        raise ConfigurationError(
            f"num_elements must be in [0, {_MAX_ELEMENTS}], got {num_elements!r}"
        )
    n = int(num_elements)
    _check_vector("out", out, writable=True)
    if out.size != n:
        raise ConfigurationError(f"out has {out.size} elements, expected {n}")
    try:
        kind = Encoding(encoding)
    except ValueError:
        raise CommunicationError(f"unknown encoding {encoding!r}") from None
    if kind is Encoding.SPARSE:
        index, values = sparse_entries(payload, n, tau)
        out[index] += values  # one gather/add/scatter (indices unique)
        return
    t = _float32_tau(tau, CommunicationError)
    data = _as_bytes_view(payload)
    nbytes = data.nbytes
    expected = bitmap_nbytes(n)
    if nbytes != expected:
        raise CommunicationError(
            f"bitmap payload has {nbytes} bytes, expected {expected} for {n} elements"
        )
    if n == 0:
        return
    raw = np.frombuffer(data, dtype=np.uint8)
    for first in range(0, expected, _CHUNK_BYTES):
        block = raw[first : first + _CHUNK_BYTES]
        if np.any(block & (block >> 1) & 0x55):
            raise CommunicationError("bitmap holds the invalid code 3")
    tail = n % 4
    if tail and int(raw[-1]) >> (2 * tail):
        raise CommunicationError("bitmap padding bits of the last byte are not zero")
    table = _bitmap_table(t)
    for first in range(0, expected, _CHUNK_BYTES):
        block = raw[first : first + _CHUNK_BYTES]
        start = 4 * first
        values = table[block].view(np.float32)
        stop = min(start + values.size, n)
        target = out[start:stop]
        np.add(target, values[: stop - start], out=target)
