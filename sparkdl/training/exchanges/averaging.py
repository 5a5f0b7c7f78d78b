"""Parameter averaging: local steps, then average parameters (and optimizer state)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import tensorflow as tf

from sparkdl.comm.communicator import Communicator
from sparkdl.errors import ConfigurationError
from sparkdl.training.exchanges.exchange import StepResult, UpdateExchange, model_loss
from sparkdl.training.exchanges.variables import FlatVariables
from sparkdl.training.weights import split_target

#: The most elements one allreduce of an average carries (32 MiB of float32): a model whose
#: weights and optimizer state are larger is averaged in windows of this size, in turn.
AVERAGE_WINDOW = 1 << 23


class ParameterAveragingExchange(UpdateExchange):
    """Each worker fits ``averaging_frequency`` minibatches on its own, then all workers
    replace their parameters — and, with ``save_updater``, their optimizer state — by the
    average across workers.

    With ``report_score_after_averaging`` (DL4J's ``reportScoreAfterAveraging``), a step that
    averaged also reports the loss of the averaged model on that step's batch (inference
    mode, one extra forward pass) as ``StepResult.extra["loss_after_averaging"]``.
    State: the optimizer's variables and ``since_average`` (local steps since the last
    average).

    The local step that an average follows returns, from its own graph, reads of the averaged
    variables that alias their buffers (float32 host variables): the average reads and
    writes the buffers through them, with no TensorFlow call of its own.
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
        # the step an average follows: the same step, then aliasing reads of what is averaged
        # (outside XLA: such reads do not compile)
        self._train_step_reading = (
            tf.function(self._train_step_reading_fn, reduce_retracing=True)
            if self._averaged.on_host and self._averaged.size else None)
        self._reads: list[tf.Tensor] | None = None  # from the step an average follows
        self._average_now = False  # step_with_average: this step averages, whatever the count
        self._loss_fn = self._function(self._loss_only, reduce_retracing=True)
        self._since_average = 0
        # an average's result window, kept: its pages are touched once, not every round;
        # a larger vector is averaged in windows of this size (no second copy of the model)
        self._result = np.empty(min(self._averaged.size, AVERAGE_WINDOW), np.float32)

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

    def _train_step_reading_fn(self, x: tf.Tensor, y: tf.Tensor
                               ) -> tuple[tf.Tensor, list[tf.Tensor]]:
        """:meth:`_train_step_fn` (compiled with XLA when :attr:`jit_compile`), then reads
        of the averaged variables that alias their buffers."""
        loss = self._train_step(x, y)
        return loss, self._averaged.reads()

    def average(self) -> None:
        """Replace parameters (and optimizer state) by their mean over all workers."""
        self._since_average = 0
        reads, self._reads = self._reads, None
        if self._changes_anything():
            self.replace_by(self.mean_over_ranks, reads)

    def replace_by(self, reduce: Callable[[list[np.ndarray], np.ndarray], np.ndarray],
                   reads: list[tf.Tensor] | None = None) -> None:
        """One average given its reduce: the parameters (and, with ``save_updater``, the
        optimizer state), as one vector, are handed to ``reduce`` as the variables' own
        buffers, read in place (through ``reads``, aliasing reads taken since the last
        step's writes, when given), with a kept vector for the result, and set to what it
        returns (:meth:`FlatVariables.replace_by`)."""
        if self._averaged.size:
            self._averaged.replace_by(reduce, self._result, reads)

    def step_with_average(self, x: np.ndarray, y: Any, step: int) -> StepResult:
        """:meth:`step`, ending with an average whatever the steps since the last one and
        the number of workers (through a one-rank communicator, the round's own work on
        this worker: what the benchmarks measure it by)."""
        self._average_now = True
        try:
            return self.step(x, y, step)
        finally:
            self._average_now = False

    def _due(self) -> bool:
        """Whether this step ends with a round: ``averaging_frequency`` local steps since the
        last, or :meth:`step_with_average`."""
        return self._average_now or self._since_average >= self.averaging_frequency

    def _changes_anything(self) -> bool:
        """Whether a round here reads and writes the variables: more than one worker, or
        :meth:`step_with_average` (one worker's mean is its own)."""
        return self.comm.world_size > 1 or self._average_now

    def compute_update(self, x: np.ndarray, y: np.ndarray, step: int) -> tuple[Any, Any, bool]:
        """A local optimizer step; nothing to share but the batch (for the score). Before
        an average, the step's graph also returns the reads the average takes."""
        self._since_average += 1
        self._reads = None
        if self._train_step_reading is not None and self._due() and self._changes_anything():
            loss, self._reads = self._train_step_reading(x, y)
            return loss, (x, y), True
        return self._train_step(x, y), (x, y), True

    def communicate(self, message: Any, step: int) -> Any:
        """Every ``averaging_frequency`` local steps, average (then ``message`` is the batch
        to score); otherwise nothing."""
        if not self._due():
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
