"""The optimizer's update of one step as its own tensors, without touching the weights.

Gradient sharing needs the update ``u`` the model's optimizer would apply, not the new
weights. For optimizers whose update does not read the weights (SGD with or without
momentum, Adam, RMSprop, ... without weight decay), applying the gradients to a set of
zeroed variables ``U`` (shaped like the weights) leaves exactly ``U = u``, while the
optimizer's own state (momenta, moments, iterations) advances as in a normal step. The
weights are then never written by the optimizer: no ``v - w`` pass, no reset copy. Nor is
``U`` zeroed: its one addition per step is written as the assignment ``U ← 0 + d``, the
same bits.

With ``accumulate=True`` the optimizer's addition is made as it is, ``U ← U + d``: ``U`` is
then gradient sharing's residual (:class:`UpdateMemory`), encoded in place on the host.

:func:`fallback_reason` says why an optimizer cannot take this path (then the caller applies
to the weights and takes the update back out of them).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from sparkdl.compression.memory import PiecewiseMemory
from sparkdl.compression.pieces import Pieces
from sparkdl.compression.threshold import ResidualPostProcessor
from sparkdl.training.exchanges.host_views import HostViews, read_no_copy
from sparkdl.training.exchanges.variables import FlatVariables

__all__ = ["UpdateMemory", "UpdateVariables", "fallback_reason"]

#: Optimizer classes whose ``update_step`` never reads the variable's value (only the
#: gradient and the optimizer's own state). Exact types: a subclass may override
#: ``update_step``. Ftrl and Lamb read the weights, Muon is not checked.
_WEIGHT_FREE = (
    keras.optimizers.SGD,
    keras.optimizers.Adam,
    keras.optimizers.AdamW,
    keras.optimizers.Adamax,
    keras.optimizers.Nadam,
    keras.optimizers.RMSprop,
    keras.optimizers.Adagrad,
    keras.optimizers.Adadelta,
    keras.optimizers.Lion,
)


def fallback_reason(optimizer: Any, variables: Sequence[Any]) -> str | None:
    """None when applying ``optimizer`` to zeroed variables yields its update exactly; else
    why not (weight decay, EMA, gradient accumulation, constraints, an optimizer type whose
    update is not known to be free of the weights)."""
    if type(optimizer) not in _WEIGHT_FREE:
        return f"{type(optimizer).__name__} is not known to update without reading weights"
    if getattr(optimizer, "weight_decay", None):
        return f"weight_decay={optimizer.weight_decay} reads the weights"
    if getattr(optimizer, "use_ema", False):
        return "use_ema averages the weights"
    if getattr(optimizer, "gradient_accumulation_steps", None):
        return "gradient_accumulation_steps updates on some steps only"
    for variable in variables:
        if getattr(variable, "constraint", None) is not None:
            return f"variable {variable.path} has a constraint"
        if getattr(variable, "overwrite_with_gradient", False):
            return f"variable {variable.path} is overwritten with its gradient"
    return None


class UpdateVariables:
    """Float32 variables ``U`` shaped like ``variables`` that the model's optimizer updates
    in their place (:meth:`apply`): the optimizer's slot for ``variables[i]`` serves
    ``U[i]``, so its state (and its saved form) is the model's optimizer state, unchanged.

    Only for an optimizer :func:`fallback_reason` accepts, built on ``variables``. With
    ``accumulate`` the update is added to what ``U`` holds (the optimizer's own addition):
    ``U`` then serves as gradient sharing's residual.
    """

    def __init__(self, optimizer: Any, variables: Sequence[Any], *, accumulate: bool = False
                 ) -> None:
        reason = fallback_reason(optimizer, variables)
        if reason is not None:
            raise ValueError(f"the update cannot be computed apart from the weights: {reason}")
        self.optimizer = optimizer
        #: Whether the optimizer's update adds to what ``U`` holds (``U`` is then a residual,
        #: :class:`UpdateMemory`) rather than replacing it.
        self.accumulate = accumulate
        self.variables = [
            tf.Variable(tf.zeros(v.shape, tf.float32), trainable=False, name=f"update_{i}")
            for i, v in enumerate(variables)
        ]
        self._zero = tf.Variable(0.0, trainable=False, name="update_zero")
        # The optimizer finds a variable's slots by its key: U[i] maps to variables[i]'s.
        indices = optimizer._trainable_variables_indices
        for i, (variable, update) in enumerate(zip(variables, self.variables)):
            if indices.get(optimizer._var_key(variable)) != i:
                raise ValueError("the optimizer must be built on exactly these variables")
            indices[optimizer._var_key(update)] = i

    def values(self) -> list[tf.Tensor]:
        """(In a graph) the values of ``U``, aliasing their buffers on the host (not in an
        XLA-compiled function: the reads that alias do not compile)."""
        return [read_no_copy(update) for update in self.variables]

    def apply(self, grads: Sequence[tf.Tensor]) -> None:
        """(In a graph) one optimizer step on ``U`` with ``grads``: ``U`` holds the update
        (:meth:`values`).

        The optimizer's one addition to each ``U[i]`` (``assign_add(U, d)`` or
        ``assign_sub(U, d)``) is written as an assignment of ``0 + d`` (``0 - d``): bit for bit
        what adding to a zeroed ``U`` gives, without a pass that zeroes ``U`` or reads it back.
        A variable with a sparse gradient is zeroed first and takes the optimizer's own
        scatter."""
        if self.accumulate:
            raise ValueError("accumulating update variables take add(), not apply()")
        for update, grad in zip(self.variables, grads):
            if isinstance(grad, tf.IndexedSlices):
                update.assign(tf.zeros_like(update))

        def write(variable: Any, value: Any, sign: float, own: Any) -> None:
            if isinstance(value, tf.IndexedSlices):
                own(variable, value)
                return
            # a zero TensorFlow cannot fold away (0 - d is not -d for d = +0.0)
            zero = self._zero.read_value()
            variable.assign(tf.add(zero, value) if sign > 0 else tf.subtract(zero, value))

        self._optimizer_step(grads, write)

    def add(self, grads: Sequence[tf.Tensor]) -> None:
        """(In a graph, ``accumulate=True``) one optimizer step whose update is added to
        ``U`` (the optimizer's own ``U + d``). Its finiteness is not checked here: the host's
        encode sweep checks it (``ThresholdCompressor.compress_held``), with no pass of its
        own. A non-finite update stays in ``U``, as it stays in the optimizer's state:
        training ends on it (the loop raises ``TrainingError``)."""
        if not self.accumulate:
            raise ValueError("add() needs update variables built with accumulate=True")
        self._optimizer_step(grads, lambda variable, value, sign, own: own(variable, value))

    def _optimizer_step(self, grads: Sequence[tf.Tensor], write: Any) -> None:
        """Run the optimizer with ``grads`` on ``U``; its one addition to each ``U[i]`` goes
        to ``write(variable, value, sign, own)`` (``own``: the optimizer's own addition)
        instead; additions to its own state are made as usual."""
        optimizer = self.optimizer
        grads = list(grads)
        mine = {id(update): i for i, update in enumerate(self.variables)}
        calls = [0] * len(self.variables)
        add, sub = optimizer.assign_add, optimizer.assign_sub

        def written(variable: Any, value: Any, sign: float, own: Any) -> None:
            i = mine.get(id(variable))
            if i is None:
                own(variable, value)
                return
            calls[i] += 1
            write(variable, tf.cast(value, tf.float32), sign, own)

        optimizer.assign_add = lambda variable, value: written(variable, value, 1.0, add)
        optimizer.assign_sub = lambda variable, value: written(variable, value, -1.0, sub)
        try:
            optimizer.apply(grads, self.variables)
        finally:
            del optimizer.assign_add, optimizer.assign_sub
        if any(count > 1 for count in calls):
            raise RuntimeError(
                f"{type(optimizer).__name__} adds to a variable more than once per step; "
                "its update cannot be written into U"
            )


class UpdateMemory(PiecewiseMemory):
    """Gradient sharing's residual held in :class:`UpdateVariables` built with
    ``accumulate=True``: the optimizer adds each step's update to it, in the step's graph,
    and the host encodes and post-processes it in place through numpy views of the
    variables' buffers (:meth:`hold`), so the residual is never added to, copied or
    concatenated apart from the encode (CPU variables only)."""

    def __init__(self, updates: UpdateVariables,
                 post_processor: ResidualPostProcessor | None = None) -> None:
        if not updates.accumulate:
            raise ValueError("the update variables must accumulate (accumulate=True)")
        self._flat = FlatVariables(updates.variables)
        super().__init__(self._flat.size, post_processor)
        self.updates = updates
        self._views = HostViews(updates.variables)
        self._pieces: Pieces | None = None
        # the last views handed out, and their Pieces (reused while the views are the same)
        self._known: tuple[list[np.ndarray], Pieces] | None = None
        self._reads: list[Any] | None = None

    def hold(self, reads: Sequence[Any]) -> None:
        """Take ``reads``: aliasing reads of the variables (numpy or tensors) since their last
        write, whose buffers :meth:`pieces` hands out until :meth:`release`."""
        self._reads = list(reads)  # they keep the buffers alive while we write through views
        views = self._views.views(self._reads)
        if self._known is None or any(a is not b for a, b in zip(views, self._known[0])):
            self._known = (views, Pieces(views))  # the buffers moved (or the first hold)
        self._pieces = self._known[1]

    def release(self) -> None:
        """Drop the held reads (before TensorFlow writes the variables again: a buffer
        still read is copied before the write)."""
        self._pieces = self._reads = None

    def pieces(self) -> Pieces:
        if self._pieces is None:
            self.hold(self._views.read_all())
        assert self._pieces is not None
        return self._pieces

    def get_residual(self) -> np.ndarray:
        return self._flat.read()

    def set_residual(self, value: np.ndarray) -> None:
        value = self._checked(value)
        self.release()
        self._flat.assign(value)
