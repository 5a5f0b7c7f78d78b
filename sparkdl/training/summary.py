"""What each worker returns, and the job metrics the driver makes of them (no TensorFlow)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sparkdl.training.loop import LoopResult
from sparkdl.training.masters import TrainingMaster


@dataclass
class WorkerResult:
    """One worker's outcome of a fit (plain data: it travels back from the executors)."""

    rank: int
    checksum: str
    loop: LoopResult
    num_parameters: int
    trained_steps: int
    started_at: float
    resumed_from: str | None = None
    executor_address: str = "local"
    timeline: str | None = None  # URI of this rank's Chrome trace
    model_bytes: bytes | None = field(default=None, repr=False)  # rank 0 only


def summarize_fit(
    results: list[WorkerResult],
    tm: TrainingMaster,
    steps_per_epoch: int,
    wall_seconds: float,
) -> dict[str, Any]:
    """Combine every worker's measurements into the job's metrics."""
    first = results[0]
    loops = [r.loop for r in results]
    world = len(results)
    steps = first.loop.steps
    train_seconds = max(loop.train_seconds for loop in loops)
    num_parameters = first.num_parameters
    timed = max(first.loop.timed_steps, 1)
    timings = {
        name: sum(loop.timings.get(name, 0.0) for loop in loops) / world / timed
        for name in first.loop.timings
    }
    extras = {
        name: sum(loop.extras.get(name, 0.0) for loop in loops) / world / timed
        for name in first.loop.extras
    }
    # Steady state: epochs after the first of this attempt (which includes tracing).
    this_attempt = first.loop.history[len(first.loop.history) - first.loop.epochs_run :]
    later = [e["samples_per_second"] for e in this_attempt[1:] if "samples_per_second" in e]
    last = first.loop.history[-1] if first.loop.history else {}
    metrics: dict[str, Any] = {
        "mode": tm.mode,
        "num_workers": world,
        "batch_size_per_worker": tm.batch_size_per_worker,
        "epochs": len(first.loop.history),
        "stopped_early": first.loop.stopped_early,
        "steps_per_epoch": steps_per_epoch,
        "steps": steps,
        "samples": first.loop.samples,
        "train_seconds": train_seconds,
        "stage_seconds": wall_seconds,
        "samples_per_second": first.loop.samples / train_seconds if train_seconds else 0.0,
        "steady_samples_per_second": sum(later) / len(later) if later else None,
        "num_parameters": num_parameters,
        "bytes_per_step": sum(loop.bytes_sent for loop in loops) / world
        / max(first.trained_steps, 1),
        "resumed_from": first.resumed_from,
        "attempt_started_at": min(r.started_at for r in results),
        "dense_bytes_per_step": dense_bytes_per_step(num_parameters, world),
        "data_wait_fraction": sum(loop.data_wait_seconds for loop in loops)
        / max(sum(loop.train_seconds for loop in loops), 1e-9),
        "replicas_identical": len({r.checksum for r in results}) == 1,
        "executor_addresses": [r.executor_address for r in results],
        "final_loss": last.get("loss"),
        "step_timings_s": timings,
        "step_stats": extras,
    }
    if any(r.timeline for r in results):
        metrics["timeline"] = [r.timeline for r in results if r.timeline]
    if "accuracy" in last:
        metrics["final_train_accuracy"] = last["accuracy"]
    # After the first epoch: adaptive thresholds have settled (and tracing is over).
    metrics["steady_bytes_per_step"] = (
        sum(loop.steady_bytes_sent or loop.bytes_sent for loop in loops) / world / timed
    )
    if metrics["bytes_per_step"]:
        metrics["compression_ratio"] = metrics["dense_bytes_per_step"] / metrics["bytes_per_step"]
    if metrics["steady_bytes_per_step"]:
        metrics["steady_compression_ratio"] = (
            metrics["dense_bytes_per_step"] / metrics["steady_bytes_per_step"]
        )
    return metrics


def dense_bytes_per_step(num_parameters: int, world_size: int) -> float:
    """What a ring allreduce of float32 gradients sends per step and worker."""
    return 4.0 * num_parameters * 2 * (world_size - 1) / max(world_size, 1)
