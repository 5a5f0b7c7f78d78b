"""SparkModel on DataFrames: fit / evaluate / predict through the run store, real Spark + TF."""

from __future__ import annotations

import numpy as np
import pytest
from _frame_fixtures import classifier as _classifier
from _frame_fixtures import iris_frame
from _frame_fixtures import regressor as _regressor

from sparkdl import DenseTrainingMaster, SparkModel
from sparkdl.errors import ConfigurationError, DataError

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def iris(spark):
    return iris_frame(spark)


def _store_entries(store):
    """The store's shard entries (not its leases, nor the model files of its fits)."""
    from pathlib import Path

    from sparkdl.training.model_files import MODELS_DIR

    return sorted(p.name for p in Path(store).iterdir()
                  if not p.name.startswith(".") and p.name != MODELS_DIR)


def test_fit_on_columns_with_string_labels_reuses_its_shards(spark, iris, tmp_path):
    store = str(tmp_path / "store")
    spark_model = SparkModel(spark, _classifier(4, 3),
                             DenseTrainingMaster(batch_size_per_worker=16, num_workers=2))
    history = spark_model.fit(iris, epochs=3, features_col=["a", "b", "c", "d"],
                              label_col="species", store=store)
    assert history.history["loss"][-1] < history.history["loss"][0]
    assert spark_model.label_spec.classes == ["setosa", "versicolor", "virginica"]
    written = _store_entries(store)
    assert len(written) == 1

    evaluation = spark_model.evaluate(iris, features_col=["a", "b", "c", "d"],
                                      label_col="species", store=store)
    assert evaluation.count == 150 and evaluation.accuracy() > 0.6, evaluation.stats()
    assert _store_entries(store) == written  # the same DataFrame: the same shards

    predictions = spark_model.predict(iris, features_col=["a", "b", "c", "d"])
    assert dict(predictions.dtypes)["prediction"] == "double"
    assert dict(predictions.dtypes)["probability"] == "vector"
    rows = predictions.select("prediction", "probability", "species").collect()
    probabilities = np.array([r.probability.toArray() for r in rows])
    np.testing.assert_allclose(probabilities.sum(axis=1), 1.0, rtol=1e-5)
    assert [r.prediction for r in rows] == probabilities.argmax(axis=1).tolist()

    from sparkdl.data.store import open_store

    open_store(store).cleanup()  # what the process does at exit
    assert _store_entries(store) == []


def test_fit_on_a_vector_column_keeps_shards_when_asked(spark, iris, tmp_path):
    from pyspark.ml.feature import StringIndexer, VectorAssembler

    indexed = StringIndexer(inputCol="species", outputCol="label").fit(iris).transform(iris)
    df = VectorAssembler(inputCols=["a", "b", "c", "d"], outputCol="features").transform(indexed)
    store = str(tmp_path / "kept")
    spark_model = SparkModel(spark, _classifier(4, 3),
                             DenseTrainingMaster(batch_size_per_worker=16, num_workers=2))
    spark_model.fit(df, epochs=1, store=store, keep_shards=True)
    # the indexer's labels (Spark ML metadata) name the classes
    assert sorted(spark_model.label_spec.classes) == ["setosa", "versicolor", "virginica"]
    from sparkdl.data.store import open_store

    open_store(store, keep=True).cleanup()
    assert len(_store_entries(store)) == 1


def test_regression_fits_from_a_dataframe_and_predicts_its_output_vector(spark, tmp_path):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(256, 3))
    y = np.stack([x @ [1.0, -2.0, 0.5], x @ [0.3, 0.3, -1.0]], axis=1)
    rows = [(xi.tolist(), yi.tolist()) for xi, yi in zip(x, y, strict=True)]
    df = spark.createDataFrame(rows, "features array<double>, target array<double>")
    spark_model = SparkModel(spark, _regressor(3, 2),
                             DenseTrainingMaster(batch_size_per_worker=32, num_workers=2))
    history = spark_model.fit(df, epochs=4, label_col="target", store=str(tmp_path / "s"))
    assert spark_model.label_spec.kind == "regression"
    assert history.history["loss"][-1] < history.history["loss"][0]

    predictions = spark_model.predict(df)
    assert dict(predictions.dtypes)["prediction"] == "vector"
    assert "probability" not in predictions.columns
    got = np.array([r.prediction.toArray() for r in predictions.select("prediction").collect()])
    assert got.shape == (256, 2)
    expected = spark_model.model.predict(x.astype(np.float32), verbose=0)
    np.testing.assert_allclose(np.sort(got, axis=0), np.sort(expected, axis=0), rtol=1e-4,
                               atol=1e-5)

    one = spark.createDataFrame([(1.0, 2.0, 3.0)], "a double, b double, c double")
    single = SparkModel(spark, _regressor(3, 1), DenseTrainingMaster())
    assert dict(single.predict(one, features_col=["a", "b", "c"]).dtypes)["prediction"] == (
        "double"
    )


def test_wrong_arguments_say_what_is_accepted(spark, iris, tmp_path):
    spark_model = SparkModel(spark, _classifier(4, 3), DenseTrainingMaster())
    with pytest.raises(ConfigurationError, match="takes a Spark DataFrame or the URI"):
        spark_model.fit(iris.toPandas(), epochs=1)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="takes a Spark DataFrame or the URI"):
        spark_model.predict(42)  # type: ignore[arg-type]
    with pytest.raises(DataError, match="has no column 'nope'"):
        spark_model.fit(iris, features_col="nope", label_col="species", store=str(tmp_path))
    with pytest.raises(DataError, match="accepted: a Spark ML vector column"):
        spark_model.fit(iris, features_col="species", label_col="species", store=str(tmp_path))
    with pytest.raises(ConfigurationError, match="label_kind must be"):
        spark_model.fit(iris, features_col=["a", "b"], label_col="species", label_kind="x")
    two_class = SparkModel(spark, _classifier(4, 2), DenseTrainingMaster())
    with pytest.raises(ConfigurationError, match=r"has 3 classes .* the model outputs 2"):
        two_class.fit(iris, features_col=["a", "b", "c", "d"], label_col="species",
                      store=str(tmp_path))
    assert _store_entries(tmp_path) == []  # nothing half-written


def test_fingerprint_follows_the_plan_and_the_input_files(spark, tmp_path):
    from sparkdl.data.store import fingerprint

    path = str(tmp_path / "input.parquet")
    spark.range(20).selectExpr("id", "id * 2.0 AS x").write.parquet(path)
    first = fingerprint(spark.read.parquet(path).select("x"))
    assert fingerprint(spark.read.parquet(path).select("x")) == first  # rebuilt: same
    assert fingerprint(spark.read.parquet(path).select("id")) != first  # another plan
    assert fingerprint(spark.read.parquet(path).select("x"), {"k": 1}) != first  # options
    spark.range(21).selectExpr("id", "id * 2.0 AS x").write.mode("overwrite").parquet(path)
    assert fingerprint(spark.read.parquet(path).select("x")) != first  # new files

    local = spark.createDataFrame([(1.0,)], "x double")
    assert fingerprint(local) == fingerprint(local)
    assert fingerprint(local) == fingerprint(spark.createDataFrame([(1.0,)], "x double"))
    assert fingerprint(local) != fingerprint(spark.createDataFrame([(2.0,)], "x double"))



def _python_udf_division(frame):
    """The user's own bad column: a Python UDF dividing by zero on every row."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import DoubleType

    divide = F.udf(lambda a, zero: a / zero, DoubleType())
    return frame.withColumn("a", divide(F.col("a"), F.col("a") * 0))


def _sql_division(frame):
    """The same in SQL: ANSI mode (Spark 4's default) raises DIVIDE_BY_ZERO."""
    from pyspark.sql import functions as F

    return frame.withColumn("a", F.col("a") / (F.col("a") * 0))


@pytest.mark.parametrize(("make_bad", "cause"), [
    (_python_udf_division, "ZeroDivisionError: float division by zero"),
    (_sql_division, "[DIVIDE_BY_ZERO] Division by zero"),
], ids=["python-udf", "sql"])
def test_a_failure_inside_the_users_dataframe_is_one_data_error_naming_its_cause(
        spark, iris, tmp_path, make_bad, cause):
    if make_bad is _sql_division and spark.conf.get("spark.sql.ansi.enabled") != "true":
        pytest.skip("ANSI mode is off: SQL division by zero is NULL, not an error")
    store = tmp_path / "store"
    spark_model = SparkModel(spark, _classifier(4, 3), DenseTrainingMaster())
    with pytest.raises(DataError) as raised:
        spark_model.fit(make_bad(iris), features_col=["a", "b", "c", "d"], label_col="species",
                        store=str(store), epochs=1)
    message = str(raised.value)
    assert message.startswith("fit(): the DataFrame failed on Spark: "), message
    assert cause in message, message
    assert "Traceback" not in message and "py4j" not in message.lower(), message
    assert len(message.splitlines()) == 1, message
    assert raised.value.__cause__ is None and raised.value.__suppress_context__
    assert not store.exists() or _store_entries(store) == []  # nothing half-written


@pytest.mark.slow
def test_a_sample_weight_column_weights_the_spark_fit_and_its_validation(spark, iris, tmp_path):
    from pyspark.sql import functions as F

    from sparkdl.data.reader import read_all

    # virginica rows weigh nothing: the model never learns to predict them
    weighted = iris.withColumn("w", F.when(F.col("species") == "virginica", 0.0).otherwise(1.5))
    features = ["a", "b", "c", "d"]
    spark_model = SparkModel(spark, _classifier(4, 3),
                             DenseTrainingMaster(batch_size_per_worker=16, num_workers=2))
    history = spark_model.fit(weighted, epochs=4, features_col=features, label_col="species",
                              sample_weight_col="w", validation_data=weighted,
                              store=str(tmp_path / "store"), keep_shards=True)
    shards = next(p for p in (tmp_path / "store").iterdir() if not p.name.startswith("."))
    x, y, w = read_all(str(shards))
    assert sorted(set(w.tolist())) == [0.0, 1.5]
    model = spark_model.model
    expected = model.evaluate(x, y, sample_weight=w, batch_size=256, verbose=0)
    np.testing.assert_allclose(history.history["val_loss"][-1], expected, rtol=1e-4)
    virginica = spark_model.label_spec.classes.index("virginica")
    probabilities = model.predict(x[y == virginica], verbose=0)
    assert probabilities[:, virginica].mean() < 0.2
    with pytest.raises(DataError, match="sample_weight_col 'nope' is not a column"):
        spark_model.fit(weighted, features_col=features, label_col="species",
                        sample_weight_col="nope", store=str(tmp_path / "store"))
