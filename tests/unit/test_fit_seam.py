"""The typed driver→worker seam without TensorFlow: FitMetrics (metrics.json's document),
the worker loop's CallbackList, FitOptions from a job's training section, imports."""

from __future__ import annotations

import json

import pytest

from sparkdl.config import TrainingConfig
from sparkdl.fit_options import FitOptions
from sparkdl.training.masters import SharedTrainingMaster
from sparkdl.training.summary import FitMetrics, WorkerResult, summarize_fit
from sparkdl.training.worker.loop import CallbackList, LoopResult, WorkerCallback

#: metrics.json's keys of a fit without timeline, accuracy or elastic events, in order.
_KEYS = [
    "mode", "num_workers", "batch_size_per_worker", "epochs", "stopped_early",
    "steps_per_epoch", "steps", "samples", "train_seconds", "stage_seconds",
    "samples_per_second", "steady_samples_per_second", "num_parameters", "bytes_per_step",
    "resumed_from", "attempt_started_at", "dense_bytes_per_step", "data_wait_fraction",
    "replicas_identical", "executor_addresses", "final_loss", "step_timings_s", "step_stats",
    "steady_bytes_per_step", "compression_ratio", "steady_compression_ratio",
]


def _result(rank: int, *, sent: int, accuracy: bool = False) -> WorkerResult:
    history = [{"loss": 2.0, "samples_per_second": 10.0},
               {"loss": 1.0, "samples_per_second": 30.0, **({"accuracy": 0.5} if accuracy else {})}]
    loop = LoopResult(history=history, steps=8, samples=64, train_seconds=4.0,
                      data_wait_seconds=1.0, bytes_sent=sent, timed_steps=4,
                      steady_bytes_sent=sent // 2, timings={"compute_s": 0.4},
                      extras={"tau": 0.2}, epochs_run=2)
    return WorkerResult(rank, "same", loop, num_parameters=100, trained_steps=8,
                        started_at=10.0 + rank, executor_address=f"host{rank}:1")


def test_fit_metrics_write_metrics_json_with_the_same_keys_and_figures() -> None:
    metrics = summarize_fit([_result(0, sent=800), _result(1, sent=1600)],
                            SharedTrainingMaster(num_workers=2), 4, 5.0)
    document = metrics.to_json()
    assert list(document) == _KEYS
    assert document["bytes_per_step"] == 150.0  # (800 + 1600) / 2 workers / 8 steps
    assert document["compression_ratio"] == metrics.dense_bytes_per_step / 150.0
    assert document["steady_samples_per_second"] == 30.0  # epochs after the first
    assert document["attempt_started_at"] == 10.0 and document["replicas_identical"] is True
    assert json.loads(json.dumps(document)) == document  # plain JSON
    # it reads as that mapping too: fit.metrics["steps"]
    assert metrics["steps"] == metrics.steps == 8 and dict(metrics) == document
    assert "timeline" not in metrics and metrics.get("final_train_accuracy") is None


def test_optional_figures_appear_only_when_measured() -> None:
    with_accuracy = _result(0, sent=0, accuracy=True)
    with_accuracy.timeline = "file:///t/rank-0.json"
    with_accuracy.topology = "hierarchical"
    metrics = summarize_fit([with_accuracy], SharedTrainingMaster(num_workers=1), 4, 1.0)
    metrics.elastic_events = [{"epoch": 1, "step": 0, "from_workers": 2, "to_workers": 1,
                               "cause": "lost"}]
    document = metrics.to_json()
    assert document["timeline"] == ["file:///t/rank-0.json"]
    assert document["final_train_accuracy"] == 0.5
    assert document["topology"] == "hierarchical"
    assert "compression_ratio" not in document  # nothing was sent
    assert list(document)[-2:] == ["elastic_events", "topology"]
    assert isinstance(metrics, FitMetrics)


def test_callback_list_runs_each_hook_in_order_and_closes_every_callback() -> None:
    calls: list[str] = []

    class Named(WorkerCallback):
        def __init__(self, name: str, fail_close: bool = False) -> None:
            self.name, self.fail_close = name, fail_close

        def on_epoch_end(self, loop, epoch, logs):
            calls.append(f"{self.name}:{epoch}")
            logs[self.name] = float(epoch)

        def close(self) -> None:
            calls.append(f"close {self.name}")
            if self.fail_close:
                raise OSError(f"{self.name} could not close")

    callbacks = CallbackList([Named("a", fail_close=True), Named("b")])
    logs: dict[str, float] = {}
    callbacks.on_epoch_end(None, 3, logs)  # the loop is not read
    assert calls == ["a:3", "b:3"] and logs == {"a": 3.0, "b": 3.0}
    with pytest.raises(OSError, match="a could not close"):
        callbacks.close()
    assert calls[-2:] == ["close a", "close b"]  # b closed although a failed
    assert len(callbacks) == 2


def test_fit_options_from_a_jobs_training_section(tmp_path) -> None:
    training = TrainingConfig.model_validate({
        "epochs": 3, "checkpoint_dir": str(tmp_path / "ckpt"), "checkpoint_every": 2,
        "checkpoint_unit": "steps", "prefetch": 7, "timeline": str(tmp_path / "trace"),
        "validation_freq": 2, "log_every_steps": 5,
    })
    options = training.fit_options(validation_data="file:///v", resume=True)
    options.check()
    assert (options.epochs, options.checkpoint_every, options.checkpoint_unit) == (3, 2, "steps")
    assert options.checkpoint_dir == (tmp_path / "ckpt").as_uri()
    assert options.timeline == (tmp_path / "trace").as_uri()
    assert (options.prefetch, options.validation_freq, options.log_every_steps) == (7, 2, 5)
    assert options.resume and options.validation_data == "file:///v"


def test_the_launchers_and_the_seam_import_no_tensorflow() -> None:
    """Executors import ``sparkdl.spark_model`` to evaluate and predict: TensorFlow must load
    only where a task trains or predicts."""
    import subprocess
    import sys

    code = ("import sys, sparkdl.spark_model, sparkdl.parallel, sparkdl.training.driver.keras_fit, "
            "sparkdl.fit_options, sparkdl.training.driver.launcher, sparkdl.run_layout; "
            "print(sorted(m for m in ('keras', 'tensorflow') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=True).stdout
    assert out.strip() == "[]"


def test_fit_keywords_and_the_yaml_keys_are_fit_options_with_their_defaults() -> None:
    """Each option is defined once, in FitOptions: ``fit()``'s keywords are its fields with its
    defaults, and the training section's keys of the same names default to them (but
    ``epochs``: a job trains 10 unless told)."""
    import dataclasses
    import inspect

    from sparkdl.fit_options import YAML_KEYS
    from sparkdl.training.driver.keras_fit import KerasFit

    defaults = {f.name: f.default for f in dataclasses.fields(FitOptions)}
    signature = inspect.signature(KerasFit.fit).parameters
    assert {name: p.default for name, p in signature.items() if name not in ("self", "data")} \
        == defaults
    section = TrainingConfig()
    assert {name: getattr(section, name) for name in YAML_KEYS if name != "epochs"} == {
        name: defaults[name] for name in YAML_KEYS if name != "epochs"}
    assert section.fit_options() == dataclasses.replace(FitOptions(), epochs=10)
