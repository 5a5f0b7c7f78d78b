"""Sample and class weights: a 1-worker dense fit matches Keras's own ``model.fit``."""

from __future__ import annotations

from pathlib import Path

import keras
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sparkdl.data.metadata import FORMAT_VERSION, ShardFile, ShardMetadata, write_metadata
from sparkdl.errors import ConfigurationError
from sparkdl.parallel import ParallelWrapper
from sparkdl.training.masters import DenseTrainingMaster

ROWS, FEATURES, CLASSES, BATCH = 96, 5, 3, 16


def _data(seed: int = 3) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(ROWS, FEATURES)).astype(np.float32)
    y = rng.integers(0, CLASSES, ROWS).astype(np.int64)
    w = rng.uniform(0.0, 3.0, ROWS).astype(np.float32)
    return x, y, w


def write_shards(root: Path, x: np.ndarray, y: np.ndarray, w: np.ndarray | None) -> str:
    """One file, one row group: a 1-worker unshuffled fit reads the rows in this order."""
    root.mkdir(parents=True)
    columns = {"features": pa.array(list(x)), "label": pa.array(y)}
    if w is not None:
        columns["sample_weight"] = pa.array(w)
    pq.write_table(pa.table(columns), root / "part-00000.parquet", row_group_size=len(x))
    write_metadata(str(root), ShardMetadata(
        format_version=FORMAT_VERSION, feature_shape=[FEATURES], feature_dtype="float32",
        label_kind="class", classes=[str(c) for c in range(CLASSES)], label_shape=[],
        num_rows=len(x), files=[ShardFile("part-00000.parquet", len(x), [len(x)])],
        weight_column=None if w is None else "sample_weight",
    ))
    return str(root)


def _model() -> keras.Model:
    keras.utils.set_random_seed(11)
    model = keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(8, "tanh"),
                              keras.layers.Dense(CLASSES, "softmax")])
    model.compile(keras.optimizers.Adam(0.01), "sparse_categorical_crossentropy",
                  metrics=["accuracy"], jit_compile=False)
    return model


def _compare(tmp_path: Path, *, sample_weight: bool, class_weight: dict | None) -> None:
    x, y, w = _data()
    uri = write_shards(tmp_path / "shards", x, y, w if sample_weight else None)
    reference = _model()
    expected = reference.fit(x, y, sample_weight=w if sample_weight else None,
                             class_weight=class_weight, batch_size=BATCH, epochs=2,
                             shuffle=False, verbose=0)
    wrapper = ParallelWrapper(_model(), DenseTrainingMaster(BATCH, num_workers=1), timeout_s=60)
    got = wrapper.fit(uri, epochs=2, shuffle=False, verbose=0, class_weight=class_weight)
    for ours, theirs in zip(wrapper.model.get_weights(), reference.get_weights(), strict=True):
        np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-6)
    for name in ("loss", "accuracy"):
        np.testing.assert_allclose(got.history[name], expected.history[name], rtol=1e-5)
    # the weights did act: an unweighted fit ends elsewhere
    plain = _model()
    plain.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0)
    assert not np.allclose(plain.get_weights()[0], reference.get_weights()[0], atol=1e-4)


def test_a_sample_weight_column_trains_as_keras_fit_with_sample_weight(tmp_path):
    _compare(tmp_path, sample_weight=True, class_weight=None)


def test_class_weights_train_as_keras_fit_with_class_weight(tmp_path):
    _compare(tmp_path, sample_weight=False, class_weight={0: 0.5, 2: 3.0})


def test_weighted_validation_matches_keras_evaluate_with_sample_weight(tmp_path):
    x, y, _ = _data()
    vx, vy, vw = _data(seed=5)
    uri = write_shards(tmp_path / "train", x, y, None)
    val = write_shards(tmp_path / "val", vx, vy, vw)
    wrapper = ParallelWrapper(_model(), DenseTrainingMaster(BATCH, num_workers=1), timeout_s=60)
    got = wrapper.fit(uri, epochs=1, shuffle=False, verbose=0, validation_data=val,
                      validation_batch_size=BATCH)
    expected = wrapper.model.evaluate(vx, vy, sample_weight=vw, batch_size=BATCH, verbose=0,
                                      return_dict=True)
    np.testing.assert_allclose(got.history["val_loss"][-1], expected["loss"], rtol=1e-5)
    np.testing.assert_allclose(got.history["val_accuracy"][-1], expected["accuracy"], rtol=1e-5)


def test_class_weight_with_a_sample_weight_column_is_refused_as_keras_does(tmp_path):
    x, y, w = _data()
    uri = write_shards(tmp_path / "shards", x, y, w)
    wrapper = ParallelWrapper(_model(), DenseTrainingMaster(BATCH, num_workers=1), timeout_s=60)
    with pytest.raises(ConfigurationError, match="sample-weight column 'sample_weight'"):
        wrapper.fit(uri, class_weight={0: 2.0})
    with pytest.raises(ConfigurationError, match=r"class_weight key 7 .*\[0, 3\)"):
        wrapper.fit(write_shards(tmp_path / "plain", x, y, None), class_weight={7: 2.0})
