"""The dense baseline: synchronous allreduce-mean of gradients every step (Horovod's
semantics)."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from sparkdl.comm.communicator import Communicator
from sparkdl.training.exchange import StepResult, Stopwatch, UpdateExchange


class DenseAllreduceExchange(UpdateExchange):
    """Every worker averages the full float32 gradient and applies the same optimizer step."""

    def __init__(self, model: tf.keras.Model, comm: Communicator):
        super().__init__(model, comm)
        self._gradients = tf.function(self._flat_gradients, reduce_retracing=True)
        self._apply = tf.function(self._apply_fn, reduce_retracing=True)

    def _apply_fn(self, flat: tf.Tensor) -> None:
        self.model.optimizer.apply(self.trainable.split(flat), self.model.trainable_variables)

    def step(self, x: np.ndarray, y: np.ndarray, step: int) -> StepResult:
        watch = Stopwatch()
        loss, grads, finite = self._gradients(x, y)
        if not bool(finite):
            return StepResult(loss=float(loss), finite_update=False)
        grads_np = grads.numpy()
        watch.lap("compute_s")
        mean = self.comm.allreduce(grads_np, "mean") if self.comm.world_size > 1 else grads_np
        watch.lap("communicate_s")
        self._apply(mean)
        watch.lap("apply_s")
        return StepResult(loss=float(loss), timings=watch.timings)
