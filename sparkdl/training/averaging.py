"""Parameter averaging: local steps, then average parameters (and optimizer state)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import tensorflow as tf

from sparkdl.comm.communicator import Communicator
from sparkdl.errors import ConfigurationError
from sparkdl.training.exchange import UpdateExchange, model_loss
from sparkdl.training.variables import FlatVariables
from sparkdl.training.weights import split_target


class ParameterAveragingExchange(UpdateExchange):
    """Each worker fits ``averaging_frequency`` minibatches on its own, then all workers
    replace their parameters — and, with ``save_updater``, their optimizer state — by the
    average across workers.

    With ``report_score_after_averaging`` (DL4J's ``reportScoreAfterAveraging``), a step that
    averaged also reports the loss of the averaged model on that step's batch (inference
    mode, one extra forward pass) as ``StepResult.extra["loss_after_averaging"]``.
    State: the optimizer's variables and ``since_average`` (local steps since the last
    average).
    """

    def __init__(
        self,
        model: tf.keras.Model,
        comm: Communicator,
        *,
        averaging_frequency: int,
        save_updater: bool,
        report_score_after_averaging: bool = False,
    ) -> None:
        super().__init__(model, comm)
        self.loss_scale = None  # local steps: the LossScaleOptimizer decides for itself
        self.averaging_frequency = averaging_frequency
        self.save_updater = save_updater
        self.report_score_after_averaging = report_score_after_averaging
        self.optimizer_state = FlatVariables(model.optimizer.variables)
        # what an average replaces: one vector, so one read of the buffers and one allreduce
        self._averaged = FlatVariables(
            [*self.trainable.variables, *(self.optimizer_state.variables if save_updater else [])])
        self._train_step = self._function(self._train_step_fn, reduce_retracing=True)
        self._loss_fn = self._function(self._loss_only, reduce_retracing=True)
        self._since_average = 0
        # an average's result, kept: its pages are touched once, not every round
        self._result = np.empty(self._averaged.size, np.float32)

    def _loss_only(self, x: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
        """The averaged model's loss on the batch (the compiled metrics are not updated)."""
        y, sample_weight = split_target(y)
        y_pred = self.model(x, training=False)
        return model_loss(self.model, x, y, y_pred, sample_weight, False)

    def _train_step_fn(self, x: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
        """One local step as Keras's ``train_step`` (a ``LossScaleOptimizer`` scales the loss,
        unscales the gradient and skips a non-finite step itself: local steps are local)."""
        with tf.GradientTape() as tape:
            loss = self._loss(x, y)
            scaled = self.model.optimizer.scale_loss(loss)
        variables = self.model.trainable_variables
        self.model.optimizer.apply(tape.gradient(scaled, variables), variables)
        return loss

    def average(self) -> None:
        """Replace parameters (and optimizer state) by their mean over all workers."""
        self._since_average = 0
        if self.comm.world_size > 1:
            self.replace_by(self.mean_over_ranks)

    def replace_by(self, reduce: Callable[[list[np.ndarray], np.ndarray], np.ndarray]
                   ) -> None:
        """One average given its reduce: the parameters (and, with ``save_updater``, the
        optimizer state), as one vector, are handed to ``reduce`` as the variables' own
        buffers, read in place, with a kept vector for the result, and set to what it
        returns (:meth:`FlatVariables.replace_by`)."""
        if self._averaged.size:
            self._averaged.replace_by(reduce, self._result)

    def compute_update(self, x: np.ndarray, y: np.ndarray, step: int) -> tuple[Any, Any, bool]:
        """A local optimizer step; nothing to share but the batch (for the score)."""
        self._since_average += 1
        return self._train_step(x, y), (x, y), True

    def communicate(self, message: Any, step: int) -> Any:
        """Every ``averaging_frequency`` local steps, average (then ``message`` is the batch
        to score); otherwise nothing."""
        if self._since_average < self.averaging_frequency:
            return None
        self.average()
        return message

    def apply(self, decoded: Any, step: int) -> dict[str, float]:
        if decoded is None or not self.report_score_after_averaging:
            return {}
        return {"loss_after_averaging": float(self._loss_fn(*decoded))}

    def finish(self) -> None:
        if self._since_average:
            self.average()

    def get_state(self) -> dict[str, Any]:
        return {**super().get_state(), "since_average": self._since_average}

    def set_state(self, state: dict[str, Any]) -> None:
        state = dict(state)
        since = state.pop("since_average", None)
        if isinstance(since, np.ndarray) and since.ndim == 0:
            since = since.item()
        if isinstance(since, bool) or not isinstance(since, (int, np.integer)) or since < 0:
            raise ConfigurationError(
                f"averaging state needs 'since_average', an integer >= 0, got {since!r}"
            )
        super().set_state(state)
        self._since_average = int(since)
