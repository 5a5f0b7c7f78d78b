"""ParallelWrapper: the Spark worker loop in local processes, without Spark."""

from __future__ import annotations

import pytest

from sparkdl.errors import ConfigurationError
from sparkdl.parallel import ParallelWrapper
from sparkdl.training.masters import SharedTrainingMaster


def test_parallel_wrapper_trains_with_identical_replicas(digits_shards, make_mlp):
    wrapper = ParallelWrapper(make_mlp([8, 8, 1], 10), SharedTrainingMaster(num_workers=2),
                              timeout_s=60)
    fit = wrapper.fit(digits_shards["train"], epochs=6)
    assert fit.metrics["replicas_identical"] is True
    assert fit.metrics["steady_compression_ratio"] >= 20
    assert fit.history["accuracy"][-1] > 0.9


@pytest.mark.slow
def test_mesh_collectives_train_the_same_bits_as_the_ring(digits_shards, make_mlp):
    """``cluster.mesh``: the log-depth allgather hands the sharing exchange the same updates in
    the same rank order as the ring, so 4 replicas end identical to each other and to the
    ring's run; the frames differ (lengths per message instead of a header per hop), which
    shows the mesh carried the steps."""
    fits = {}
    for mesh in ("plain", "mesh"):
        wrapper = ParallelWrapper(make_mlp([8, 8, 1], 10), SharedTrainingMaster(num_workers=4),
                                  timeout_s=120, mesh=mesh)
        fits[mesh] = wrapper.fit(digits_shards["train"], epochs=2)
        assert fits[mesh].metrics["replicas_identical"] is True
    assert fits["mesh"].workers[0].checksum == fits["plain"].workers[0].checksum
    assert fits["mesh"].metrics["bytes_per_step"] != fits["plain"].metrics["bytes_per_step"]


def test_parallel_wrapper_refuses_a_bad_mesh_mode(make_mlp):
    with pytest.raises(ConfigurationError, match="mesh: expected one of"):
        ParallelWrapper(make_mlp([8, 8, 1], 10), SharedTrainingMaster(num_workers=2),
                        mesh="tree")
