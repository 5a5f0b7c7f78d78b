"""jobs/airflow_dag.py under real Airflow: ``dag.test()`` runs the four stages with
spark-submit on local Spark, each in the run's directory, each result JSON in XCom. This is
also the test of the stage jobs run one at a time with spark-submit."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DRIVER = Path(__file__).with_name("airflow_dag_driver.py")
STAGES = ["etl", "train", "evaluate", "predict"]


def airflow_python() -> str:
    """Airflow's interpreter: ``$SPARKDL_AIRFLOW_PYTHON`` (set by .ci/run), else this one."""
    configured = os.environ.get("SPARKDL_AIRFLOW_PYTHON")
    python = configured or sys.executable
    probe = subprocess.run([python, "-c", "import airflow.providers.apache.spark"],
                           capture_output=True, text=True, timeout=120)
    if probe.returncode != 0 and configured:  # CI set it: a broken install fails, never skips
        pytest.fail(f"SPARKDL_AIRFLOW_PYTHON={configured}: {probe.stderr[-2000:]}")
    if probe.returncode != 0:
        pytest.skip(f"no Airflow with the Spark provider in {python} "
                    "(set SPARKDL_AIRFLOW_PYTHON; .ci/run does)")
    return python


@pytest.mark.slow
@pytest.mark.timeout(2500)
def test_dag_runs_four_stages_and_pushes_their_json(tmp_path):
    python = airflow_python()
    root = tmp_path / "runs"
    bin_dir = str(Path(sys.executable).parent)  # sparkdl's environment: its spark-submit
    env = {
        **os.environ,
        "AIRFLOW_HOME": str(tmp_path / "airflow"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "jobs"),
        "AIRFLOW_CONN_SPARK_DEFAULT": json.dumps({"conn_type": "spark", "host": "local[2]"}),
        "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
        "SPARKDL_PYTHON": sys.executable,
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
        "PYTHONPATH": str(REPO),
    }
    run_conf = {"output_root": str(root), "conf": str(REPO / "conf" / "digits.yaml"),
                "sets": ["training.epochs=1", "training.mode=averaging",
                         "cluster.spark_conf.spark.driver.memory=1g"]}
    out = tmp_path / "report.json"
    proc = subprocess.run(
        [python, str(DRIVER), str(REPO / "jobs" / "airflow_dag.py"), "2026-11-20T00:00:00+00:00",
         json.dumps(run_conf), str(out)],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=2400,
    )
    assert proc.returncode == 0, (proc.stdout[-3000:], proc.stderr[-5000:])
    report = json.loads(out.read_text())
    assert report["states"] == dict.fromkeys(STAGES, "success"), report
    assert report["run_state"].endswith("success"), report
    # the run's own directory under its logical date (two runs of one date never share one)
    run_dir = root / "2026-11-20" / re.sub(r"[^A-Za-z0-9._-]+", "_", report["run_id"]).strip(".")
    assert [p.name for p in (root / "2026-11-20").iterdir()] == [run_dir.name]
    for stage in STAGES:  # each task's XCom is exactly the JSON its stage wrote
        assert report["xcoms"][stage] == json.loads((run_dir / f"{stage}.json").read_text())
    assert report["xcoms"]["train"]["mode"] == "averaging"
    assert report["xcoms"]["evaluate"]["test_accuracy"] > 0.7
    assert (run_dir / "model.keras").is_file()
    assert (run_dir / "data" / "train" / "_sparkdl.json").is_file()
    assert any((run_dir / "predictions").glob("*.parquet"))
