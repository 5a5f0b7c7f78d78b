"""fit as Keras's: History, callbacks on the driver, validation, exact compiled metrics."""

from __future__ import annotations

import csv

import keras
import numpy as np
import pytest

from sparkdl.data import read_all
from sparkdl.parallel import ParallelWrapper
from sparkdl.spark_model import SparkModel
from sparkdl.training.masters import DenseTrainingMaster, SharedTrainingMaster


class Recorder(keras.callbacks.Callback):
    """Records which hooks fired, with what."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple] = []

    def on_train_begin(self, logs=None):
        self.calls.append(("train_begin",))

    def on_epoch_begin(self, epoch, logs=None):
        self.calls.append(("epoch_begin", epoch))

    def on_train_batch_end(self, batch, logs=None):
        self.calls.append(("batch_end", batch, sorted(logs or {})))

    def on_epoch_end(self, epoch, logs=None):
        self.calls.append(("epoch_end", epoch, sorted(logs or {})))

    def on_test_end(self, logs=None):
        self.calls.append(("test_end", sorted(logs or {})))

    def on_train_end(self, logs=None):
        self.calls.append(("train_end", self.model.count_params()))


def _model(metrics=("accuracy",)):
    from sparkdl.models import mlp

    keras.utils.set_random_seed(11)
    model = mlp([8, 8, 1], 10, hidden=(64,))
    model.compile(optimizer=keras.optimizers.Adam(0.003),
                  loss="sparse_categorical_crossentropy", metrics=list(metrics))
    return model


def test_early_stopping_lr_schedule_csv_and_user_callbacks_on_spark(spark, digits_shards, tmp_path):
    recorder = Recorder()
    csv_path = tmp_path / "log.csv"
    callbacks = [
        # val_loss never improves by 10: patience 1 stops after the second epoch
        keras.callbacks.EarlyStopping(monitor="val_loss", patience=1, min_delta=10.0),
        keras.callbacks.LearningRateScheduler(lambda epoch, lr: 0.003 / (1 + epoch)),
        keras.callbacks.CSVLogger(str(csv_path)),
        recorder,
    ]
    spark_model = SparkModel(spark, _model(), SharedTrainingMaster(num_workers=2))
    fit = spark_model.fit(digits_shards["train"], epochs=6, verbose=2, callbacks=callbacks,
                          validation_data=digits_shards["test"], log_every_steps=5)

    assert isinstance(fit, keras.callbacks.History)
    assert fit.epoch == [0, 1] and fit.params["epochs"] == 6
    steps = fit.params["steps"]
    # every rank stopped after the same step, with the same weights
    assert fit.metrics["stopped_early"] and fit.metrics["steps"] == 2 * steps
    assert fit.metrics["replicas_identical"] is True
    assert fit.metrics["topology"] == "flat"  # cluster.topology auto, one host
    for key in ("loss", "accuracy", "val_loss", "val_accuracy", "samples_per_second",
                "bytes_sent_per_step", "tau", "sparsity", "compute_s", "learning_rate"):
        assert len(fit.history[key]) == 2, key
    np.testing.assert_allclose(fit.history["learning_rate"], [0.003, 0.0015], rtol=1e-6)
    # the workers' optimizer got the driver's rate: the returned model holds the last one
    assert float(spark_model.model.optimizer.learning_rate) == pytest.approx(0.0015, rel=1e-6)
    rows = list(csv.DictReader(csv_path.open()))
    assert [int(r["epoch"]) for r in rows] == [0, 1] and "val_accuracy" in rows[0]

    kinds = [call[0] for call in recorder.calls]
    assert kinds[0] == "train_begin" and kinds[-1] == "train_end"
    assert [c[1] for c in recorder.calls if c[0] == "epoch_begin"] == [0, 1]
    batches = [c for c in recorder.calls if c[0] == "batch_end"]
    assert len(batches) >= 2 * (steps // 5) - 1 and "loss" in batches[0][2]
    assert recorder.calls[-1][1] == spark_model.model.count_params()
    tests = [c for c in recorder.calls if c[0] == "test_end"]
    assert len(tests) == 2 and tests[0][1] == ["accuracy", "loss"]


def test_compiled_metrics_are_exact_against_single_process_evaluate(spark, digits_shards):
    metrics = ["accuracy", keras.metrics.SparseTopKCategoricalAccuracy(k=3, name="top3"),
               keras.metrics.SparseCategoricalCrossentropy(name="xent")]
    spark_model = SparkModel(spark, _model(metrics), DenseTrainingMaster(num_workers=2))
    fit = spark_model.fit(digits_shards["train"], epochs=2, verbose=0,
                          validation_data=digits_shards["test"])
    x, y = read_all(digits_shards["test"])
    single = spark_model.model.evaluate(x, y, batch_size=64, verbose=0, return_dict=True)
    for name in ("accuracy", "top3", "xent"):
        assert fit.history[f"val_{name}"][-1] == pytest.approx(single[name], abs=1e-6), name
    assert fit.history["val_loss"][-1] == pytest.approx(single["loss"], rel=1e-5)
    assert 0 < fit.history["top3"][-1] <= 1 and fit.metrics["replicas_identical"]


def test_parallel_wrapper_runs_the_same_callbacks_and_keeps_replicas_identical(
    digits_shards, tmp_path
):
    recorder = Recorder()
    schedule = keras.callbacks.LearningRateScheduler(lambda epoch, lr: 0.002 * 0.5**epoch)
    best = tmp_path / "best.keras"
    checkpoint = keras.callbacks.ModelCheckpoint(str(best), monitor="val_accuracy",
                                                 save_best_only=True, mode="max")
    board = keras.callbacks.TensorBoard(log_dir=str(tmp_path / "tb"))
    wrapper = ParallelWrapper(_model(), DenseTrainingMaster(num_workers=2), timeout_s=60)
    fit = wrapper.fit(digits_shards["train"], epochs=3, verbose=0,
                      validation_data=digits_shards["test"],
                      callbacks=[schedule, checkpoint, board, keras.callbacks.TerminateOnNaN(),
                                 recorder])
    assert fit.epoch == [0, 1, 2] and fit.metrics["replicas_identical"] is True
    np.testing.assert_allclose(fit.history["learning_rate"], [0.002, 0.001, 0.0005], rtol=1e-6)
    assert best.is_file()  # ModelCheckpoint saved the driver's copy (weights sent per epoch)
    saved = keras.models.load_model(best)
    x, y = read_all(digits_shards["test"])
    best_epoch = int(np.argmax(fit.history["val_accuracy"]))
    assert saved.evaluate(x, y, verbose=0, return_dict=True)["accuracy"] == pytest.approx(
        fit.history["val_accuracy"][best_epoch], abs=1e-6)
    assert [c[0] for c in recorder.calls].count("epoch_end") == 3
    assert _scalar_tags(tmp_path / "tb" / "train") >= {"epoch_loss", "epoch_accuracy"}
    assert "epoch_loss" in _scalar_tags(tmp_path / "tb" / "validation")


def _scalar_tags(log_dir) -> set[str]:
    import tensorflow as tf

    return {value.tag for path in log_dir.glob("events.out.tfevents.*")
            for event in tf.compat.v1.train.summary_iterator(str(path))
            for value in event.summary.value}


def test_bad_fit_arguments_are_one_clear_error(spark, digits_shards):
    from sparkdl.errors import ConfigurationError

    spark_model = SparkModel(spark, _model(), SharedTrainingMaster(num_workers=2))
    with pytest.raises(ConfigurationError, match=r"callbacks must be keras\.callbacks\.Callback"):
        spark_model.fit(digits_shards["train"], callbacks=[print])
    with pytest.raises(ConfigurationError, match=r"initial_epoch must be .* \[0, epochs=2\)"):
        spark_model.fit(digits_shards["train"], epochs=2, initial_epoch=2)
    with pytest.raises(ConfigurationError, match="verbose must be 0, 1, 2 or 'auto'"):
        spark_model.fit(digits_shards["train"], verbose=3)
    with pytest.raises(ConfigurationError, match="validation_data must be the URI"):
        spark_model.fit(digits_shards["train"], validation_data=(1, 2))


class EpochModels(keras.callbacks.Callback):
    """Records the driver model's optimizer step and weights at every epoch's end."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[int, list[np.ndarray]]] = []

    def on_epoch_end(self, epoch, logs=None):
        self.seen.append((int(self.model.optimizer.iterations.numpy()),
                          [w.copy() for w in self.model.get_weights()]))


def test_callbacks_get_rank_0s_model_as_a_file_and_the_files_are_removed(
    spark, digits_shards, tmp_path
):
    from sparkdl.models import mlp
    from sparkdl.training.driver.run_fit import _EVENT_BLOB_MAX

    keras.utils.set_random_seed(5)
    model = mlp([8, 8, 1], 10, hidden=(512, 512))
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    # more weights than an event may carry: they can reach the driver only as a file
    assert 4 * model.count_params() > _EVENT_BLOB_MAX
    epochs = EpochModels()
    store = tmp_path / "store"
    spark_model = SparkModel(spark, model, DenseTrainingMaster(num_workers=2), store=str(store))
    fit = spark_model.fit(digits_shards["train"], epochs=2, verbose=0, callbacks=[epochs])
    steps = fit.metrics["steps_per_epoch"]
    # the optimizer's state came with the weights, as the workers held them
    assert [iterations for iterations, _ in epochs.seen] == [steps, 2 * steps]
    assert any(not np.array_equal(a, b) for a, b in zip(epochs.seen[0][1], epochs.seen[1][1]))
    for seen, trained in zip(epochs.seen[-1][1], spark_model.model.get_weights()):
        np.testing.assert_array_equal(seen, trained)
    # the driver deleted each epoch's file once read: what is left is the fit's own
    left = sorted(p.name for p in (store / "_sparkdl_models").iterdir())
    assert len(left) <= 2, left  # the model trained from, and rank 0's trained model
