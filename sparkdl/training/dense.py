"""The dense baseline: synchronous allreduce-mean of gradients every step (Horovod's
semantics)."""

from __future__ import annotations

from typing import Any

import numpy as np
import tensorflow as tf

from sparkdl.comm.communicator import Communicator
from sparkdl.training.exchange import StepResult, Stopwatch, UpdateExchange
from sparkdl.training.overlap import InFlightExchange, overlap_timeout


class DenseAllreduceExchange(UpdateExchange):
    """Every worker averages the full float32 gradient and applies the same optimizer step.

    With ``overlap`` the allreduce of step t's gradient runs on a background thread while
    step t+1's gradient is computed; step t+1 then applies the mean gradient of step t (one
    step stale, the same on every rank). :meth:`finish`, :meth:`end_epoch` and
    :meth:`get_state` apply the gradient in flight first.
    """

    def __init__(self, model: tf.keras.Model, comm: Communicator, *, overlap: bool = False):
        super().__init__(model, comm)
        self.overlap = bool(overlap)
        self._in_flight = InFlightExchange(overlap_timeout(comm)) if self.overlap else None
        self._gradients = tf.function(self._flat_gradients, reduce_retracing=True)
        self._apply = tf.function(self._apply_fn, reduce_retracing=True)

    def _apply_fn(self, flat: tf.Tensor) -> None:
        self.model.optimizer.apply(self.trainable.split(flat), self.model.trainable_variables)

    def _mean(self, grads: np.ndarray) -> np.ndarray:
        return self.comm.allreduce(grads, "mean") if self.comm.world_size > 1 else grads

    def _drain(self) -> None:
        """Overlap: apply the mean gradient in flight (its optimizer step) now."""
        if self._in_flight is not None and self._in_flight.in_flight:
            self._apply(self._in_flight.wait())

    def step(self, x: np.ndarray, y: np.ndarray, step: int) -> StepResult:
        watch = Stopwatch()
        loss, grads, finite = self._gradients(x, y)
        if not bool(finite):
            return StepResult(loss=float(loss), finite_update=False)
        grads_np = grads.numpy()
        watch.lap("compute_s")
        if self._in_flight is None:
            mean = self._mean(grads_np)
            watch.lap("communicate_s")
            self._apply(mean)
            watch.lap("apply_s")
            return StepResult(loss=float(loss), timings=watch.timings)
        extra: dict[str, float] = {}
        if self._in_flight.in_flight:
            previous = self._in_flight.wait()
            extra["exchange_s"] = self._in_flight.busy_s
            watch.lap("communicate_s")
            self._apply(previous)
            watch.lap("apply_s")
        self._in_flight.submit(lambda: self._mean(grads_np))
        return StepResult(loss=float(loss), timings=watch.timings, extra=extra)

    def end_epoch(self, epoch: int) -> None:
        self._drain()
        super().end_epoch(epoch)

    def finish(self) -> None:
        self._drain()

    def get_state(self) -> dict[str, Any]:
        self._drain()
        return super().get_state()
