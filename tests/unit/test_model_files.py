"""Models through storage (``sparkdl.training.model_files``): a model file named by its
checksum, written once, read back checked, on local disk and on S3 (moto)."""

from __future__ import annotations

import pickle
from pathlib import Path

import keras
import numpy as np
import pytest

from sparkdl.errors import DataError
from sparkdl.training import model_files
from sparkdl.training.model_files import (
    ModelRef,
    adopt,
    load_model,
    read_model_bytes,
    staged_model,
    weights_digest,
    write_model,
    write_model_bytes,
)


def _model(seed: int = 1) -> keras.Model:
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, activation="softmax")])
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    return model


def test_a_model_file_is_named_by_its_checksum_and_written_once(tmp_path: Path) -> None:
    directory = tmp_path.as_uri() + "/models"
    ref = write_model_bytes(b"model-1", directory)
    assert ref.uri.endswith(f"/models/{ref.sha256}.keras") and ref.size == 7
    path = Path(ref.uri.removeprefix("file://"))
    stamp = path.stat().st_mtime_ns
    assert write_model_bytes(b"model-1", directory) == ref
    assert path.stat().st_mtime_ns == stamp  # the same bytes: not written again
    assert read_model_bytes(ref) == b"model-1"
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temporary left


def test_a_changed_or_missing_model_file_is_one_error_naming_it(tmp_path: Path) -> None:
    ref = write_model_bytes(b"model-2", tmp_path.as_uri())
    Path(ref.uri.removeprefix("file://")).write_bytes(b"model-X")
    with pytest.raises(DataError, match=r"model file .*\.keras: 7 bytes with SHA-256 .*changed"):
        read_model_bytes(ref)
    with pytest.raises(DataError, match=r"model file .*gone\.keras does not exist"):
        read_model_bytes(ModelRef(tmp_path.as_uri() + "/gone.keras", ref.sha256, 7))


def test_the_reference_is_small_whatever_the_model(tmp_path: Path) -> None:
    big = keras.Sequential([keras.Input((512,)), keras.layers.Dense(1024)])
    big.compile(optimizer="adam", loss="mse")
    ref = write_model(big, tmp_path.as_uri())
    assert ref.size > 4 << 20  # weights and Adam's slots
    assert len(pickle.dumps(ref)) < 400  # what a task or a result row carries
    loaded = load_model(ref)
    for a, b in zip(big.weights, loaded.weights, strict=True):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_the_file_holds_the_optimizer_state_and_loads_as_in_memory_bytes(tmp_path: Path) -> None:
    """A model file is the ``.keras`` archive: Keras's own loader and the in-memory path read
    it alike, optimizer slots and step count included."""
    from sparkdl.training.serialization import model_from_bytes

    model = _model(7)
    x, y = np.ones((8, 4), np.float32), np.zeros(8, np.int64)
    model.fit(x, y, epochs=1, verbose=0)
    ref = write_model(model, tmp_path.as_uri())
    path = ref.uri.removeprefix("file://")
    for loaded in (load_model(ref), model_from_bytes(read_model_bytes(ref)),
                   keras.models.load_model(path)):
        assert int(loaded.optimizer.iterations.numpy()) == 1
        for a, b in zip(model.optimizer.variables, loaded.optimizer.variables, strict=True):
            np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_an_unchanged_model_is_staged_once_and_a_changed_one_again(tmp_path: Path) -> None:
    model = _model()
    directory = tmp_path.as_uri()
    calls: list[str] = []

    def where() -> str:
        calls.append(directory)
        return directory

    first = staged_model(model, where)
    assert staged_model(model, where) == first and len(calls) == 1
    model.layers[0].kernel.assign(model.layers[0].kernel.numpy() + 1.0)
    second = staged_model(model, where)
    assert second != first and len(calls) == 2
    assert weights_digest(load_model(second)) == weights_digest(model)


def test_the_oldest_staged_models_files_are_deleted(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(model_files, "KEEP_STAGED", 2)
    directory = tmp_path.as_uri()
    refs = []
    for seed in range(3):
        model = _model(seed)
        refs.append(adopt(write_model(model, directory), model))
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == sorted(r.uri.rsplit("/", 1)[1] for r in refs[1:])


def test_a_model_file_on_s3(s3_bucket: str) -> None:
    model = _model(5)
    ref = write_model(model, f"{s3_bucket}/models")
    assert ref.uri.startswith("s3://")
    assert weights_digest(load_model(ref)) == weights_digest(model)


def test_a_trained_file_loads_into_the_model_it_came_from(tmp_path: Path) -> None:
    """The driver loads rank 0's trained file into the model it fitted (one model in memory):
    weights, optimizer slots and step count, as a model loaded anew would hold them."""
    from sparkdl.training.model_files import load_weights

    model, trained = _model(8), _model(8)
    model.optimizer.build(model.trainable_variables)
    x, y = np.ones((8, 4), np.float32), np.zeros(8, np.int64)
    trained.fit(x, y, epochs=2, verbose=0)
    ref = write_model(trained, tmp_path.as_uri())
    load_weights(model, ref)
    assert int(model.optimizer.iterations.numpy()) == 2
    for a, b in zip(trained.weights + trained.optimizer.variables,
                    model.weights + model.optimizer.variables, strict=True):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
