"""Built-in Keras models, and building the model a job configuration names."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from importlib import import_module
from typing import Any

import keras

from sparkdl.config import ModelConfig
from sparkdl.data.metadata import TensorSpec
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


def multi_mlp(
    inputs: Sequence[TensorSpec],
    outputs: Sequence[TensorSpec],
    hidden: Sequence[int] = (128, 64),
    dropout: float = 0.0,
) -> keras.Model:
    """The MLP for shards with several named inputs and outputs: each input flattened, all
    concatenated, shared hidden layers, one head per output (softmax over a class output's
    classes, linear for a regression output), every layer named after its input or output."""
    tensors = {t.name: keras.Input(shape=tuple(t.shape), name=t.name) for t in inputs}
    flat = [keras.layers.Flatten(name=f"{name}_flat")(x) for name, x in tensors.items()]
    x = keras.layers.Concatenate(name="inputs")(flat) if len(flat) > 1 else flat[0]
    for units in hidden:
        x = keras.layers.Dense(int(units), activation="relu")(x)
        if dropout:
            x = keras.layers.Dropout(float(dropout))(x)
    heads = {t.name: keras.layers.Dense(len(t.classes), activation="softmax", name=t.name)(x)
             if t.kind == "class" else
             keras.layers.Reshape(tuple(t.shape), name=t.name)(
                 keras.layers.Dense(t.size, name=f"{t.name}_dense")(x))
             for t in outputs}
    return keras.Model(tensors, heads, name="multi_mlp")


def lenet(input_shape: Sequence[int] = (28, 28, 1), num_classes: int = 10) -> keras.Model:
    """DL4J's LeNet: conv 5×5×20, maxpool, conv 5×5×50, maxpool, dense 500, softmax."""
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


def check_mlp_params(params: dict[str, Any]) -> None:
    """The built-in MLP's ``hidden`` and ``dropout`` in ``model.params`` (Keras would take
    ``hidden: [1.5]`` as 1 unit and fail on ``[0]`` only when the model is built)."""
    hidden = params.get("hidden", [])
    if not isinstance(hidden, list | tuple) or not all(
        isinstance(units, int) and not isinstance(units, bool) and units >= 1
        for units in hidden
    ):
        raise ConfigurationError(
            f"model.params.hidden: expected a list of positive integers (units per hidden "
            f"layer), got {hidden!r}"
        )
    dropout = params.get("dropout", 0.0)
    if isinstance(dropout, bool) or not isinstance(dropout, int | float) \
            or not 0 <= dropout < 1:
        raise ConfigurationError(
            f"model.params.dropout: expected a number in [0, 1), got {dropout!r}"
        )


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


def build_model(config: ModelConfig, input_shape: Sequence[int], num_classes: int, *,
                inputs: Sequence[TensorSpec] = (), outputs: Sequence[TensorSpec] = ()
                ) -> keras.Model:
    """Build and compile the model ``config`` describes for the given data.

    For shards with several named ``inputs`` and ``outputs`` the built-in ``mlp`` becomes
    :func:`multi_mlp`, compiled with one loss per output (sparse categorical cross-entropy for
    class outputs, MSE for regression outputs); other models take such data through
    ``SparkModel`` with a functional Keras model of the same input and output names.
    """
    if inputs and config.name != "mlp":
        raise ConfigurationError(
            f"model.name: {config.name!r} takes one input; shards with several inputs and "
            f"outputs train the built-in 'mlp' here, or a functional Keras model through "
            f"SparkModel"
        )
    builder = multi_mlp if inputs else resolve_builder(config.name)
    if builder is mlp or builder is multi_mlp:
        check_mlp_params(config.params)
    shapes = {"inputs": inputs, "outputs": outputs} if inputs else {
        "input_shape": input_shape, "num_classes": num_classes}
    try:
        model = builder(**shapes, **config.params)
    except TypeError as exc:
        raise ConfigurationError(f"model.params: {exc}") from None
    try:
        optimizer = keras.optimizers.get(
            {"class_name": config.optimizer.name,
             "config": {"learning_rate": config.optimizer.learning_rate}}
        )
    except ValueError as exc:
        raise ConfigurationError(f"model.optimizer.name: {exc}") from None
    if inputs:
        loss: Any = {t.name: "sparse_categorical_crossentropy" if t.kind == "class" else "mse"
                     for t in outputs}
        metrics: Any = {t.name: ["accuracy"] for t in outputs if t.kind == "class"}
    else:
        loss, metrics = config.loss, ["accuracy"] if "categorical" in config.loss else []
    model.compile(optimizer=optimizer, loss=loss, metrics=metrics)
    return model
