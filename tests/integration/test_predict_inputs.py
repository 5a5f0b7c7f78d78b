"""``SparkModel.predict`` and ``evaluate`` on DataFrames whose features the model cannot take
(issue 52, findings 2 and 6): a width the model's input shape does not have, null features,
NaN. Each fails in one line naming the column, the expected and the found shape; nothing is
predicted silently wrong. A width the schema or the first row shows fails in ``predict()``
itself, before Spark runs the model; a bad row further on fails the action that computes it
in one line (SQL ``raise_error``, no Python worker traceback)."""

from __future__ import annotations

import pytest

from sparkdl.errors import DataError

pytestmark = pytest.mark.spark

WIDTH, CLASSES = 16, 4


@pytest.fixture(scope="module")
def spark_model(spark):
    import keras

    from sparkdl import DenseTrainingMaster, SparkModel

    keras.utils.set_random_seed(3)
    model = keras.Sequential([keras.Input((WIDTH,)),
                              keras.layers.Dense(CLASSES, activation="softmax")])
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    return SparkModel(spark, model, DenseTrainingMaster(num_workers=2))


def _frame(spark, widths: list[int | None], *, nan_row: int | None = None):
    """One row per entry of ``widths``: an ``array<float>`` of that many values (None: null)."""
    rows = []
    for i, width in enumerate(widths):
        values = None if width is None else [float(i % 3)] * width
        if values is not None and i == nan_row:
            values[1] = float("nan")
        rows.append((values, i % CLASSES))
    return spark.createDataFrame(rows, "features array<float>, label long")


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip()
    assert len(text.splitlines()) == 1, text
    return text


@pytest.mark.parametrize("width", [8, 32])
def test_predict_refuses_a_width_the_model_does_not_take_before_the_model_runs(
        spark, spark_model, width):
    df = _frame(spark, [width] * 64)
    with pytest.raises(DataError) as refused:
        spark_model.predict(df)  # not an action: refused in predict() itself
    message = _one_line(refused.value)
    assert "features_col 'features'" in message, message
    assert f"{width} values" in message and "(16,)" in message, message


def test_predict_refuses_columns_and_vectors_of_the_wrong_width_from_the_schema(
        spark, spark_model):
    from pyspark.ml.feature import VectorAssembler

    df = spark.createDataFrame([(1.0, 2.0, 0)], "a double, b double, label long")
    with pytest.raises(DataError, match=r"features_col \['a', 'b'\]: 2 values per row; the "
                                        r"model's input shape \(16,\) takes 16"):
        spark_model.predict(df, features_col=["a", "b"])
    vectors = VectorAssembler(inputCols=["a", "b"], outputCol="v").transform(df)
    with pytest.raises(DataError, match=r"features_col 'v': 2 values per row; the model's "
                                        r"input shape \(16,\) takes 16"):
        spark_model.predict(vectors, features_col="v")


def test_predict_fails_on_a_bad_row_in_one_line_naming_the_column_and_shapes(
        spark, spark_model):
    """Issue 52's finding 6: a 5-wide row among 16-wide ones ended in a 21-line
    ``PythonException``, its cause only in the executor's log."""
    widths: list[int | None] = [WIDTH] * 40
    widths[30] = 5
    from pyspark.errors import PySparkException

    out = spark_model.predict(_frame(spark, widths))  # the first row is right
    with pytest.raises(PySparkException) as failed:  # the user's own action raises
        out.collect()
    message = _one_line(failed.value)
    assert "features_col 'features' holds 5 values in a row; the model's input shape (16,) " \
        "takes 16" in message, message
    assert "Traceback" not in message and "Python worker" not in message, message


@pytest.mark.parametrize("case", ["null", "nan"])
def test_each_row_is_checked_where_spark_computes_it(spark, case):
    """The row checks run in the JVM (SQL ``raise_error``), before the model's Python UDF
    sees the row; sparkdl's own actions turn the marked line into a :class:`DataError`."""
    from sparkdl.data.frames import checked_features_column
    from sparkdl.data.spark_errors import dataframe_errors

    widths: list[int | None] = [3] * 6
    widths[4] = None if case == "null" else 3
    df = _frame(spark, widths, nan_row=4 if case == "nan" else None)
    column = checked_features_column(df, "features", [3])
    with pytest.raises(DataError) as failed, dataframe_errors("predict()"):
        df.select(column).collect()
    message = _one_line(failed.value)
    expected = {"null": "features_col 'features' is null in a row; the model's input shape "
                        "(3,) takes 3 values",
                "nan": "features_col 'features' has null, NaN or infinite values in a row; "
                       "the model takes 3 finite values (input shape (3,))"}
    assert message == expected[case]


def test_evaluate_refuses_the_same_frames_in_one_data_error(spark, spark_model, tmp_path):
    """``evaluate`` writes a DataFrame as shards, whose writer checks every row as ``fit``'s
    does (and a width the schema shows before that: see the test above)."""
    widths: list[int | None] = [WIDTH] * 40
    widths[30] = 8
    with pytest.raises(DataError) as refused:
        spark_model.evaluate(_frame(spark, widths), store=str(tmp_path / "store"))
    message = _one_line(refused.value)
    assert "1 of 40 rows do not have prod(feature_shape) = 16 values (e.g. a row with 8)" \
        in message, message
    df = spark.createDataFrame([(1.0, 2.0, 0)], "a double, b double, label long")
    with pytest.raises(DataError, match=r"features_col \['a', 'b'\]: 2 values per row; the "
                                        r"model's input shape \(16,\) takes 16"):
        spark_model.evaluate(df, features_col=["a", "b"], store=str(tmp_path / "store"))


def test_a_streaming_dataframe_is_checked_row_by_row_only(spark):
    """No first-row job on a stream (Spark refuses a batch action on it)."""
    from pyspark.sql import functions as F

    from sparkdl.data.frames import checked_features_column

    stream = spark.readStream.format("rate").load().select(
        F.array(F.col("value").cast("float")).alias("features"))
    assert stream.isStreaming
    checked_features_column(stream, "features", [3])  # no error: the rows fail as computed


def test_a_multi_input_model_names_the_input_whose_column_has_the_wrong_width(spark):
    import keras

    from sparkdl import DenseTrainingMaster, SparkModel

    left, right = keras.Input((3,), name="left"), keras.Input((4,), name="right")
    joined = keras.layers.Concatenate()([left, right])
    net = keras.Model([left, right], keras.layers.Dense(2, activation="softmax")(joined))
    net.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    spark_model = SparkModel(spark, net, DenseTrainingMaster(num_workers=2))
    df = spark.createDataFrame([([1.0] * 3, [1.0] * 2)], "a array<float>, b array<float>")
    with pytest.raises(DataError, match=r"^features_col 'b' \(input 'right'\): 2 values in the "
                                        r"first row; the model's input shape \(4,\) takes 4$"):
        spark_model.predict(df, features_col={"left": "a", "right": "b"})
