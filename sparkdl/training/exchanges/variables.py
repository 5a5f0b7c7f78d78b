"""A list of TensorFlow variables seen as one flat float32 vector."""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Callable, Iterable, Iterator, Sequence

import numpy as np
import tensorflow as tf

from sparkdl.training.exchanges.host_views import HostViews, on_host_float32, read_no_copy


class FlatVariables:
    """Reads and writes a fixed list of float variables as one contiguous float32 vector.

    The order is the order of ``variables``; it is the same on every worker because every
    worker builds the same model.
    """

    def __init__(self, variables: Iterable[tf.Variable]) -> None:
        self.variables: list[tf.Variable] = [
            v for v in variables if tf.as_dtype(v.dtype).is_floating
        ]
        self.shapes = [tuple(int(d) for d in v.shape) for v in self.variables]
        self.sizes = [int(np.prod(shape, dtype=np.int64)) for shape in self.shapes]
        self.offsets = np.concatenate([[0], np.cumsum(self.sizes, dtype=np.int64)]).tolist()
        self.size = int(self.offsets[-1])
        self._views = HostViews(self.variables) if on_host_float32(self.variables) else None

    def read(self) -> np.ndarray:
        """A new float32 vector holding every variable's current value."""
        out = np.empty(self.size, dtype=np.float32)
        for variable, start, stop in zip(self.variables, self.offsets, self.offsets[1:]):
            # one copy: the read aliases a host variable's buffer (``numpy()`` copies first)
            out[start:stop] = np.asarray(read_no_copy(variable), dtype=np.float32).ravel()
        return out

    def assign(self, flat: np.ndarray) -> None:
        """Set every variable from ``flat`` (length :attr:`size`)."""
        if flat.shape != (self.size,):
            raise ValueError(f"expected a vector of {self.size} elements, got {flat.shape}")
        for variable, shape, start, stop in zip(
            self.variables, self.shapes, self.offsets, self.offsets[1:]
        ):
            variable.assign(flat[start:stop].reshape(shape).astype(tf.as_dtype(variable.dtype).as_numpy_dtype))

    @property
    def on_host(self) -> bool:
        """Whether every variable is float32 on the host (:meth:`host_pieces` has views)."""
        return self._views is not None

    def reads(self) -> list[tf.Tensor]:
        """One read per variable aliasing its buffer (eager, or in a graph that returns
        them: then :meth:`host_pieces` and :meth:`replace_by` take them as they are). Only
        when :attr:`on_host`."""
        if self._views is None:
            raise ValueError("aliasing reads need every variable float32 on the host")
        return self._views.reads()

    @contextlib.contextmanager
    def host_pieces(self, reads: Sequence[tf.Tensor] | None = None
                    ) -> Iterator[list[np.ndarray] | None]:
        """Writable flat views of each variable's own buffer, in order, valid inside the
        block (the reads that hold the buffers live until it ends); ``None`` unless every
        variable is float32 on the host. Only between TensorFlow calls. ``reads``:
        :meth:`reads` taken since the variables' last write (say, returned by the step's
        graph), else read now (one TensorFlow call)."""
        if self._views is None:
            yield None
            return
        if reads is None:
            reads = self._views.read_all()  # alive while the views are used
        yield self._views.views(reads)
        del reads

    def replace_by(self, reduce: Callable[[list[np.ndarray], np.ndarray], np.ndarray],
                   out: np.ndarray, reads: Sequence[tf.Tensor] | None = None) -> None:
        """Set the vector to ``reduce(pieces, out)`` (e.g. an allreduce of the pieces'
        concatenation into ``out``): the pieces are :meth:`host_pieces` (of ``reads`` when
        given), read in place and written back in place, else one flat :meth:`read`.
        ``out``: a float32 vector that ``reduce`` may write its result into, of :attr:`size`
        elements or fewer: then the vector is reduced in windows of ``out.size`` elements
        in turn (one ``reduce`` each; ``reduce`` must be elementwise, as a sum or a mean
        over ranks is), so that no buffer of the whole vector's size is needed."""
        with self.host_pieces(reads) as pieces:
            if pieces is None:
                full = out if out.size == self.size else np.empty(self.size, np.float32)
                self.assign(reduce([self.read()], full))
                return
            for window in _windows(pieces, out.size):
                size = sum(piece.size for piece in window)
                result = reduce(window, out[:size])
                if result.shape != (size,):
                    raise ValueError(f"expected a vector of {size} elements, got "
                                     f"{result.shape}")
                start = 0
                for piece in window:
                    piece[:] = result[start:start + piece.size]
                    start += piece.size

    def split(self, flat: tf.Tensor) -> list[tf.Tensor]:
        """Split a flat tensor into tensors shaped like the variables (usable in tf.function)."""
        return [
            tf.reshape(flat[start:stop], shape)
            for shape, start, stop in zip(self.shapes, self.offsets, self.offsets[1:])
        ]


def _windows(pieces: Sequence[np.ndarray], limit: int) -> Iterator[list[np.ndarray]]:
    """``pieces`` (flat arrays) in consecutive groups of at most ``limit`` elements in all, a
    piece larger than what is left of a group split into views across groups."""
    limit = max(1, int(limit))
    window: list[np.ndarray] = []
    filled = 0
    for piece in pieces:
        start = 0
        while start < piece.size:
            take = min(limit - filled, piece.size - start)
            window.append(piece[start:start + take])
            filled += take
            start += take
            if filled == limit:
                yield window
                window, filled = [], 0
    if window:
        yield window


def weights_checksum(variables: Sequence[tf.Variable]) -> str:
    """SHA-256 over the exact bytes of every variable, in order."""
    digest = hashlib.sha256()
    for variable in variables:
        digest.update(np.ascontiguousarray(variable.numpy()).tobytes())
    return digest.hexdigest()
