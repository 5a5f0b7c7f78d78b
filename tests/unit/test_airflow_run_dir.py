"""jobs/airflow_run_dir.py, the Airflow DAG's run directory, without Airflow."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

JOBS = Path(__file__).resolve().parents[2] / "jobs"


def _module():
    spec = importlib.util.spec_from_file_location("airflow_run_dir", JOBS / "airflow_run_dir.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_two_runs_of_one_logical_date_get_different_directories():
    module = _module()
    scheduled = module.run_dir("runs/airflow", "2026-11-20",
                               "scheduled__2026-11-20T00:00:00+00:00")
    manual = module.run_dir("runs/airflow", "2026-11-20", "manual__2026-11-20T00:00:00+00:00")
    assert scheduled != manual
    assert manual == "runs/airflow/2026-11-20/manual__2026-11-20T00_00_00_00_00"
    assert module.run_dir("/abs/", "2026-11-20", "manual__x") == "/abs/2026-11-20/manual__x"


@pytest.mark.parametrize("run_id", ["a/../../etc", "x:y", "séance 1", "a\\b", ".hidden"])
def test_a_run_id_becomes_one_component_spark_accepts(run_id):
    name = _module().safe_run_id(run_id)
    assert "/" not in name and ":" not in name and "\\" not in name
    assert not name.startswith(".") and name


def test_a_run_id_with_nothing_to_keep_is_refused():
    with pytest.raises(ValueError, match=r"run id '\.\.'"):
        _module().safe_run_id("..")


def test_the_dag_puts_each_run_in_its_run_id_directory():
    source = (JOBS / "airflow_dag.py").read_text()
    assert "run_dir(" in source and 'context["run_id"]' in source
