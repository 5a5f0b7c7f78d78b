"""Directory names with a space, ``%``, ``#`` and ``?`` in ``data.dir`` and ``output.dir``,
through the ``sparkdl`` command as a user runs it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ODD = "my runs%20 #1?x"  # space, %, # and ?; "%20" would be decoded by a careless reader

pytestmark = pytest.mark.spark


def _sparkdl(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable,
           "PYSPARK_DRIVER_PYTHON": sys.executable, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "sparkdl.cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=400, check=False)


@pytest.mark.slow  # two Spark processes
def test_the_iris_pipeline_and_predict_run_in_directories_with_odd_characters(tmp_path):
    """The iris conf end to end (ETL with its analysis, train, evaluate, report) through
    ``sparkdl pipeline``, then ``sparkdl predict`` with the model it trained, every path in a
    directory named with a space, ``%``, ``#`` and ``?``."""
    base = tmp_path / ODD
    data, out = base / "data", base / "out"
    sets = ["--set", f"data.dir={json.dumps(str(data))}",  # quoted: YAML reads " #" as a comment
            "--set", f"output.dir={json.dumps(str(out))}", "--set", "training.epochs=15"]
    pipeline = _sparkdl("pipeline", "--conf", "iris", *sets, cwd=tmp_path)
    assert pipeline.returncode == 0, pipeline.stderr[-3000:]
    assert (data / "train" / "_sparkdl.json").is_file() and (data / "test").is_dir()
    assert (data / "analysis.json").is_file()
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["test_accuracy"] >= 0.8

    predict = _sparkdl("predict", "--conf", "iris", *sets, cwd=tmp_path)
    assert predict.returncode == 0, predict.stderr[-3000:]
    result = json.loads(predict.stdout.strip().splitlines()[-1])
    predictions = out / "predictions"
    assert (predictions / "_sparkdl_predictions.json").is_file()
    assert list(predictions.glob("part-*.parquet")), sorted(os.listdir(predictions))
    assert {"model.keras", "metrics.json", "report.html", "predictions"} <= {
        p.name for p in out.iterdir()}
    assert sorted(p.name for p in tmp_path.iterdir()) == [ODD]  # nothing stray beside it
    assert sorted(p.name for p in base.iterdir()) == ["data", "out"]

    import pyarrow.parquet as pq

    from sparkdl.data import read_metadata
    from sparkdl.storage import local_path

    assert local_path(result["predictions"]) == predictions
    table = pq.read_table(predictions)
    assert table.num_rows == read_metadata(str(data / "test")).num_rows


def test_predict_reads_and_writes_directories_with_odd_characters(spark, tmp_path,
                                                                   digits_shards, make_mlp):
    import shutil

    from sparkdl.config import load_config
    from sparkdl.data import read_metadata
    from sparkdl.stages import run_predict

    source = Path(digits_shards["test"].removeprefix("file://")).parent
    data, out = tmp_path / ODD / "data", tmp_path / ODD / "out"
    shutil.copytree(source, data)
    out.mkdir()
    make_mlp(read_metadata(str(data / "test")).feature_shape, 10).save(out / "model.keras")
    config = load_config(None, [f"data.dir={json.dumps(str(data))}",
                                f"output.dir={json.dumps(str(out))}"])
    run_predict(config, spark)
    assert sorted(p.name for p in out.iterdir()) == ["model.keras", "predictions"]
    assert sorted(p.name for p in (tmp_path / ODD).iterdir()) == ["data", "out"]
    import pyarrow.parquet as pq

    assert pq.read_table(out / "predictions").num_rows == read_metadata(
        str(data / "test")).num_rows
