"""Bad data, each one clear error naming the file, column or value, and nothing half-written."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sparkdl.data import plan_slices, read_metadata, write_shards
from sparkdl.errors import ConfigurationError, DataError

pytestmark = pytest.mark.spark

SHAPE = [4]


def _shards(spark, tmp_path: Path, n: int = 64, **kw) -> str:
    rows = [([float(i), 1.0, 2.0, 3.0], i % 2) for i in range(n)]
    df = spark.createDataFrame(rows, "features array<float>, label long")
    uri = f"file://{tmp_path}/train"
    write_shards(df, uri, feature_shape=SHAPE, classes=["a", "b"], **{"num_files": 2, **kw})
    return uri


def test_corrupt_parquet_is_found_before_training(spark, tmp_path: Path) -> None:
    uri = _shards(spark, tmp_path)
    (tmp_path / "train" / "part-00001.parquet").write_bytes(b"PAR1 garbage PAR1")
    with pytest.raises(DataError, match=r"shard file .*/train/part-00001\.parquet is not a "
                                        r"readable Parquet file"):
        read_metadata(uri)


def test_listed_file_missing(spark, tmp_path: Path, make_mlp) -> None:
    from sparkdl import SharedTrainingMaster, SparkModel

    uri = _shards(spark, tmp_path)
    (tmp_path / "train" / "part-00000.parquet").unlink()
    model = SparkModel(spark, make_mlp(SHAPE, 2), SharedTrainingMaster(batch_size_per_worker=4))
    with pytest.raises(DataError, match=r"shard file .*/train/part-00000\.parquet listed in "
                                        r"_sparkdl\.json does not exist"):
        model.fit(uri)


def test_schema_drift_between_files(spark, tmp_path: Path) -> None:
    uri = _shards(spark, tmp_path)
    path = tmp_path / "train" / "part-00001.parquet"
    table = pq.read_table(path)
    drifted = table.set_column(0, "features", table.column("features").cast(
        pa.list_(pa.float64())))
    meta = read_metadata(uri)
    pq.write_table(drifted, path, row_group_size=meta.files[1].row_groups[0])
    with pytest.raises(DataError, match=r"schema drift: shard file .*part-00001\.parquet has "
                                        r"column 'features' of type list<element: double>, but "
                                        r".*part-00000\.parquet has list<element: float>"):
        read_metadata(uri)


def test_fewer_rows_than_workers_times_batch(spark, tmp_path: Path, make_mlp) -> None:
    from sparkdl import SharedTrainingMaster, SparkModel

    uri = _shards(spark, tmp_path, n=40, rows_per_group=10)
    tm = SharedTrainingMaster(batch_size_per_worker=32, num_workers=2)
    model = SparkModel(spark, make_mlp(SHAPE, 2), tm)
    expected = (re.escape(uri) + r": steps_per_epoch would be 0: 40 rows over 2 workers .*"
                r"\(need at least num_workers x batch_size = 64 rows")
    with pytest.raises(DataError, match=expected):
        model.fit(uri)


def test_num_workers_gives_balanced_files(spark, tmp_path: Path) -> None:
    uri = _shards(spark, tmp_path, n=400, num_files=None, num_workers=3, rows_per_group=64)
    meta = read_metadata(uri)
    assert len(meta.files) >= 12
    assert all(len(f.row_groups) >= 1 for f in meta.files)
    slices, steps = plan_slices(meta, 3, 8)
    rows = [s.rows for s in slices]
    assert max(rows) - min(rows) <= max(n for f in meta.files for n in f.row_groups)
    assert steps == min(rows) // 8
    with pytest.raises(ConfigurationError, match="num_workers must be >= 1"):
        write_shards(spark.range(1).selectExpr("array(1.0) features", "0L label"),
                     str(tmp_path / "x"), feature_shape=[1], classes=["a"], num_workers=0)


def _csv(tmp_path: Path, lines: list[str]) -> str:
    path = tmp_path / "in.csv"
    path.write_text("x0,x1,label\n" + "".join(f"{line}\n" for line in lines))
    return str(path)


def _run_csv(spark, tmp_path: Path, path: str, **kw):
    from sparkdl.pipelines import get_pipeline

    options = {
        "path": path, "header": True, "columns": {"x0": "double", "x1": "double",
                                                  "label": "string"},
        "transform": {"steps": [
            {"op": "categorical_to_integer", "column": "label", "categories": ["a", "b"]},
            {"op": "assemble", "features": ["x0", "x1"], "label": "label"}]},
        "rows_per_group": 4, "num_files": 2, **kw,
    }
    return get_pipeline("csv")(spark, f"file://{tmp_path}/out", **options)


def _good(n: int = 40) -> list[str]:
    return [f"{i},{i % 7},{'ab'[i % 2]}" for i in range(n)]


def test_nan_policy_fail_and_drop(spark, tmp_path: Path) -> None:
    path = _csv(tmp_path, [*_good(), "1,NaN,a", "2,Infinity,b", "3,-Infinity,a"])
    with pytest.raises(DataError, match=r"column 'features' has NaN or infinite values in \d of "
                                        r"\d+ rows \(nan_policy 'fail'"):
        _run_csv(spark, tmp_path, path)
    assert not (tmp_path / "out").exists()
    result = _run_csv(spark, tmp_path, path, nan_policy="drop")
    assert result["train_dropped_non_finite"] + result["test_dropped_non_finite"] == 3
    assert result["train_rows"] + result["test_rows"] == 40


def test_label_outside_declared_classes(spark, tmp_path: Path) -> None:
    path = _csv(tmp_path, [*_good(), "5,5,zebra"])
    with pytest.raises(DataError, match=r"^column 'label': value 'zebra' is not one of the "
                                        r"declared categories \[a, b\]$"):
        _run_csv(spark, tmp_path, path)
    assert not (tmp_path / "out").exists()


def test_empty_data_set(spark, tmp_path: Path) -> None:
    with pytest.raises(DataError, match="empty"):
        _run_csv(spark, tmp_path, _csv(tmp_path, []), normalizer="none")
    assert not (tmp_path / "out").exists()


def test_csv_row_with_wrong_number_of_fields(spark, tmp_path: Path) -> None:
    path = _csv(tmp_path, [*_good(), "7,8,a,surplus"])
    with pytest.raises(DataError, match=rf"^CSV file file://{path}: malformed record \(expected "
                                        r"3 fields: x0 double, x1 double, label string\): "
                                        r"7,8,a,surplus$"):
        _run_csv(spark, tmp_path, path)
    assert not (tmp_path / "out").exists()


def test_image_that_does_not_decode_leaves_nothing(spark, tmp_path: Path) -> None:
    from _etl_fixtures import write_image_folder

    from sparkdl.pipelines import get_pipeline

    write_image_folder(tmp_path / "img", per_class=3)
    (tmp_path / "img" / "blue" / "x.jpg").write_bytes(b"\xff\xd8\xff not a jpeg")
    with pytest.raises(DataError, match=r"^image file file:.*/img/blue/x\.jpg cannot be decoded"):
        get_pipeline("images")(spark, f"file://{tmp_path}/out", path=str(tmp_path / "img"),
                               height=8, width=8)
    assert not (tmp_path / "out").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["img"]


def test_nothing_half_written_listing(spark, tmp_path: Path) -> None:
    uri = _shards(spark, tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["train"]
    assert np.array([f.rows for f in read_metadata(uri).files]).sum() == 64
