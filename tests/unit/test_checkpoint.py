"""Checkpoint store: atomic writes, run identity, retention, partial writes ignored."""

from __future__ import annotations

import pytest

from sparkdl.errors import ConfigurationError, TrainingError
from sparkdl.training.worker.checkpoint import CheckpointPolicy, CheckpointStore, TrainingState


def _model_file(directory, content: bytes):
    path = directory / f"model-{content.decode()}.keras"
    path.write_bytes(content)
    return path


def test_latest_complete_checkpoint_of_the_run(tmp_path):
    store = CheckpointStore((tmp_path / "ckpt").as_uri())
    tmp_path = tmp_path / "ckpt"
    run = store.start_run(resume=False)
    for step in (10, 20, 30):
        store.save(TrainingState(run, step, step // 10, 0, [{"loss": 1.0}]),
                   _model_file(tmp_path.parent, b"m%d" % step))
    names = sorted(p.name for p in tmp_path.glob("ckpt-*"))
    assert names == ["ckpt-0000000020", "ckpt-0000000030"]  # keep=2
    latest = store.latest(run)
    with latest.model_file() as model_file:
        assert latest.state.global_step == 30 and model_file.read_bytes() == b"m30"
        assert model_file.parent == tmp_path / "ckpt-0000000030"  # read in place, not copied
    # a half-written checkpoint is never taken for a whole one, and is cleaned up
    (tmp_path / ".ckpt-0000000040.tmp-abcd").mkdir()
    (tmp_path / "ckpt-0000000050").mkdir()  # complete-looking name, no files
    assert store.latest(run).state.global_step == 30
    assert store.start_run(resume=True) == run
    assert not list(tmp_path.glob(".ckpt-*"))


def test_a_new_run_clears_old_checkpoints_and_resume_keeps_them(tmp_path):
    model = _model_file(tmp_path, b"x")
    tmp_path = tmp_path / "ckpt"
    store = CheckpointStore(tmp_path.as_uri())
    old = store.start_run(resume=False)
    store.save(TrainingState(old, 5, 1, 0), model)
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


def test_a_rank_state_goes_to_the_store_and_back_without_a_second_full_copy(tmp_path):
    """A residual of a big model's size is streamed into its .npz and read back bit for bit,
    never held twice: saving allocates a small part of it, loading about the array itself."""
    import tracemalloc

    import numpy as np

    residual = np.random.default_rng(3).standard_normal(12_500_000, dtype=np.float32)  # 50 MB
    store = CheckpointStore((tmp_path / "ckpt").as_uri())
    run = store.start_run(resume=False)
    tracemalloc.start()
    try:
        store.save_worker_state(run, 7, 0, {"residual": residual, "tau": 0.25, "step": 7})
        saving_peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.reset_peak()
        model = tmp_path / "m.keras"
        model.write_bytes(b"m")
        store.save(TrainingState(run, 7, 1, 0), model)
        state = store.latest(run).worker_state(store, 0)
        loading_peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert state["tau"] == 0.25 and state["step"] == 7
    assert state["residual"].dtype == np.float32
    assert state["residual"].tobytes() == residual.tobytes()  # bit for bit
    assert saving_peak < 0.5 * residual.nbytes, saving_peak
    assert loading_peak < 1.5 * residual.nbytes, loading_peak
