"""Does a Keras model fit a shard directory? Checked on the driver before any task runs.

:func:`check_model_fits_shards` compares the model with the shards' ``_sparkdl.json``: its
input shape(s) with the features, its output units with the classes (or the regression
target's size), and its loss with the label kind (class indices or float targets). A
mismatch is one :class:`ConfigurationError` line naming both sides, instead of a shape
error from inside every Spark task.

:func:`check_training_step` refuses a model whose class overrides ``train_step``: the
workers never call it (each computes the gradient of ``model.compute_loss``, which an
override does change, and the training master exchanges it).
"""

from __future__ import annotations

import math
from typing import Any

from sparkdl.data.metadata import METADATA_FILE, ShardMetadata, join
from sparkdl.errors import ConfigurationError

# Losses that take one-hot (or probability) rows, never a class index.
_ONE_HOT_LOSSES = {"categorical_crossentropy", "categorical_focal_crossentropy",
                   "categorical_hinge", "kl_divergence", "kld", "kullback_leibler_divergence"}
# Losses that take a class index, never a float target.
_INDEX_LOSSES = {"sparse_categorical_crossentropy"}


def check_model_fits_shards(model: Any, metadata: ShardMetadata, uri: str, *,
                            training: bool = True) -> None:
    """Raise one :class:`ConfigurationError` if ``model`` cannot train on (``training``) or
    score the shards at ``uri`` (described by ``metadata``); the loss is checked only for
    training. What cannot be told (a custom loss, unknown dimensions) passes."""
    where = join(uri.rstrip("/"), METADATA_FILE)
    loss = getattr(model, "loss", None) if training else None
    if metadata.multi:
        _check_multi(model, metadata, where, loss)
        return
    inputs = _shapes(getattr(model, "inputs", None) or [])
    if len(inputs) != 1:
        raise ConfigurationError(
            f"model has {len(inputs)} inputs, but the shards hold one features column "
            f"{_fmt(metadata.feature_shape)} in {where}"
        )
    if not _matches(inputs[0], metadata.feature_shape):
        raise ConfigurationError(
            f"model input {_fmt(inputs[0])} does not match the shards' features "
            f"{_fmt(metadata.feature_shape)} in {where}"
        )
    outputs = _shapes(getattr(model, "outputs", None) or [])
    if len(outputs) != 1:
        raise ConfigurationError(
            f"model has {len(outputs)} outputs, but the shards hold one label in {where}"
        )
    _check_output(outputs[0], _loss_name(loss), metadata.label_kind,
                  metadata.num_classes, metadata.label_shape, "", where)


def check_training_step(model: Any) -> None:
    """Raise one :class:`ConfigurationError` if ``model``'s class overrides Keras's
    ``train_step`` (sparkdl's workers run their own step around ``compute_loss``)."""
    import keras

    for cls in type(model).__mro__:
        if cls is keras.Model or cls.__module__.startswith("keras."):
            return
        if "train_step" in vars(cls):
            raise ConfigurationError(
                f"model class {cls.__qualname__} overrides train_step, which sparkdl does not "
                "run: every worker computes the gradient of model.compute_loss and the training "
                "master exchanges it. Override compute_loss instead (sparkdl calls it, with "
                "the sample weights), or move the custom computation into a layer or the loss"
            )


def _check_multi(model: Any, metadata: ShardMetadata, where: str, losses: Any) -> None:
    for role, tensors, specs in (("input", model.inputs, metadata.inputs),
                                 ("output", model.outputs, metadata.outputs)):
        names = _names(model, role, tensors)
        wanted = {spec.name: spec for spec in specs}
        missing = sorted(set(wanted) - set(names))
        if missing or len(names) != len(wanted):
            raise ConfigurationError(
                f"model {role}s {sorted(names)} do not match the shards' {role}s "
                f"{sorted(wanted)} in {where}"
            )
        for name, shape in zip(names, _shapes(tensors), strict=True):
            spec = wanted[name]
            if role == "input":
                if not _matches(shape, spec.shape):
                    raise ConfigurationError(
                        f"model input {name!r} {_fmt(shape)} does not match the shards' "
                        f"{name!r} {_fmt(spec.shape)} in {where}"
                    )
                continue
            loss = losses.get(name) if isinstance(losses, dict) else None
            _check_output(shape, _loss_name(loss), spec.kind, len(spec.classes), spec.shape,
                          f" {name!r}", where)


def _check_output(shape: list[int | None], loss: str | None, kind: str, num_classes: int,
                  label_shape: list[int], name: str, where: str) -> None:
    units = math.prod(d for d in shape if d is not None) if shape else 1
    if kind == "class":
        expected = f"{num_classes} classes"
        if units != num_classes and not (units == 1 and num_classes == 2):
            raise ConfigurationError(
                f"model output{name} has {units} units, but the shards' label{name} has "
                f"{expected} in {where}"
            )
        if loss in _ONE_HOT_LOSSES:
            raise ConfigurationError(
                f"model loss {loss} expects one-hot labels, but the shards' label{name} holds "
                f"class indices ({expected}) in {where}: use sparse_categorical_crossentropy"
            )
        return
    size = math.prod(label_shape) if label_shape else 1
    if units != size:
        raise ConfigurationError(
            f"model output{name} has {units} units, but the shards' regression label{name} "
            f"has {size} value(s) {_fmt(label_shape)} in {where}"
        )
    if loss in _INDEX_LOSSES:
        raise ConfigurationError(
            f"model loss {loss} expects class indices, but the shards' label{name} holds "
            f"regression targets {_fmt(label_shape)} in {where}"
        )


def _shapes(tensors: Any) -> list[list[int | None]]:
    return [list(t.shape[1:]) for t in tensors]


def _names(model: Any, role: str, tensors: Any) -> list[str]:
    names = getattr(model, f"{role}_names", None)
    if names is None:
        names = [getattr(t, "name", "").split(":")[0] for t in tensors]
    return list(names)


def _matches(shape: list[int | None], expected: list[int]) -> bool:
    return len(shape) == len(expected) and all(
        d is None or int(d) == int(e) for d, e in zip(shape, expected, strict=True))


def _fmt(shape: list[Any]) -> str:
    return str(tuple(None if d is None else int(d) for d in shape))


def _loss_name(loss: Any) -> str | None:
    """The loss's Keras name (``"categorical_crossentropy"``); None for a custom loss."""
    if loss is None:
        return None
    if isinstance(loss, str):
        return loss.lower()
    if hasattr(loss, "fn"):  # a keras.losses.LossFunctionWrapper (CategoricalCrossentropy())
        return getattr(loss.fn, "__name__", None)
    return getattr(loss, "__name__", None)
