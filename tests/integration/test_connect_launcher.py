"""SparkModel.fit on Spark Connect (``SparkSession.builder.remote("local[2]")``): the barrier
training stage, structured failure records and the slot check work without a SparkContext.
Connect runs in a subprocess (``_connect_launcher.py``): a classic session (this test
process's) and a Connect one cannot share a process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).with_name("_connect_launcher.py")
REPO = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def test_a_fit_on_spark_connect_trains_reports_failures_and_checks_slots(digits_shards):
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYSPARK_PYTHON": sys.executable}
    proc = subprocess.run([sys.executable, "-W", "ignore::UserWarning", str(SCRIPT),
                           digits_shards["train"]], env=env, capture_output=True, text=True,
                          timeout=900, check=False)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-4000:]
    out = json.loads(lines[-1].removeprefix("RESULT "))
    assert out["connect"] is True
    assert out["ranks"] == [0, 1]
    assert out["checksums"][0] == out["checksums"][1]  # replicas identical
    assert out["loss"][-1] < out["loss"][0]
    # the failure comes from the tasks' own records: every attempt, rank, type and message
    error = out["error"]
    assert error and "non-finite loss" in error and "attempt 0, rank" in error, error
    assert "TrainingError" in error and "attempt 1, rank" in error, error  # 2 stage attempts
    assert out["slots_error"].startswith("ConfigurationError: num_workers=3 but Spark has only 2"),\
        out["slots_error"]
