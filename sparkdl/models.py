"""Built-in Keras models, and building the model a job configuration names."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from importlib import import_module
from typing import Any

import keras

from sparkdl.config import ModelConfig
from sparkdl.errors import ConfigurationError


def mlp(
    input_shape: Sequence[int],
    num_classes: int,
    hidden: Sequence[int] = (128, 64),
    dropout: float = 0.0,
    output_activation: str = "softmax",
) -> keras.Model:
    """A multilayer perceptron over the flattened input (``output_activation="linear"`` for
    regression: ``num_classes`` is then the number of targets)."""
    layers: list[Any] = [keras.Input(shape=tuple(input_shape)), keras.layers.Flatten()]
    for units in hidden:
        layers.append(keras.layers.Dense(int(units), activation="relu"))
        if dropout:
            layers.append(keras.layers.Dropout(float(dropout)))
    layers.append(keras.layers.Dense(num_classes, activation=output_activation))
    return keras.Sequential(layers, name="mlp")


def lenet(input_shape: Sequence[int] = (28, 28, 1), num_classes: int = 10) -> keras.Model:
    """The seeds' LeNet: conv 5×5×20, maxpool, conv 5×5×50, maxpool, dense 500, softmax."""
    return keras.Sequential(
        [
            keras.Input(shape=tuple(input_shape)),
            keras.layers.Conv2D(20, 5, activation="relu"),
            keras.layers.MaxPooling2D(2),
            keras.layers.Conv2D(50, 5, activation="relu"),
            keras.layers.MaxPooling2D(2),
            keras.layers.Flatten(),
            keras.layers.Dense(500, activation="relu"),
            keras.layers.Dense(num_classes, activation="softmax"),
        ],
        name="lenet",
    )


BUILTIN: dict[str, Callable[..., keras.Model]] = {"mlp": mlp, "lenet": lenet}


def resolve_builder(name: str) -> Callable[..., keras.Model]:
    """A built-in model name, or ``package.module:function``."""
    if name in BUILTIN:
        return BUILTIN[name]
    module_name, sep, attr = name.partition(":")
    if not sep:
        raise ConfigurationError(
            f"model.name: unknown model {name!r}; use one of {sorted(BUILTIN)} or "
            "'package.module:function'"
        )
    try:
        return getattr(import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise ConfigurationError(f"model.name: cannot import {name!r}: {exc}") from None


def build_model(config: ModelConfig, input_shape: Sequence[int], num_classes: int) -> keras.Model:
    """Build and compile the model ``config`` describes for the given data."""
    builder = resolve_builder(config.name)
    try:
        model = builder(input_shape=input_shape, num_classes=num_classes, **config.params)
    except TypeError as exc:
        raise ConfigurationError(f"model.params: {exc}") from None
    try:
        optimizer = keras.optimizers.get(
            {"class_name": config.optimizer.name,
             "config": {"learning_rate": config.optimizer.learning_rate}}
        )
    except ValueError as exc:
        raise ConfigurationError(f"model.optimizer.name: {exc}") from None
    metrics = ["accuracy"] if "categorical" in config.loss else []
    model.compile(optimizer=optimizer, loss=config.loss, metrics=metrics)
    return model
