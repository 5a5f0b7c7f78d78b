"""sparkdl on Spark Connect: the cases of ``_connect_cases.py`` run once, in a pytest process
of their own (a local Connect server cannot share a process with a classic session), and
each case is reported here by name."""

from __future__ import annotations

import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

pytestmark = pytest.mark.spark

HERE = Path(__file__).parent
CASES = HERE / "_connect_cases.py"


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory) -> dict[str, str]:
    """``{case: "passed" | "failed: ..." | "skipped: ..."}`` of one run of the cases."""
    pytest.importorskip("pyspark.sql.connect.session", reason="needs pyspark's connect extra")
    report = tmp_path_factory.mktemp("connect") / "report.xml"
    root = HERE.parent.parent
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable,
           "PYTHONPATH": os.pathsep.join(filter(None, [str(root),
                                                      os.environ.get("PYTHONPATH")]))}
    env.pop("SPARK_REMOTE", None)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", str(CASES), "-q", "-p", "no:cacheprovider",
         "-o", "addopts=", f"--junitxml={report}"],
        cwd=root, env=env, capture_output=True, text=True, timeout=540,
    )
    if not report.exists():
        pytest.fail(f"the Connect cases did not run (exit {done.returncode}):\n"
                    f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    found = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        problem = case.find("failure")
        problem = case.find("error") if problem is None else problem
        skipped = case.find("skipped")
        if problem is not None:
            found[case.get("name")] = f"failed: {problem.get('message')}\n{problem.text}"
        elif skipped is not None:
            found[case.get("name")] = f"skipped: {skipped.get('message')}"
        else:
            found[case.get("name")] = "passed"
    return found


def _check(outcomes: dict[str, str], case: str) -> None:
    outcome = outcomes.get(case, "not run")
    if outcome.startswith("skipped"):
        pytest.skip(outcome)
    assert outcome == "passed", outcome


def test_the_digits_etl_runs_on_spark_connect(outcomes):
    _check(outcomes, "test_the_digits_etl_writes_its_shards")


def test_evaluate_and_predict_run_on_spark_connect(outcomes):
    _check(outcomes, "test_evaluate_and_predict_match_keras_on_the_driver")


def test_evaluate_on_a_connect_dataframe_reuses_its_shards(outcomes):
    _check(outcomes, "test_evaluate_on_a_dataframe_reuses_its_shards")


def test_a_keras_model_stage_runs_in_a_pipeline_and_saves_on_spark_connect(outcomes):
    _check(outcomes, "test_a_keras_model_stage_transforms_in_a_pipeline_and_round_trips")


def test_fit_on_a_dataframe_runs_on_spark_connect(outcomes):
    _check(outcomes, "test_fit_on_a_dataframe_trains")


def test_a_keras_estimator_pipeline_runs_on_spark_connect(outcomes):
    _check(outcomes, "test_a_keras_estimator_pipeline_fits_and_transforms")


def test_predict_on_spark_connect_refuses_features_the_model_does_not_take(outcomes):
    _check(outcomes, "test_predict_refuses_features_the_model_does_not_take")


def test_every_connect_case_is_reported_here(outcomes):
    names = {line.split("(")[0][4:] for line in CASES.read_text().splitlines()
             if line.startswith("def test_")}
    assert names == set(outcomes), (names, set(outcomes))


def test_a_sharing_fit_on_spark_connect_reports_failures_and_checks_slots(outcomes):
    _check(outcomes, "test_a_sharing_fit_keeps_replicas_identical_and_reports_failures_and_slots")


def test_a_model_larger_than_a_connect_message_travels_through_storage(outcomes):
    _check(outcomes, "test_a_model_larger_than_a_connect_message_trains_and_predicts")


def test_a_task_too_large_for_a_connect_plan_is_one_error(outcomes):
    _check(outcomes, "test_a_custom_object_too_large_for_a_plan_is_one_error_before_any_task")
