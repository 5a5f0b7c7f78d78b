"""The dense baseline: synchronous allreduce-mean of gradients every step (Horovod's
semantics)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import tensorflow as tf

from sparkdl.comm.communicator import Communicator
from sparkdl.errors import ConfigurationError
from sparkdl.training.exchange import UpdateExchange

#: The dense allreduce's wire formats (``DenseTrainingMaster(wire_dtype=...)``).
WIRE_DTYPES = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16}


class DenseAllreduceExchange(UpdateExchange):
    """Every worker averages the full float32 gradient and applies the same optimizer step.

    The template's defaults do the rest (flat gradient out, optimizer step with what comes
    back). ``wire_dtype="bfloat16"``: the gradient travels as bfloat16 (half the bytes; the
    ring sums it in bfloat16, float32's range with 8 bits of mantissa) and is applied as the
    float32 mean of what arrives, the same bits on every rank. With ``overlap`` the allreduce
    of step t's gradient runs on a background thread while step t+1's gradient is computed;
    step t+1 then applies the mean gradient of step t (one step stale, the same on every
    rank). :meth:`finish`, :meth:`end_epoch` and
    :meth:`get_state` apply the gradient in flight first.
    """

    non_finite_travels = True  # a non-finite gradient makes the mean non-finite everywhere

    def __init__(self, model: tf.keras.Model, comm: Communicator, *, overlap: bool = False,
                 wire_dtype: str = "float32"):
        super().__init__(model, comm, overlap=overlap)
        if wire_dtype not in WIRE_DTYPES:
            raise ConfigurationError(
                f"wire_dtype must be one of {sorted(WIRE_DTYPES)}, got {wire_dtype!r}")
        self.wire_dtype = wire_dtype
        self._wire = np.dtype(WIRE_DTYPES[wire_dtype])

    def encode(self, update: np.ndarray, step: int) -> np.ndarray:
        if self._wire == np.float32 or self.comm.world_size == 1:
            return update
        return np.asarray(update).astype(self._wire)

    def communicate(self, message: np.ndarray, step: int) -> np.ndarray:
        if self.comm.world_size == 1:
            return message
        if self._wire == np.float32:
            return self.comm.allreduce(message, "mean")
        return self.comm.allreduce(message, "sum")

    def decode(self, received: np.ndarray, step: int) -> np.ndarray:
        if received.dtype == np.float32:
            return received
        total = received.astype(np.float32)
        total /= np.float32(self.comm.world_size)
        return total
