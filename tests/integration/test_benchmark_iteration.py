"""The iteration suite (the README's decision-guide figures) runs end to end."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.spark, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]


def test_iteration_benchmark_quick_run(tmp_path):
    """Every launcher and model gets a positive step time and fixed cost (none asserted)."""
    out = tmp_path / "iteration.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, "jobs/benchmark.py", "iteration", "--quick", "--json", str(out)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    figures = json.loads(out.read_text())
    for model in ("mlp", "lenet"):
        for launcher in ("one_process", "parallel_wrapper", "spark_model"):
            assert figures[f"{model}_{launcher}_ms_per_step"] > 0
            assert f"{model}_{launcher}_fixed_s" in figures
    assert "SparkModel ms/step" in proc.stdout
