"""A ``mixed_float16`` model trains to the float32 model's accuracy (issue 23.2): digits
(sklearn), 2 local workers (``ParallelWrapper``), dense allreduce and gradient sharing."""

from __future__ import annotations

from pathlib import Path

import keras
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sparkdl.data.metadata import FORMAT_VERSION, ShardFile, ShardMetadata, write_metadata
from sparkdl.parallel import ParallelWrapper
from sparkdl.training.masters import DenseTrainingMaster, SharedTrainingMaster

pytestmark = pytest.mark.slow

EPOCHS, BATCH, GROUP = 8, 32, 128


def _digits() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    data = load_digits()
    x = (data.data / 16.0).astype(np.float32)
    return train_test_split(x, data.target.astype(np.int64), test_size=0.25, random_state=0,
                            stratify=data.target)


def write_digits_shards(root: Path, x: np.ndarray, y: np.ndarray) -> str:
    """Two files of row groups of ``GROUP`` rows (one per worker)."""
    root.mkdir(parents=True)
    files = []
    for i, rows in enumerate(np.array_split(np.arange(len(x)), 2)):
        name = f"part-{i:05d}.parquet"
        table = pa.table({"features": pa.array(list(x[rows])), "label": pa.array(y[rows])})
        pq.write_table(table, root / name, row_group_size=GROUP)
        groups = [pq.ParquetFile(root / name).metadata.row_group(g).num_rows
                  for g in range(pq.ParquetFile(root / name).num_row_groups)]
        files.append(ShardFile(name, len(rows), groups))
    write_metadata(str(root), ShardMetadata(
        format_version=FORMAT_VERSION, feature_shape=[x.shape[1]], feature_dtype="float32",
        label_kind="class", classes=[str(c) for c in range(10)], label_shape=[],
        num_rows=len(x), files=files,
    ))
    return str(root)


def digits_model(policy: str) -> keras.Model:
    keras.mixed_precision.set_global_policy(policy)
    try:
        keras.utils.set_random_seed(7)
        model = keras.Sequential([
            keras.Input((64,)), keras.layers.Dense(128, "relu"), keras.layers.Dense(64, "relu"),
            keras.layers.Dense(10, "softmax", dtype="float32"),  # Keras's advice: float32 out
        ])
        model.compile(keras.optimizers.Adam(0.002), "sparse_categorical_crossentropy",
                      jit_compile=False)
    finally:
        keras.mixed_precision.set_global_policy("float32")
    return model


def accuracy(model: keras.Model, x: np.ndarray, y: np.ndarray) -> float:
    return float(np.mean(model.predict(x, verbose=0).argmax(axis=1) == y))


@pytest.mark.parametrize("master", [DenseTrainingMaster, SharedTrainingMaster])
def test_a_mixed_float16_model_reaches_the_float32_accuracy_on_digits(tmp_path, master):
    x_train, x_test, y_train, y_test = _digits()
    uri = write_digits_shards(tmp_path / "train", x_train, y_train)
    results = {}
    for policy in ("float32", "mixed_float16"):
        wrapper = ParallelWrapper(digits_model(policy), master(BATCH, 2, seed=3), timeout_s=120)
        fit = wrapper.fit(uri, epochs=EPOCHS, verbose=0)
        assert fit.metrics["replicas_identical"] is True
        optimizer = wrapper.model.optimizer
        if policy == "mixed_float16":  # the loss scale travelled and acted
            assert isinstance(optimizer, keras.optimizers.LossScaleOptimizer)
            assert wrapper.model.layers[0].compute_dtype == "float16"
        results[policy] = accuracy(wrapper.model, x_test, y_test)
    print(master.mode, "digits test accuracy:", results)
    assert results["float32"] > 0.9, results
    assert results["mixed_float16"] >= results["float32"] - 0.01, results


def test_the_bfloat16_wire_halves_the_bytes_and_reaches_the_float32_wire_accuracy(tmp_path):
    x_train, x_test, y_train, y_test = _digits()
    uri = write_digits_shards(tmp_path / "train", x_train, y_train)
    results, sent = {}, {}
    for wire in ("float32", "bfloat16"):
        wrapper = ParallelWrapper(digits_model("float32"),
                                  DenseTrainingMaster(BATCH, 2, seed=3, wire_dtype=wire),
                                  timeout_s=120)
        fit = wrapper.fit(uri, epochs=EPOCHS, verbose=0)
        assert fit.metrics["replicas_identical"] is True
        results[wire] = accuracy(wrapper.model, x_test, y_test)
        sent[wire] = fit.metrics["bytes_per_step"]
    print("dense digits test accuracy by wire:", results, "bytes per step:", sent)
    assert 0.45 < sent["bfloat16"] / sent["float32"] < 0.55, sent
    assert results["bfloat16"] >= results["float32"] - 0.01, results
