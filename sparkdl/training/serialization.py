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
import zipfile
from collections.abc import Iterator
from pathlib import Path
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


def save_model_file(model: keras.Model, path: str | os.PathLike[str]) -> None:
    """:func:`model_to_bytes`'s ``.keras`` archive written to the local file ``path``, without
    a copy of the weights in memory: Keras writes its weights file straight to disk (its
    unzipped format), which is then stored into the archive in chunks (uncompressed)."""
    optimizer = getattr(model, "optimizer", None)
    if optimizer is not None and not optimizer.built:
        optimizer.build(model.trainable_variables)
    if _saving_lib is None:  # pragma: no cover - depends on the Keras version
        Path(path).write_bytes(model_to_bytes(model))
        return
    with tempfile.TemporaryDirectory(prefix="sparkdl-model-") as tmp:
        unzipped = Path(tmp, "model")
        with _compiled_with_loss_scale(model):
            _saving_lib.save_model(model, str(unzipped), zipped=False)
        with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as archive:
            for member in sorted(p for p in unzipped.rglob("*") if p.is_file()):
                archive.write(member, member.relative_to(unzipped).as_posix())


def load_model_file(path: str | os.PathLike[str],
                    custom_objects: dict[str, Any] | None = None) -> keras.Model:
    """Load the ``.keras`` archive at the local ``path`` (written by :func:`save_model_file` or
    :func:`model_to_bytes`), compiled as it was saved: its members are extracted to disk in
    chunks and the weights read from there, not from a copy in memory."""
    if _saving_lib is None:  # pragma: no cover - depends on the Keras version
        return keras.models.load_model(str(path), custom_objects=custom_objects, compile=True)
    with tempfile.TemporaryDirectory(prefix="sparkdl-model-") as tmp:
        with zipfile.ZipFile(path) as archive:
            for member in archive.infolist():
                target = Path(tmp, member.filename).resolve()
                if not target.is_relative_to(Path(tmp).resolve()):
                    raise ValueError(f"{path}: member {member.filename!r} leaves the archive")
                archive.extract(member, tmp)
        return _saving_lib.load_model(tmp, custom_objects=custom_objects, compile=True)


def load_weights_file(model: keras.Model, path: str | os.PathLike[str]) -> None:
    """Load the weights and optimizer state of the ``.keras`` archive at the local ``path``
    into ``model``, a model of the same structure whose optimizer is built: no second model,
    and the weights read from disk (the archive's weights file extracted in chunks)."""
    with tempfile.TemporaryDirectory(prefix="sparkdl-model-") as tmp:
        with zipfile.ZipFile(path) as archive:
            archive.extract(_WEIGHTS_FILE, tmp)
        model.load_weights(str(Path(tmp, _WEIGHTS_FILE)))


#: The weights file inside a ``.keras`` archive.
_WEIGHTS_FILE = "model.weights.h5"
