"""The per-step update exchange: the part of the worker loop each training master defines."""

from __future__ import annotations

import abc
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import tensorflow as tf

from sparkdl.comm.communicator import Communicator
from sparkdl.errors import ConfigurationError, NonFiniteError
from sparkdl.training.exchanges.host_views import shared_tensor
from sparkdl.training.exchanges.overlap import InFlightExchange, overlap_timeout
from sparkdl.training.exchanges.variables import FlatVariables
from sparkdl.training.metrics import CompiledMetrics
from sparkdl.training.weights import split_target
from sparkdl.training.worker import timeline
from sparkdl.training.worker.loss_scale import LossScale, inner_optimizer, scale, scaled_gradients


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
    non-finite update ends the step before anything leaves the worker: ``finite`` from
    :meth:`compute_update`, or :class:`~sparkdl.errors.NonFiniteError` from :meth:`encode`
    (for an exchange whose encode reads the whole update anyway and checks it there). With
    ``overlap`` only :meth:`communicate` (the collective) runs on a background thread
    (:class:`~sparkdl.training.exchanges.overlap.InFlightExchange`): step t computes its update
    while
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

    The step's TensorFlow graphs are compiled with XLA when the model's ``jit_compile`` is
    set (:attr:`jit_compile`), as ``model.fit`` compiles its train step (gradient sharing:
    see :class:`~sparkdl.training.exchanges.sharing.GradientSharingExchange`).

    :meth:`accumulate` (Horovod's ``backward_passes_per_step``): :meth:`step` adds each
    micro-batch's gradient to a float32 sum and exchanges the mean of ``k`` of them once every
    ``k`` calls (the pending sum is part of the state). Only for exchanges whose update is the
    gradient (the template's :meth:`compute_update`: dense and one-method exchanges).

    Loss scaling (``mixed_float16``: Keras wraps the optimizer in a ``LossScaleOptimizer``,
    :attr:`loss_scale`): the gradient is taken of the scaled loss and unscaled where it is
    computed, so the update is exchanged in float32 at its true size; the inner optimizer
    applies it. Whether a step is skipped (a non-finite gradient on any rank) is decided
    alike on every rank, and every rank halves or grows the scale alike: exchanges whose
    message carries a non-finite value to every rank (:attr:`non_finite_travels`, the dense
    allreduce) decide in :meth:`apply` on the received mean; the others agree on a flag (one
    allreduce of one float) before the encode and drop the update (:meth:`discard_update`).
    """

    #: A non-finite update reaches every rank through :meth:`communicate` (a sum), so the
    #: loss scale's skip decision can be taken on the received result.
    non_finite_travels = False

    def __init__(
        self, model: tf.keras.Model, comm: Communicator, *, overlap: bool = False
    ) -> None:
        self.model = model
        self.comm = comm
        self.trainable = FlatVariables(model.trainable_variables)
        self.non_trainable = FlatVariables(model.non_trainable_variables)
        self.metrics = CompiledMetrics(model)
        #: Whether the step's graphs are compiled with XLA: the model's ``jit_compile``, as
        #: ``model.fit`` would (Keras resolves ``"auto"`` when the model is compiled: off on
        #: a machine without an accelerator, on for a model that supports it where one is).
        self.jit_compile = bool(getattr(model, "jit_compile", False))
        self.overlap = bool(overlap)
        self._in_flight = InFlightExchange(overlap_timeout(comm)) if self.overlap else None
        self._evaluate_fn: Any = None
        self._gradients_fn: Any = None
        self._apply_gradients_fn: Any = None
        #: The model's dynamic loss scale (None without a ``LossScaleOptimizer``).
        self.loss_scale = LossScale.of(model.optimizer)
        #: The optimizer that updates the weights (a ``LossScaleOptimizer``'s inner one).
        self.optimizer = inner_optimizer(model.optimizer)
        self.accumulate_steps = 1
        self._accumulated: np.ndarray | None = None  # the sum of the pending micro-batches
        self._micro_batches = 0
        self._update_tensor: tuple[np.ndarray, tf.Tensor] | None = None
        model.optimizer.build(model.trainable_variables)

    def accumulate(self, steps: int) -> None:
        """Exchange once every ``steps`` calls of :meth:`step`, the gradients' mean over them."""
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
            raise ConfigurationError(f"accumulate_steps must be a positive integer, got {steps!r}")
        if steps > 1 and not self._update_is_gradient():
            raise ConfigurationError(
                f"accumulate_steps={steps} needs an exchange whose update is the gradient "
                f"(mode 'dense'); {type(self).__name__} exchanges optimizer updates or weights"
            )
        self.accumulate_steps = steps

    def _update_is_gradient(self) -> bool:
        """Whether the update is the batch's gradient (by default: :meth:`compute_update` is
        the template's)."""
        return type(self).compute_update is UpdateExchange.compute_update

    # The template -----------------------------------------------------------------------

    def step(self, x: np.ndarray, y: Any, step: int) -> StepResult:
        """Run one step on batch ``(x, y)``; ``step`` counts from 0 over the whole fit. ``y``
        may be :class:`~sparkdl.training.weights.Weighted` (labels with sample weights)."""
        watch = Stopwatch()
        loss, update, finite = self.compute_update(x, y, step)
        if self.loss_scale is not None and not self.non_finite_travels:
            if self._in_flight is not None:
                self.drain()  # the flag's collective must not race the one in flight
            finite = self.loss_scale.agree(finite, self.comm)
            self.loss_scale.update(finite)
            if not finite:  # skipped on every rank, as LossScaleOptimizer skips
                self.discard_update(update)
                return StepResult(loss=float(loss), extra=self._scale_figures(skipped=True))
        elif not bool(finite) and not (self.loss_scale is not None and self.non_finite_travels):
            return StepResult(loss=float(loss), finite_update=False)
        if self.accumulate_steps > 1:
            update = self._accumulate(update)
            if update is None:  # more micro-batches to come before the exchange
                watch.lap("compute_s")
                return StepResult(loss=float(loss), timings=watch.timings)
        watch.lap("compute_s")
        try:
            message = self.encode(update, step)
        except NonFiniteError:  # an update whose finiteness the encode sweep checks
            return StepResult(loss=float(loss), finite_update=False)
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
            watch.lap("communicate_s", span="hand-off")  # this step's message to the thread
        return StepResult(loss=float(loss), timings=watch.timings, extra=extra)

    def _accumulate(self, gradient: Any) -> np.ndarray | None:
        """Add a micro-batch's gradient; the mean of ``accumulate_steps`` of them once there
        are that many, else None."""
        if self._accumulated is None:
            self._accumulated = np.zeros(self.trainable.size, np.float32)
        np.add(self._accumulated, gradient, out=self._accumulated)
        self._micro_batches += 1
        if self._micro_batches < self.accumulate_steps:
            return None
        mean = self._accumulated / np.float32(self.accumulate_steps)
        self._accumulated.fill(0)
        self._micro_batches = 0
        return mean

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
            self._gradients_fn = self._function(self._flat_gradients, reduce_retracing=True)
        loss, grads, finite = self._gradients_fn(x, y)
        update = np.asarray(grads)
        self._update_tensor = (update, grads)  # handed back as is if it comes back unchanged
        return loss, update, finite

    def discard_update(self, update: Any) -> None:
        """Drop an update that will not be encoded (a step the loss scale skips)."""

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
        default an optimizer step with ``decoded`` as the flat gradient (with loss scaling
        and :attr:`non_finite_travels`: skipped, and the scale halved, when it is not
        finite — the same bits, so the same decision, on every rank)."""
        # a tensor argument: a numpy one costs tf.function far more than the conversion
        applied = self._apply_tensor(self._host_tensor(decoded))
        if self.loss_scale is None or not self.non_finite_travels:
            return {}
        self.loss_scale.update(bool(applied))
        return self._scale_figures(skipped=not bool(applied))

    def _apply_tensor(self, flat: tf.Tensor) -> tf.Tensor:
        """:meth:`_apply_flat` in its own graph; whether it applied."""
        if self._apply_gradients_fn is None:
            self._apply_gradients_fn = self._function(
                self._apply_flat, input_signature=[tf.TensorSpec([None], tf.float32)]
            )
        return self._apply_gradients_fn(flat)

    def _scale_figures(self, skipped: bool) -> dict[str, float]:
        assert self.loss_scale is not None
        return {"loss_scale": self.loss_scale.value, "loss_scale_skipped": float(skipped)}

    def _host_tensor(self, array: np.ndarray) -> tf.Tensor:
        """``array`` as a tensor without a copy: this step's own update (one rank) is its
        tensor; another array (the collective's result) is shared through DLPack."""
        known, self._update_tensor = self._update_tensor, None
        if known is not None and known[0] is array:
            return known[1]
        return shared_tensor(array)

    # Around the steps -------------------------------------------------------------------

    def end_epoch(self, epoch: int) -> None:
        """Drain, then average non-trainable state (e.g. BatchNorm statistics) so replicas
        agree."""
        self.drain()
        if self.non_trainable.size and self.comm.world_size > 1:
            self.non_trainable.replace_by(self.mean_over_ranks,
                                          np.empty(self.non_trainable.size, np.float32))

    def mean_over_ranks(self, pieces: list[np.ndarray], out: np.ndarray) -> np.ndarray:
        """The mean over the ranks of the concatenation of ``pieces``, into ``out`` (a reduce
        for :meth:`FlatVariables.replace_by`)."""
        return self.comm.allreduce_pieces(pieces, "mean", out=out)

    def finish(self) -> None:
        """Leave every replica with the same weights now: called after the last step and
        before every checkpoint (so it must be safe to call mid-training)."""
        self.drain()

    def close(self) -> None:
        """Stop the overlap's background thread (after the exchange in flight, which is not
        applied: call :meth:`finish` first to keep it). Idempotent; no-op without overlap."""
        if self._in_flight is not None:
            self._in_flight.close()

    def evaluate_batch(self, x: np.ndarray, y: np.ndarray) -> float:
        """The loss of the current weights on a batch (inference mode); adds the batch to the
        compiled metrics."""
        if self._evaluate_fn is None:
            self._evaluate_fn = self._function(
                lambda x, y: self._loss(x, y, training=False), reduce_retracing=True
            )
        return float(self._evaluate_fn(x, y))

    def get_state(self) -> dict[str, Any]:
        """This rank's exchange state (see the class docstring); drains first."""
        self.drain()
        state: dict[str, Any] = {
            f"optimizer.{i}": np.array(v.numpy(), copy=True)
            for i, v in enumerate(self.model.optimizer.variables)
        }
        if self.accumulate_steps > 1:
            state["accumulated"] = (np.zeros(self.trainable.size, np.float32)
                                    if self._accumulated is None else self._accumulated.copy())
            state["accumulated_steps"] = self._micro_batches
        return state

    def set_state(self, state: dict[str, Any]) -> None:
        """Restore :meth:`get_state` output of this rank (the same model and optimizer)."""
        variables = self.model.optimizer.variables
        expected = {f"optimizer.{i}" for i in range(len(variables))}
        if self.accumulate_steps > 1 and isinstance(state, dict):
            state = dict(state)
            accumulated = np.asarray(state.pop("accumulated", np.zeros(0, np.float32)))
            pending = int(state.pop("accumulated_steps", 0))
            if accumulated.shape != (self.trainable.size,) or not (
                0 <= pending < self.accumulate_steps
            ):
                raise ConfigurationError(
                    f"{type(self).__name__} state holds no pending accumulation of "
                    f"{self.trainable.size} values and < {self.accumulate_steps} micro-batches "
                    f"(got shape {accumulated.shape}, {pending} micro-batches)"
                )
            self._accumulated = accumulated.astype(np.float32, copy=True)
            self._micro_batches = pending
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

    def _function(self, fn: Any, **kwargs: Any) -> Any:
        """``tf.function(fn, **kwargs)``, compiled with XLA when :attr:`jit_compile` is set."""
        return tf.function(fn, jit_compile=True if self.jit_compile else None, **kwargs)

    def _loss(self, x: tf.Tensor, y: Any, training: bool = True) -> tf.Tensor:
        """The batch loss (the model's own ``compute_loss``, with the sample weights of a
        :class:`~sparkdl.training.weights.Weighted` target, as Keras's ``train_step``); also
        adds the batch to the model's compiled metrics."""
        y, sample_weight = split_target(y)
        y_pred = self.model(x, training=training)
        loss = model_loss(self.model, x, y, y_pred, sample_weight, training)
        self.metrics.update(x, y, y_pred, sample_weight)
        return loss

    def _gradients(self, x: tf.Tensor, y: Any, variables: list[Any]) -> tuple[Any, list[Any]]:
        """(In a graph) the batch loss and its gradients, as Keras's ``train_step`` takes
        them (of ``optimizer.scale_loss(loss)``), unscaled with a ``LossScaleOptimizer``."""
        with tf.GradientTape() as tape:
            loss = self._loss(x, y)
            scaled = scale(self.model.optimizer, loss)
        return loss, scaled_gradients(self.model.optimizer, tape, scaled, variables)

    def _gradient_tensors(self, x: tf.Tensor, y: Any) -> tuple[tf.Tensor, list[tf.Tensor]]:
        """(In a graph) the batch loss and one dense gradient per trainable variable (zeros
        where it has none)."""
        variables = self.model.trainable_variables
        loss, grads = self._gradients(x, y, variables)
        return loss, [tf.zeros_like(v) if g is None else tf.convert_to_tensor(g)
                      for g, v in zip(grads, variables)]

    def _flat_gradients(self, x: tf.Tensor, y: tf.Tensor) -> tuple[tf.Tensor, ...]:
        loss, grads = self._gradient_tensors(x, y)
        flat = tf.concat([tf.reshape(g, [-1]) for g in grads], axis=0)
        return loss, flat, all_finite([flat])

    def _apply_flat(self, flat: tf.Tensor) -> tf.Tensor:
        """One optimizer step with the flat gradient ``flat``; with loss scaling only when
        it is finite. Returns whether it was applied."""
        variables = self.model.trainable_variables
        if self.loss_scale is None:
            self.optimizer.apply(self.trainable.split(flat), variables)
            return tf.constant(True)
        return self._apply_if_finite(
            lambda: self.optimizer.apply(self.trainable.split(flat), variables), [flat]
        )

    def _apply_if_finite(self, apply: Any, grads: list[Any], skip: Any = None) -> tf.Tensor:
        """(In a graph) ``apply()`` when every gradient is finite, else ``skip()`` (so no
        optimizer state takes a non-finite gradient); whether every one is."""
        present = [g for g in grads if g is not None]
        finite = all_finite(present) if present else tf.constant(True)

        def run(fn: Any, flag: bool) -> tf.Tensor:
            if fn is not None:
                fn()
            return tf.constant(flag)

        return tf.cond(finite, lambda: run(apply, True), lambda: run(skip, False))


def model_loss(model: Any, x: Any, y: Any, y_pred: Any, sample_weight: Any, training: bool
               ) -> tf.Tensor:
    """``model.compute_loss`` as Keras's ``train_step`` calls it (an override that predates its
    ``training`` argument is called without it)."""
    if getattr(model, "_compute_loss_has_training_arg", True):
        return model.compute_loss(x, y, y_pred, sample_weight, training=training)
    return model.compute_loss(x, y, y_pred, sample_weight)


def all_finite(tensors: list[tf.Tensor]) -> tf.Tensor:
    """(In a graph) whether every element of ``tensors`` is finite, in one summing pass: a sum
    is finite only if every term is (NaN and ±inf propagate), so only a non-finite sum (or
    an overflow of finite terms) pays the exact element-wise check."""
    total = tf.add_n([tf.reduce_sum(t) for t in tensors])
    return tf.cond(
        tf.math.is_finite(total),
        lambda: tf.constant(True),
        lambda: tf.reduce_all([tf.reduce_all(tf.math.is_finite(t)) for t in tensors]),
    )


class Stopwatch:
    """Accumulates named phase durations of one step; each lap is also a span of the active
    timeline (``compute_s`` → ``compute``, see :mod:`sparkdl.training.worker.timeline`)."""

    def __init__(self) -> None:
        self.timings: dict[str, float] = {}
        self._last = time.perf_counter()

    def lap(self, name: str, span: str | None = None) -> None:
        """Add the time since the last lap to ``name``; the timeline's span is ``span``
        (default: ``name`` without ``_s``)."""
        now = time.perf_counter()
        self.timings[name] = self.timings.get(name, 0.0) + now - self._last
        timeline.record(span or name.removesuffix("_s"), self._last, now)
        self._last = now
