"""Keras's dynamic loss scaling (``mixed_float16``) with the skip decision taken by all ranks.

Keras 3 wraps a ``mixed_float16`` model's optimizer in
:class:`keras.optimizers.LossScaleOptimizer` at ``compile``: ``scale_loss`` multiplies the loss
by ``dynamic_scale`` before the gradient, and ``apply`` divides the gradient by it, skips a
step with a non-finite gradient (halving the scale) and doubles the scale after
``dynamic_growth_steps`` finite steps. Its decision is local to one process. The exchanges
take it apart: the gradient is unscaled where it is computed (so what travels is the true
float32 gradient), the ranks agree whether the step is finite (:meth:`LossScale.agree`, one
tiny allreduce), and every rank then updates the scale the same way (:meth:`LossScale.update`)
and applies the inner optimizer — or skips the step — together.
"""

from __future__ import annotations

from typing import Any

import keras
import numpy as np
import tensorflow as tf

__all__ = ["LossScale", "inner_optimizer", "scale", "scaled_gradients"]


def inner_optimizer(optimizer: Any) -> Any:
    """The optimizer that updates the weights: the wrapped one of a ``LossScaleOptimizer``."""
    if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        return optimizer.inner_optimizer
    return optimizer


class LossScale:
    """The dynamic loss scale of a model's ``LossScaleOptimizer`` (its own variables, so
    checkpoints and ``model.save`` keep it)."""

    def __init__(self, optimizer: keras.optimizers.LossScaleOptimizer) -> None:
        self.optimizer = optimizer

    @classmethod
    def of(cls, optimizer: Any) -> LossScale | None:
        """The loss scale of ``optimizer``; None when it does not scale the loss."""
        if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
            return cls(optimizer)
        return None

    @property
    def value(self) -> float:
        return float(self.optimizer.dynamic_scale.numpy())

    def agree(self, finite: Any, comm: Any) -> bool:
        """Whether every rank's gradient is finite (one float32 allreduce of the count of
        ranks with a non-finite one); the same answer on every rank."""
        local = bool(finite)
        if comm.world_size == 1:
            return local
        bad = comm.allreduce(np.array([0.0 if local else 1.0], np.float32), "sum")
        return bool(bad[0] == 0)

    def update(self, finite: bool) -> None:
        """The scale's bookkeeping of one step as ``LossScaleOptimizer.apply`` does it: a
        skipped step halves the scale; ``dynamic_growth_steps`` finite ones double it."""
        opt = self.optimizer
        if not finite:
            opt.step_counter.assign(0)
            opt.dynamic_scale.assign(opt.dynamic_scale * 0.5)
        elif int(opt.step_counter.numpy()) == opt.dynamic_growth_steps - 1:
            opt.step_counter.assign(0)
            opt.dynamic_scale.assign(opt.dynamic_scale * 2.0)
        else:
            opt.step_counter.assign_add(1)


def scaled_gradients(optimizer: Any, tape: tf.GradientTape, loss: tf.Tensor,
                     variables: list[Any]) -> list[Any]:
    """(In a graph) the gradients of ``loss`` with respect to ``variables``; with a
    ``LossScaleOptimizer``, of the scaled loss, divided by the scale again (float32, as its
    ``apply`` unscales them). ``loss``: the output of :func:`scale`, recorded by ``tape``."""
    grads: list[Any] = tape.gradient(loss, variables)
    if not isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        return grads
    factor = tf.cast(optimizer.dynamic_scale, tf.float32)  # read when the graph runs
    return [None if g is None else tf.cast(g, tf.float32) / factor for g in grads]


def scale(optimizer: Any, loss: tf.Tensor) -> tf.Tensor:
    """The loss the gradient is taken of: ``optimizer.scale_loss(loss)`` (Keras's
    ``train_step``), the loss itself for an optimizer without loss scaling."""
    return optimizer.scale_loss(loss)
