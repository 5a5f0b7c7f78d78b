"""The models DL4J's examples use, trained on real local Spark (issue 14.4): the LeNet of
``conf/mnist.yaml`` on IDX data through the mnist pipeline, and a functional (non-Sequential)
Keras model in sharing and averaging modes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from sparkdl import ParameterAveragingTrainingMaster, SharedTrainingMaster, SparkModel
from sparkdl.config import load_config
from sparkdl.data.files import read_metadata
from sparkdl.etl.samples import write_mnist_sample
from sparkdl.models import build_model

pytestmark = pytest.mark.spark

REPO = Path(__file__).resolve().parents[2]


def _trained_identically(fit) -> None:  # type: ignore[no-untyped-def]
    checksums = [w.checksum for w in fit.workers]
    assert len(checksums) == 2 and checksums[0] == checksums[1], checksums
    assert fit.metrics["replicas_identical"] is True
    losses = fit.history["loss"]
    assert all(np.isfinite(losses)) and losses[-1] < losses[0], losses


@pytest.mark.slow  # the mnist ETL plus LeNet on 2 cores: about 2 minutes
def test_lenet_of_the_mnist_conf_trains_on_idx_data(spark, tmp_path):
    from sparkdl.pipelines import mnist

    conf = load_config(REPO / "conf" / "mnist.yaml")
    assert conf.model.name == "lenet"
    idx = write_mnist_sample(str(tmp_path / "idx"), n_train=256, n_test=64)
    shards = mnist.run(spark, (tmp_path / "data").as_uri(), path=idx, num_workers=2,
                       num_files=2, rows_per_group=32)
    meta = read_metadata(shards["train"])
    assert tuple(meta.feature_shape) == (28, 28, 1)
    import keras

    keras.utils.set_random_seed(1)
    model = build_model(conf.model, meta.feature_shape, meta.num_classes)
    assert [layer.__class__.__name__ for layer in model.layers][:2] == ["Conv2D", "MaxPooling2D"]
    tm = SharedTrainingMaster(batch_size_per_worker=16, num_workers=2)
    fit = SparkModel(spark, model, tm).fit(shards["train"], epochs=3)
    _trained_identically(fit)
    assert fit.metrics["steps"] == 3 * fit.metrics["steps_per_epoch"] >= 3 * 7


def _functional_model(input_shape, num_classes: int):  # type: ignore[no-untyped-def]
    """Two branches over the same input, concatenated: not expressible as a Sequential."""
    import keras

    keras.utils.set_random_seed(5)
    inputs = keras.Input(shape=tuple(input_shape), name="pixels")
    flat = keras.layers.Flatten()(inputs)
    wide = keras.layers.Dense(32, activation="relu", name="wide")(flat)
    deep = keras.layers.Dense(32, activation="relu", name="deep_1")(flat)
    deep = keras.layers.Dense(16, activation="relu", name="deep_2")(deep)
    merged = keras.layers.Concatenate()([wide, deep])
    outputs = keras.layers.Dense(num_classes, activation="softmax", name="classes")(merged)
    model = keras.Model(inputs, outputs, name="two_branch")
    model.compile(optimizer=keras.optimizers.Adam(0.005), loss="sparse_categorical_crossentropy")
    return model


@pytest.mark.parametrize(
    "master",
    [
        SharedTrainingMaster(batch_size_per_worker=32, num_workers=2),
        ParameterAveragingTrainingMaster(batch_size_per_worker=32, num_workers=2,
                                         averaging_frequency=4),
    ],
    ids=["sharing", "averaging"],
)
def test_functional_model_trains(spark, digits_shards, master):
    import keras

    meta = read_metadata(digits_shards["train"])
    model = _functional_model(meta.feature_shape, meta.num_classes)
    assert not isinstance(model, keras.Sequential)
    spark_model = SparkModel(spark, model, master)
    fit = spark_model.fit(digits_shards["train"], epochs=3)
    _trained_identically(fit)
    trained = spark_model.model
    assert not isinstance(trained, keras.Sequential)
    assert [layer.name for layer in trained.layers] == [layer.name for layer in model.layers]
    evaluation = spark_model.evaluate(digits_shards["test"])
    assert evaluation.count == digits_shards["test_rows"]
    assert evaluation.accuracy() > 0.5, evaluation.stats()
