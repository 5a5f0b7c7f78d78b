"""The launcher's Spark-free parts: slot counts from a master and settings (what a Spark
Connect session offers), and failed-task records written by tasks and read by the driver."""

from __future__ import annotations

import os

import pytest

from sparkdl.session import cores_from_settings, executors_from_settings
from sparkdl.spark.attempts import AttemptLog, TaskFailure, stage_error


@pytest.mark.parametrize(("master", "settings", "cores", "executors"), [
    ("local", {}, 1, 1),
    ("local[3]", {}, 3, 1),
    ("local[*]", {}, os.cpu_count(), 1),
    ("local-cluster[2,3,1024]", {}, 6, 2),
    ("spark://h:7077", {"spark.executor.instances": "4", "spark.executor.cores": "2"}, 8, 4),
    ("spark://h:7077", {"spark.default.parallelism": "12", "spark.executor.cores": "4"}, 12, 3),
    ("yarn", {}, None, None),
])
def test_slots_come_from_the_master_and_settings_or_are_unknown(master, settings, cores,
                                                                executors):
    assert cores_from_settings(master, settings) == cores
    assert executors_from_settings(master, settings, cores) == executors


def _failure(attempt: int, rank: int, message: str) -> TaskFailure:
    try:
        raise ValueError(message)
    except ValueError as exc:
        return TaskFailure.of(attempt, rank, f"10.0.0.{rank}:4040", exc)


def test_failed_tasks_are_read_back_in_attempt_and_rank_order(tmp_path):
    log = AttemptLog.create(tmp_path.as_uri())
    for failure in (_failure(7, 1, "late"), _failure(3, 1, "b"), _failure(3, 0, "a")):
        log.record(failure)
    failures = log.failures()
    assert [(f.stage_attempt, f.rank) for f in failures] == [(3, 0), (3, 1), (7, 1)]
    assert failures[0].error_type == "ValueError" and "raise ValueError" in failures[0].traceback
    assert log.read() == ["attempt 0, rank 0 on 10.0.0.0:4040: ValueError: a",
                          "attempt 0, rank 1 on 10.0.0.1:4040: ValueError: b",
                          "attempt 1, rank 1 on 10.0.0.1:4040: ValueError: late"]
    message = stage_error(failures, RuntimeError("py4j text"))
    assert message.startswith("the training stage failed (2 attempt(s)): attempt 0, rank 0")
    log.close()
    assert log.failures() == []


def test_without_records_the_stage_error_is_sparks_own_cause():
    exc = RuntimeError("Job aborted due to stage failure\nExecutorLostFailure (executor 1 exited)")
    assert "Job aborted" in stage_error([], exc)
