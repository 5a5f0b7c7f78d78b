"""The dense baseline: synchronous allreduce-mean of gradients every step (Horovod's
semantics)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import ml_dtypes
import numpy as np
import tensorflow as tf

from sparkdl.comm.communicator import Communicator
from sparkdl.errors import ConfigurationError
from sparkdl.training.exchanges.exchange import UpdateExchange, all_finite
from sparkdl.training.exchanges.host_views import aligned_empty

if TYPE_CHECKING:
    from collections.abc import Callable

#: The gradient stays in per-variable pieces only where they hold this many elements on
#: average: handing each piece to TensorFlow and numpy costs about 20 µs (measured: 122
#: variables of a deep MLP, +2.3 ms a step), one flat copy about 0.3 ms per million elements.
PIECES_MIN_ELEMENTS = 1 << 16

#: The dense allreduce's wire formats (``DenseTrainingMaster(wire_dtype=...)``).
WIRE_DTYPES = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16}


class DenseAllreduceExchange(UpdateExchange):
    """Every worker averages the full float32 gradient and applies the same optimizer step.

    The template's defaults do the rest (flat gradient out, optimizer step with what comes
    back). ``wire_dtype="bfloat16"``: the gradient travels as bfloat16 (half the bytes; the
    ring sums it in bfloat16, float32's range with 8 bits of mantissa) and is applied as the
    float32 mean of what arrives, the same bits on every rank. With ``overlap`` the allreduce
    of step t's gradient runs on a background thread while step t+1's gradient is computed;
    step t+1 then applies the mean gradient of step t (one step stale, the same on every
    rank). :meth:`finish`, :meth:`end_epoch` and
    :meth:`get_state` apply the gradient in flight first.

    Without overlap, loss scaling or accumulation the optimizer step is deferred into the next
    step's graph: step t+1's one TensorFlow call applies step t's mean gradient, then takes its
    own gradient at the new weights (the order of a plain step; one TensorFlow call per step
    instead of two). The weights lag one optimizer step between two
    :meth:`step` calls; :meth:`drain` (so :meth:`finish`, :meth:`end_epoch`,
    :meth:`get_state` and :meth:`evaluate_batch`) applies it alone, with the same bits. The
    step's ``compute_s`` then holds the previous step's optimizer step, ``apply_s`` none.
    On that path with the float32 wire and large variables (:data:`PIECES_MIN_ELEMENTS` on
    average) the gradient also stays in its per-variable tensors: the collective reads them in
    place (:meth:`Communicator.allreduce_pieces`), so no flat copy of it is ever made (one
    rank applies them as they are).
    """

    non_finite_travels = True  # a non-finite gradient makes the mean non-finite everywhere

    def __init__(self, model: tf.keras.Model, comm: Communicator, *, overlap: bool = False,
                 wire_dtype: str = "float32"):
        super().__init__(model, comm, overlap=overlap)
        if wire_dtype not in WIRE_DTYPES:
            raise ConfigurationError(
                f"wire_dtype must be one of {sorted(WIRE_DTYPES)}, got {wire_dtype!r}")
        self.wire_dtype = wire_dtype
        self._wire = np.dtype(WIRE_DTYPES[wire_dtype])
        # the mean gradient the next step applies first: flat, or one tensor per variable
        self._pending: tf.Tensor | list[tf.Tensor] | None = None
        self._apply_then_gradients_fn: Callable[..., Any] | None = None
        self._apply_pieces_fn: Callable[..., Any] | None = None
        self._buffers: dict[np.dtype, np.ndarray] = {}  # the collective's reused results

    def _defers(self) -> bool:
        """Whether the optimizer step waits for the next step's graph (see the class)."""
        return self.loss_scale is None and not self.overlap and self.accumulate_steps == 1

    def _update_is_gradient(self) -> bool:
        return True

    def _in_pieces(self) -> bool:
        """Whether the gradient stays in per-variable pieces (see the class docstring): on
        the deferred float32 path, for variables of :data:`PIECES_MIN_ELEMENTS` on average."""
        count = len(self.model.trainable_variables)
        return (self._defers() and self._wire == np.float32
                and self.trainable.size >= PIECES_MIN_ELEMENTS * count)

    def compute_update(self, x: np.ndarray, y: Any, step: int) -> tuple[Any, Any, Any]:
        """The batch's gradient (flat, or per variable on the deferred float32 path); first,
        in the same graph, the deferred optimizer step (dropped if the call fails: never
        applied twice)."""
        pending, self._pending = self._pending, None
        pieces = self._in_pieces()
        if pending is None and not pieces:
            return super().compute_update(x, y, step)
        if self._apply_then_gradients_fn is None:
            self._apply_then_gradients_fn = self._function(self._apply_then_gradients,
                                                           reduce_retracing=True)
        loss, grads, finite = self._apply_then_gradients_fn(pending, x, y, pieces)
        update: Any = [np.asarray(g) for g in grads] if pieces else np.asarray(grads)
        self._update_tensor = (update, grads)
        return loss, update, finite

    def _apply_then_gradients(self, pending: Any, x: tf.Tensor, y: Any, pieces: bool
                              ) -> tuple[Any, ...]:
        """(In a graph) the optimizer step with ``pending`` (a flat gradient, one tensor per
        variable, or None), then the batch's gradient at the new weights, flat or one
        tensor per variable (the graph orders the variables' reads after their writes)."""
        if pending is not None:
            self._apply_update(pending)
        if not pieces:
            return self._flat_gradients(x, y)
        loss, grads = self._gradient_tensors(x, y)
        return loss, grads, all_finite(grads)

    def _apply_update(self, pending: Any) -> None:
        """(In a graph) one optimizer step with a flat gradient or one tensor per variable."""
        if isinstance(pending, (list, tuple)):
            self.optimizer.apply(list(pending), self.model.trainable_variables)
        else:
            self._apply_flat(pending)

    def apply(self, decoded: Any, step: int) -> dict[str, float]:
        if not self._defers():
            return super().apply(decoded, step)
        self._pending = self._host_tensor(decoded)
        return {}

    def drain(self) -> None:
        super().drain()
        pending, self._pending = self._pending, None
        if pending is not None:
            self._apply_alone(pending)

    def _apply_alone(self, pending: Any) -> None:
        """The deferred optimizer step in a graph of its own (flat, or one tensor per
        variable)."""
        if not isinstance(pending, list):
            self._apply_tensor(pending)
            return
        if self._apply_pieces_fn is None:
            self._apply_pieces_fn = self._function(self._apply_update, reduce_retracing=True)
        self._apply_pieces_fn(pending)

    def evaluate_batch(self, x: np.ndarray, y: np.ndarray) -> float:
        self.drain()
        return super().evaluate_batch(x, y)

    def set_state(self, state: dict[str, Any]) -> None:
        self._pending = None  # the state replaces the weights' history
        super().set_state(state)

    def encode(self, update: Any, step: int) -> Any:
        if self._wire == np.float32 or self.comm.world_size == 1:
            return update
        return np.asarray(update).astype(self._wire)

    def _buffer(self, dtype: np.dtype) -> np.ndarray:
        """A 64-byte aligned vector of the gradient's length, reused every step: what the
        collective writes (float32: TensorFlow reads it in place, through DLPack). Its last
        contents are consumed before the next step writes it: by the optimizer step, or
        with overlap by decode and apply before the next collective starts."""
        buffer = self._buffers.get(dtype)
        if buffer is None:
            buffer = self._buffers[dtype] = aligned_empty(self.trainable.size, dtype)
        return buffer

    def communicate(self, message: Any, step: int) -> Any:
        if self.comm.world_size == 1:
            return message
        if isinstance(message, list):  # the gradient's pieces, read in place
            return self.comm.allreduce_pieces(message, "mean",
                                              out=self._buffer(message[0].dtype))
        op = "mean" if self._wire == np.float32 else "sum"
        return self.comm.allreduce(message, op, out=self._buffer(message.dtype))

    def decode(self, received: Any, step: int) -> Any:
        if isinstance(received, list) or received.dtype == np.float32:
            return received
        total = self._buffer(np.dtype(np.float32))
        np.copyto(total, received, casting="unsafe")  # the float32 sum, as astype() gives it
        total /= np.float32(self.comm.world_size)
        return total
