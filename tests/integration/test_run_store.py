"""The run store's fingerprint on real Spark: reused only when provably the same data."""

from __future__ import annotations

import pandas as pd
import pytest
from _frame_fixtures import classifier as _classifier
from _log_capture import sparkdl_log

from sparkdl import DenseTrainingMaster, SparkModel
from sparkdl.data.store import fingerprint

pytestmark = pytest.mark.spark


def _csv(tmp_path, text, name="data.csv"):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_reader_options_are_part_of_a_file_scans_fingerprint(spark, tmp_path):
    csv = _csv(tmp_path, "1;2\n3;\n5;NA\n")
    schema = "a int, b int"

    def read(**options):
        return fingerprint(spark.read.schema(schema).options(**options).csv(csv))

    plain = read(sep=";")
    assert plain.reusable and read(sep=";").key == plain.key  # the same read: the same key
    for options in ({"sep": ";", "header": "true"}, {"sep": ","},
                    {"sep": ";", "mode": "DROPMALFORMED"}, {"sep": ";", "nullValue": "NA"}):
        assert read(**options).key != plain.key, options

    json = _csv(tmp_path, '{"a": 1}\n// note\n{"a": 2}\n', "data.json")
    strict = fingerprint(spark.read.schema("a int").json(json))
    lenient = fingerprint(spark.read.schema("a int").option("allowComments", "true").json(json))
    assert strict.key != lenient.key


def test_a_jdbc_table_is_never_reused_so_an_update_is_seen(spark):
    url = "jdbc:derby:memory:sparkdl_store_test;create=true"
    props = {"driver": "org.apache.derby.iapi.jdbc.AutoloadedDriver"}
    spark.createDataFrame([(1, 1.0), (2, 2.0)], "id int, x double").write.jdbc(
        url, "points", mode="overwrite", properties=props)
    table = spark.read.jdbc(url, "points", properties=props)
    before = fingerprint(table)
    assert not before.reusable and "JDBCRelation" in before.why

    # a test may reach the JVM: Spark has no public API for an UPDATE statement
    connection = spark.sparkContext._jvm.java.sql.DriverManager.getConnection(url)
    try:
        connection.createStatement().executeUpdate("UPDATE points SET \"x\" = \"x\" * 10")
    finally:
        connection.close()
    after = fingerprint(spark.read.jdbc(url, "points", properties=props))
    assert after.key != before.key and not after.reusable


def test_plans_with_python_functions_are_never_reused(spark):
    from pyspark.sql import functions as F
    from pyspark.sql.functions import pandas_udf, udf

    base = spark.range(8)
    builtin = fingerprint(base.select((F.col("id") + 1).alias("y")))
    assert builtin.reusable
    assert fingerprint(base.select((F.col("id") + 1).alias("y"))).key == builtin.key

    plus_one = udf(lambda v: v + 1, "long")
    plus_two = udf(lambda v: v + 2, "long")  # the same name in the plan: <lambda>
    offset = 1

    @pandas_udf("long")
    def shifted(v: pd.Series) -> pd.Series:
        return v + offset

    def batches(it):
        for frame in it:
            yield frame * offset

    frames = [base.select(plus_one("id")), base.select(plus_two("id")),
              base.select(shifted("id")), base.mapInPandas(batches, "id long")]
    prints = [fingerprint(frame) for frame in frames]
    offset = 2  # a closure over a changed variable: the same plan text
    prints.append(fingerprint(base.select(shifted("id"))))
    assert not any(p.reusable for p in prints)
    assert all("Python" in p.why for p in prints), [p.why for p in prints]
    assert len({p.key for p in prints}) == len(prints)


def test_spark_ml_transforms_are_proven_by_a_digest_of_their_output(spark):
    from pyspark.ml.feature import MinMaxScaler, VectorAssembler
    from pyspark.ml.functions import array_to_vector, vector_to_array
    from pyspark.sql import functions as F

    data = VectorAssembler(inputCols=["a"], outputCol="v").transform(
        spark.createDataFrame([(1.0,), (3.0,)], "a double"))
    narrow = MinMaxScaler(inputCol="v", outputCol="s").fit(data)
    wide = MinMaxScaler(inputCol="v", outputCol="s", max=10.0).fit(data)
    # the same plan text (UDF(v)): only the scalers' captured ranges differ
    prints = [fingerprint(narrow.transform(data)), fingerprint(wide.transform(data))]
    assert all(p.reusable and "digest" in p.why for p in prints), prints
    assert prints[0].key != prints[1].key
    assert fingerprint(narrow.transform(data)).key == prints[0].key  # transformed again

    vectors = spark.range(4).select(array_to_vector(F.array(F.col("id").cast("double"))).alias("v"))
    assembled = fingerprint(data)  # VectorAssembler: its output follows from its inputs
    assert assembled.reusable and fingerprint(data).key == assembled.key
    arrays = fingerprint(vectors.select(vector_to_array("v", "float32")))
    assert arrays.reusable, arrays.why
    assert fingerprint(vectors.select(vector_to_array("v", "float32"))).key == arrays.key


def test_local_rows_and_rdds_are_proven_by_a_digest_of_their_content(spark, tmp_path):
    local = spark.createDataFrame([(1.0,)], "x double")  # Python data held by the driver
    assert fingerprint(local).reusable and fingerprint(local).key == fingerprint(local).key
    assert fingerprint(spark.createDataFrame([(2.0,)], "x double")).key != fingerprint(local).key
    path = tmp_path / "lines.txt"
    path.write_text("1.0\n2.0\n")
    # a test may use an RDD: classic Spark's users have them
    read = spark.createDataFrame(spark.sparkContext.textFile(str(path)).map(lambda s: (float(s),)),
                                 "x double")
    before = fingerprint(read)
    assert before.reusable and "digest" in before.why, before.why
    path.write_text("1.0\n3.0\n")  # the file behind the RDD changed: the digest sees it
    assert fingerprint(read).key != before.key
    assert fingerprint(spark.range(3)).reusable


def test_a_refit_with_fixed_reader_options_writes_new_shards_and_says_why(spark, tmp_path):
    rows = "".join(f"{i % 5}.0,{i % 2}\n" for i in range(40))
    csv = _csv(tmp_path, rows)
    store = str(tmp_path / "store")
    spark_model = SparkModel(spark, _classifier(1, 2), DenseTrainingMaster(num_workers=2))

    def evaluate(header):
        df = spark.read.schema("x double, label int").option("header", header).csv(csv)
        return spark_model.evaluate(df, features_col=["x"], store=store).count

    with sparkdl_log() as messages:
        assert evaluate("true") == 39  # the first line taken for a header by mistake
        assert evaluate("false") == 40  # fixed: new shards, not the 39 rows again
        assert evaluate("false") == 40
    store_lines = [m for m in messages if "shards" in m]
    assert len(store_lines) == 3, messages
    assert store_lines[0].startswith("writing shards") and "no shards" in store_lines[0]
    assert store_lines[1].startswith("writing shards")
    assert store_lines[2].startswith("reusing shards") and "same plan" in store_lines[2]
