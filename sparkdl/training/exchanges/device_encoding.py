"""Threshold encoding on the device that holds the model (GPU workers).

:class:`DeviceThresholdCompressor` is a drop-in for
:class:`~sparkdl.compression.ThresholdCompressor` whose memory (:class:`DeviceMemory`) is a
float32 ``tf.Variable`` on the model's device. One ``tf.function`` adds the update to the
residual, selects the candidates ``|r| >= tau``, applies the encoder's exactness rule,
subtracts, and builds the message on the device (the memory then clips, also there); only
the message (int32 sparse entries or the packed 2-bit bitmap, plus ``nnz``) is copied to the
host. Everything else host-side is reused from
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
import copy
import time
from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np
import tensorflow as tf

from sparkdl.compression.compressor import (
    Compressor,
    CompressorConfig,
    EncodingStats,
    ThresholdCompressor,
    ThresholdCompressorConfig,
)
from sparkdl.compression.encoding import EncodedUpdate, Encoding, _float32_tau, bitmap_nbytes
from sparkdl.compression.memory import Memory
from sparkdl.compression.threshold import (
    ResidualClipping,
    ResidualPostProcessor,
    ShakeUp,
    TargetSparsityThreshold,
    ThresholdAlgorithm,
)
from sparkdl.errors import ConfigurationError

__all__ = [
    "DeviceMemory",
    "DeviceThresholdCompressor",
    "build_compressor",
    "variable_device",
    "variables_on_gpu",
]

_BITMAP_WEIGHTS = (1, 4, 16, 64)  # code of element i lands in bits 2*(i % 4) of its byte
#: What the encode graph returns: (sparse entries int32, bitmap uint8, nnz), one part empty.
_Message = tuple[tf.Tensor, tf.Tensor, tf.Tensor]


def variable_device(variable: Any) -> str:
    """The TensorFlow device string of a ``tf.Variable`` or Keras 3 variable ("" if unknown)."""
    device = getattr(variable, "device", None)
    if not device:
        device = getattr(getattr(variable, "value", None), "device", None)
    return str(device or "")


def variables_on_gpu(variables: Sequence[Any]) -> bool:
    """Whether the first variable lives on a GPU (the ``encoder="auto"`` rule)."""
    return bool(variables) and "GPU" in variable_device(variables[0]).upper()


class DeviceMemory(Memory):
    """The residual as a float32 ``tf.Variable`` on ``device`` (None: TensorFlow's default
    placement). :class:`~sparkdl.compression.threshold.ResidualClipping` runs on the device;
    any other post-processor gets a host copy of the residual (and writes it back)."""

    on_device: ClassVar[bool] = True

    def __init__(
        self,
        num_elements: int,
        post_processor: ResidualPostProcessor | None = None,
        *,
        device: str | None = None,
    ) -> None:
        super().__init__(num_elements, post_processor)
        self.device = device or None
        with self.placement():
            self.variable = tf.Variable(
                tf.zeros([self.num_elements], tf.float32), trainable=False, name="residual"
            )
        self._add_fn = tf.function(self._add)
        self._clip_fn = tf.function(self._clip)

    def placement(self) -> Any:
        """A context that places ops on this memory's device."""
        return tf.device(self.device) if self.device else contextlib.nullcontext()

    def get_residual(self) -> np.ndarray:
        return np.array(self.variable.numpy(), dtype=np.float32, copy=True)

    def set_residual(self, value: np.ndarray) -> None:
        self.variable.assign(self._checked(value))

    def add(self, update: tf.Tensor) -> None:
        """residual += update, on the device."""
        with self.placement():
            self._add_fn(update)

    def post_process(self, tau: float, step: int) -> None:
        processor = self.post_processor
        if processor is None:
            return
        if isinstance(processor, ResidualClipping):
            bound = processor.bound(tau) if processor.due(step) else None
            if bound is not None:
                with self.placement():
                    self._clip_fn(tf.constant(bound))
            return
        residual = self.get_residual()  # unknown processors: on a host copy
        processor.apply(residual, tau, step)
        self.set_residual(residual)

    def _add(self, update: tf.Tensor) -> None:
        self.variable.assign_add(update)

    def _clip(self, bound: tf.Tensor) -> None:
        y = self.variable.read_value()
        self.variable.assign(tf.where(y > bound, bound, tf.where(y < -bound, -bound, y)))


class DeviceThresholdCompressor(ThresholdCompressor):
    """:class:`ThresholdCompressor` with its memory (a :class:`DeviceMemory`) and the encode
    sweep on a TF device.

    ``device`` is a TensorFlow device string (e.g. the device of the model's first variable);
    ``None`` uses TensorFlow's default placement. :meth:`compress` takes the update as a
    ``tf.Tensor`` (numpy is accepted and converted) and never copies it to the host.
    ``residual`` reads (copies) the device residual as numpy and can be assigned; use it for
    tests and checkpoints, not per step.
    """

    memory_type: ClassVar[type[Memory]] = DeviceMemory

    def __init__(
        self,
        num_elements: int,
        threshold: ThresholdAlgorithm,
        *,
        shake_up: ShakeUp | None = None,
        post_processor: ResidualPostProcessor | None = None,
        job_id: int = 0,
        rank: int = 0,
        device: str | None = None,
    ) -> None:
        super().__init__(
            num_elements,
            threshold,
            shake_up=shake_up,
            job_id=job_id,
            rank=rank,
            memory=DeviceMemory(num_elements, post_processor, device=device),
        )
        self._max_sparse = bitmap_nbytes(self.num_elements) // 4
        self._functions: dict[bool, Any] = {}
        self._quantile_fn = tf.function(self._sample_quantile, reduce_retracing=True)

    @property
    def device_memory(self) -> DeviceMemory:
        """The memory, a :class:`DeviceMemory` (as built in ``__init__``)."""
        memory = self.memory
        assert isinstance(memory, DeviceMemory)
        return memory

    @property
    def variable(self) -> tf.Variable:
        """The device residual itself."""
        return self.device_memory.variable

    # Device graphs ----------------------------------------------------------------------

    def _sample_quantile(
        self, offset: tf.Tensor, period: tf.Tensor, width: tf.Tensor, blocks: tf.Tensor,
        passing: tf.Tensor,
    ) -> tf.Tensor:
        """The ``passing``-th largest of ``|block_sample(residual, plan)|`` (== the numpy
        ``np.partition`` order statistic)."""
        starts = offset + tf.range(blocks, dtype=tf.int64) * period
        index = tf.reshape(starts[:, None] + tf.range(width, dtype=tf.int64)[None, :], [-1])
        sample = tf.abs(tf.gather(self.variable, index))
        return tf.reduce_min(tf.math.top_k(sample, k=passing, sorted=False).values)

    def _encode_graph(self, update: tf.Tensor, t: tf.Tensor, *, add: bool) -> _Message:
        """Residual (+= update), encode at ``t``; return ``(sparse_entries int32, bitmap
        uint8, nnz)`` with one of the two messages empty."""
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

        def sparse() -> _Message:
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

        def bitmap() -> _Message:
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
        return entries, packed, nnz

    def _encode_fn(self, add: bool) -> Any:
        if add not in self._functions:

            def graph(update: tf.Tensor, t: tf.Tensor) -> _Message:
                return self._encode_graph(update, t, add=add)

            self._functions[add] = tf.function(graph, reduce_retracing=True)
        return self._functions[add]

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
        plan = th.sample_plan(n, step)
        with self.device_memory.placement():
            value = float(
                self._quantile_fn(
                    *(tf.constant(v, tf.int64)
                      for v in (plan.offset, plan.period, plan.width, plan.blocks)),
                    tf.constant(plan.passing, tf.int32),
                )
            )
        return th.accept_quantile(value)

    def compress(
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
        memory = self.device_memory
        add = not self.threshold.uses_residual
        if not add:
            memory.add(update)
        tau = self._select_tau(step)
        shake, encode_tau = self.shaken_tau(tau, step)
        t = _float32_tau(encode_tau, ConfigurationError)
        with memory.placement():
            entries, packed, nnz_t = self._encode_fn(add)(update, tf.constant(t))
        memory.post_process(tau, step)  # clipping: on the device, after the encode
        # The only device -> host copies: the message and its count.
        nnz = int(nnz_t)
        if packed.shape[0]:
            encoded = EncodedUpdate(
                Encoding.BITMAP, self.num_elements, float(t), nnz, packed.numpy().tobytes()
            )
        else:
            payload = entries.numpy().astype("<i4", copy=False).tobytes() if nnz else b""
            encoded = EncodedUpdate(Encoding.SPARSE, self.num_elements, float(t), nnz, payload)
        return self.finish_frame(encoded, step, shake, started)


def build_compressor(
    config: CompressorConfig,
    num_elements: int,
    *,
    job_id: int,
    rank: int,
    device: str | None,
) -> Compressor:
    """``config``'s compressor for one worker: with ``device`` (not None; "" means TF's
    default placement) the device encoder of a :class:`ThresholdCompressorConfig`, else the
    host compressor ``config.build`` makes. Other configs have no device encoder: asked for
    one, they raise :class:`ConfigurationError`."""
    if device is None:
        return config.build(num_elements, job_id=job_id, rank=rank)
    if not isinstance(config, ThresholdCompressorConfig):
        raise ConfigurationError(
            f"encoder='device' needs a ThresholdCompressorConfig; {type(config).__name__} "
            "has no device encoder (use encoder='host')"
        )
    return DeviceThresholdCompressor(
        num_elements,
        copy.deepcopy(config.threshold),
        shake_up=config.shake_up,
        post_processor=config.residual_post_processor,
        job_id=job_id,
        rank=rank,
        device=device or None,
    )
