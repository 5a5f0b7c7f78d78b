"""Keras models to and from bytes (the ``.keras`` format), for shipping to workers."""

from __future__ import annotations

import os
import tempfile
from typing import Any

import keras


def model_to_bytes(model: keras.Model) -> bytes:
    """The model (architecture, weights, compiled optimizer and its state, loss) as
    ``.keras`` bytes. The optimizer is built first, so its state travels and loads whole."""
    optimizer = getattr(model, "optimizer", None)
    if optimizer is not None and not optimizer.built:
        optimizer.build(model.trainable_variables)
    with tempfile.TemporaryDirectory(prefix="sparkdl-model-") as tmp:
        path = os.path.join(tmp, "model.keras")
        model.save(path)
        with open(path, "rb") as f:
            return f.read()


def model_from_bytes(data: bytes, custom_objects: dict[str, Any] | None = None) -> keras.Model:
    """Load a model saved by :func:`model_to_bytes`, compiled as it was saved."""
    with tempfile.TemporaryDirectory(prefix="sparkdl-model-") as tmp:
        path = os.path.join(tmp, "model.keras")
        with open(path, "wb") as f:
            f.write(data)
        return keras.models.load_model(path, custom_objects=custom_objects, compile=True)
