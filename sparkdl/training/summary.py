"""What each worker returns, and the job metrics the driver makes of them (no TensorFlow)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, fields

from sparkdl.training.masters import TrainingMaster
from sparkdl.training.model_files import ModelRef
from sparkdl.training.worker.loop import LoopResult


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
    cpus: list[int] | None = None  # the cores it was pinned to (sparkdl.cpus); None: not pinned
    topology: str | None = None  # its communicator's (Communicator.topology); None: not known
    model: ModelRef | None = None  # rank 0 only: the trained model's file


@dataclass
class FitMetrics(Mapping[str, object]):
    """The job's measurements of a fit, combined over every worker.

    Typed fields; :meth:`to_json` is ``metrics.json``'s document (optional figures left out
    when absent). It also reads as that mapping (``fit.metrics["steps"]``) for scripts that
    index it by name.
    """

    mode: str
    num_workers: int
    batch_size_per_worker: int
    epochs: int
    stopped_early: bool
    steps_per_epoch: int
    steps: int
    samples: int
    train_seconds: float
    stage_seconds: float
    samples_per_second: float
    steady_samples_per_second: float | None
    num_parameters: int
    bytes_per_step: float
    resumed_from: str | None
    attempt_started_at: float
    dense_bytes_per_step: float
    data_wait_fraction: float
    replicas_identical: bool
    executor_addresses: list[str]
    final_loss: float | None
    step_timings_s: dict[str, float]
    step_stats: dict[str, float]
    steady_bytes_per_step: float
    timeline: list[str] | None = None  # URIs of the ranks' Chrome traces
    final_train_accuracy: float | None = None
    elastic_events: list[dict[str, object]] | None = None  # relaunches and retried stages
    shuffle: str | None = None  # the fit's shuffle mode (global, window, none)
    rows_dropped_per_epoch: int | None = None  # rows no worker reads in an epoch
    worker_cpus: list[list[int] | None] | None = None  # each rank's pinned cores, if any was
    topology: str | None = None  # the communicator's layout (flat, hierarchical), if reported

    @property
    def compression_ratio(self) -> float | None:
        """Dense bytes over the bytes sent per step (``None`` when nothing was sent)."""
        return self.dense_bytes_per_step / self.bytes_per_step if self.bytes_per_step else None

    @property
    def steady_compression_ratio(self) -> float | None:
        """:attr:`compression_ratio` after the first epoch (thresholds settled)."""
        steady = self.steady_bytes_per_step
        return self.dense_bytes_per_step / steady if steady else None

    def to_json(self) -> dict[str, object]:
        """``metrics.json``'s keys, in their order; absent optional figures left out."""
        document = {f.name: getattr(self, f.name) for f in fields(self)}
        optional = ("timeline", "final_train_accuracy", "elastic_events", "shuffle",
                    "rows_dropped_per_epoch", "worker_cpus", "topology")
        extra = {name: document.pop(name) for name in optional}
        document.pop("steady_bytes_per_step")
        if extra["timeline"]:
            document["timeline"] = extra["timeline"]
        if extra["final_train_accuracy"] is not None:
            document["final_train_accuracy"] = extra["final_train_accuracy"]
        document["steady_bytes_per_step"] = self.steady_bytes_per_step
        for name in ("compression_ratio", "steady_compression_ratio"):
            if getattr(self, name) is not None:
                document[name] = getattr(self, name)
        if extra["elastic_events"] is not None:
            document["elastic_events"] = extra["elastic_events"]
        for name in ("shuffle", "rows_dropped_per_epoch", "worker_cpus", "topology"):
            if extra[name] is not None:
                document[name] = extra[name]
        return document

    def __getitem__(self, key: str) -> object:
        return self.to_json()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.to_json())

    def __len__(self) -> int:
        return len(self.to_json())


def summarize_fit(
    results: list[WorkerResult],
    tm: TrainingMaster,
    steps_per_epoch: int,
    wall_seconds: float,
) -> FitMetrics:
    """Combine every worker's measurements into the job's metrics."""
    first = results[0]
    loops = [r.loop for r in results]
    world = len(results)
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
    return FitMetrics(
        mode=tm.mode,
        num_workers=world,
        batch_size_per_worker=tm.batch_size_per_worker,
        epochs=len(first.loop.history),
        stopped_early=first.loop.stopped_early,
        steps_per_epoch=steps_per_epoch,
        steps=first.loop.steps,
        samples=first.loop.samples,
        train_seconds=train_seconds,
        stage_seconds=wall_seconds,
        samples_per_second=first.loop.samples / train_seconds if train_seconds else 0.0,
        steady_samples_per_second=sum(later) / len(later) if later else None,
        num_parameters=num_parameters,
        bytes_per_step=sum(loop.bytes_sent for loop in loops) / world
        / max(first.trained_steps, 1),
        resumed_from=first.resumed_from,
        attempt_started_at=min(r.started_at for r in results),
        dense_bytes_per_step=dense_bytes_per_step(num_parameters, world),
        data_wait_fraction=sum(loop.data_wait_seconds for loop in loops)
        / max(sum(loop.train_seconds for loop in loops), 1e-9),
        replicas_identical=len({r.checksum for r in results}) == 1,
        executor_addresses=[r.executor_address for r in results],
        final_loss=last.get("loss"),
        step_timings_s=timings,
        step_stats=extras,
        # after the first epoch: adaptive thresholds have settled (and tracing is over)
        steady_bytes_per_step=sum(loop.steady_bytes_sent or loop.bytes_sent for loop in loops)
        / world / timed,
        timeline=[r.timeline for r in results if r.timeline] or None,
        worker_cpus=[r.cpus for r in results] if any(r.cpus for r in results) else None,
        final_train_accuracy=last.get("accuracy"),
        topology=first.topology,
    )


def dense_bytes_per_step(num_parameters: int, world_size: int) -> float:
    """What a ring allreduce of float32 gradients sends per step and worker."""
    return 4.0 * num_parameters * 2 * (world_size - 1) / max(world_size, 1)
