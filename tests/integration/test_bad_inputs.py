"""Bad inputs on a real local Spark: each one clear sparkdl error naming the file or key, and
nothing touched or half-written. The ones that need no Spark are in
tests/unit/test_bad_inputs_nospark.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from sparkdl.data import write_shards
from sparkdl.errors import DataError

pytestmark = pytest.mark.spark

SHAPE = [4]


def _df(spark, n: int = 40):
    rows = [([float(i), 1.0, 2.0, 3.0], i % 2) for i in range(n)]
    return spark.createDataFrame(rows, "features array<float>, label long")


def test_overwrite_keeps_a_user_folder(spark, tmp_path: Path) -> None:
    folder = tmp_path / "train"
    folder.mkdir()
    (folder / "notes.txt").write_text("mine")
    with pytest.raises(DataError, match=r"train holds files sparkdl did not write \(notes.txt"):
        write_shards(_df(spark), folder.as_uri(), feature_shape=SHAPE, classes=["a", "b"],
                     overwrite=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["train"]
    assert [p.name for p in folder.iterdir()] == ["notes.txt"]
    # sparkdl's own shards (and an empty directory) are still replaced
    write_shards(_df(spark), folder.with_name("mine").as_uri(), feature_shape=SHAPE,
                 classes=["a", "b"])
    write_shards(_df(spark, 20), folder.with_name("mine").as_uri(), feature_shape=SHAPE,
                 classes=["a", "b"], overwrite=True)


# --- item 2: page checksums ------------------------------------------------------------------

def _column_data_offset(path: Path) -> tuple[int, int]:
    """(start, length) of the first data page's bytes of column 'features' in row group 0."""
    import pyarrow.parquet as pq

    col = pq.ParquetFile(path).metadata.row_group(0).column(0)
    start = col.data_page_offset
    return start, col.total_compressed_size - (start - (col.dictionary_page_offset or start))


def test_shards_carry_page_checksums_and_flipped_bytes_are_found(spark, tmp_path: Path) -> None:
    from sparkdl.data import read_all, read_metadata

    uri = (tmp_path / "train").as_uri()
    write_shards(_df(spark, 200), uri, feature_shape=SHAPE, classes=["a", "b"], num_files=1,
                 rows_per_group=200)
    meta = read_metadata(uri)
    path = tmp_path / "train" / meta.files[0].path
    good = path.read_bytes()
    start, length = _column_data_offset(path)
    found = 0
    for k in range(12):  # bytes spread over the page's (compressed) values
        pos = start + length // 4 + (length // 2) * k // 12
        bad = bytearray(good)
        bad[pos] ^= 0x5A
        path.write_bytes(bytes(bad))
        try:
            read_all(uri, metadata=meta)
        except DataError as exc:
            assert "part-00000.parquet" in str(exc), exc
            found += 1
    path.write_bytes(good)
    assert found == 12  # every flip is an error naming the file, none gives other values
    x, _ = read_all(uri)
    assert x.shape == (200, 4)


# --- item 4: a failed ETL leaves no analysis.json --------------------------------------------

def _csv(tmp_path: Path, lines: list[str], header: str = "x0,x1,label") -> str:
    path = tmp_path / "in.csv"
    path.write_text("".join(f"{line}\n" for line in [header, *lines]) if header or lines
                    else "")
    return str(path)


def _run_csv(spark, tmp_path: Path, path: str, label: str = "string", **kw):
    from sparkdl.pipelines import get_pipeline

    steps = [{"op": "assemble", "features": ["x0", "x1"], "label": "label"}]
    if label == "string":
        steps.insert(0, {"op": "categorical_to_integer", "column": "label",
                         "categories": ["a", "b"]})
    options = {"path": path, "header": True,
               "columns": {"x0": "double", "x1": "double", "label": label},
               "transform": {"steps": steps}, "test_fraction": 0.5, "num_files": 1, **kw}
    if label != "string":
        options["classes"] = ["a", "b"]
    return get_pipeline("csv")(spark, f"file://{tmp_path}/out", **options)


def test_failed_etl_leaves_no_analysis(spark, tmp_path: Path) -> None:
    rows = [f"{i},{i % 3},{i % 2}" for i in range(40)] + ["1,2,7"]
    path = _csv(tmp_path, rows)
    with pytest.raises(DataError, match="outside the 2 classes"):
        _run_csv(spark, tmp_path, path, label="int", analysis=True)
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


# --- item 11: data errors name the file and the cause ----------------------------------------

@pytest.mark.parametrize(("header", "message"), [
    ("", r"^CSV .*in\.csv is empty: no records after the header line$"),
    ("x0,x1,label", r"^CSV .*in\.csv is empty: no records after the header line$"),
])
def test_empty_csv(spark, tmp_path: Path, header: str, message: str) -> None:
    path = _csv(tmp_path, [], header=header)
    with pytest.raises(DataError, match=message):
        _run_csv(spark, tmp_path, path)
    assert not (tmp_path / "out").exists()


def test_out_of_range_labels_name_file_and_every_split(spark, tmp_path: Path) -> None:
    rows = [f"{i},{i % 3},{5 if i % 4 == 0 else i % 2}" for i in range(80)]
    path = _csv(tmp_path, rows)
    with pytest.raises(DataError) as info:
        _run_csv(spark, tmp_path, path, label="int")
    message = str(info.value)
    assert "in.csv, train split: column 'label'" in message
    assert "outside the 2 classes" in message
    counts = dict(part.split() for part in message.split("per split: ")[1].split(", "))
    assert int(counts["train"]) + int(counts["test"]) == 20 and int(counts["test"]) > 0
    assert not (tmp_path / "out" / "train").exists()
    assert not (tmp_path / "out" / "test").exists()


# --- item 12: a cheap check on read for shards not written by sparkdl ------------------------

def _foreign_shards(spark, tmp_path: Path, *, label: int = 1, value: float = 1.0) -> str:
    """Shards whose Parquet file was replaced by another writer's (same schema and groups)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from sparkdl.data import read_metadata

    uri = (tmp_path / "train").as_uri()
    write_shards(_df(spark, 40), uri, feature_shape=SHAPE, classes=["a", "b"], num_files=1,
                 rows_per_group=40)
    meta = read_metadata(uri)
    path = tmp_path / "train" / meta.files[0].path
    table = pq.read_table(path)
    feats = table.column("features").to_pylist()
    labels = table.column("label").to_pylist()
    feats[7] = [value, 1.0, 2.0, 3.0]
    labels[9] = label
    new = pa.table({"features": pa.array(feats, table.schema.field("features").type),
                    "label": pa.array(labels, table.schema.field("label").type)})
    pq.write_table(new, path, row_group_size=40)
    return uri


@pytest.mark.parametrize(("kw", "message"), [
    ({"label": 2}, r"train/part-00000\.parquet: column 'label' row 9 holds 2, outside the 2 "
                   r"declared classes \[0, 2\)"),
    ({"label": -1}, r"train/part-00000\.parquet: column 'label' row 9 holds -1"),
    ({"value": float("nan")}, r"train/part-00000\.parquet: column 'features' row 7 holds NaN "
                              r"or infinite values"),
    ({"value": float("inf")}, r"column 'features' row 7 holds NaN or infinite"),
])
def test_foreign_shards_are_checked_on_read(spark, tmp_path: Path, kw, message) -> None:
    from sparkdl.data import read_all

    uri = _foreign_shards(spark, tmp_path, **kw)
    with pytest.raises(DataError, match=message):
        read_all(uri)


# --- the CLI on a bad CSV: one clear line, no JVM stack trace ---------------------------------

def test_cli_bad_csv_is_one_line(tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[2]
    path = _csv(tmp_path, [f"{i},{i % 3},{'ab'[i % 2]}" for i in range(30)] + ["7,8,a,surplus"])
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable,
           "PYSPARK_DRIVER_PYTHON": sys.executable, "PYTHONPATH": str(repo)}
    proc = subprocess.run(  # -X importtime: every module the driver imports, on stderr
        [sys.executable, "-X", "importtime", "-m", "sparkdl.cli", "etl", "--conf", "conf/csv.yaml",
         "--set", f"data.dir={tmp_path}/data", "--set", f"output.dir={tmp_path}/run",
         "--set", f"data.options.path={path}",
         "--set", "data.options.columns={x0: double, x1: double, label: string}",
         "--set", "data.options.transform={steps: [{op: categorical_to_integer, column: label},"
                  " {op: assemble, features: [x0, x1], label: label}]}"],
        cwd=repo, env=env, capture_output=True, text=True, timeout=400, check=False)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert proc.stdout == ""
    imported = [ln.rsplit("|", 1)[-1].strip() for ln in proc.stderr.splitlines()
                if ln.startswith("import time:")]
    assert "sparkdl.etl.readers.csv" in imported  # the stage ran
    assert "tensorflow" not in imported  # the ETL driver needs no TensorFlow
    lines = [ln for ln in proc.stderr.strip().splitlines() if not ln.startswith("import time:")]
    assert lines[-1].startswith("sparkdl etl: error: CSV file file:") and "surplus" in lines[-1]
    noise = [ln for ln in lines if ln.startswith(("\tat ", "Caused by", "Traceback"))]
    assert noise == [], proc.stderr[-3000:]
    assert not (tmp_path / "data").exists() or not any((tmp_path / "data").iterdir())


def test_cli_bad_model_is_one_line_after_spark_started_beside_tensorflow(tmp_path: Path) -> None:
    """The train stage checks the model once TensorFlow, imported while Spark started, is
    there: one line, exit 2, nothing written."""
    import os
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable,
           "PYSPARK_DRIVER_PYTHON": sys.executable, "PYTHONPATH": str(repo)}
    proc = subprocess.run(
        [sys.executable, "-m", "sparkdl.cli", "train", "--conf", "conf/digits.yaml",
         "--set", f"data.dir={tmp_path}/data", "--set", f"output.dir={tmp_path}/run",
         "--set", "model.optimizer.name=sgdx"],
        cwd=repo, env=env, capture_output=True, text=True, timeout=400, check=False)
    assert proc.returncode == 2, proc.stderr[-3000:]
    lines = proc.stderr.strip().splitlines()
    assert lines[-1].startswith("sparkdl train: error: model.optimizer.name: unknown optimizer "
                                "'sgdx'"), proc.stderr[-3000:]
    noise = [ln for ln in lines if ln.startswith(("\tat ", "Caused by", "Traceback"))
             or "oneDNN" in ln or "absl::InitializeLog" in ln]
    assert noise == [], proc.stderr[-3000:]
    assert sorted(p.name for p in tmp_path.iterdir()) == []


# --- item 1 for predictions: replaced only when sparkdl wrote them ---------------------------

def test_predictions_replace_only_their_own(spark, tmp_path: Path, digits_shards,
                                            make_mlp) -> None:
    from sparkdl.config import load_config
    from sparkdl.data import read_metadata
    from sparkdl.stages import MODEL_FILE, PREDICTIONS_MARKER, run_predict

    data_dir = digits_shards["train"].rsplit("/", 1)[0]
    out = tmp_path / "run"
    out.mkdir()
    shape = read_metadata(digits_shards["train"]).feature_shape
    make_mlp(shape, 10).save(out / MODEL_FILE)
    config = load_config(None, [f"data.dir={data_dir}", f"output.dir={out}",
                                "training.num_workers=2"])
    first = run_predict(config, spark)
    predictions = out / "predictions"
    assert (predictions / PREDICTIONS_MARKER).is_file()
    assert run_predict(config, spark) == first  # its own output is replaced
    assert sorted(p.name for p in out.iterdir()) == [MODEL_FILE, "predictions"]
    for p in predictions.iterdir():
        p.unlink()
    (predictions / "mine.txt").write_text("keep")
    with pytest.raises(DataError, match=r"predictions holds files sparkdl did not write"):
        run_predict(config, spark)
    assert [p.name for p in predictions.iterdir()] == ["mine.txt"]
    assert sorted(p.name for p in out.iterdir()) == [MODEL_FILE, "predictions"]
