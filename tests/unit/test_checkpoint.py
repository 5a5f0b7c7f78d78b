"""Checkpoint store: atomic writes, run identity, retention, partial writes ignored."""

from __future__ import annotations

import pytest

from sparkdl.errors import ConfigurationError, TrainingError
from sparkdl.training.worker.checkpoint import CheckpointPolicy, CheckpointStore, TrainingState


def test_latest_complete_checkpoint_of_the_run(tmp_path):
    store = CheckpointStore(tmp_path.as_uri())
    run = store.start_run(resume=False)
    for step in (10, 20, 30):
        store.save(TrainingState(run, step, step // 10, 0, [{"loss": 1.0}]), b"m%d" % step)
    names = sorted(p.name for p in tmp_path.glob("ckpt-*"))
    assert names == ["ckpt-0000000020", "ckpt-0000000030"]  # keep=2
    latest = store.latest(run)
    assert latest.state.global_step == 30 and latest.model_bytes == b"m30"
    # a half-written checkpoint is never taken for a whole one, and is cleaned up
    (tmp_path / ".ckpt-0000000040.tmp-abcd").mkdir()
    (tmp_path / "ckpt-0000000050").mkdir()  # complete-looking name, no files
    assert store.latest(run).state.global_step == 30
    assert store.start_run(resume=True) == run
    assert not list(tmp_path.glob(".ckpt-*"))


def test_a_new_run_clears_old_checkpoints_and_resume_keeps_them(tmp_path):
    store = CheckpointStore(tmp_path.as_uri())
    old = store.start_run(resume=False)
    store.save(TrainingState(old, 5, 1, 0), b"x")
    assert store.start_run(resume=True) == old
    new = store.start_run(resume=False)
    assert new != old and store.latest(new) is None and not list(tmp_path.glob("ckpt-*"))


def test_recorded_failure_fails_the_next_attempt_fast(tmp_path):
    store = CheckpointStore(tmp_path.as_uri())
    store.start_run(resume=False)
    store.record_failure("non-finite loss nan at epoch 0, step 3")
    with pytest.raises(TrainingError, match=r"earlier attempt .* epoch 0, step 3"):
        store.check_failure()


def test_policy_schedule_and_validation():
    assert CheckpointPolicy("file:///x", every=2).due(10, True, 1)
    assert not CheckpointPolicy("file:///x", every=2).due(10, True, 0)
    assert not CheckpointPolicy("file:///x", every=2).due(10, False, 1)
    assert CheckpointPolicy("file:///x", every=5, unit="steps").due(10, False, 0)
    with pytest.raises(ConfigurationError, match="checkpoint_unit"):
        CheckpointPolicy("file:///x", unit="hours")
