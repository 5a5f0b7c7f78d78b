"""One float32 vector held as consecutive pieces in separate buffers, worked on in place.

A residual need not be one array: gradient sharing keeps it in the buffers the optimizer
adds its update to, one per model variable. :class:`Pieces` lets the encoder sweep, index
and sample such a vector as if it were the concatenation, without ever concatenating it.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator, Sequence

import numpy as np

from sparkdl.errors import ConfigurationError

__all__ = ["Pieces", "block_view", "split_sorted"]


def block_view(vector: np.ndarray, offset: int, period: int, width: int,
               count: int) -> np.ndarray:
    """A read-only ``(count, width)`` view of the 1-D ``vector``: row ``i`` holds the
    ``width`` consecutive elements from ``offset + i * period`` (all within ``vector``)."""
    itemsize = vector.strides[0]
    return np.lib.stride_tricks.as_strided(
        vector[offset:], shape=(count, width), strides=(period * itemsize, itemsize),
        writeable=False)


def split_sorted(index: np.ndarray, offsets: Sequence[int]
                 ) -> Iterator[tuple[int, np.ndarray, slice]]:
    """``(i, local, where)`` for each piece ``i`` that the flat ``index`` (ascending) touches,
    piece ``i`` holding the flat elements ``offsets[i]:offsets[i + 1]``: the piece's own
    indices, and their positions in ``index``."""
    bounds = np.searchsorted(index, offsets).tolist()
    for i in range(len(offsets) - 1):
        start, stop = bounds[i], bounds[i + 1]
        if stop > start:
            local = index[start:stop]
            if offsets[i]:
                local = local - offsets[i]
            yield i, local, slice(start, stop)


class Pieces:
    """Consecutive writable float32 arrays (any shape, C-contiguous) seen as one flat vector
    of :attr:`size` elements; element ``offsets[i] + j`` is ``arrays[i].flat[j]``. Writes go
    to the arrays' own memory."""

    def __init__(self, arrays: Sequence[np.ndarray]) -> None:
        flat = []
        for i, array in enumerate(arrays):
            if (
                not isinstance(array, np.ndarray)
                or array.dtype != np.float32
                or not array.flags.c_contiguous
                or not array.flags.writeable
            ):
                got = (f"{array.dtype} array, contiguous={array.flags.c_contiguous}, "
                       f"writable={array.flags.writeable}"
                       if isinstance(array, np.ndarray) else type(array).__name__)
                raise ConfigurationError(
                    f"piece {i} must be a writable C-contiguous float32 array, got {got}"
                )
            flat.append(array.reshape(-1))  # a view: the array is contiguous
        self.arrays: list[np.ndarray] = flat
        self.offsets: list[int] = [0, *np.cumsum([a.size for a in flat]).tolist()]
        self.size: int = self.offsets[-1]

    def chunks(self, width: int) -> Iterator[tuple[int, np.ndarray, bool]]:
        """``(start, chunk, staged)`` for the elements ``start:start + width`` (the last chunk
        shorter), ``start`` a multiple of ``width``. ``chunk`` is a view of one piece, or,
        where the chunk spans pieces, a staged copy (``staged``): :meth:`write` it back after
        changing it."""
        for start in range(0, self.size, width):
            stop = min(start + width, self.size)
            i = bisect.bisect_right(self.offsets, start) - 1
            low = self.offsets[i]
            if stop <= self.offsets[i + 1]:
                yield start, self.arrays[i][start - low : stop - low], False
            else:
                yield start, self.read(start, stop), True

    def _spans(self, start: int, stop: int) -> Iterator[tuple[np.ndarray, slice]]:
        """``(part, where)`` for each piece overlapping the elements ``start:stop``: the
        piece's view of its share, and that share's positions within ``start:stop``."""
        for piece, low in zip(self.arrays, self.offsets):
            high = low + piece.size
            if high > start and low < stop:
                a, b = max(start, low), min(stop, high)
                yield piece[a - low : b - low], slice(a - start, b - start)

    def read(self, start: int, stop: int) -> np.ndarray:
        """A copy of the elements ``start:stop``."""
        out = np.empty(stop - start, np.float32)
        for part, where in self._spans(start, stop):
            out[where] = part
        return out

    def write(self, start: int, values: np.ndarray) -> None:
        """Set the elements ``start:start + len(values)`` to ``values``."""
        for part, where in self._spans(start, start + values.size):
            part[...] = values[where]

    def take(self, index: np.ndarray) -> np.ndarray:
        """The elements at ``index`` (ascending)."""
        if len(self.arrays) == 1:
            gathered: np.ndarray = self.arrays[0][index]
            return gathered
        out = np.empty(index.size, np.float32)
        for i, local, where in split_sorted(index, self.offsets):
            out[where] = self.arrays[i][local]
        return out

    def put(self, index: np.ndarray, values: np.ndarray) -> None:
        """Set the elements at ``index`` (ascending) to ``values``."""
        if len(self.arrays) == 1:
            self.arrays[0][index] = values
            return
        for i, local, where in split_sorted(index, self.offsets):
            self.arrays[i][local] = values[where]

    def blocks(self, offset: int, period: int, width: int, count: int) -> np.ndarray:
        """A copy of ``count`` blocks of ``width`` consecutive elements, the first at
        ``offset``, one every ``period`` elements, one after the other (each block within the
        vector; a block may span pieces)."""
        out = np.empty((count, width), np.float32)
        for piece, low in zip(self.arrays, self.offsets):
            high = low + piece.size
            first = max(0, -((offset - low) // period))  # the first block starting in it
            stop = min(count, (high - width - offset) // period + 1)  # past the last within
            if stop > first:
                out[first:stop] = block_view(piece, offset + first * period - low, period,
                                             width, stop - first)
        for boundary in self.offsets[1:-1]:  # blocks spanning a boundary between pieces
            i = max(0, (boundary - width - offset) // period + 1)
            start = offset + i * period
            if i < count and start < boundary:
                out[i] = self.read(start, start + width)
        return out.reshape(-1)

    def concatenate(self) -> np.ndarray:
        """A copy of the whole vector."""
        return self.read(0, self.size)
