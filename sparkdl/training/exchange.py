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
from sparkdl.training.overlap import InFlightExchange, overlap_timeout
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

    The template (:meth:`step`, written once here for every exchange)::

        compute_update -> [finite?] -> encode -> communicate -> decode -> apply

    timed as ``compute_s``, ``encode_s``, ``communicate_s``, ``decode_s`` and ``apply_s``. A
    non-finite update ends the step before anything leaves the worker. With ``overlap`` only
    :meth:`communicate` (the collective) runs on a background thread
    (:class:`~sparkdl.training.overlap.InFlightExchange`): step t computes its update while
    step t-1's message travels, then decodes and applies step t-1's result and sends its own
    message. Encoding and decoding stay on the main thread, so the background thread holds no
    core the gradient needs (one worker per core is the common case). :meth:`drain` applies
    the exchange in flight; :meth:`finish`, :meth:`end_epoch` and :meth:`get_state` call it.

    A new exchange is one method: :meth:`communicate` (the defaults of the other hooks share
    the flat float32 gradient and apply the optimizer to what comes back). Every worker calls
    :meth:`step` the same number of times (collectives are synchronous).

    :meth:`get_state` / :meth:`set_state`: this rank's state beyond the model's weights, a
    flat dict of numpy arrays and Python numbers (here the optimizer's variables, one entry
    ``optimizer.<i>`` per variable in ``model.optimizer.variables`` order; subclasses add
    theirs). Restoring it after the weights continues training exactly.
    """

    def __init__(
        self, model: tf.keras.Model, comm: Communicator, *, overlap: bool = False
    ) -> None:
        self.model = model
        self.comm = comm
        self.trainable = FlatVariables(model.trainable_variables)
        self.non_trainable = FlatVariables(model.non_trainable_variables)
        self.metrics = CompiledMetrics(model)
        self.overlap = bool(overlap)
        self._in_flight = InFlightExchange(overlap_timeout(comm)) if self.overlap else None
        self._evaluate_fn: Any = None
        self._gradients_fn: Any = None
        self._apply_gradients_fn: Any = None
        model.optimizer.build(model.trainable_variables)

    # The template -----------------------------------------------------------------------

    def step(self, x: np.ndarray, y: np.ndarray, step: int) -> StepResult:
        """Run one step on batch ``(x, y)``; ``step`` counts from 0 over the whole fit."""
        watch = Stopwatch()
        loss, update, finite = self.compute_update(x, y, step)
        if not bool(finite):
            return StepResult(loss=float(loss), finite_update=False)
        watch.lap("compute_s")
        message = self.encode(update, step)
        watch.lap("encode_s")
        in_flight = self._in_flight
        if in_flight is None:
            received = self.communicate(message, step)
            watch.lap("communicate_s")
            extra = self._decode_apply(received, step, watch)
        else:
            extra = {}
            if in_flight.in_flight:
                received, sent_step = in_flight.wait()
                watch.lap("communicate_s")  # only the part the update did not hide
                extra = self._decode_apply(received, sent_step, watch)
                extra["exchange_s"] = in_flight.busy_s
            in_flight.submit(lambda: (self.communicate(message, step), step))
        return StepResult(loss=float(loss), timings=watch.timings, extra=extra)

    def _decode_apply(self, received: Any, step: int, watch: Stopwatch) -> dict[str, float]:
        decoded = self.decode(received, step)
        watch.lap("decode_s")
        extra = self.apply(decoded, step)
        watch.lap("apply_s")
        return extra

    def drain(self) -> None:
        """Overlap: wait for the exchange in flight and apply its result now."""
        if self._in_flight is not None and self._in_flight.in_flight:
            received, sent_step = self._in_flight.wait()
            self.apply(self.decode(received, sent_step), sent_step)

    # The hooks --------------------------------------------------------------------------

    def compute_update(self, x: np.ndarray, y: np.ndarray, step: int) -> tuple[Any, Any, Any]:
        """``(loss, update, finite)`` of this worker's batch; by default the flat float32
        gradient as a read-only numpy view of the tensor (no copy on CPU; ``finite``: whether
        every element is finite)."""
        if self._gradients_fn is None:
            self._gradients_fn = tf.function(self._flat_gradients, reduce_retracing=True)
        loss, grads, finite = self._gradients_fn(x, y)
        return loss, np.asarray(grads), finite

    def encode(self, update: Any, step: int) -> Any:
        """The message this worker sends (main thread); by default the update itself."""
        return update

    @abc.abstractmethod
    def communicate(self, message: Any, step: int) -> Any:
        """The collective: what this worker receives for its message (with ``overlap``, on
        the background thread: touch the communicator only, no model, no TensorFlow)."""

    def decode(self, received: Any, step: int) -> Any:
        """What :meth:`apply` takes (main thread); by default what was received."""
        return received

    def apply(self, decoded: Any, step: int) -> dict[str, float]:
        """Apply the decoded result to the model; returns the step's extra figures. By
        default an optimizer step with ``decoded`` as the flat gradient."""
        if self._apply_gradients_fn is None:
            self._apply_gradients_fn = tf.function(
                self._apply_flat, input_signature=[tf.TensorSpec([None], tf.float32)]
            )
        # one explicit conversion: a numpy argument costs tf.function far more than the copy
        self._apply_gradients_fn(tf.convert_to_tensor(decoded, tf.float32))
        return {}

    # Around the steps -------------------------------------------------------------------

    def end_epoch(self, epoch: int) -> None:
        """Drain, then average non-trainable state (e.g. BatchNorm statistics) so replicas
        agree."""
        self.drain()
        if self.non_trainable.size and self.comm.world_size > 1:
            self.non_trainable.assign(self.comm.allreduce(self.non_trainable.read(), "mean"))

    def finish(self) -> None:
        """Leave every replica with the same weights now: called after the last step and
        before every checkpoint (so it must be safe to call mid-training)."""
        self.drain()

    def evaluate_batch(self, x: np.ndarray, y: np.ndarray) -> float:
        """The loss of the current weights on a batch (inference mode); adds the batch to the
        compiled metrics."""
        if self._evaluate_fn is None:
            self._evaluate_fn = tf.function(
                lambda x, y: self._loss(x, y, training=False), reduce_retracing=True
            )
        return float(self._evaluate_fn(x, y))

    def get_state(self) -> dict[str, Any]:
        """This rank's exchange state (see the class docstring); drains first."""
        self.drain()
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

    def _flat_gradients(self, x: tf.Tensor, y: tf.Tensor) -> tuple[tf.Tensor, ...]:
        with tf.GradientTape() as tape:
            loss = self._loss(x, y)
        grads = tape.gradient(loss, self.model.trainable_variables)
        grads = [tf.zeros_like(v) if g is None else tf.convert_to_tensor(g)
                 for g, v in zip(grads, self.model.trainable_variables)]
        flat = tf.concat([tf.reshape(g, [-1]) for g in grads], axis=0)
        return loss, flat, tf.reduce_all(tf.math.is_finite(flat))

    def _apply_flat(self, flat: tf.Tensor) -> None:
        """One optimizer step with the flat gradient ``flat``."""
        self.model.optimizer.apply(self.trainable.split(flat), self.model.trainable_variables)


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
