"""Sparse in-place additions to CPU variables through numpy views of their buffers.

TensorFlow has no element-wise in-place scatter into a multi-dimensional variable: its
``scatter_nd_*`` ops switch the variable to copy-on-read and then copy the whole buffer on
every update (and every later read). A sparse sum of a few thousand entries would cost a
full pass over the weights. A CPU variable read with ``read_value_no_copy`` hands out its
own buffer (copy-on-read mode, if set, becomes copy-on-write), so numpy can add the entries
in place, in O(entries).

Writes through the views are seen by every tensor that aliases the buffer: use them only
between TensorFlow calls, on variables whose reads nobody else holds.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from sparkdl.compression.pieces import split_sorted
from sparkdl.training.exchanges.device_encoding import variable_device

__all__ = ["HostViews", "aligned_empty", "on_host_float32", "read_no_copy", "shared_tensor",
           "writable"]


def on_host_float32(variables: Sequence[Any]) -> bool:
    """Whether every variable is float32 and not on a GPU: what :class:`HostViews` needs."""
    return all(tf.as_dtype(v.dtype) == tf.float32 and "GPU" not in variable_device(v).upper()
               for v in variables)


def read_no_copy(variable: Any) -> tf.Tensor:
    """The value of a ``tf.Variable`` or Keras 3 variable, aliasing its buffer on the host."""
    if not isinstance(variable, tf.Variable):
        variable = variable.value  # Keras 3: the backing tf.Variable
    return variable.read_value_no_copy()


def writable(array: np.ndarray) -> np.ndarray:
    """A writable flat float32 view of ``array``'s memory (a read-only view of a host tensor;
    keep the tensor alive while the view is used)."""
    if array.dtype != np.float32 or not array.flags.c_contiguous:
        raise TypeError(f"need a contiguous float32 array, got {array.dtype}")
    if array.size == 0:
        return np.zeros(0, np.float32)
    address = array.__array_interface__["data"][0]
    return np.ctypeslib.as_array((ctypes.c_float * array.size).from_address(address))


#: TensorFlow's CPU kernels need buffers aligned to this many bytes (Eigen's largest).
_TF_ALIGNMENT = 64


def aligned_empty(size: int, dtype: Any = np.float32) -> np.ndarray:
    """A new 1-D array whose data starts on a 64-byte boundary (so :func:`shared_tensor`
    shares it rather than copying)."""
    dtype = np.dtype(dtype)
    raw = np.empty(size * dtype.itemsize + _TF_ALIGNMENT, np.uint8)
    start = -raw.ctypes.data % _TF_ALIGNMENT
    return raw[start : start + size * dtype.itemsize].view(dtype)


def shared_tensor(array: np.ndarray) -> tf.Tensor:
    """A CPU tensor holding ``array`` (float32), sharing its memory through DLPack where
    TensorFlow can use it as it is (writable, C-contiguous, 64-byte aligned), else a copy.
    The tensor keeps ``array`` alive; do not change ``array`` while the tensor is in use."""
    if (
        array.dtype == np.float32
        and array.flags.c_contiguous
        and array.flags.writeable
        and array.size
        and array.ctypes.data % _TF_ALIGNMENT == 0
    ):
        return tf.experimental.dlpack.from_dlpack(array.__dlpack__())
    return tf.convert_to_tensor(array, tf.float32)


class HostViews:
    """Adds sparse sums to ``variables`` (float32, on the host) in place.

    The writable view of each variable's buffer is kept and reused while the read handed to
    :meth:`scatter_add` still has its data at the same address (a new buffer, e.g. after an
    ``assign`` that reallocates, gets a new view)."""

    def __init__(self, variables: Sequence[Any]) -> None:
        self.variables = list(variables)
        self._views: list[tuple[int, np.ndarray] | None] = [None] * len(self.variables)
        self._read_all: Any = None

    def reads(self) -> list[tf.Tensor]:
        """One aliasing read per variable (eager, or inside a graph: then return them)."""
        return [read_no_copy(v) for v in self.variables]

    def read_all(self) -> list[tf.Tensor]:
        """:meth:`reads` in one TensorFlow call (eager only): each eager read costs about as
        much as the call."""
        if self._read_all is None:
            self._read_all = tf.function(self.reads)
        return list(self._read_all())

    def _view(self, i: int, read: tf.Tensor | np.ndarray) -> np.ndarray:
        """The writable view of variable ``i``'s buffer, which ``read`` aliases."""
        array = np.asarray(read)
        address = array.ctypes.data
        cached = self._views[i]
        if cached is not None and cached[0] == address and cached[1].size == array.size:
            return cached[1]
        view = writable(array)
        self._views[i] = (address, view)
        return view

    def scatter_add(
        self,
        index: np.ndarray,
        values: np.ndarray,
        offsets: Sequence[int],
        reads: Sequence[tf.Tensor] | None = None,
    ) -> None:
        """Add ``values`` at the flat ``index`` (ascending, unique; variable i holds the flat
        elements ``offsets[i]:offsets[i + 1]``) in place. ``reads``: :meth:`reads` taken
        since the last TensorFlow write to the variables (else read now)."""
        if reads is None:
            reads = self.read_all()
        # the reads keep the buffers alive while we write
        for i, local, where in split_sorted(index, offsets):
            self._view(i, reads[i])[local] += values[where]

    def views(self, reads: Sequence[tf.Tensor | np.ndarray]) -> list[np.ndarray]:
        """Writable flat views of every variable's buffer, which ``reads`` (one aliasing
        read per variable, kept alive while the views are used) share."""
        return [self._view(i, read) for i, read in enumerate(reads)]
