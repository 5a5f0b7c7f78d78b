"""ParallelWrapper: the Spark worker loop in local processes, without Spark."""

from __future__ import annotations

from sparkdl.parallel import ParallelWrapper
from sparkdl.training.masters import SharedTrainingMaster


def test_parallel_wrapper_trains_with_identical_replicas(digits_shards, make_mlp):
    wrapper = ParallelWrapper(make_mlp([8, 8, 1], 10), SharedTrainingMaster(num_workers=2),
                              timeout_s=60)
    fit = wrapper.fit(digits_shards["train"], epochs=6)
    assert fit.metrics["replicas_identical"] is True
    assert fit.metrics["steady_compression_ratio"] >= 20
    assert fit.history["accuracy"][-1] > 0.9
