"""Combining the workers' results of one fit into history and metrics."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sparkdl.training.masters import TrainingMaster


@dataclass
class FitResult:
    """What :meth:`SparkModel.fit` returns: Keras-style per-epoch history plus measurements."""

    history: dict[str, list[float]]
    metrics: dict[str, Any]
    workers: list[dict[str, Any]] = field(default_factory=list)

    @property
    def epoch(self) -> list[int]:
        return list(range(len(next(iter(self.history.values()), []))))



def summarize_fit(
    results: list[dict[str, Any]],
    tm: TrainingMaster,
    epochs: int,
    steps_per_epoch: int,
    wall_seconds: float,
) -> FitResult:
    """Combine every worker's measurements into history and job metrics."""
    history: dict[str, list[float]] = {
        "loss": [e["loss"] for e in results[0]["history"]],
        "accuracy": [e["accuracy"] for e in results[0]["history"]],
    }
    steps = results[0]["steps"]
    train_seconds = max(r["train_seconds"] for r in results)
    num_parameters = results[0]["num_parameters"]
    world = len(results)
    checksums = {r["checksum"] for r in results}
    timed = max(results[0].get("timed_steps", steps), 1)
    timings = {
        name: sum(r["timings"].get(name, 0.0) for r in results) / world / timed
        for name in results[0]["timings"]
    }
    extras = {
        name: sum(r["extras"].get(name, 0.0) for r in results) / world / timed
        for name in results[0]["extras"]
    }
    # Steady state: epochs after the first (which includes tracing the step functions).
    later = [max(r["history"][e]["seconds"] for r in results) for e in range(1, epochs)]
    steady = (len(later) * steps_per_epoch * tm.batch_size_per_worker * world / sum(later)
              if later and sum(later) > 0 else None)
    metrics = {
        "mode": tm.mode,
        "num_workers": world,
        "batch_size_per_worker": tm.batch_size_per_worker,
        "epochs": epochs,
        "steps_per_epoch": steps_per_epoch,
        "steps": steps,
        "samples": results[0]["samples"],
        "train_seconds": train_seconds,
        "stage_seconds": wall_seconds,
        "samples_per_second": results[0]["samples"] / train_seconds if train_seconds else 0.0,
        "steady_samples_per_second": steady,
        "num_parameters": num_parameters,
        "bytes_per_step": sum(r["bytes_sent"] for r in results) / world
        / max(results[0].get("trained_steps", steps), 1),
        "resumed_from": results[0].get("resumed_from"),
        "attempt_started_at": min(r.get("started_at", 0.0) for r in results),
        "dense_bytes_per_step": 4.0 * num_parameters * 2 * (world - 1) / world,
        "data_wait_fraction": sum(r["data_wait_seconds"] for r in results)
        / max(sum(r["train_seconds"] for r in results), 1e-9),
        "replicas_identical": len(checksums) == 1,
        "executor_addresses": [r.get("executor_address", "local") for r in results],
        "final_loss": history["loss"][-1],
        "final_train_accuracy": history["accuracy"][-1],
        "step_timings_s": timings,
        "step_stats": extras,
    }
    # After the first epoch: adaptive thresholds have settled (and tracing is over).
    metrics["steady_bytes_per_step"] = (
        sum(r.get("steady_bytes_sent", r["bytes_sent"]) for r in results) / world / timed
    )
    if metrics["bytes_per_step"]:
        metrics["compression_ratio"] = metrics["dense_bytes_per_step"] / metrics["bytes_per_step"]
    if metrics["steady_bytes_per_step"]:
        metrics["steady_compression_ratio"] = (
            metrics["dense_bytes_per_step"] / metrics["steady_bytes_per_step"]
        )
    return FitResult(history=history, metrics=metrics, workers=results)
