"""Parameter averaging: local steps, then average parameters (and optimizer state)."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from sparkdl.comm.communicator import Communicator
from sparkdl.training.exchange import StepResult, Stopwatch, UpdateExchange
from sparkdl.training.variables import FlatVariables


class ParameterAveragingExchange(UpdateExchange):
    """Each worker fits ``averaging_frequency`` minibatches on its own, then all workers
    replace their parameters — and, with ``save_updater``, their optimizer state — by the
    average across workers."""

    def __init__(
        self,
        model: tf.keras.Model,
        comm: Communicator,
        *,
        averaging_frequency: int,
        save_updater: bool,
        classification: bool,
    ) -> None:
        super().__init__(model, comm, classification=classification)
        self.averaging_frequency = averaging_frequency
        self.save_updater = save_updater
        self.optimizer_state = FlatVariables(model.optimizer.variables)
        self._train_step = tf.function(self._train_step_fn, reduce_retracing=True)
        self._since_average = 0

    def _train_step_fn(self, x: tf.Tensor, y: tf.Tensor):
        with tf.GradientTape() as tape:
            loss = self._loss(x, y)
        variables = self.model.trainable_variables
        self.model.optimizer.apply(tape.gradient(loss, variables), variables)
        return loss

    def average(self) -> None:
        """Replace parameters (and optimizer state) by their mean over all workers."""
        self._since_average = 0
        if self.comm.world_size == 1:
            return
        self.trainable.assign(self.comm.allreduce(self.trainable.read(), "mean"))
        if self.save_updater and self.optimizer_state.size:
            self.optimizer_state.assign(
                self.comm.allreduce(self.optimizer_state.read(), "mean")
            )

    def step(self, x: np.ndarray, y: np.ndarray, step: int) -> StepResult:
        watch = Stopwatch()
        loss = float(self._train_step(x, y))
        watch.lap("compute_s")
        self._since_average += 1
        if self._since_average >= self.averaging_frequency:
            self.average()
            watch.lap("communicate_s")
        return StepResult(loss=loss, timings=watch.timings)

    def finish(self) -> None:
        if self._since_average:
            self.average()
