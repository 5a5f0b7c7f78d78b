"""Gradient sharing (Strom 2015): threshold-encoded optimizer updates with residuals."""

from __future__ import annotations

import contextlib
from typing import Any

import numpy as np
import tensorflow as tf

from sparkdl.comm.communicator import Communicator
from sparkdl.compression.compressor import Compressor, prefixed, unprefixed
from sparkdl.errors import ConfigurationError
from sparkdl.training.exchange import StepResult, Stopwatch, UpdateExchange
from sparkdl.training.overlap import InFlightExchange, overlap_timeout


class GradientSharingExchange(UpdateExchange):
    """Each worker computes the update its optimizer would apply, adds it to its residual,
    sends the elements that reach τ as ±τ, and applies the decoded sum of every worker's
    message — never its own unencoded update — so replicas stay bit-identical.

    State (:meth:`get_state`): the compressor's (``compressor.memory.residual``,
    ``compressor.threshold.*``), the optimizer's variables (``optimizer.<i>``) and the decoded
    sum not applied yet (``pending``; zeros after :meth:`finish`). The shared weights are the
    model's weights after :meth:`finish`, saved with the model; :meth:`set_state` takes them
    from the model.

    With ``overlap`` (``training.overlap``) step t's message is encoded, exchanged and decoded
    on a background thread (:class:`~sparkdl.training.overlap.InFlightExchange`) while step
    t+1 computes its gradient; step t+1 then waits for that decoded sum and applies it to the
    shared weights *before* its optimizer update. So the gradient of step t+1 is computed on
    weights holding the decoded sums up to step t-1 (staleness exactly one step), and every
    rank applies the same sums at the same steps: replicas stay bit-identical. The exchange is
    drained (its sum applied) by :meth:`finish`, :meth:`end_epoch` and before
    :meth:`get_state`, so checkpoints, validation and the epoch's collectives see one
    consistent state and use the communicator alone; the first step after a drain computes on
    fully updated weights.
    """

    def __init__(
        self,
        model: tf.keras.Model,
        comm: Communicator,
        compressor: Compressor,
        *,
        overlap: bool = False,
    ) -> None:
        super().__init__(model, comm)
        self.compressor = compressor
        self.overlap = bool(overlap)
        self._in_flight = InFlightExchange(overlap_timeout(comm)) if self.overlap else None
        # The shared weights W, identical on every worker. The model's variables hold
        # W + (this worker's local update) between steps; the next step resets them to
        # W + (decoded sum), so a worker never keeps its own unencoded update.
        self._shared = [
            tf.Variable(v, trainable=False, name=f"shared_{i}")
            for i, v in enumerate(model.trainable_variables)
        ]
        # Device encoder: the update stays a tensor on the model's device, and a sparse
        # decoded sum goes back to the device as (index, value) pairs.
        self._on_device = compressor.memory.on_device
        self._device = compressor.memory.device
        # Host double buffer of the decoded sum; ``_pending`` is what the next step applies
        # (the host buffer itself, or a device tensor built from it).
        self._pending_host = np.zeros(self.trainable.size, dtype=np.float32)
        self._sum = np.zeros(self.trainable.size, dtype=np.float32)
        self._pending: np.ndarray | tf.Tensor = self._pending_host
        self._step_fn = tf.function(self._step_graph, reduce_retracing=True)
        self._flush_fn = tf.function(self._flush_graph, reduce_retracing=True)
        self._scatter_fn = tf.function(self._scatter_graph, reduce_retracing=True)
        self._gradients_fn = tf.function(self._gradients_graph, reduce_retracing=True)
        self._update_fn = tf.function(self._update_graph, reduce_retracing=True)
        self.last_stats = None

    def _apply_shared_sum(self, total: tf.Tensor) -> None:
        """W ← W + total; the model's variables ← W (one pass, same bits on every worker)."""
        for variable, shared, piece in zip(
            self.model.trainable_variables, self._shared, self.trainable.split(total)
        ):
            shared.assign_add(piece)
            variable.assign(shared)

    def _step_graph(self, x: tf.Tensor, y: tf.Tensor, previous_sum: tf.Tensor):
        """Apply the previous step's decoded sum, then run the optimizer locally and return
        its update as one flat vector."""
        self._apply_shared_sum(previous_sum)
        variables = self.model.trainable_variables
        with tf.GradientTape() as tape:
            loss = self._loss(x, y)
        grads = tape.gradient(loss, variables)
        self.model.optimizer.apply(grads, variables)
        update = tf.concat(
            [tf.reshape(v - w, [-1]) for v, w in zip(variables, self._shared)], axis=0
        )
        return loss, update, tf.reduce_all(tf.math.is_finite(update))

    def _gradients_graph(self, x: tf.Tensor, y: tf.Tensor):
        """Overlap, first half: the loss and gradients at the model's weights (= W)."""
        variables = self.model.trainable_variables
        with tf.GradientTape() as tape:
            loss = self._loss(x, y)
        grads = tape.gradient(loss, variables)
        return loss, [tf.zeros_like(v) if g is None else g for g, v in zip(grads, variables)]

    def _update_graph(self, grads: list[tf.Tensor], previous_sum: tf.Tensor):
        """Overlap, second half: apply the previous step's decoded sum, run the optimizer on
        the gradients, return its update and leave the model's weights at W again (the
        next gradient is computed on the shared weights, never on a local update)."""
        self._apply_shared_sum(previous_sum)
        variables = self.model.trainable_variables
        self.model.optimizer.apply(grads, variables)
        update = tf.concat(
            [tf.reshape(v - w, [-1]) for v, w in zip(variables, self._shared)], axis=0
        )
        for variable, shared in zip(variables, self._shared):
            variable.assign(shared)
        return update, tf.reduce_all(tf.math.is_finite(update))

    def _flush_graph(self, previous_sum: tf.Tensor) -> None:
        self._apply_shared_sum(previous_sum)

    def _scatter_graph(self, index: tf.Tensor, values: tf.Tensor) -> tf.Tensor:
        return tf.scatter_nd(index[:, None], values, [self.trainable.size])

    def _to_device(self, total: np.ndarray) -> np.ndarray | tf.Tensor:
        """The decoded sum for the device: its non-zeros scattered into zeros on the device
        when that moves fewer bytes, else the dense host vector. Bit-identical to the dense
        vector: the host sum has no ``-0.0`` (it starts at ``+0.0`` and only adds ``±tau``),
        so its zeros are exactly the ``+0.0`` that ``scatter_nd`` fills in."""
        index = np.flatnonzero(total)
        if 2 * index.size >= total.size:
            return total
        with tf.device(self._device) if self._device else contextlib.nullcontext():
            return self._scatter_fn(index.astype(np.int32), total[index])

    def _drain(self) -> None:
        """Overlap: wait for the exchange in flight and make its decoded sum the pending one."""
        if self._in_flight is not None and self._in_flight.in_flight:
            self._receive(self._in_flight.wait())

    def flush(self) -> None:
        """Apply the pending decoded sum now (before anything reads the weights)."""
        self._drain()
        self._flush_fn(self._pending)
        self._pending_host[:] = 0.0
        self._pending = self._pending_host

    def end_epoch(self, epoch: int) -> None:
        self.flush()
        super().end_epoch(epoch)

    def get_state(self) -> dict[str, Any]:
        self._drain()
        return {
            **super().get_state(),
            **prefixed("compressor", self.compressor.get_state()),
            "pending": self._pending_host.copy(),
        }

    def set_state(self, state: dict[str, Any]) -> None:
        state = dict(state)
        pending = np.asarray(state.pop("pending", None))
        if pending.dtype != np.float32 or pending.shape != self._pending_host.shape:
            raise ConfigurationError(
                f"sharing state needs 'pending', a float32 vector of {self.trainable.size} "
                f"elements, got {pending.dtype} array of shape {pending.shape}"
            )
        compressor = unprefixed("compressor", state)
        super().set_state({k: v for k, v in state.items() if not k.startswith("compressor.")})
        self.compressor.set_state(compressor)
        for shared, variable in zip(self._shared, self.model.trainable_variables):
            shared.assign(variable)
        self._pending_host[:] = pending
        self._pending = (
            self._to_device(self._pending_host) if self._on_device else self._pending_host
        )

    def finish(self) -> None:
        self.flush()

    def step(self, x: np.ndarray, y: np.ndarray, step: int) -> StepResult:
        if self.overlap:
            return self._overlapped_step(x, y, step)
        watch = Stopwatch()
        loss, update, finite = self._step_fn(x, y, self._pending)
        if not bool(finite):
            return StepResult(loss=float(loss), finite_update=False)
        if not self._on_device:
            update = update.numpy()  # the host encoder needs the whole update on the host
        watch.lap("compute_s")
        frame, stats = self.compressor.compress(update, step)
        watch.lap("encode_s")
        frames = self.comm.allgather(frame)
        watch.lap("communicate_s")
        total = self.compressor.decompress_sum(frames, step, out=self._sum)
        watch.lap("decode_s")
        return StepResult(loss=float(loss), timings=watch.timings,
                          extra=self._receive((total, frame, frames, stats)))

    def _overlapped_step(self, x: np.ndarray, y: np.ndarray, step: int) -> StepResult:
        """Gradient of this step while the previous step's message travels; then apply the
        previous decoded sum, update, and send this step's message in the background."""
        watch = Stopwatch()
        loss, grads = self._gradients_fn(x, y)
        watch.lap("compute_s")
        extra: dict[str, float] = {}
        if self._in_flight is not None and self._in_flight.in_flight:
            extra = self._receive(self._in_flight.wait())
            extra["exchange_s"] = self._in_flight.busy_s
        watch.lap("communicate_s")  # only the part the gradient did not hide
        update, finite = self._update_fn(grads, self._pending)
        if not bool(finite):
            return StepResult(loss=float(loss), finite_update=False)
        self._pending_host[:] = 0.0  # applied; the next sum comes from the exchange
        self._pending = self._pending_host
        if not self._on_device:
            update = update.numpy()
        watch.lap("apply_s")
        out = self._sum

        def exchange() -> tuple[np.ndarray, bytes, list[bytes], Any]:
            frame, stats = self.compressor.compress(update, step)
            frames = self.comm.allgather(frame)
            return self.compressor.decompress_sum(frames, step, out=out), frame, frames, stats

        assert self._in_flight is not None
        self._in_flight.submit(exchange)
        return StepResult(loss=float(loss), timings=watch.timings, extra=extra)

    def _receive(self, received: tuple[np.ndarray, bytes, list[bytes], Any]) -> dict[str, float]:
        """Make an exchange's decoded sum the pending one; returns its step figures."""
        total, frame, frames, stats = received
        # double buffer: the step function has finished with the previous pending sum
        self._pending_host, self._sum = total, self._pending_host
        self._pending = self._to_device(total) if self._on_device else total
        self.last_stats = stats
        return {
            "tau": float(stats.tau),
            "sparsity": float(stats.sparsity),
            "bitmap": float(stats.encoding == "bitmap"),
            "frame_bytes": float(len(frame)),
            "received_bytes": float(sum(len(f) for f in frames) - len(frame)),
        }
