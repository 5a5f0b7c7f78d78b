"""Several named inputs and outputs (MultiDataSet, issue 12.5) on real local Spark: the
digits_split ETL writes two-input, two-output shards; a functional Keras model trains from them
in sharing and averaging modes and is evaluated per output, figures equal scikit-learn's."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.metrics import accuracy_score, mean_squared_error, r2_score, roc_auc_score

from sparkdl import ParameterAveragingTrainingMaster, SharedTrainingMaster, SparkModel
from sparkdl.data.files import read_metadata
from sparkdl.data.reader import read_all
from sparkdl.evaluation import Evaluation, RegressionEvaluation, ROCMultiClass

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def split_shards(spark, tmp_path_factory) -> dict:
    from sparkdl.pipelines import digits_split

    out = tmp_path_factory.mktemp("digits_split")
    return digits_split.run(spark, out.as_uri() + "/data", num_workers=2, rows_per_group=32)


def _two_in_two_out():  # type: ignore[no-untyped-def]
    import keras

    keras.utils.set_random_seed(3)
    top = keras.Input(shape=(4, 8, 1), name="top")
    bottom = keras.Input(shape=(4, 8, 1), name="bottom")
    merged = keras.layers.Concatenate()([keras.layers.Flatten()(top),
                                         keras.layers.Flatten()(bottom)])
    hidden = keras.layers.Dense(32, activation="relu")(merged)
    digit = keras.layers.Dense(10, activation="softmax", name="digit")(hidden)
    ink = keras.layers.Dense(1, name="ink")(hidden)
    model = keras.Model({"top": top, "bottom": bottom}, {"digit": digit, "ink": ink})
    model.compile(optimizer=keras.optimizers.Adam(0.01),
                  loss={"digit": "sparse_categorical_crossentropy", "ink": "mse"})
    return model


def test_etl_writes_named_columns_and_readers_yield_dicts(split_shards):
    meta = read_metadata(split_shards["train"])
    assert meta.format_version == 2 and meta.multi
    assert [(t.name, t.shape, t.kind) for t in meta.inputs] == [
        ("top", [4, 8, 1], "features"), ("bottom", [4, 8, 1], "features")]
    assert [(t.name, t.kind) for t in meta.outputs] == [("digit", "class"), ("ink", "regression")]
    x, y = read_all(split_shards["test"])
    assert set(x) == {"top", "bottom"} and set(y) == {"digit", "ink"}
    assert x["top"].shape == (split_shards["test_rows"], 4, 8, 1)
    assert y["digit"].dtype == np.int64 and set(np.unique(y["digit"])) <= set(range(10))
    whole = np.concatenate([x["top"], x["bottom"]], axis=1).reshape(len(x["top"]), -1)
    np.testing.assert_allclose(y["ink"][:, 0], whole.mean(axis=1), rtol=1e-5)


@pytest.mark.parametrize(
    "master",
    [SharedTrainingMaster(batch_size_per_worker=32, num_workers=2),
     ParameterAveragingTrainingMaster(batch_size_per_worker=32, num_workers=2,
                                      averaging_frequency=3)],
    ids=["sharing", "averaging"],
)
def test_two_input_two_output_model_trains_and_evaluates_per_output(spark, split_shards, master,
                                                                    capsys):
    spark_model = SparkModel(spark, _two_in_two_out(), master)
    fit = spark_model.fit(split_shards["train"], epochs=2)
    first, second = (w.checksum for w in fit.workers)
    assert first == second  # replicas stay bit-identical
    losses = fit.history["loss"]
    assert all(np.isfinite(losses)) and losses[-1] < losses[0], losses

    capsys.readouterr()
    result = spark_model.evaluate(  # a bar of the rows of two named inputs
        split_shards["test"], evaluations={"digit": ["classification", "roc"]}, verbose=1
    )
    rows = split_shards["test_rows"]
    assert f"{rows}/{rows}" in capsys.readouterr().out
    digit, roc = result["digit"]
    (ink,) = result["ink"]  # the regression output gets its default evaluation
    assert isinstance(digit, Evaluation) and isinstance(roc, ROCMultiClass)
    assert isinstance(ink, RegressionEvaluation)
    x, y = read_all(split_shards["test"])
    pred = spark_model.model.predict(x, verbose=0)
    assert digit.count == split_shards["test_rows"]
    assert digit.accuracy() == pytest.approx(accuracy_score(y["digit"],
                                                            pred["digit"].argmax(axis=1)))
    assert digit.accuracy() > 0.3, digit.stats()
    assert roc.summary()["macro_auroc"] == pytest.approx(
        roc_auc_score(y["digit"], pred["digit"], multi_class="ovr"), abs=1e-6)
    assert ink.mse()[0] == pytest.approx(mean_squared_error(y["ink"], pred["ink"]), rel=1e-4)
    assert ink.r2()[0] == pytest.approx(r2_score(y["ink"], pred["ink"]), abs=1e-4)


@pytest.mark.slow  # ETL, train and evaluate stages in a row: about a minute on an idle machine
def test_digits_split_conf_runs_every_stage(spark, tmp_path):
    from pathlib import Path

    from sparkdl.config import load_config
    from sparkdl.stages import run_etl, run_evaluate, run_train

    conf = Path(__file__).resolve().parents[2] / "conf" / "digits_split.yaml"
    config = load_config(conf, [f"data.dir={tmp_path / 'data'}",
                                f"output.dir={tmp_path / 'run'}", "training.epochs=2"])
    run_etl(config, spark)
    run_train(config, spark)
    metrics = run_evaluate(config, spark)
    assert 0.0 <= metrics["test_digit_accuracy"] <= 1.0
    assert np.isfinite(metrics["test_ink_mse"])
    assert "<td>ink</td>" in (tmp_path / "run" / "report.html").read_text()


def _check_predictions(model, rows, top: str, bottom: str) -> None:  # type: ignore[no-untyped-def]
    x = {"top": np.array([r[top] for r in rows], np.float32).reshape(-1, 4, 8, 1),
         "bottom": np.array([r[bottom] for r in rows], np.float32).reshape(-1, 4, 8, 1)}
    expected = model.predict(x, verbose=0)
    probability = np.array([r["probability_digit"].toArray() for r in rows])
    np.testing.assert_allclose(probability, expected["digit"], atol=1e-5)
    assert [r["prediction_digit"] for r in rows] == list(expected["digit"].argmax(axis=1))
    np.testing.assert_allclose([r["prediction_ink"] for r in rows], expected["ink"][:, 0],
                               rtol=1e-4, atol=1e-5)


def test_predict_gives_a_column_per_output_for_multi_io_shards_and_dataframes(
    spark, split_shards
):
    from pyspark.sql import functions as F

    spark_model = SparkModel(spark, _two_in_two_out(), SharedTrainingMaster(num_workers=2))
    out = spark_model.predict(split_shards["test"], batch_size=50)
    assert {"prediction_digit", "probability_digit", "prediction_ink"} <= set(out.columns)
    assert "probability_ink" not in out.columns  # a regression output has no probabilities
    rows = out.collect()
    assert len(rows) == split_shards["test_rows"]
    _check_predictions(spark_model.model, rows, "top", "bottom")

    df = spark.read.parquet(split_shards["test"]).select(
        F.col("top").alias("upper"), F.col("bottom").alias("lower"))
    rows = spark_model.predict(df, features_col={"top": "upper", "bottom": "lower"}).collect()
    assert len(rows) == split_shards["test_rows"]
    _check_predictions(spark_model.model, rows, "upper", "lower")
    with pytest.raises(Exception, match="input 'bottom'"):
        spark_model.predict(df, features_col={"top": "upper"})
