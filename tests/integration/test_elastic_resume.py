"""An elastic fit's resume with fewer workers, on local Spark: a checkpoint written by 2 ranks
is resumed by 1 (as a relaunch after losing a host does), with rank 1's residual folded into
rank 0's, the shard slices re-planned and the position mapped onto the new plan. The relaunch
itself, on a cluster that really loses a host, is tests/cluster/test_elastic_harness.py."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from sparkdl import ElasticPolicy, SharedTrainingMaster, SparkModel
from sparkdl.errors import ConfigurationError, TrainingError

pytestmark = pytest.mark.spark


def test_two_ranks_checkpoint_resumes_on_one_worker(spark, digits_shards, make_mlp, tmp_path):
    train = digits_shards["train"]
    ckpt = tmp_path / "ckpt"
    two = SparkModel(spark, make_mlp([8, 8, 1], 10), SharedTrainingMaster(num_workers=2))
    first = two.fit(train, epochs=2, checkpoint_dir=ckpt.as_uri(), checkpoint_every=5,
                    checkpoint_unit="steps")
    latest = sorted(ckpt.glob("ckpt-*"))[-1]
    state = json.loads((latest / "state.json").read_text())
    assert state["world_size"] == 2
    assert state["steps_per_epoch"] == first.metrics["steps_per_epoch"]
    for rank in range(2):
        with np.load(latest / "workers" / f"rank-{rank:05d}") as saved:
            assert saved["compressor.memory.residual"].any()
    lacking = tmp_path / "lacking"
    shutil.copytree(ckpt, lacking)
    (lacking / latest.name / "workers" / "rank-00001").unlink()

    one = SparkModel(spark, make_mlp([8, 8, 1], 10), SharedTrainingMaster(num_workers=1),
                     elastic=ElasticPolicy(min_workers=1, max_failures=0))
    fit = one.fit(train, epochs=3, checkpoint_dir=ckpt.as_uri(), resume=True)
    per_epoch = fit.metrics["steps_per_epoch"]
    assert per_epoch >= 2 * first.metrics["steps_per_epoch"]  # one worker reads all the data
    assert fit.metrics["num_workers"] == 1
    assert fit.metrics["resumed_from"].endswith(latest.name)
    assert fit.metrics["steps"] == 3 * per_epoch
    assert fit.metrics["elastic_events"] == []  # no stage failed in this fit
    assert len(fit.history["loss"]) == 3
    assert fit.history["workers"][-1] == 1
    assert fit.history["accuracy"][-1] > fit.history["accuracy"][0]

    # without rank 1's saved state nothing can be folded: the fit says so and fails
    again = SparkModel(spark, make_mlp([8, 8, 1], 10), SharedTrainingMaster(num_workers=1),
                       elastic=ElasticPolicy(min_workers=1, max_failures=0))
    with pytest.raises(TrainingError, match="lacks the state of a rank of its 2 ranks"):
        again.fit(train, epochs=3, checkpoint_dir=lacking.as_uri(), resume=True)


def test_an_elastic_fit_needs_a_checkpoint_dir(spark, digits_shards, make_mlp):
    model = SparkModel(spark, make_mlp([8, 8, 1], 10), SharedTrainingMaster(num_workers=2),
                       elastic=ElasticPolicy(min_workers=1))
    with pytest.raises(ConfigurationError, match="elastic fit resumes from checkpoints"):
        model.fit(digits_shards["train"], epochs=1)
    with pytest.raises(ConfigurationError, match="min_workers=3 is more than num_workers=2"):
        SparkModel(spark, make_mlp([8, 8, 1], 10), SharedTrainingMaster(num_workers=2),
                   elastic=ElasticPolicy(min_workers=3))
