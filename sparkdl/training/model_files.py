"""Models through storage: a model travels to and from the workers as a ``.keras`` file and a
:class:`ModelRef` (its URI, SHA-256 and size), never inside a task, a result row or a Spark
Connect plan (Horovod's Store does the same).

The driver writes the model to be trained once into a *model directory* every executor reads
(:mod:`sparkdl.spark.model_store` picks it); each task carries only the reference. Rank 0
writes the trained model there and returns its reference. Evaluation and inference load the
file once per Python worker, checked against the reference's checksum.

Files are named by their checksum (``<sha256>.keras``): writing the same bytes twice writes
one file. Importing this module imports no TensorFlow.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import shutil
import tempfile
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sparkdl.errors import DataError
from sparkdl.storage import child, make_dirs, read_bytes, resolve, write_bytes

if TYPE_CHECKING:
    import keras

#: The folder of model files under a store, a checkpoint directory or a shard directory
#: (a leading ``_``: Spark's and sparkdl's readers skip it).
MODELS_DIR = "_sparkdl_models"


@dataclass(frozen=True)
class ModelRef:
    """A model file: where it is and what it holds (its bytes' SHA-256 and size)."""

    uri: str
    sha256: str
    size: int

    def describe(self) -> str:
        return f"{self.uri} ({self.size / 1e6:.1f} MB)"


def write_model_bytes(data: bytes, directory: str) -> ModelRef:
    """Write ``data`` (``.keras`` bytes) into ``directory`` as ``<sha256>.keras``, atomically,
    unless that file is there already; return its reference."""
    digest = hashlib.sha256(data).hexdigest()
    ref = ModelRef(child(directory, f"{digest}.keras"), digest, len(data))
    fs, path = resolve(ref.uri)
    try:
        found = fs.get_file_info(path)
        if found.size == len(data):
            return ref
        make_dirs(directory, key="the model directory")
        write_bytes(fs, path, data)
    except OSError as exc:
        raise DataError(f"cannot write the model to {ref.uri}: {exc}") from None
    return ref


def write_model(model: keras.Model, directory: str) -> ModelRef:
    """:func:`write_model_bytes` of the model's ``.keras`` bytes (weights, optimizer state)."""
    from sparkdl.training.serialization import model_to_bytes

    return write_model_bytes(model_to_bytes(model), directory)


def read_model_bytes(ref: ModelRef) -> bytes:
    """The bytes of ``ref``'s file; one :class:`DataError` when the file is missing or is not
    the one written (another size or checksum: changed or cut short on its storage)."""
    data = read_bytes(ref.uri, what="model file", limit=ref.size)
    digest = hashlib.sha256(data).hexdigest()
    if len(data) != ref.size or digest != ref.sha256:
        raise DataError(
            f"model file {ref.uri}: {len(data)} bytes with SHA-256 {digest[:12]}…, not the "
            f"{ref.size} bytes with SHA-256 {ref.sha256[:12]}… that were written (the file "
            "changed on its storage)"
        )
    return data


def load_model(ref: ModelRef, custom_objects: dict[str, Any] | None = None) -> keras.Model:
    """The model in ``ref``'s file, checked against the reference."""
    from sparkdl.training.serialization import model_from_bytes

    return model_from_bytes(read_model_bytes(ref), custom_objects)


def delete_model(ref: ModelRef) -> None:
    """Remove ``ref``'s file if it is there (a failure is not an error: it is temporary)."""
    with contextlib.suppress(OSError, DataError):
        fs, path = resolve(ref.uri)
        fs.delete_file(path)


def weights_digest(model: keras.Model) -> str:
    """A digest of the model's structure and weights: whether a model written before still
    holds what ``model`` holds now (``.keras`` bytes differ by their time stamp alone)."""
    import numpy as np

    layers = [type(layer).__name__ for layer in model.layers]  # names differ once loaded
    digest = hashlib.sha256(repr((layers, [(tuple(w.shape), str(w.dtype))
                                           for w in model.weights])).encode())
    for weight in model.weights:
        digest.update(np.ascontiguousarray(weight.numpy()).data)
    return digest.hexdigest()


# The driver's model files ---------------------------------------------------------------------

#: How many models this process keeps written for evaluation and inference; the oldest one's
#: file is deleted when another is written.
KEEP_STAGED = 4

_lock = threading.Lock()
_temporary_dir: str | None = None
#: weights digest -> the file holding that model, most recent last
_staged: OrderedDict[str, ModelRef] = OrderedDict()


def temporary_model_dir() -> str:
    """This process's temporary model directory (``file://``), for executors on this machine;
    removed with everything in it when the process exits."""
    global _temporary_dir
    with _lock:
        if _temporary_dir is None:
            _temporary_dir = tempfile.mkdtemp(prefix="sparkdl-models-")
        return "file://" + _temporary_dir


def staged_model(model: keras.Model, directory: Callable[[], str]) -> ModelRef:
    """A file holding ``model`` as it is now, for evaluation and inference: the one written
    before while the model's weights are unchanged (by :func:`weights_digest`; rank 0's
    trained model, :func:`adopt`), else a new one in ``directory()``. Deleted at exit, or
    when :data:`KEEP_STAGED` newer ones are written."""
    digest = weights_digest(model)
    with _lock:
        ref = _staged.get(digest)
        if ref is not None:
            _staged.move_to_end(digest)
            return ref
    return adopt(write_model(model, directory()), model, digest=digest)


def adopt(ref: ModelRef, model: keras.Model, *, digest: str | None = None) -> ModelRef:
    """Keep ``ref`` (a file that holds ``model``, such as rank 0's trained model) as
    :func:`staged_model`'s file for ``model``."""
    digest = digest or weights_digest(model)
    evicted: list[ModelRef] = []
    with _lock:
        _staged[digest] = ref
        _staged.move_to_end(digest)
        while len(_staged) > KEEP_STAGED:
            evicted.append(_staged.popitem(last=False)[1])
        in_use = {kept.uri for kept in _staged.values()}
    for old in evicted:
        if old.uri not in in_use:
            delete_model(old)
    return ref


@atexit.register
def _remove_staged() -> None:
    with _lock:
        refs = list(_staged.values())
        _staged.clear()
        temporary = _temporary_dir
    for ref in refs:
        with contextlib.suppress(Exception):
            delete_model(ref)
    if temporary:
        shutil.rmtree(temporary, ignore_errors=True)


__all__ = ["KEEP_STAGED", "MODELS_DIR", "ModelRef", "adopt", "delete_model", "load_model",
           "read_model_bytes", "staged_model", "temporary_model_dir", "weights_digest",
           "write_model", "write_model_bytes"]
