"""Sample and class weights of a fit (Keras's ``sample_weight`` / ``class_weight``), no TF.

A weighted batch's target is :class:`Weighted` ``(labels, sample_weight)``; the exchanges pass
the weights to the model's ``compute_loss`` and ``compute_metrics`` exactly as Keras's
``train_step`` does. Class weights become per-row sample weights on the worker, as Keras's
data adapters make them: ``class_weight.get(label, 1.0)``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any, NamedTuple

import numpy as np

from sparkdl.errors import ConfigurationError


class Weighted(NamedTuple):
    """A batch's target with its per-row sample weights (a tf.function takes it as a tuple)."""

    labels: Any
    sample_weight: Any


def split_target(y: Any) -> tuple[Any, Any]:
    """``(labels, sample_weight or None)`` of a target that may be :class:`Weighted`."""
    if isinstance(y, Weighted):
        return y.labels, y.sample_weight
    return y, None


def model_batch(batch: tuple[Any, ...]) -> tuple[Any, Any]:
    """A reader's ``(x, y)`` or ``(x, y, sample_weight)`` as ``(x, target)``."""
    if len(batch) == 3:
        return batch[0], Weighted(batch[1], batch[2])
    return batch[0], batch[1]


def check_class_weight(class_weight: Any, metadata: Any, where: str) -> dict[int, float] | None:
    """``class_weight`` as ``{class index: weight}``, checked against the shards at ``where``
    (class labels, one output, no sample-weight column: Keras refuses both at once)."""
    if class_weight is None:
        return None
    if not isinstance(class_weight, Mapping) or not class_weight:
        raise ConfigurationError(
            f"class_weight must be a non-empty dict {{class index: weight}}, got {class_weight!r}"
        )
    if metadata.multi or metadata.label_kind != "class":
        raise ConfigurationError(
            f"class_weight needs one class label, but the shards at {where} hold "
            + ("several outputs" if metadata.multi else "regression targets")
        )
    if metadata.weight_column is not None:
        raise ConfigurationError(
            f"class_weight and sample weights cannot be used at the same time (as in Keras): "
            f"the shards at {where} have the sample-weight column {metadata.weight_column!r}"
        )
    out: dict[int, float] = {}
    for key, value in class_weight.items():
        if isinstance(key, bool) or not isinstance(key, (int, np.integer)) or not (
            0 <= int(key) < metadata.num_classes
        ):
            raise ConfigurationError(
                f"class_weight key {key!r} is not a class index in [0, {metadata.num_classes}) "
                f"of the shards at {where} (classes {metadata.classes})"
            )
        try:
            weight = float(value)
        except (TypeError, ValueError):
            weight = float("nan")
        if not np.isfinite(weight) or weight < 0:
            raise ConfigurationError(
                f"class_weight[{key}] must be a finite number >= 0, got {value!r}"
            )
        out[int(key)] = weight
    return out


def class_weight_table(class_weight: Mapping[int, float], num_classes: int) -> np.ndarray:
    """One float32 weight per class index; classes not named weigh 1 (as in Keras)."""
    return np.array([class_weight.get(c, 1.0) for c in range(num_classes)], np.float32)


def with_class_weights(batches: Iterable[tuple[Any, ...]], table: np.ndarray
                       ) -> Iterator[tuple[Any, ...]]:
    """``(x, y)`` batches as ``(x, y, table[y])`` (closing ``batches`` when closed)."""
    iterator = iter(batches)
    try:
        for x, y in iterator:
            yield x, y, table[y]
    finally:
        close = getattr(iterator, "close", None)
        if close is not None:
            close()
