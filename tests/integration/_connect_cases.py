"""sparkdl on a real Spark Connect session (``SparkSession.builder.remote("local[2]")``).

Run in a process of its own by ``test_spark_connect.py``: a local Connect server wraps its
own SparkContext and switches pyspark's functions to Connect for the whole process, so it
cannot share a process with the classic session of the other tests.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator

import numpy as np
import pytest
from _log_capture import sparkdl_log

#: The Connect server's message limit in these cases (its default is 128 MiB).
MESSAGE_LIMIT = 4 << 20


@pytest.fixture(scope="module")
def connect() -> Iterator[object]:
    os.environ["PYSPARK_PYTHON"] = sys.executable
    # an ephemeral Connect port (the client reads it back from the local server only with
    # SPARK_TESTING set), so that concurrent runs do not collide on 15002
    os.environ["SPARK_TESTING"] = "1"
    from pyspark.sql import SparkSession

    session = (SparkSession.builder.remote("local[2]")
               .config("spark.connect.grpc.binding.port", "0")
               # deliberately low: a plan carrying a model would be refused (see
               # test_a_model_larger_than_a_connect_message_trains_and_predicts)
               .config("spark.connect.grpc.maxInboundMessageSize", str(MESSAGE_LIMIT))
               .config("spark.stage.maxConsecutiveAttempts", "2")
               .config("spark.sql.shuffle.partitions", "4").getOrCreate())
    from sparkdl.session import is_connect

    assert is_connect(session), type(session)
    yield session
    session.stop()


@pytest.fixture(scope="module")
def digits(connect, tmp_path_factory) -> dict:
    """The digits ETL run as the job's stage (``sparkdl etl``) on the Connect session."""
    from sparkdl import stages
    from sparkdl.config import load_config

    out = tmp_path_factory.mktemp("digits")
    config = load_config("sparkdl/conf/digits.yaml", [
        f"data.dir={out / 'data'}", f"output.dir={out / 'run'}", "data.options.num_files=4",
    ])
    return stages.run_etl(config, connect)


def _mlp(seed: int = 7):
    import keras

    from sparkdl.models import mlp

    keras.utils.set_random_seed(seed)
    model = mlp((8, 8, 1), 10, hidden=(32,))  # the digits' feature shape
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy",
                  metrics=["accuracy"])
    return model


@pytest.fixture(scope="module")
def trained(digits: dict):
    """A model trained in this process (not by Spark) on the train shards."""
    from sparkdl.data.reader import read_all

    x, y = read_all(digits["train"])
    model = _mlp()
    model.fit(x, y, epochs=3, batch_size=64, verbose=0)
    return model


def test_the_digits_etl_writes_its_shards(digits):
    from sparkdl.data.files import read_metadata

    train, test = read_metadata(digits["train"]), read_metadata(digits["test"])
    assert train.num_rows == digits["train_rows"] and test.num_rows == digits["test_rows"]
    assert train.num_rows + test.num_rows == 1797  # scikit-learn's digits
    assert train.normalizer and train.feature_shape == [8, 8, 1]


def test_evaluate_and_predict_match_keras_on_the_driver(connect, digits, trained):
    from sparkdl import DenseTrainingMaster, SparkModel
    from sparkdl.data.reader import read_all

    model = trained
    x, y = read_all(digits["test"])
    expected = np.argmax(model.predict(x, verbose=0), axis=1)
    spark_model = SparkModel(connect, model, DenseTrainingMaster(num_workers=2))

    evaluation = spark_model.evaluate(digits["test"])
    assert evaluation.count == len(y)
    assert evaluation.accuracy() == pytest.approx(float(np.mean(expected == y)))

    rows = spark_model.predict(digits["test"]).select("label", "prediction").collect()
    assert sorted((int(r["label"]), int(r["prediction"])) for r in rows) == \
        sorted(zip(y.tolist(), expected.tolist(), strict=True))


def test_evaluate_on_a_dataframe_reuses_its_shards(connect, digits, trained, tmp_path):
    from sparkdl import DenseTrainingMaster, SparkModel
    from sparkdl.data.files import read_metadata

    meta = read_metadata(digits["test"])
    df = connect.read.parquet(*[f"{digits['test']}/{f.path}" for f in meta.files])
    spark_model = SparkModel(connect, trained, DenseTrainingMaster(num_workers=2))
    store = str(tmp_path / "store")
    with sparkdl_log() as messages:
        first = spark_model.evaluate(df, store=store)
        again = spark_model.evaluate(df, store=store)
    assert first.count == again.count == meta.num_rows
    lines = [m for m in messages if "shards" in m]
    assert lines[0].startswith("writing shards") and lines[1].startswith("reusing shards"), lines


def test_a_keras_model_stage_transforms_in_a_pipeline_and_round_trips(connect, tmp_path):
    import keras
    from pyspark.ml import PipelineModel
    from pyspark.ml.feature import VectorAssembler

    from sparkdl.ml import KerasModel

    rows = [(float(i), float(i % 3)) for i in range(12)]
    df = connect.createDataFrame([(*r, int(r[0]) % 10) for r in rows], "a double, b double, y int")
    keras_input = VectorAssembler(inputCols=["a", "b"], outputCol="features")
    two = keras.Sequential([keras.Input((2,)), keras.layers.Dense(3, activation="softmax")])
    two.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    pipeline = PipelineModel(stages=[keras_input, KerasModel(two)])
    out = pipeline.transform(df).select("a", "b", "prediction", "probability").collect()
    assert len(out) == len(rows)
    x = np.array([[r["a"], r["b"]] for r in out], dtype=np.float32)
    expected = np.argmax(two.predict(x, verbose=0), axis=1)
    assert [int(r["prediction"]) for r in out] == expected.tolist()
    assert all(len(r["probability"]) == 3 for r in out)

    KerasModel(two).save(str(tmp_path / "stage"))
    loaded = KerasModel.load(str(tmp_path / "stage"))
    again = loaded.transform(keras_input.transform(df)).select("prediction").collect()
    assert [int(r["prediction"]) for r in again] == expected.tolist()


def test_predict_refuses_features_the_model_does_not_take(connect):
    """Issue 52, findings 2 and 6, on Connect: a width the first row shows is a DataError in
    predict() itself; a bad row further on fails the action in one line (it was 73 lines)."""
    import keras
    from pyspark.errors import PySparkException

    from sparkdl import DenseTrainingMaster, SparkModel
    from sparkdl.errors import DataError

    net = keras.Sequential([keras.Input((16,)), keras.layers.Dense(4, activation="softmax")])
    net.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    spark_model = SparkModel(connect, net, DenseTrainingMaster(num_workers=2))
    narrow = connect.createDataFrame([([1.0] * 8,)] * 4, "features array<float>")
    with pytest.raises(DataError, match=r"^features_col 'features': 8 values in the first row; "
                                        r"the model's input shape \(16,\) takes 16$"):
        spark_model.predict(narrow)
    rows = [([1.0] * 16,)] * 6 + [([1.0] * 5,)]
    out = spark_model.predict(connect.createDataFrame(rows, "features array<float>"))
    # the fixture's SPARK_TESTING turns the JVM stack trace in the client's errors on; a
    # user's session has both of these off
    traces = ("spark.sql.pyspark.jvmStacktrace.enabled",
              "spark.sql.connect.serverStacktrace.enabled")
    saved = {key: connect.conf.get(key, None) for key in traces}
    for key in traces:
        connect.conf.set(key, "false")
    try:
        with pytest.raises(PySparkException) as failed:
            out.collect()
    finally:
        for key, value in saved.items():
            if value is None:
                connect.conf.unset(key)
            else:
                connect.conf.set(key, value)
    message = str(failed.value).strip()
    assert len(message.splitlines()) == 1, message
    assert "features_col 'features' holds 5 values in a row; the model's input shape (16,) " \
        "takes 16" in message, message


def test_fit_on_a_dataframe_trains(connect, digits):
    from sparkdl import DenseTrainingMaster, SparkModel
    from sparkdl.data.files import read_metadata

    meta = read_metadata(digits["train"])
    df = connect.read.parquet(*[f"{digits['train']}/{f.path}" for f in meta.files])
    spark_model = SparkModel(connect, _mlp(), DenseTrainingMaster(num_workers=2,
                                                                   batch_size_per_worker=32))
    result = spark_model.fit(df, epochs=3)
    losses = result.history["loss"]
    assert len(losses) == 3 and losses[-1] < losses[0]
    assert spark_model.evaluate(digits["test"]).accuracy() > 0.5


def test_a_keras_estimator_pipeline_fits_and_transforms(connect):
    import keras
    from pyspark.ml import Pipeline
    from pyspark.ml.feature import StringIndexer, VectorAssembler

    from sparkdl.ml import KerasEstimator

    rows = [(float(i % 4), float(i % 4) * 2.0, ["a", "b"][i % 4 >= 2]) for i in range(64)]
    df = connect.createDataFrame(rows, "x double, z double, kind string")
    net = keras.Sequential([keras.Input((2,)), keras.layers.Dense(2, activation="softmax")])
    net.compile(optimizer=keras.optimizers.Adam(0.05), loss="sparse_categorical_crossentropy")
    pipeline = Pipeline(stages=[
        StringIndexer(inputCol="kind", outputCol="label"),
        VectorAssembler(inputCols=["x", "z"], outputCol="features"),
        KerasEstimator(model=net, epochs=40, batchSize=16,
                       trainingConfig={"mode": "dense", "num_workers": 2}),
    ])
    out = pipeline.fit(df).transform(df).select("label", "prediction").collect()
    assert len(out) == len(rows)
    assert np.mean([r["label"] == r["prediction"] for r in out]) > 0.9


def test_a_sharing_fit_keeps_replicas_identical_and_reports_failures_and_slots(connect, digits):
    """The barrier stage, the tasks' structured failure records and the slot check, all
    without a Spark context."""
    import keras

    from sparkdl import DenseTrainingMaster, SharedTrainingMaster, SparkModel
    from sparkdl.errors import ConfigurationError, TrainingError

    fit = SparkModel(connect, _mlp(), SharedTrainingMaster(num_workers=2)).fit(
        digits["train"], epochs=2, verbose=0)
    assert [w.rank for w in fit.workers] == [0, 1]
    assert fit.workers[0].checksum == fit.workers[1].checksum  # replicas identical
    assert fit.history["loss"][-1] < fit.history["loss"][0]

    broken = _mlp()
    broken.compile(optimizer=keras.optimizers.SGD(1e12), loss="sparse_categorical_crossentropy")
    with pytest.raises(TrainingError) as failed:
        SparkModel(connect, broken, DenseTrainingMaster(num_workers=2)).fit(
            digits["train"], epochs=2, verbose=0)
    error = str(failed.value)  # every attempt, rank, type and message, from the records
    assert "non-finite loss" in error and "attempt 0, rank" in error, error
    assert "TrainingError" in error and "attempt 1, rank" in error, error  # 2 stage attempts
    with pytest.raises(ConfigurationError, match="num_workers=3 but Spark has only 2"):
        SparkModel(connect, _mlp(), SharedTrainingMaster(num_workers=3)).fit(digits["train"])


def test_a_model_larger_than_a_connect_message_trains_and_predicts(connect, digits, tmp_path):
    """A 5.8 MB model on a server taking 4 MiB messages: the model travels through storage
    (the plans and result rows carry its URI), in fit, evaluate and predict."""
    import keras

    from sparkdl import DenseTrainingMaster, SparkModel
    from sparkdl.models import mlp
    from sparkdl.training.serialization import model_to_bytes

    keras.utils.set_random_seed(3)
    net = mlp((8, 8, 1), 10, hidden=(2048, 640))
    net.compile(optimizer="adam", loss="sparse_categorical_crossentropy",
                metrics=["accuracy"])
    assert len(model_to_bytes(net)) > MESSAGE_LIMIT
    spark_model = SparkModel(connect, net, DenseTrainingMaster(num_workers=2,
                                                               batch_size_per_worker=64))
    fit = spark_model.fit(digits["train"], epochs=1, verbose=0)
    assert fit.workers[0].checksum == fit.workers[1].checksum
    assert spark_model.evaluate(digits["test"]).accuracy() > 0.5
    rows = spark_model.predict(digits["test"]).select("prediction").limit(5).collect()
    assert len(rows) == 5


def test_a_custom_object_too_large_for_a_plan_is_one_error_before_any_task(connect, digits):
    """A loss closing over an 8 MB array: its task function would not fit the server's 4 MiB
    message. One error names the size, the largest custom object, the limit and the setting,
    before any task runs, and the server goes on serving."""
    import keras

    from sparkdl import DenseTrainingMaster, SparkModel
    from sparkdl.errors import ConfigurationError

    table = np.ones(2_000_000, np.float32)

    def heavy_loss(y_true, y_pred):
        loss = keras.losses.sparse_categorical_crossentropy(y_true, y_pred)
        return loss * float(table[0])

    model = _mlp()
    model.compile(optimizer="adam", loss=heavy_loss)
    spark_model = SparkModel(connect, model, DenseTrainingMaster(num_workers=2),
                             custom_objects={"heavy_loss": heavy_loss})
    pattern = (r"the task function Spark Connect would ship is 7\.\d MiB, more than 2\.0 MiB "
               r".*maxInboundMessageSize=4\.0 MiB\); the largest part is "
               r"custom_objects\['heavy_loss'\], 7\.\d MiB")
    with pytest.raises(ConfigurationError, match=r"fit\(\): " + pattern):
        spark_model.fit(digits["train"], epochs=1, verbose=0)
    with pytest.raises(ConfigurationError, match=r"evaluate\(\): " + pattern):
        spark_model.evaluate(digits["test"])
    assert connect.range(3).count() == 3
