"""Elastic fits without a cluster: the lost ranks' residuals folded into the survivors', the
shard slices re-planned for the new world, the resume position, the config and the report."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from sparkdl.compression.compressor import ThresholdCompressor
from sparkdl.compression.threshold import FixedThreshold
from sparkdl.config import load_config
from sparkdl.data.metadata import FORMAT_VERSION, ShardFile, ShardMetadata
from sparkdl.errors import ConfigurationError
from sparkdl.fit_options import FitOptions
from sparkdl.report import build_report
from sparkdl.training.elastic import (
    RESIDUAL_SUFFIX,
    ElasticPolicy,
    absorbed_ranks,
    fold_states,
    resume_step,
)
from sparkdl.training.model_files import ModelRef
from sparkdl.training.worker.run_worker import WorkerSpec, replan

SIZE = 1000


def _sharing_state(rank: int, rng: np.random.Generator) -> dict:
    """A sharing rank's state as ``SharingExchange.get_state`` lays it out: its optimizer
    variables, its compressor's (a real ThresholdCompressor's keys) and the pending sum."""
    compressor = ThresholdCompressor(SIZE, FixedThreshold(1e-3), rank=rank)
    compressor.set_residual(rng.normal(size=SIZE).astype(np.float32))
    state = {f"compressor.{k}": v for k, v in compressor.get_state().items()}
    return {**state, "optimizer.0": np.int64(rank), "optimizer.1": rng.normal(size=SIZE),
            "pending": np.zeros(SIZE, np.float32)}


@pytest.mark.parametrize(("old", "new"), [(4, 3), (4, 2), (4, 1), (7, 3), (3, 3), (2, 4)])
def test_every_old_rank_is_absorbed_by_exactly_one_new_rank(old, new):
    assigned = [absorbed_ranks(rank, old, new) for rank in range(new)]
    flat = sorted(r for ranks in assigned for r in ranks)
    assert flat == list(range(old))  # every old rank once, none invented
    for rank, ranks in enumerate(assigned):
        if rank < old:
            assert ranks[0] == rank  # its own state first: it keeps its optimizer state


def test_four_to_three_folds_rank_three_into_rank_zero():
    assert [absorbed_ranks(r, 4, 3) for r in range(3)] == [[0, 3], [1], [2]]


def test_folding_preserves_the_sum_of_the_residuals():
    rng = np.random.default_rng(0)
    old = [_sharing_state(rank, rng) for rank in range(4)]
    key = "compressor.memory.residual"
    assert key.endswith(RESIDUAL_SUFFIX)
    before = np.sum([s[key].astype(np.float64) for s in old], axis=0)

    new = [fold_states([old[r] for r in absorbed_ranks(rank, 4, 3)]) for rank in range(3)]
    after = np.sum([s[key].astype(np.float64) for s in new], axis=0)
    np.testing.assert_allclose(after, before, rtol=0, atol=1e-6)  # float32 rounding only
    assert not np.array_equal(new[0][key], old[0][key])  # rank 0 really absorbed rank 3's
    for rank in range(3):  # everything else is the new rank's own
        assert new[rank]["optimizer.0"] == rank
        np.testing.assert_array_equal(new[rank]["optimizer.1"], old[rank]["optimizer.1"])
        assert new[rank][key].dtype == np.float32
    # the folded state restores into a real compressor
    compressor = ThresholdCompressor(SIZE, FixedThreshold(1e-3))
    compressor.set_state({k.removeprefix("compressor."): v for k, v in new[0].items()
                          if k.startswith("compressor.")})
    np.testing.assert_array_equal(compressor.get_residual(), new[0][key])


def test_a_state_without_a_residual_is_its_own():
    """Averaging and dense keep no residual: the new rank takes its own state unchanged."""
    states = [{"optimizer.0": np.ones(3), "since_average": 2},
              {"optimizer.0": np.zeros(3), "since_average": 2}]
    folded = fold_states(states)
    np.testing.assert_array_equal(folded["optimizer.0"], np.ones(3))


def test_folding_refuses_residuals_of_another_shape():
    a = {"compressor.memory.residual": np.zeros(3, np.float32)}
    b = {"compressor.memory.residual": np.zeros(4, np.float32)}
    with pytest.raises(ConfigurationError, match=r"compressor\.memory\.residual"):
        fold_states([a, b])


def _spec(num_workers: int) -> WorkerSpec:
    files = [ShardFile(f"part-{k:05d}.parquet", 200, [100, 100]) for k in range(6)]
    meta = ShardMetadata(format_version=FORMAT_VERSION, feature_shape=[4],
                         feature_dtype="float32", label_kind="class", classes=["a", "b"],
                         label_shape=[], num_rows=1200, files=files)
    config = {"mode": "dense", "num_workers": num_workers, "batch_size_per_worker": 10}
    spec = WorkerSpec(ModelRef("file:///m.keras", "0" * 64, 1), "file:///models", config,
                      "file:///x", meta.to_json(), [], 0, 1, FitOptions(epochs=3))
    return replan(spec, num_workers)


def test_replanning_gives_the_survivors_all_the_row_groups():
    four, three = _spec(4), replan(_spec(4), 3)
    assert len(four.slices) == 4 and len(three.slices) == 3
    assert three.master_config["num_workers"] == 3
    assert four.master_config["num_workers"] == 4  # the original spec is left alone

    def pieces(spec):
        return sorted(p for s in spec.slices for p in s.pieces)

    assert pieces(three) == pieces(four)  # the same data, nothing lost or doubled
    assert four.steps_per_epoch == 1200 // 4 // 10 == 30
    assert three.steps_per_epoch == 1200 // 3 // 10 == 40


def test_resume_step_keeps_the_fraction_of_the_epoch():
    assert resume_step(0, 30, 40) == 0  # an epoch boundary stays one
    assert resume_step(15, 30, 40) == 20
    assert resume_step(29, 30, 40) == 38
    assert resume_step(7, 30, 30) == 7
    assert resume_step(7, 0, 40) == 7  # an older checkpoint without the plan


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["training.elastic.min_workers=3"], "min_workers=3 is more than num_workers=2"),
        (["training.elastic.min_workers=0"], "training.elastic.min_workers"),
        (["training.elastic.max_failures=-1"], "training.elastic.max_failures"),
        (["training.elastic.min_workerz=1"], "training.elastic.min_workerz"),
    ],
)
def test_bad_elastic_settings_are_named(tmp_path, overrides, message):
    overrides = ["training.checkpoint_dir=/tmp/ckpt", *overrides]
    with pytest.raises(ConfigurationError, match=message):
        load_config(_conf(tmp_path), overrides)


def test_elastic_needs_a_checkpoint_dir(tmp_path):
    with pytest.raises(ConfigurationError, match="elastic needs checkpoint_dir"):
        load_config(_conf(tmp_path), ["training.elastic={min_workers: 1}"])
    config = load_config(_conf(tmp_path), ["training.checkpoint_dir=/tmp/ckpt",
                                           "training.elastic={min_workers: 1}"])
    assert config.training.elastic.min_workers == 1
    assert config.training.elastic.max_failures == 3


def test_elastic_policy_checks_its_numbers():
    with pytest.raises(ConfigurationError, match="min_workers must be an integer >= 1"):
        ElasticPolicy(min_workers=0)
    with pytest.raises(ConfigurationError, match="max_failures must be an integer >= 0"):
        ElasticPolicy(max_failures=True)
    with pytest.raises(ConfigurationError, match="min_workers=3 is more than num_workers=2"):
        ElasticPolicy(min_workers=3).check(2)


def test_the_report_has_a_line_per_elastic_event(tmp_path):
    history = {"loss": [1.0, 0.5, 0.4], "workers": [4, 3, 3]}
    event = {"epoch": 1, "step": 0, "from_workers": 4, "to_workers": 3,
             "cause": "the training stage failed (1 attempt(s)): lost executor 1"}
    (tmp_path / "metrics.json").write_text(json.dumps(
        {"mode": "sharing", "num_workers": 3, "history": history, "elastic_events": [event]}
    ))
    page = build_report(tmp_path)
    assert ("Elastic fit: continued at epoch 1, step 0 with 3 workers instead of 4 after: "
            "the training stage failed (1 attempt(s)): lost executor 1") in page
    assert "Workers</h2>" not in page  # a column of the history table, not a plot


def _conf(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text("training:\n  num_workers: 2\n")
    return path


# A relaunch at the same world size is an event too (issue 52, finding 12) ---------------------


def _launcher(tmp_path, outcomes: list, slots: int):  # type: ignore[no-untyped-def]
    """A SparkLauncher whose stage runs ``outcomes`` in turn (an exception is a failed
    stage) and whose cluster has ``slots`` task slots after a failure: no Spark."""
    from types import SimpleNamespace

    from sparkdl.errors import TrainingError
    from sparkdl.spark.launcher import SparkLauncher

    launcher = object.__new__(SparkLauncher)
    launcher.elastic = ElasticPolicy(min_workers=1, max_failures=3)
    launcher.elastic_events = []
    launcher._cancelled = False
    launched: list[int] = []

    def run_stage(spec, secret, *, spark_retries):  # type: ignore[no-untyped-def]
        launched.append(len(spec.slices))
        outcome = outcomes.pop(0)
        if isinstance(outcome, str):
            raise TrainingError(outcome)
        return outcome

    launcher._run_stage = run_stage  # type: ignore[method-assign]
    launcher._settled_slots = lambda: slots  # type: ignore[method-assign]
    checkpoint = SimpleNamespace(uri=(tmp_path / "ckpt").as_uri(), run_id="run")
    return launcher, _Spec([object(), object()], checkpoint), launched


@dataclasses.dataclass
class _Spec:
    """What an elastic relaunch reads of a WorkerSpec."""

    slices: list
    checkpoint: object
    options: FitOptions = dataclasses.field(default_factory=FitOptions)
    elastic: bool = False


def test_an_elastic_relaunch_with_as_many_workers_is_an_elastic_event(tmp_path):
    launcher, spec, launched = _launcher(tmp_path, ["lost executor 1", ["ok"]], slots=2)
    assert launcher.run(spec, b"s" * 32) == ["ok"]
    assert launched == [2, 2]
    assert [e.to_dict() for e in launcher.elastic_events] == [
        {"epoch": 0, "step": 0, "from_workers": 2, "to_workers": 2, "cause": "lost executor 1"}
    ]


def test_a_retried_stage_is_an_elastic_event_at_the_checkpoint_it_resumed_from():
    from sparkdl.spark.launcher import retry_event

    class Result:
        resumed_from = "file:///ckpt/ckpt-0000000013"

    spec = WorkerSpec.__new__(WorkerSpec)
    spec.__dict__.update(slices=[object(), object()], steps_per_epoch=5,
                         options=FitOptions(epochs=3))
    event = retry_event(spec, [Result()], ["rank 1 on exec-2: OSError: lost"])
    assert event.to_dict() == {"epoch": 2, "step": 3, "from_workers": 2, "to_workers": 2,
                               "cause": "rank 1 on exec-2: OSError: lost"}
    Result.resumed_from = None  # no checkpoint: the retry started over
    spec.options.initial_epoch = 1
    assert (retry_event(spec, [Result()], ["x"]).epoch,
            retry_event(spec, [Result()], ["x"]).step) == (1, 0)


def test_the_report_says_a_relaunch_with_as_many_workers():
    from sparkdl.report import _elastic

    page = _elastic({"elastic_events": [{"epoch": 1, "step": 2, "from_workers": 3,
                                         "to_workers": 3, "cause": "lost executor 1"}]})
    assert ("Elastic fit: relaunched at epoch 1, step 2 with the same 3 workers after: lost "
            "executor 1") in page
