"""write_shards on a real local Spark: round trip, determinism, validation, atomicity."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from sparkdl.data import read_all, read_metadata, write_shards
from sparkdl.errors import ConfigurationError, DataError

pytestmark = pytest.mark.spark

SHAPE = [2, 3]


def _df(spark, n: int = 300, *, classes: int = 3, partitions: int = 2, dtype: str = "double"):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(n, math.prod(SHAPE)))
    x[:, 0] = np.arange(n)  # row id in element 0
    rows = [(r.tolist(), int(i % classes)) for i, r in enumerate(x)]
    return spark.createDataFrame(rows, f"features array<{dtype}>, label long").repartition(
        partitions
    ), x.astype(np.float32)


def _listing(path: Path) -> list[str]:
    return sorted(p.name for p in path.iterdir())


def test_round_trip(spark, tmp_path: Path) -> None:
    df, x = _df(spark)
    uri = f"file://{tmp_path}/train"
    meta = write_shards(df, uri, feature_shape=SHAPE, classes=["a", "b", "c"], num_files=3,
                        rows_per_group=32, extra={"note": "t"}, normalizer={"class_name": "X"})
    assert meta == read_metadata(uri)
    assert meta.num_rows == 300 and meta.num_classes == 3 and meta.label_shape == []
    assert [f.path for f in meta.files] == ["part-00000.parquet", "part-00001.parquet",
                                            "part-00002.parquet"]
    assert all(n <= 32 for f in meta.files for n in f.row_groups)
    assert all(n == 32 for f in meta.files for n in f.row_groups[:-1])
    assert meta.extra == {"note": "t"} and meta.normalizer == {"class_name": "X"}
    assert _listing(tmp_path / "train") == sorted([*(f.path for f in meta.files),
                                                   "_sparkdl.json"])
    assert _listing(tmp_path) == ["train"]  # no temporary directory left behind
    got_x, got_y = read_all(uri)
    assert got_x.shape == (300, *SHAPE) and got_y.dtype == np.int64
    order = np.argsort(got_x.reshape(300, -1)[:, 0])
    np.testing.assert_array_equal(got_x.reshape(300, -1)[order], x)
    np.testing.assert_array_equal(got_y[order], np.arange(300) % 3)


def test_deterministic_for_seed(spark, tmp_path: Path) -> None:
    df, _ = _df(spark, partitions=2)
    other, _ = _df(spark, partitions=5)
    kw = dict(feature_shape=SHAPE, classes=["a", "b", "c"], num_files=3, rows_per_group=40)
    m1 = write_shards(df, str(tmp_path / "a"), seed=3, **kw)
    m2 = write_shards(other, str(tmp_path / "b"), seed=3, **kw)
    write_shards(df, str(tmp_path / "c"), seed=4, **kw)
    assert m1.files == m2.files
    x1, y1 = read_all(str(tmp_path / "a"))
    x2, y2 = read_all(str(tmp_path / "b"))
    x3, _ = read_all(str(tmp_path / "c"))
    np.testing.assert_array_equal(x1, x2)
    np.testing.assert_array_equal(y1, y2)
    assert not np.array_equal(x1, x3)


def test_regression_labels(spark, tmp_path: Path) -> None:
    df = spark.createDataFrame([([float(i)] * 6, float(i) / 2) for i in range(20)],
                               "features array<float>, label double")
    meta = write_shards(df, str(tmp_path / "r"), feature_shape=SHAPE, label_kind="regression",
                        num_files=1)
    assert meta.label_shape == [1] and meta.classes == []
    x, y = read_all(str(tmp_path / "r"))
    assert y.shape == (20, 1) and y.dtype == np.float32
    np.testing.assert_array_equal(y[:, 0], x.reshape(20, -1)[:, 0] / 2)


@pytest.mark.parametrize(
    ("rows", "schema", "kwargs", "message"),
    [
        ([([1.0] * 5 + [float("nan")], 0), ([1.0] * 6, 1)], "features array<double>, label long",
         {}, r"column 'features' has NaN or infinite values in 1 of 2 rows"),
        ([([1.0] * 6, 0), ([1.0] * 6, 7)], "features array<double>, label long",
         {}, r"column 'label': 1 rows hold values outside the 3 classes \[0, 3\) \(bad values "
             r"from 7 to 7\)"),
        ([([1.0] * 6, 0), ([1.0] * 4, 1)], "features array<double>, label long",
         {}, r"1 of 2 rows do not have prod\(feature_shape\) = 6 values \(e.g. a row with 4\)"),
        ([([1.0] * 6, 0.5)], "features array<double>, label double",
         {}, r"outside the 3 classes"),
        ([([1.0] * 6, 0)], "features array<double>, target long",
         {}, r"DataFrame has no column 'label'"),
        ([([1.0] * 6, 0)], "features array<double>, label long",
         {"classes": []}, r"needs the class names"),
    ],
)
def test_bad_input_leaves_nothing(spark, tmp_path: Path, rows, schema, kwargs, message) -> None:
    df = spark.createDataFrame(rows, schema)
    uri = str(tmp_path / "out" / "train")
    args = {"feature_shape": SHAPE, "classes": ["a", "b", "c"], **kwargs}
    with pytest.raises((DataError, ConfigurationError), match=message):
        write_shards(df, uri, **args)
    assert not Path(uri).exists()
    assert not (tmp_path / "out").exists()


def test_empty_dataframe(spark, tmp_path: Path) -> None:
    df = spark.createDataFrame([], "features array<float>, label long")
    with pytest.raises(DataError, match="the DataFrame is empty"):
        write_shards(df, str(tmp_path / "e"), feature_shape=SHAPE, classes=["a"])
    assert _listing(tmp_path) == []


def test_failure_after_spark_write_cleans_up(spark, tmp_path: Path, monkeypatch) -> None:
    import sparkdl.data.writer as writer

    def broken(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(writer, "write_metadata", broken)
    df, _ = _df(spark, 50)
    with pytest.raises(DataError, match=r"writing shards to .*/train failed: disk full"):
        write_shards(df, str(tmp_path / "train"), feature_shape=SHAPE, classes=["a", "b", "c"])
    assert _listing(tmp_path) == []


def test_existing_uri(spark, tmp_path: Path) -> None:
    df, _ = _df(spark, 50)
    uri = str(tmp_path / "train")
    kw = dict(feature_shape=SHAPE, classes=["a", "b", "c"], num_files=2)
    write_shards(df, uri, **kw)
    with pytest.raises(DataError, match=f"{uri} already exists; pass overwrite=True"):
        write_shards(df, uri, **kw)
    small, _ = _df(spark, 20)
    meta = write_shards(small, uri, overwrite=True, **kw)
    assert read_metadata(uri).num_rows == meta.num_rows == 20
    assert _listing(tmp_path) == ["train"]


def test_a_sample_weight_column_round_trips_and_a_negative_weight_writes_nothing(
    spark, tmp_path: Path
) -> None:
    from pyspark.sql import functions as F

    df, _ = _df(spark, 60)
    weighted = df.withColumn("sample_weight", F.element_at("features", 1) * 0.25)
    uri = f"file://{tmp_path}/w"
    meta = write_shards(weighted, uri, feature_shape=SHAPE, classes=["a", "b", "c"],
                        num_files=2, sample_weight=True)
    assert meta.weight_column == "sample_weight" == read_metadata(uri).weight_column
    x, _, w = read_all(uri)
    np.testing.assert_array_equal(w, x.reshape(60, -1)[:, 0] * np.float32(0.25))
    negative = weighted.withColumn("sample_weight", F.col("sample_weight") - 1.0)
    with pytest.raises(DataError, match="column 'sample_weight': 4 of 60 rows hold a null, "
                       "NaN, infinite or negative sample weight"):
        write_shards(negative, f"file://{tmp_path}/bad", feature_shape=SHAPE,
                     classes=["a", "b", "c"], sample_weight=True)
    assert not (tmp_path / "bad").exists()
    with pytest.raises(DataError, match="DataFrame has no column 'sample_weight'"):
        write_shards(df, f"file://{tmp_path}/none", feature_shape=SHAPE,
                     classes=["a", "b", "c"], sample_weight=True)


def test_a_write_draws_a_bar_of_the_files_it_has_committed(spark, tmp_path: Path, capsys,
                                                           monkeypatch) -> None:
    from sparkdl.data import write_progress

    df, _ = _df(spark)
    kw = dict(feature_shape=SHAPE, classes=["a", "b", "c"], num_files=3)
    write_shards(df, str(tmp_path / "quiet"), **kw)  # not a terminal: no bar
    assert capsys.readouterr().out == ""
    monkeypatch.setattr(write_progress, "SHOW_AFTER_S", 0.0)  # even a short write draws it
    monkeypatch.setattr(write_progress, "POLL_S", 0.05)
    write_shards(df, str(tmp_path / "shown"), show_progress=True, **kw)
    drawn = capsys.readouterr().out
    assert drawn.endswith("\n") and drawn.count("\n") == 1
    last = drawn.rstrip("\n").split("\r")[-1]
    assert last.startswith(f"writing {tmp_path / 'shown'}: [") and " 3/3 files - " in last
