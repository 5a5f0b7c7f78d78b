"""The launcher contract (no TensorFlow): how :func:`sparkdl.training.driver.run_fit.run_fit` runs
the workers of a :class:`~sparkdl.training.worker.run_worker.WorkerSpec` — a barrier-mode Spark
stage for
``SparkModel``, local processes for ``ParallelWrapper``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from sparkdl.training.summary import WorkerResult
    from sparkdl.training.worker.run_worker import WorkerSpec


@dataclass(frozen=True)
class ChannelSettings:
    """The driver's event channel: how long a worker waits for it, and the ports it may
    listen on (``None``: any)."""

    timeout_s: float = 120.0
    port_range: tuple[int, int] | None = None


class Launcher(Protocol):
    """Runs ``master.num_workers`` workers of a spec and returns their results."""

    driver_host: str  # the address workers reach the driver at
    bind_host: str  # where the driver listens
    threads_per_worker: int

    def check_slots(self, num_workers: int) -> None:
        """Fail fast when there is no room for ``num_workers`` workers at once."""

    def model_dir(self, data_uri: str, checkpoint_dir: str | None) -> str:
        """Where the workers read the model to train and rank 0 writes the trained one
        (storage every worker reaches; :mod:`sparkdl.training.model_files`)."""

    def run(self, spec: WorkerSpec, secret: bytes) -> list[WorkerResult]:
        """Run every worker to completion (blocking); raise on failure."""

    def cancel(self) -> None:
        """Stop the workers of a running :meth:`run` (called from another thread)."""
