"""Gradient sharing (Strom 2015): threshold-encoded optimizer updates with residuals."""

from __future__ import annotations

import contextlib
from typing import Any

import numpy as np
import tensorflow as tf

from sparkdl.comm.communicator import Communicator
from sparkdl.compression.compressor import (
    Compressor,
    ThresholdCompressor,
    prefixed,
    unprefixed,
)
from sparkdl.compression.memory import HostMemory
from sparkdl.errors import ConfigurationError
from sparkdl.training.exchanges.exchange import UpdateExchange, all_finite
from sparkdl.training.exchanges.host_views import HostViews, on_host_float32
from sparkdl.training.exchanges.optimizer_update import (
    UpdateMemory,
    UpdateVariables,
    fallback_reason,
)


class GradientSharingExchange(UpdateExchange):
    """Each worker computes the update its optimizer would apply, adds it to its residual,
    sends the elements that reach τ as ±τ, and applies the decoded sum of every worker's
    message — never its own unencoded update — so replicas stay bit-identical.

    The template's hooks: :meth:`compute_update` runs the optimizer on the batch's gradient
    and returns its update, the model's weights staying the shared weights W between steps
    (fused path: the optimizer writes the update into variables of its own,
    :mod:`~sparkdl.training.exchanges.optimizer_update`; fallback, for optimizers that read the
    weights
    (:attr:`fallback_reason`): it updates the weights and the graph takes the update back out
    of them); :meth:`encode` adds it to the residual and encodes; :meth:`communicate`
    allgathers the frames; :meth:`decode` sums them (as ``(index, value)`` pairs when every
    frame is sparse, so the cost follows the entries, not the model); :meth:`apply` adds the
    sum to W (fused on the host: in place through numpy views,
    :mod:`~sparkdl.training.exchanges.host_views`; else a scatter of the entries, or one dense pass
    for
    bitmap frames).

    Fused on the host with a threshold compressor and no loss scaling (``hold_residual``,
    the default), the optimizer's variables ``U`` are the residual
    (:class:`~sparkdl.training.exchanges.optimizer_update.UpdateMemory`): the optimizer adds its
    update
    to them in the step's graph and :meth:`encode` encodes them in place, so the residual is
    never added to or copied apart; the same bits as the residual kept in the compressor's
    own vector (``hold_residual=False``). A non-finite update then stays in the residual, as
    it stays in the optimizer's state; the graph does not check it: the encode sweep, which
    reads every element anyway, finds it before anything is encoded (no pass of its own) and
    the step ends there (the training loop ends training on it).

    With the model's ``jit_compile`` the gradient and the optimizer's step are compiled with
    XLA: the fallback's whole update graph; on the fused path a function of their own, called
    from the update graph, which then takes the reads that alias ``U`` and W (those do not
    compile).

    State (:meth:`get_state`): the compressor's (``compressor.memory.residual``,
    ``compressor.threshold.*``), the optimizer's variables (``optimizer.<i>``) and
    ``pending``, a decoded sum not applied yet (zeros: every sum is applied within its step
    or by the drain; a non-zero one from an older checkpoint is applied by
    :meth:`set_state`). The shared weights are the model's weights, saved with the model.

    With ``overlap`` (``training.overlap``) step t's frames travel on a background thread
    while step t+1 computes its update; step t+1 then decodes and applies step t's sum and
    sends its own message. So the gradient of step t+1 is computed on weights holding the
    decoded sums up to step t-1 (staleness exactly one step), and every rank applies the same
    sums at the same steps: replicas stay bit-identical. The exchange is drained by
    :meth:`finish`, :meth:`end_epoch` and before :meth:`get_state`.
    """

    def __init__(
        self,
        model: tf.keras.Model,
        comm: Communicator,
        compressor: Compressor,
        *,
        overlap: bool = False,
        hold_residual: bool = True,
    ) -> None:
        super().__init__(model, comm, overlap=overlap)
        self.compressor = compressor
        # Device encoder: the update stays a tensor on the model's device.
        self._on_device = compressor.memory.on_device
        self._device = compressor.memory.device
        variables = model.trainable_variables
        #: Why the optimizer's update is taken back out of the weights (None: the fused
        #: path, the optimizer writes the update into variables of its own).
        self.fallback_reason = fallback_reason(self.optimizer, variables)
        self._updates: UpdateVariables | None = None
        # Fallback: the shared weights W, identical on every worker and equal to the model's
        # weights between steps (the update graph takes each local update back out of them).
        # Fused: the model's weights are W at all times.
        self._shared: list[tf.Variable] = []
        # Fused on the host: the sum's entries are added to the weights in place.
        self._views: HostViews | None = None
        self._reads: list[tf.Tensor] | None = None  # aliasing reads of W from this step
        # Fused on the host, threshold-encoded, without loss scaling: the residual lives in U
        # (the optimizer adds each update to it; the host encodes it in place).
        self._memory: UpdateMemory | None = None
        if self.fallback_reason is None:
            if not self._on_device and on_host_float32(variables):
                self._views = HostViews(variables)
            hold = (hold_residual and self._views is not None and self.loss_scale is None
                    and isinstance(compressor, ThresholdCompressor)
                    and type(compressor.memory) is HostMemory)
            with self._placement():
                self._updates = UpdateVariables(self.optimizer, variables, accumulate=hold)
            if hold:
                assert isinstance(compressor, ThresholdCompressor)
                self._memory = UpdateMemory(self._updates)
                compressor.hold_residual_in(self._memory)
        else:
            self._shared = [
                tf.Variable(v, trainable=False, name=f"shared_{i}")
                for i, v in enumerate(variables)
            ]
        n = self.trainable.size
        self._pending_host = np.zeros(n, dtype=np.float32)  # checkpoint compatibility: zeros
        self._scratch = np.zeros(n, dtype=np.float32)  # decompress_sparse_sum's argument
        self._sum = np.zeros(n, dtype=np.float32)  # the dense sum of bitmap frames
        # XLA (the model's jit_compile): the fallback's whole graph; the fused graph's
        # gradient and optimizer step, its reads that alias U and W apart (they do not compile)
        self._xla_step = (self._function(self._optimizer_into_updates, reduce_retracing=True)
                          if self.jit_compile and self._updates is not None else None)
        self._update_fn = (
            self._function(self._update_graph, reduce_retracing=True) if self._updates is None
            else tf.function(self._fused_update_graph, reduce_retracing=True)
        )
        self._add_dense_fn = tf.function(self._add_dense_graph, reduce_retracing=True)
        self._add_sparse_fn = tf.function(
            self._add_sparse_graph,
            input_signature=[
                tf.TensorSpec([None], tf.int64),
                tf.TensorSpec([None], tf.float32),
                tf.TensorSpec([len(variables) + 1], tf.int64),
            ],
        )
        self.last_stats = None

    # Graphs -----------------------------------------------------------------------------

    def _update_graph(self, x: tf.Tensor, y: tf.Tensor, flat: bool) -> tuple[tf.Tensor, ...]:
        """The optimizer's update of this batch (one flat vector, or one piece per variable
        with ``flat=False``) and whether it is finite; the weights are W again afterwards
        (``u = v - w``, then ``v`` shares ``w``'s buffer until the next optimizer step)."""
        variables = self.model.trainable_variables
        loss, grads = self._gradients(x, y, variables)
        grads_finite = self._apply_if_finite(lambda: self.optimizer.apply(grads, variables), grads)
        pieces = []
        for variable, shared in zip(variables, self._shared):
            pieces.append(variable - shared)
            variable.assign(shared)
        finite = tf.logical_and(all_finite(pieces), grads_finite)
        if flat:
            return loss, tf.concat([tf.reshape(p, [-1]) for p in pieces], axis=0), finite
        return loss, pieces, finite

    def _fused_update_graph(
        self, x: tf.Tensor, y: tf.Tensor, flat: bool
    ) -> tuple[tf.Tensor, ...]:
        """:meth:`_update_graph` with the optimizer writing the update into variables of its
        own, ``U`` (overwritten each step, never zeroed): the weights stay W. A non-finite
        update ends the step before the encode (the optimizer's state has taken the step, as
        in the fallback). Also returns reads of W that alias its buffers (for :meth:`apply`'s
        in-place addition)."""
        updates = self._updates
        assert updates is not None  # the fused path has them
        loss, applied = (self._xla_step or self._optimizer_into_updates)(x, y)
        pieces = updates.values()
        if applied is not None:  # loss scaling: a skipped step ends before the encode
            finite = applied
        elif updates.accumulate:  # U is the residual, checked by the encode sweep
            finite = tf.constant(True)
        else:
            finite = all_finite(pieces)
        reads = self._views.reads() if self._views is not None else []
        if flat:
            pieces = tf.concat([tf.reshape(p, [-1]) for p in pieces], axis=0)
        return loss, pieces, finite, reads

    def _optimizer_into_updates(self, x: tf.Tensor, y: Any) -> tuple[tf.Tensor, Any]:
        """(In a graph, compiled with XLA when :attr:`jit_compile`: no aliasing read in it)
        the batch's gradient and the optimizer's step into ``U``: ``U + d`` when ``U`` is
        the residual, else ``U ← 0 + d``; with loss scaling only for a finite gradient (a
        skipped step reaches no optimizer state, and ``U`` keeps what it held, unread).
        Returns the loss and, with loss scaling, whether the step was applied (else None)."""
        loss, grads = self._gradient_tensors(x, y)
        updates = self._updates
        assert updates is not None  # the fused path has them
        if updates.accumulate:
            updates.add(grads)
        elif self.loss_scale is None:
            updates.apply(grads)
        else:
            return loss, self._apply_if_finite(lambda: updates.apply(grads), grads)
        return loss, None

    def _add_dense_graph(self, total: tf.Tensor) -> None:
        """W ← W + total; the model's variables ← W (same bits on every worker)."""
        if not self._shared:  # fused: the model's variables are W
            for variable, piece in zip(self.model.trainable_variables, self.trainable.split(total)):
                variable.assign_add(piece)
            return
        for variable, shared, piece in zip(
            self.model.trainable_variables, self._shared, self.trainable.split(total)
        ):
            shared.assign_add(piece)
            variable.assign(shared)

    def _add_sparse_graph(self, index: tf.Tensor, values: tf.Tensor, bounds: tf.Tensor) -> None:
        """W and the model's variables (equal) += the sum's entries (flat ``index``,
        ascending; variable i's are ``index[bounds[i]:bounds[i + 1]]``). A scatter into a new
        tensor, not into the variable: TensorFlow's sparse variable ops switch a variable to
        copy-on-read, and every later dense read of it would copy it."""
        variables = self.model.trainable_variables
        for i, (variable, offset) in enumerate(zip(variables, self.trainable.offsets)):
            shared = self._shared[i] if self._shared else None
            start, stop = bounds[i], bounds[i + 1]
            current = tf.convert_to_tensor(variable if shared is None else shared)

            def scatter(current: tf.Tensor = current, start: tf.Tensor = start,
                        stop: tf.Tensor = stop, offset: int = offset) -> tf.Tensor:
                local = index[start:stop] - offset
                flat = tf.reshape(current, [-1])
                return tf.reshape(
                    tf.tensor_scatter_nd_add(flat, local[:, None], values[start:stop]),
                    tf.shape(current),
                )

            total = tf.cond(stop > start, scatter, lambda current=current: current)
            if shared is not None:
                shared.assign(total)
            variable.assign(total)

    def _placement(self) -> Any:
        return tf.device(self._device) if self._device else contextlib.nullcontext()

    # The template's hooks ---------------------------------------------------------------

    def compute_update(self, x: np.ndarray, y: np.ndarray, step: int) -> tuple[Any, Any, Any]:
        # the device encoder takes the flat tensor; the host encoder the pieces, as read-only
        # numpy views of the tensors (no copy, no concatenation)
        loss, update, finite, *reads = self._update_fn(x, y, self._on_device)
        if self._memory is not None:
            # the update is in U, the residual, encoded in place; its finiteness is checked
            # by the encode sweep (the graph's flag is a constant: not read back)
            self._reads = reads[0]  # W is not written by TensorFlow until apply: aliases
            self._memory.hold(update)
            return loss, None, True
        self._reads = reads[0] if reads and reads[0] and bool(finite) else None
        if not self._on_device:
            update = [np.asarray(piece) for piece in update]
        return loss, update, finite

    def discard_update(self, update: Any) -> None:
        # U needs no zeroing: the next step's optimizer writes it whole (U <- 0 + d)
        self._reads = None

    def encode(self, update: Any, step: int) -> tuple[bytes, Any]:
        if self._memory is None:
            return self.compressor.compress(update, step)
        assert isinstance(self.compressor, ThresholdCompressor)  # it holds U as its memory
        try:
            return self.compressor.compress_held(step)
        finally:
            self._memory.release()  # before the next step's graph adds to U

    def communicate(self, message: tuple[bytes, Any], step: int) -> Any:
        frame, stats = message
        return frame, self.comm.allgather(frame), stats

    def decode(self, received: Any, step: int) -> Any:
        frame, frames, stats = received
        sparse = self.compressor.decompress_sparse_sum(frames, step, self._scratch)
        if sparse is None:
            self.compressor.decompress_sum(frames, step, out=self._sum)
        return sparse, frame, frames, stats

    def apply(self, decoded: Any, step: int) -> dict[str, float]:
        sparse, frame, frames, stats = decoded
        reads, self._reads = self._reads, None
        with self._placement():
            if sparse is None:
                del reads  # held reads would make TensorFlow copy W before adding
                self._add_dense_fn(self._sum)
            else:
                index, values = sparse
                self._add_sparse(index, values, reads)
        self.last_stats = stats
        return {
            "tau": float(stats.tau),
            "sparsity": float(stats.sparsity),
            "bitmap": float(stats.encoding == "bitmap"),
            "frame_bytes": float(len(frame)),
            "received_bytes": float(sum(len(f) for f in frames) - len(frame)),
        }

    def _add_sparse(self, index: np.ndarray, values: np.ndarray, reads: Any = None) -> None:
        if self._views is not None:
            self._views.scatter_add(index, values, self.trainable.offsets, reads)
            return
        bounds = np.searchsorted(index, self.trainable.offsets).astype(np.int64)
        self._add_sparse_fn(
            tf.constant(index, tf.int64), tf.constant(values), tf.constant(bounds)
        )

    def drain(self) -> None:
        self._reads = None  # W may have been written since the last step: read it afresh
        super().drain()

    # State ------------------------------------------------------------------------------

    def get_state(self) -> dict[str, Any]:
        state = super().get_state()  # drains: every decoded sum is applied
        return {
            **state,
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
        self._reads = None
        super().set_state({k: v for k, v in state.items() if not k.startswith("compressor.")})
        self.compressor.set_state(compressor)
        for shared, variable in zip(self._shared, self.model.trainable_variables):
            shared.assign(variable)
        if pending.any():  # an older checkpoint's sum, due before the next gradient
            with self._placement():
                self._add_dense_fn(pending)

