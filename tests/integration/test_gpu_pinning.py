"""ParallelWrapper processes are pinned to their GPUs before TensorFlow loads in them."""

from __future__ import annotations

import json

from sparkdl.gpu import ENV_TRACE
from sparkdl.parallel import ParallelWrapper
from sparkdl.training.masters import SharedTrainingMaster


def test_parallel_wrapper_pins_each_worker_before_tensorflow(digits_shards, make_mlp, tmp_path,
                                                            monkeypatch):
    trace = tmp_path / "trace.jsonl"
    monkeypatch.setenv(ENV_TRACE, str(trace))  # inherited by the spawned workers
    wrapper = ParallelWrapper(make_mlp([8, 8, 1], 10), SharedTrainingMaster(num_workers=2),
                              timeout_s=60, gpus_per_worker=1, devices=["0", "1"])
    fit = wrapper.fit(digits_shards["train"], epochs=1)
    assert fit.metrics["replicas_identical"] is True
    records = [json.loads(line) for line in trace.read_text().splitlines()]
    assert sorted(r["cuda_visible_devices"] for r in records) == ["0", "1"]
    assert all(r["role"] == "parallel" and r["tensorflow_loaded"] is False for r in records)
    assert all(r["allow_growth"] == "true" for r in records)
