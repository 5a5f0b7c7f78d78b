"""One float32 vector held as consecutive pieces in separate buffers, worked on in place.

A residual need not be one array: gradient sharing keeps it in the buffers the optimizer
adds its update to, one per model variable. :class:`Pieces` lets the encoder sweep, index
and sample such a vector as if it were the concatenation, without ever concatenating it.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np

from sparkdl.errors import ConfigurationError

__all__ = ["Pieces"]


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
            i = int(np.searchsorted(self.offsets, start, side="right")) - 1
            low = self.offsets[i]
            if stop <= self.offsets[i + 1]:
                yield start, self.arrays[i][start - low : stop - low], False
            else:
                yield start, self.read(start, stop), True

    def read(self, start: int, stop: int) -> np.ndarray:
        """A copy of the elements ``start:stop``."""
        out = np.empty(stop - start, np.float32)
        for piece, low in zip(self.arrays, self.offsets):
            high = low + piece.size
            if high > start and low < stop:
                a, b = max(start, low), min(stop, high)
                out[a - start : b - start] = piece[a - low : b - low]
        return out

    def write(self, start: int, values: np.ndarray) -> None:
        """Set the elements ``start:start + len(values)`` to ``values``."""
        stop = start + values.size
        for piece, low in zip(self.arrays, self.offsets):
            high = low + piece.size
            if high > start and low < stop:
                a, b = max(start, low), min(stop, high)
                piece[a - low : b - low] = values[a - start : b - start]

    def _split(self, index: np.ndarray) -> Iterator[tuple[np.ndarray, np.ndarray, slice]]:
        """``(piece, local index, positions in index)`` for each piece ``index`` (ascending)
        touches."""
        bounds = np.searchsorted(index, self.offsets).tolist()
        for i, piece in enumerate(self.arrays):
            start, stop = bounds[i], bounds[i + 1]
            if stop > start:
                local = index[start:stop]
                if self.offsets[i]:
                    local = local - self.offsets[i]
                yield piece, local, slice(start, stop)

    def take(self, index: np.ndarray) -> np.ndarray:
        """The elements at ``index`` (ascending)."""
        if len(self.arrays) == 1:
            gathered: np.ndarray = self.arrays[0][index]
            return gathered
        out = np.empty(index.size, np.float32)
        for piece, local, where in self._split(index):
            out[where] = piece[local]
        return out

    def put(self, index: np.ndarray, values: np.ndarray) -> None:
        """Set the elements at ``index`` (ascending) to ``values``."""
        if len(self.arrays) == 1:
            self.arrays[0][index] = values
            return
        for piece, local, where in self._split(index):
            piece[local] = values[where]

    def strided(self, offset: int, stride: int) -> np.ndarray:
        """A copy of the elements ``offset, offset + stride, ...`` (``vector[offset::stride]``)."""
        parts = []
        for piece, low in zip(self.arrays, self.offsets):
            first = offset if low <= offset else offset + -(-(low - offset) // stride) * stride
            if first < low + piece.size:
                parts.append(piece[first - low :: stride])
        return np.concatenate(parts) if parts else np.zeros(0, np.float32)

    def concatenate(self) -> np.ndarray:
        """A copy of the whole vector."""
        return self.read(0, self.size)
