"""ParallelWrapper: the Spark worker loop in local processes, without Spark."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from sparkdl.cpus import current_cpus
from sparkdl.errors import ConfigurationError
from sparkdl.parallel import ParallelWrapper
from sparkdl.training.masters import SharedTrainingMaster

REPO = Path(__file__).resolve().parents[2]


def test_parallel_wrapper_trains_with_identical_replicas(digits_shards, make_mlp):
    wrapper = ParallelWrapper(make_mlp([8, 8, 1], 10), SharedTrainingMaster(num_workers=2),
                              timeout_s=60, cpu_affinity="on")
    fit = wrapper.fit(digits_shards["train"], epochs=6)
    assert fit.metrics["replicas_identical"] is True
    assert fit.metrics["steady_compression_ratio"] >= 20
    assert fit.history["accuracy"][-1] > 0.9
    cpus = current_cpus()
    if len(cpus) >= 2:  # each worker ran on a core of its own
        assert fit.metrics["worker_cpus"] == [[cpus[0]], [cpus[1]]]


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


def test_parallel_wrapper_refuses_a_bad_mesh_or_cpu_affinity_mode(make_mlp):
    with pytest.raises(ConfigurationError, match="mesh: expected one of"):
        ParallelWrapper(make_mlp([8, 8, 1], 10), SharedTrainingMaster(num_workers=2),
                        mesh="tree")
    with pytest.raises(ConfigurationError, match=r"cpu_affinity: expected one of.*'always'"):
        ParallelWrapper(make_mlp([8, 8, 1], 10), SharedTrainingMaster(num_workers=2),
                        cpu_affinity="always")


UNGUARDED_SCRIPT = """\
import sys

import keras

from sparkdl.parallel import ParallelWrapper
from sparkdl.training.masters import SharedTrainingMaster

model = keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Flatten(),
                          keras.layers.Dense(10, activation="softmax")])
model.compile("sgd", "sparse_categorical_crossentropy")
wrapper = ParallelWrapper(model, SharedTrainingMaster(num_workers=2))
wrapper.fit(sys.argv[1], epochs=1)
print("the fit ran")
"""


def test_a_script_fitting_outside_its_main_guard_fails_at_once_naming_the_line(
        digits_shards, tmp_path):
    """Its spawned workers would rerun the script's top level: the parent says so instead,
    before any worker starts."""
    script = tmp_path / "train.py"
    script.write_text(UNGUARDED_SCRIPT)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, str(script), digits_shards["train"]], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0 and "the fit ran" not in proc.stdout
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("sparkdl.errors.ConfigurationError: ParallelWrapper.fit is called "
                           f"from the top level of {script} (line 12) outside an"), last
    assert "a worker process died" not in proc.stderr
