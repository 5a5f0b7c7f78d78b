"""Keras models to and from bytes (the ``.keras`` format), for shipping to workers.

The bytes are written and read in memory: a worker killed while loading a model (Spark kills
the tasks of a cancelled job) leaves no temporary files behind. Keras's public ``save_model``
accepts only paths, so this uses its saving library directly, and falls back to a temporary
file if a future Keras moves it.
"""

from __future__ import annotations

import contextlib
import io
import os
import tempfile
from collections.abc import Iterator
from typing import Any

import keras

from sparkdl.run_output import MODEL_FILE

try:
    from keras.src.saving import saving_lib as _saving_lib
except ImportError:  # pragma: no cover - depends on the Keras version
    _saving_lib = None


def model_to_bytes(model: keras.Model) -> bytes:
    """The model (architecture, weights, compiled optimizer and its state, loss) as
    ``.keras`` bytes. The optimizer is built first, so its state travels and loads whole."""
    optimizer = getattr(model, "optimizer", None)
    if optimizer is not None and not optimizer.built:
        optimizer.build(model.trainable_variables)
    with _compiled_with_loss_scale(model):
        if _saving_lib is not None:
            buffer = io.BytesIO()
            _saving_lib.save_model(model, buffer)
            return buffer.getvalue()
        with tempfile.TemporaryDirectory(prefix="sparkdl-model-") as tmp:
            path = os.path.join(tmp, MODEL_FILE)
            model.save(path)
            with open(path, "rb") as f:
                return f.read()


@contextlib.contextmanager
def _compiled_with_loss_scale(model: keras.Model) -> Iterator[None]:
    """While saving, the compile config names the ``LossScaleOptimizer`` Keras wrapped the
    optimizer in (``mixed_float16``). Keras saves the optimizer given to ``compile``: loaded,
    the model would get the bare optimizer, no loss scaling, and its state would be skipped
    (a different number of variables)."""
    config = getattr(getattr(model, "_compile_config", None), "config", None)
    optimizer = getattr(model, "optimizer", None)
    if (not isinstance(config, dict) or "optimizer" not in config
            or not isinstance(optimizer, keras.optimizers.LossScaleOptimizer)):
        yield
        return
    given = config["optimizer"]
    config["optimizer"] = optimizer
    try:
        yield
    finally:
        config["optimizer"] = given


def model_from_bytes(data: bytes, custom_objects: dict[str, Any] | None = None) -> keras.Model:
    """Load a model saved by :func:`model_to_bytes`, compiled as it was saved."""
    if _saving_lib is not None:
        return _saving_lib.load_model(
            io.BytesIO(data), custom_objects=custom_objects, compile=True
        )
    with tempfile.TemporaryDirectory(prefix="sparkdl-model-") as tmp:
        path = os.path.join(tmp, MODEL_FILE)
        with open(path, "wb") as f:
            f.write(data)
        return keras.models.load_model(path, custom_objects=custom_objects, compile=True)
