"""The dense baseline: synchronous allreduce-mean of gradients every step (Horovod's
semantics)."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from sparkdl.comm.communicator import Communicator
from sparkdl.training.exchange import UpdateExchange


class DenseAllreduceExchange(UpdateExchange):
    """Every worker averages the full float32 gradient and applies the same optimizer step.

    The template's defaults do the rest (flat gradient out, optimizer step with what comes
    back). With ``overlap`` the allreduce of step t's gradient runs on a background thread
    while step t+1's gradient is computed; step t+1 then applies the mean gradient of step t
    (one step stale, the same on every rank). :meth:`finish`, :meth:`end_epoch` and
    :meth:`get_state` apply the gradient in flight first.
    """

    non_finite_travels = True  # a non-finite gradient makes the mean non-finite everywhere

    def __init__(self, model: tf.keras.Model, comm: Communicator, *, overlap: bool = False):
        super().__init__(model, comm, overlap=overlap)

    def communicate(self, message: np.ndarray, step: int) -> np.ndarray:
        return self.comm.allreduce(message, "mean") if self.comm.world_size > 1 else message
