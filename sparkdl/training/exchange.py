"""The per-step update exchange: the part of the worker loop each training master defines."""

from __future__ import annotations

import abc
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import tensorflow as tf

from sparkdl.comm.communicator import Communicator
from sparkdl.errors import ConfigurationError
from sparkdl.training import timeline
from sparkdl.training.metrics import CompiledMetrics
from sparkdl.training.variables import FlatVariables


@dataclass
class StepResult:
    """What one synchronous step produced on this worker.

    ``extra`` holds figures of some exchanges, by name: sharing's ``tau``, ``sparsity``,
    ``bitmap``, ``frame_bytes``, ``received_bytes``; averaging's ``loss_after_averaging``
    (on steps that averaged, with ``report_score_after_averaging``).
    """

    loss: float
    finite_update: bool = True
    timings: dict[str, float] = field(default_factory=dict)
    extra: dict[str, float] = field(default_factory=dict)


class UpdateExchange(abc.ABC):
    """One training step on a local batch plus the exchange with the other workers.

    Subclasses hold the compiled TensorFlow functions for their algorithm. Every worker calls
    :meth:`step` the same number of times (collectives are synchronous).

    :meth:`get_state` / :meth:`set_state`: this rank's state beyond the model's weights, a
    flat dict of numpy arrays and Python numbers (here the optimizer's variables, one entry
    ``optimizer.<i>`` per variable in ``model.optimizer.variables`` order; subclasses add
    theirs). Restoring it after the weights continues training exactly.
    """

    def __init__(self, model: tf.keras.Model, comm: Communicator) -> None:
        self.model = model
        self.comm = comm
        self.trainable = FlatVariables(model.trainable_variables)
        self.non_trainable = FlatVariables(model.non_trainable_variables)
        self.metrics = CompiledMetrics(model)
        self._evaluate_fn: Any = None
        model.optimizer.build(model.trainable_variables)

    @abc.abstractmethod
    def step(self, x: np.ndarray, y: np.ndarray, step: int) -> StepResult:
        """Run one step on batch ``(x, y)``; ``step`` counts from 0 over the whole fit."""

    def end_epoch(self, epoch: int) -> None:
        """Average non-trainable state (e.g. BatchNorm statistics) so replicas agree."""
        if self.non_trainable.size and self.comm.world_size > 1:
            self.non_trainable.assign(self.comm.allreduce(self.non_trainable.read(), "mean"))

    def finish(self) -> None:
        """Leave every replica with the same weights now: called after the last step and
        before every checkpoint (so it must be safe to call mid-training)."""

    def evaluate_batch(self, x: np.ndarray, y: np.ndarray) -> float:
        """The loss of the current weights on a batch (inference mode); adds the batch to the
        compiled metrics."""
        if self._evaluate_fn is None:
            self._evaluate_fn = tf.function(
                lambda x, y: self._loss(x, y, training=False), reduce_retracing=True
            )
        return float(self._evaluate_fn(x, y))

    def get_state(self) -> dict[str, Any]:
        """This rank's exchange state (see the class docstring)."""
        return {
            f"optimizer.{i}": np.array(v.numpy(), copy=True)
            for i, v in enumerate(self.model.optimizer.variables)
        }

    def set_state(self, state: dict[str, Any]) -> None:
        """Restore :meth:`get_state` output of this rank (the same model and optimizer)."""
        variables = self.model.optimizer.variables
        expected = {f"optimizer.{i}" for i in range(len(variables))}
        if not isinstance(state, dict) or set(state) != expected:
            got = sorted(state) if isinstance(state, dict) else type(state).__name__
            raise ConfigurationError(
                f"{type(self).__name__} state needs the keys {sorted(expected)}, got {got}"
            )
        for i, variable in enumerate(variables):
            value = np.asarray(state[f"optimizer.{i}"])
            if value.shape != tuple(variable.shape):
                name = getattr(variable, "path", variable.name)
                raise ConfigurationError(
                    f"optimizer variable {i} ({name}) has shape {tuple(variable.shape)}, "
                    f"the state {value.shape}"
                )
            variable.assign(value.astype(tf.as_dtype(variable.dtype).as_numpy_dtype))

    # Shared building blocks -------------------------------------------------------------

    def _loss(self, x: tf.Tensor, y: tf.Tensor, training: bool = True) -> tf.Tensor:
        """The batch loss; also adds the batch to the model's compiled metrics."""
        y_pred = self.model(x, training=training)
        loss = self.model.compute_loss(x=x, y=y, y_pred=y_pred, training=training)
        self.metrics.update(x, y, y_pred)
        return loss

    def _flat_gradients(self, x: tf.Tensor, y: tf.Tensor):
        with tf.GradientTape() as tape:
            loss = self._loss(x, y)
        grads = tape.gradient(loss, self.model.trainable_variables)
        grads = [tf.zeros_like(v) if g is None else tf.convert_to_tensor(g)
                 for g, v in zip(grads, self.model.trainable_variables)]
        flat = tf.concat([tf.reshape(g, [-1]) for g in grads], axis=0)
        return loss, flat, tf.reduce_all(tf.math.is_finite(flat))


class Stopwatch:
    """Accumulates named phase durations of one step; each lap is also a span of the active
    timeline (``compute_s`` → ``compute``, see :mod:`sparkdl.training.timeline`)."""

    def __init__(self) -> None:
        self.timings: dict[str, float] = {}
        self._last = time.perf_counter()

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.timings[name] = self.timings.get(name, 0.0) + now - self._last
        timeline.record(name.removesuffix("_s"), self._last, now)
        self._last = now
