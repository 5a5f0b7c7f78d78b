"""fit(timeline=...) with ParallelWrapper and SparkModel: a Chrome trace per rank with every
step's spans, in order."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.timeline import write_shards
from sparkdl.parallel import ParallelWrapper
from sparkdl.training.masters import SharedTrainingMaster

ROWS, BATCH, EPOCHS = 256, 32, 2
STEPS = EPOCHS * ROWS // (2 * BATCH)


def _model():
    import keras

    keras.utils.set_random_seed(3)
    model = keras.Sequential([keras.Input((256,)), keras.layers.Dense(16, activation="relu"),
                              keras.layers.Dense(10, activation="softmax")])
    model.compile(optimizer=keras.optimizers.SGD(0.01), loss="sparse_categorical_crossentropy")
    return model


def _trace(uri: str) -> tuple[list[dict], dict[int, str]]:
    document = json.loads(Path(uri).read_text())
    threads = {e["tid"]: e["args"]["name"] for e in document["traceEvents"]
               if e["name"] == "thread_name"}
    return [e for e in document["traceEvents"] if e["ph"] == "X"], threads


def _inside(inner: dict, outer: dict) -> bool:
    return (inner is not outer and inner["tid"] == outer["tid"] and outer["ts"] <= inner["ts"]
            and inner["ts"] + inner["dur"] <= outer["ts"] + outer["dur"])


def _children(parent: dict, events: list[dict]) -> list[str]:
    """Names of the spans directly inside ``parent``, in time order."""
    within = [e for e in events if _inside(e, parent)]
    direct = [e for e in within if not any(_inside(e, other) for other in within)]
    return [e["name"] for e in sorted(direct, key=lambda e: e["ts"])]


def _check_steps(events: list[dict], overlap: bool) -> None:
    steps = sorted((e for e in events if e["name"] == "step"), key=lambda e: e["ts"])
    assert [e["args"]["global_step"] for e in steps] == list(range(STEPS))
    assert [e["args"]["epoch"] for e in steps] == [s * EPOCHS // STEPS for s in range(STEPS)]
    for step in steps:
        assert _children(step, events) == ["data wait", "exchange", "event channel"]
        exchange = next(e for e in events if e["name"] == "exchange" and _inside(e, step))
        phases = _children(exchange, events)
        if overlap:  # the previous step's result is received after this step's encode,
            # then this step's message is handed to the exchange thread
            assert phases[:2] == ["compute", "encode"], phases
            assert phases[2:] in (["hand-off"],
                                  ["communicate", "decode", "apply", "hand-off"]), phases
        else:
            assert phases == ["compute", "encode", "communicate", "decode", "apply"]
            communicate = next(e for e in events
                               if e["name"] == "communicate" and _inside(e, exchange))
            (gather,) = [e for e in events if _inside(e, communicate)]
            assert gather["name"] == "allgather" and gather["args"]["bytes_sent"] > 0


@pytest.mark.parametrize("overlap", [
    False, pytest.param(True, marks=pytest.mark.slow)], ids=["sharing", "overlap"])
def test_parallel_wrapper_writes_each_rank_s_steps_in_order(tmp_path, overlap):
    data = write_shards(tmp_path / "data", rows=ROWS)
    master = SharedTrainingMaster(num_workers=2, batch_size_per_worker=BATCH, overlap=overlap)
    fit = ParallelWrapper(_model(), master, timeout_s=60).fit(
        data, epochs=EPOCHS, verbose=0, timeline=str(tmp_path / "trace"))
    files = [str(tmp_path / "trace" / f"rank-{rank}.json") for rank in (0, 1)]
    assert fit.metrics["timeline"] == files
    for rank, uri in enumerate(files):
        events, threads = _trace(uri)
        assert {e["pid"] for e in events} == {rank}
        main = [e for e in events if threads[e["tid"]] == "main"]
        _check_steps(main, overlap)
        assert [e["name"] for e in main if e["name"] in ("epoch", "finish")] == [
            "epoch", "epoch", "finish"]
        background = [e for e in events if threads[e["tid"]] != "main"]
        if overlap:  # every step's exchange ran on the overlap thread, with its allgather
            assert {threads[e["tid"]] for e in background} == {"sparkdl-overlap"}
            assert [e["name"] for e in background].count("overlapped exchange") == STEPS
            assert [e["name"] for e in background].count("allgather") == STEPS
        else:
            assert background == []


@pytest.mark.slow  # 97 s on a loaded 2-core machine (Spark workers import TensorFlow)
def test_spark_model_fit_writes_a_timeline_per_rank(spark, tmp_path):
    from sparkdl.spark_model import SparkModel

    data = write_shards(tmp_path / "data", rows=ROWS)
    master = SharedTrainingMaster(num_workers=2, batch_size_per_worker=BATCH)
    trace = (tmp_path / "trace").as_uri()
    fit = SparkModel(spark, _model(), master).fit(
        Path(data).as_uri(), epochs=1, verbose=0, timeline=trace)
    assert fit.metrics["timeline"] == [f"{trace}/rank-0.json", f"{trace}/rank-1.json"]
    for rank in (0, 1):
        events, _ = _trace(str(tmp_path / "trace" / f"rank-{rank}.json"))
        steps = [e["args"]["global_step"] for e in events if e["name"] == "step"]
        assert steps == list(range(ROWS // (2 * BATCH)))
        assert {e["pid"] for e in events} == {rank}


@pytest.mark.slow  # a third ParallelWrapper fit (~80 s on a loaded machine)
def test_a_failed_fit_still_writes_what_each_rank_recorded(tmp_path):
    from sparkdl.errors import TrainingError

    model = _model()
    model.optimizer.learning_rate.assign(float("nan"))  # the first update is NaN
    data = write_shards(tmp_path / "data", rows=ROWS)
    master = SharedTrainingMaster(num_workers=2, batch_size_per_worker=BATCH)
    wrapper = ParallelWrapper(model, master, timeout_s=60)
    with pytest.raises(TrainingError, match="non-finite update"):
        wrapper.fit(data, epochs=EPOCHS, verbose=0, timeline=str(tmp_path / "trace"))
    for rank in (0, 1):
        events, _ = _trace(str(tmp_path / "trace" / f"rank-{rank}.json"))
        (step,) = [e for e in events if e["name"] == "step"]
        assert step["args"]["global_step"] == 0
        assert _children(step, events) == ["data wait", "exchange"]
