"""Threshold encoding on the device that holds the model (GPU workers).

:class:`DeviceThresholdCompressor` is a drop-in for
:class:`~sparkdl.compression.ThresholdCompressor` whose residual is a float32 ``tf.Variable``
on the model's device. One ``tf.function`` adds the update to the residual, selects the
candidates ``|r| >= tau``, applies the encoder's exactness rule, subtracts, optionally clips,
and builds the message on the device; only the message (int32 sparse entries or the packed
2-bit bitmap, plus ``nnz``) is copied to the host. Everything else host-side is reused from
:mod:`sparkdl.compression`: threshold algorithms and schedules, :func:`pack_frame`, and
:meth:`~sparkdl.compression.ThresholdCompressor.decompress_sum` (decoding stays on the host,
where frames are validated).

Equivalence with :func:`~sparkdl.compression.threshold_encode`: same candidate set, same
exactness rule (``fl(fl(r - t) + t) == r`` with ``t = copysign(tau, r)``), same choice of
encoding (BITMAP iff the number of *candidates* exceeds ``ceil(n / 4) // 4``), same clipping
(after encoding, to ``±fl32(factor * tau)`` with the un-shaken tau, skipped when that bound is
not finite) and the same threshold bookkeeping, so frames and residuals are bit-identical —
with one documented exception: TensorFlow runs float32 kernels with denormals flushed to zero
(CPU and GPU), numpy does not. Values that are or would become subnormal (magnitude below
``2**-126``; never the case for realistic updates and ``tau >= 2**-100``) may therefore be
treated as zero by this encoder. Replicas stay bit-identical regardless, because every worker
decodes the same frames with the same host decoder.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np
import tensorflow as tf

from sparkdl.compression.compressor import EncodingStats, ThresholdCompressor
from sparkdl.compression.encoding import EncodedUpdate, Encoding, _float32_tau, bitmap_nbytes
from sparkdl.compression.threshold import (
    ResidualClipping,
    ShakeUp,
    TargetSparsityThreshold,
    ThresholdAlgorithm,
)
from sparkdl.errors import ConfigurationError

__all__ = ["DeviceThresholdCompressor", "variable_device", "variables_on_gpu"]

_BITMAP_WEIGHTS = (1, 4, 16, 64)  # code of element i lands in bits 2*(i % 4) of its byte


def variable_device(variable: Any) -> str:
    """The TensorFlow device string of a ``tf.Variable`` or Keras 3 variable ("" if unknown)."""
    device = getattr(variable, "device", None)
    if not device:
        device = getattr(getattr(variable, "value", None), "device", None)
    return str(device or "")


def variables_on_gpu(variables: Sequence[Any]) -> bool:
    """Whether the first variable lives on a GPU (the ``encoder="auto"`` rule)."""
    return bool(variables) and "GPU" in variable_device(variables[0]).upper()


class DeviceThresholdCompressor(ThresholdCompressor):
    """:class:`ThresholdCompressor` with the residual and the encode sweep on a TF device.

    ``device`` is a TensorFlow device string (e.g. the device of the model's first variable);
    ``None`` uses TensorFlow's default placement. :meth:`compress` takes the update as a
    ``tf.Tensor`` (numpy is accepted and converted) and never copies it to the host.
    ``residual`` reads (copies) the device residual as numpy and can be assigned; use it for
    tests and checkpoints, not per step.
    """

    #: :class:`~sparkdl.training.sharing.GradientSharingExchange` passes the update tensor as is.
    device_resident: ClassVar[bool] = True

    def __init__(
        self,
        num_elements: int,
        threshold: ThresholdAlgorithm,
        *,
        shake_up: ShakeUp | None = None,
        clipping: ResidualClipping | None = None,
        job_id: int = 0,
        rank: int = 0,
        device: str | None = None,
    ) -> None:
        self._device = device or None
        self._variable: tf.Variable | None = None
        # The base class validates the arguments and assigns ``residual`` (zeros), which
        # creates the device variable through the property setter below.
        super().__init__(
            num_elements, threshold, shake_up=shake_up, clipping=clipping, job_id=job_id, rank=rank
        )
        self._max_sparse = bitmap_nbytes(self.num_elements) // 4
        self._functions: dict[tuple[bool, bool], Any] = {}
        self._quantile_fn = tf.function(self._sample_quantile, reduce_retracing=True)
        self._add_fn = tf.function(self._add_update)

    # Residual ---------------------------------------------------------------------------

    @property
    def variable(self) -> tf.Variable:
        """The device residual itself."""
        assert self._variable is not None
        return self._variable

    @property
    def residual(self) -> np.ndarray:  # type: ignore[override]
        """A host copy of the residual (float32)."""
        return self.get_residual()

    @residual.setter
    def residual(self, value: np.ndarray) -> None:
        self.set_residual(value)

    def get_residual(self) -> np.ndarray:
        """Copy the residual to the host."""
        return np.array(self.variable.numpy(), dtype=np.float32, copy=True)

    def set_residual(self, value: np.ndarray) -> None:
        """Replace the residual (e.g. from a checkpoint) with a float32 vector of the right
        length."""
        array = np.asarray(value)
        if array.dtype != np.float32 or array.shape != (self.num_elements,):
            raise ConfigurationError(
                f"residual must be a float32 array of shape ({self.num_elements},), "
                f"got {array.dtype} array of shape {array.shape}"
            )
        if self._variable is None:
            with self._placement():
                self._variable = tf.Variable(array, trainable=False, name="residual")
        else:
            self._variable.assign(array)

    def _placement(self) -> Any:
        return tf.device(self._device) if self._device else contextlib.nullcontext()

    # Device graphs ----------------------------------------------------------------------

    def _add_update(self, update: tf.Tensor) -> None:
        self.variable.assign_add(update)

    def _sample_quantile(self, offset: tf.Tensor, stride: tf.Tensor, passing: tf.Tensor):
        """The ``passing``-th largest of ``|residual[offset::stride]|`` (== the numpy
        ``np.partition`` order statistic)."""
        sample = tf.abs(self.variable[offset::stride])
        return tf.reduce_min(tf.math.top_k(sample, k=passing, sorted=False).values)

    def _encode_graph(
        self, update: tf.Tensor, t: tf.Tensor, bound: tf.Tensor, *, add: bool, clip: bool
    ):
        """Residual (+= update), encode at ``t``, (clip to ``±bound``); return
        ``(sparse_entries int32, bitmap uint8, nnz)`` with one of the two messages empty."""
        r = self.variable
        if add:
            r.assign_add(update)
        x = r.read_value()
        candidate = tf.abs(x) >= t  # False for NaN, like numpy
        # Counts and element-sized intermediates are int64/float32: TensorFlow keeps int32
        # tensors of many GPU kernels (Sum, Mul, ...) in host memory, which would move
        # n-element tensors off the GPU.
        count = tf.math.count_nonzero(candidate, dtype=tf.int64)
        n = self.num_elements

        def sparse():
            index = tf.where(candidate)[:, 0]  # int64, ascending
            values = tf.gather(x, index)
            negative = values < 0  # candidates are non-zero and not NaN: == sign bit
            signed = tf.where(negative, -t, t)
            updated = values - signed
            exact = tf.equal(updated + signed, values)
            index = tf.boolean_mask(index, exact)
            negative = tf.boolean_mask(negative, exact)
            r.scatter_nd_update(index[:, None], tf.boolean_mask(updated, exact))
            entries = index + 1
            entries = tf.cast(tf.where(negative, -entries, entries), tf.int32)
            return entries, tf.zeros([0], tf.uint8), tf.size(entries, out_type=tf.int64)

        def bitmap():
            negative = x < 0
            signed = tf.where(negative, -t, t)
            updated = x - signed
            encoded = candidate & tf.equal(updated + signed, x)
            r.assign(tf.where(encoded, updated, x))
            # codes 0/1/2 as small exact floats; byte = c0 + 4 c1 + 16 c2 + 64 c3 <= 170
            codes = tf.where(encoded, tf.where(negative, 2.0, 1.0), 0.0)
            codes = tf.pad(codes, [[0, 4 * bitmap_nbytes(n) - n]])
            packed = tf.reduce_sum(
                tf.reshape(codes, [-1, 4]) * tf.constant(_BITMAP_WEIGHTS, tf.float32), axis=1
            )
            nnz = tf.math.count_nonzero(encoded, dtype=tf.int64)
            return tf.zeros([0], tf.int32), tf.cast(packed, tf.uint8), nnz

        entries, packed, nnz = tf.cond(count > self._max_sparse, bitmap, sparse)
        if clip:
            with tf.control_dependencies([entries, packed, nnz]):
                y = r.read_value()
            r.assign(tf.where(y > bound, bound, tf.where(y < -bound, -bound, y)))
        return entries, packed, nnz

    def _encode_fn(self, add: bool, clip: bool) -> Any:
        key = (add, clip)
        if key not in self._functions:

            def graph(update: tf.Tensor, t: tf.Tensor, bound: tf.Tensor):
                return self._encode_graph(update, t, bound, add=add, clip=clip)

            self._functions[key] = tf.function(graph, reduce_retracing=True)
        return self._functions[key]

    # Host driver ------------------------------------------------------------------------

    def _select_tau(self, step: int) -> float:
        """``threshold.select(residual, step)`` without copying the residual to the host
        (except for unknown algorithms that read it, which get a host copy)."""
        th = self.threshold
        if not th.uses_residual and type(th).select is ThresholdAlgorithm.select:
            return th.threshold(step)
        if type(th) is TargetSparsityThreshold:
            return self._target_sparsity_select(th, step)
        return th.select(self.get_residual(), step)  # fallback: host copy

    def _target_sparsity_select(self, th: TargetSparsityThreshold, step: int) -> float:
        """:meth:`TargetSparsityThreshold.select` with the sample quantile on the device."""
        n = self.num_elements
        if n == 0:
            return th.tau
        offset, stride, passing = th.sample_plan(n, step)
        with self._placement():
            value = float(
                self._quantile_fn(
                    tf.constant(offset, tf.int64),
                    tf.constant(stride, tf.int64),
                    tf.constant(passing, tf.int32),
                )
            )
        return th.accept_quantile(value)

    def compress(  # type: ignore[override]
        self, update: tf.Tensor | np.ndarray, step: int
    ) -> tuple[bytes, EncodingStats]:
        """Add ``update`` (on the device) to the residual, encode it there, and return
        ``(frame, stats)``; only the encoded message crosses to the host."""
        if isinstance(update, np.ndarray):
            self._check("update", update)
        update = tf.convert_to_tensor(update)
        if update.dtype != tf.float32 or tuple(update.shape) != (self.num_elements,):
            raise ConfigurationError(
                f"update must be a float32 tensor of shape ({self.num_elements},), "
                f"got {update.dtype.name} tensor of shape {tuple(update.shape)}"
            )
        started = time.perf_counter()
        shake = self.shake_up is not None and self.shake_up.due(step)
        add = not self.threshold.uses_residual
        if not add:
            with self._placement():
                self._add_fn(update)
        tau = self._select_tau(step)
        encode_tau = tau * self.shake_up.factor if shake and self.shake_up else tau
        t = _float32_tau(encode_tau, ConfigurationError)
        clip = False
        bound = np.float32(np.inf)
        if self.clipping is not None and self.clipping.due(step):
            bound = np.float32(self.clipping.factor) * np.float32(tau)
            clip = bool(np.isfinite(bound))
        with self._placement():
            entries, packed, nnz_t = self._encode_fn(add, clip)(
                update, tf.constant(t), tf.constant(bound)
            )
        # The only device -> host copies: the message and its count.
        nnz = int(nnz_t)
        if packed.shape[0]:
            encoded = EncodedUpdate(
                Encoding.BITMAP, self.num_elements, float(t), nnz, packed.numpy().tobytes()
            )
        else:
            payload = entries.numpy().astype("<i4", copy=False).tobytes() if nnz else b""
            encoded = EncodedUpdate(Encoding.SPARSE, self.num_elements, float(t), nnz, payload)
        return self._finish_frame(encoded, step, shake, started)
