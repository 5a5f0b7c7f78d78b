"""TensorBoardScalars: written event files read back with TensorFlow's summary iterator."""

from __future__ import annotations

import glob
import os
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest

keras = pytest.importorskip("keras")
tf = pytest.importorskip("tensorflow")

from sparkdl.callbacks import TensorBoardScalars  # noqa: E402
from sparkdl.errors import ConfigurationError  # noqa: E402


def read_scalars(log_dir: Path) -> dict[str, dict[str, dict[int, float]]]:
    """``{subdir: {tag: {step: value}}}`` of every event file under ``log_dir``."""
    found: dict[str, dict[str, dict[int, float]]] = defaultdict(lambda: defaultdict(dict))
    files = glob.glob(os.path.join(log_dir, "*", "events.out.tfevents.*"))
    assert files, f"no event files under {log_dir}"
    for path in files:
        subdir = os.path.basename(os.path.dirname(path))
        for event in tf.compat.v1.train.summary_iterator(path):
            for value in event.summary.value:
                assert value.metadata.plugin_data.plugin_name == "scalars"
                found[subdir][value.tag][event.step] = float(tf.make_ndarray(value.tensor))
    return found


def _fit(callbacks: list, epochs: int = 3) -> keras.callbacks.History:
    keras.utils.set_random_seed(3)
    x = np.random.default_rng(0).normal(size=(96, 4)).astype("float32")
    y = (x[:, 0] + x[:, 1] > 0).astype("int64")
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2, activation="softmax")])
    model.compile("sgd", "sparse_categorical_crossentropy", metrics=["accuracy"])
    return model.fit(x, y, batch_size=16, epochs=epochs, validation_split=0.25,
                     callbacks=callbacks, verbose=0)


def test_keras_fit_epoch_and_batch_scalars(tmp_path):
    history = _fit([TensorBoardScalars(str(tmp_path), update_freq=2)])
    scalars = read_scalars(tmp_path)
    for key, values in history.history.items():
        subdir, name = ("validation", key[4:]) if key.startswith("val_") else ("train", key)
        assert scalars[subdir][f"epoch_{name}"] == pytest.approx(dict(enumerate(values)),
                                                                 rel=1e-6)
    # 72 training rows / 16 = 5 batches per epoch, 15 events; one written per 2 events.
    assert sorted(scalars["train"]["batch_loss"]) == [1, 3, 5, 7, 9, 11, 13, 15]
    assert "batch_val_loss" not in scalars["train"]


def test_callback_list_with_sparkdl_figures_and_global_step(tmp_path):
    callback = TensorBoardScalars((tmp_path / "tb").as_uri(), update_freq=100)
    callbacks = keras.callbacks.CallbackList([callback])
    callbacks.on_train_begin()
    for epoch in range(2):
        callbacks.on_epoch_begin(epoch)
        for step in range(50, 301, 50):  # the driver's events every training.log_every_steps
            global_step = epoch * 300 + step
            callbacks.on_train_batch_end(step - 1, {"loss": 1.0 / global_step,
                                                    "global_step": global_step,
                                                    "tau": np.float32(1e-3)})
        logs = {"loss": 0.5 - 0.1 * epoch, "accuracy": np.float64(0.8 + 0.05 * epoch),
                "val_loss": 0.6 - 0.1 * epoch, "samples_per_second": 9100.0 + epoch,
                "bytes_sent_per_step": 812.0, "tau": 1.2e-2, "sparsity": 1e-3,
                "compute_s": 0.2, "mode": "sharing"}
        callbacks.on_epoch_end(epoch, logs)
    callbacks.on_train_end()

    scalars = read_scalars(tmp_path / "tb")
    train, validation = scalars["train"], scalars["validation"]
    assert train["epoch_loss"] == pytest.approx({0: 0.5, 1: 0.4})
    assert train["epoch_accuracy"] == pytest.approx({0: 0.8, 1: 0.85})
    assert train["epoch_samples_per_second"] == {0: 9100.0, 1: 9101.0}
    assert train["epoch_bytes_sent_per_step"] == {0: 812.0, 1: 812.0}
    assert validation == {"epoch_loss": pytest.approx({0: 0.6, 1: 0.5})}
    assert "epoch_mode" not in train  # not a number
    # global steps 50, 100, ..., 600: at most one per 100 steps
    assert sorted(train["batch_loss"]) == [50, 150, 250, 350, 450, 550]
    assert train["batch_loss"][250] == pytest.approx(1 / 250)
    assert "batch_global_step" not in train


def test_remote_uri_is_copied_at_train_end(tmp_path):
    fsspec = pytest.importorskip("fsspec")
    uri = "memory://sparkdl-tests/tensorboard/run1"
    callback = TensorBoardScalars(uri)
    history = _fit([callback], epochs=2)
    memory = fsspec.filesystem("memory")
    remote = sorted(memory.find("/sparkdl-tests/tensorboard/run1"))
    assert {os.path.basename(os.path.dirname(p)) for p in remote} == {"train", "validation"}
    for path in remote:  # read back through a local copy
        local = tmp_path / Path(path).parent.name / Path(path).name
        local.parent.mkdir(exist_ok=True)
        local.write_bytes(memory.cat_file(path))
    scalars = read_scalars(tmp_path)
    assert scalars["validation"]["epoch_accuracy"] == pytest.approx(
        dict(enumerate(history.history["val_accuracy"])), rel=1e-6)
    memory.rm("/sparkdl-tests", recursive=True)


def test_update_freq_must_be_positive():
    with pytest.raises(ConfigurationError, match="update_freq must be a positive integer"):
        TensorBoardScalars("/tmp/unused", update_freq=0)
