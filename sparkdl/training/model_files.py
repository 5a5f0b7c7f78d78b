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
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sparkdl.errors import DataError
from sparkdl.storage import (
    atomic_path,
    child,
    delete,
    local_copy,
    local_path,
    make_dirs,
    read_bytes,
    resolve,
    upload,
)

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


def write_model_bytes(data: bytes, directory: str) -> ModelRef:
    """Write ``data`` (``.keras`` bytes) into ``directory`` as ``<sha256>.keras``, atomically,
    unless that file is there already; return its reference."""
    with tempfile.TemporaryDirectory(prefix="sparkdl-model-") as tmp:
        local = Path(tmp, "model.keras")
        local.write_bytes(data)
        return _publish(local, directory)


def write_model(model: keras.Model, directory: str) -> ModelRef:
    """Write the model (weights, optimizer state) as a ``.keras`` file named by its SHA-256
    into ``directory``, with no copy of its weights in memory
    (:func:`~sparkdl.training.serialization.save_model_file`); return its reference."""
    from sparkdl.training.serialization import save_model_file

    with tempfile.TemporaryDirectory(prefix="sparkdl-model-") as tmp:
        local = Path(tmp, "model.keras")
        save_model_file(model, local)
        return _publish(local, directory)


def _publish(local: Path, directory: str) -> ModelRef:
    """Move or upload the local file ``local`` to ``directory``/``<sha256>.keras``."""
    digest, size = _sha256(local)
    ref = ModelRef(child(directory, f"{digest}.keras"), digest, size)
    fs, path = resolve(ref.uri)
    try:
        if fs.get_file_info(path).size == size:
            return ref  # the same bytes are there already
        make_dirs(directory, key="the model directory")
        target = local_path(ref.uri)
        if target is not None:  # local: a rename into place, atomic
            with atomic_path(target) as staged:
                shutil.move(local, staged)
        else:
            upload(local, ref.uri)
    except OSError as exc:
        raise DataError(f"cannot write the model to {ref.uri}: {exc}") from None
    return ref


def _sha256(path: Path) -> tuple[str, int]:
    digest, size = hashlib.sha256(), 0
    with open(path, "rb") as stream:
        while chunk := stream.read(_CHUNK):
            digest.update(chunk)
            size += len(chunk)
    return digest.hexdigest(), size


_CHUNK = 8 << 20


def read_model_bytes(ref: ModelRef) -> bytes:
    """The bytes of ``ref``'s file; one :class:`DataError` when the file is missing or is not
    the one written (another size or checksum: changed or cut short on its storage)."""
    data = read_bytes(ref.uri, what="model file", limit=ref.size)
    _check(ref, hashlib.sha256(data).hexdigest(), len(data))
    return data


def _check(ref: ModelRef, digest: str, size: int) -> None:
    if size != ref.size or digest != ref.sha256:
        raise DataError(
            f"model file {ref.uri}: {size} bytes with SHA-256 {digest[:12]}…, not the "
            f"{ref.size} bytes with SHA-256 {ref.sha256[:12]}… that were written (the file "
            "changed on its storage)"
        )


@contextlib.contextmanager
def _checked_file(ref: ModelRef) -> Iterator[Path]:
    """``ref``'s file as a local path, checked against the reference: the file itself on a
    local filesystem, else a temporary download of it (removed after the block)."""
    with local_copy(ref.uri) as path:
        if not path.is_file():
            raise DataError(f"model file {ref.uri} does not exist")
        _check(ref, *_sha256(path))
        yield path


def load_model(ref: ModelRef, custom_objects: dict[str, Any] | None = None) -> keras.Model:
    """The model in ``ref``'s file, checked against the reference; read from disk, with no
    copy of the file in memory (a remote file is downloaded to a temporary file first)."""
    from sparkdl.training.serialization import load_model_file

    with _checked_file(ref) as path:
        return load_model_file(path, custom_objects)


def load_weights(model: keras.Model, ref: ModelRef) -> None:
    """Load the weights and optimizer state of ``ref``'s file into ``model`` (the model the file
    was trained from: same structure, optimizer built), checked against the reference."""
    from sparkdl.training.serialization import load_weights_file

    with _checked_file(ref) as path:
        load_weights_file(model, path)


def delete_model(ref: ModelRef) -> None:
    """Remove ``ref``'s file if it is there (a failure is not an error: it is temporary)."""
    with contextlib.suppress(DataError):
        delete(ref.uri)


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
           "load_weights",
           "read_model_bytes", "staged_model", "temporary_model_dir", "weights_digest",
           "write_model", "write_model_bytes"]
