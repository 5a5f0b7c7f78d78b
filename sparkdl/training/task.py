"""The per-worker body every launcher runs, and the :class:`Launcher` contract (no Spark).

A launcher (a barrier-mode Spark stage, :mod:`sparkdl.spark.launcher`; or local processes,
:mod:`sparkdl.parallel`) starts one task per worker; each task pins its GPUs, then calls
:func:`run_task` with a way to open its :class:`~sparkdl.comm.Communicator` (rendezvous
through ``BarrierTaskContext.allGather`` or a local TCP store).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from sparkdl.comm import Communicator
    from sparkdl.training.summary import WorkerResult
    from sparkdl.training.worker import WorkerSpec


class Launcher(Protocol):
    """Runs ``len(spec.slices)`` workers of a spec, each through :func:`run_task`."""

    driver_host: str  # the address workers reach the driver at
    bind_host: str  # where the driver listens
    threads_per_worker: int

    def check_slots(self, num_workers: int) -> None:
        """Fail fast when there is no room for ``num_workers`` workers at once."""

    def run(self, spec: WorkerSpec, secret: bytes) -> list[WorkerResult]:
        """Run every worker to completion (blocking); raise on failure."""

    def cancel(self) -> None:
        """Stop the workers of a running :meth:`run` (called from another thread)."""


def run_task(
    spec: WorkerSpec,
    communicator_factory: Callable[[], Communicator],
    *,
    secret: bytes,
    gpus: Sequence[str] | None = None,
) -> WorkerResult:
    """One worker: configure TensorFlow for its cores and GPUs (already pinned by the
    launcher, before TensorFlow loaded), open the communicator, train, close it."""
    from sparkdl.training.worker import configure_tensorflow, run_worker

    configure_tensorflow(spec.threads, list(gpus) if gpus else None)
    comm = communicator_factory()
    try:
        return run_worker(spec, comm, secret=secret)
    finally:
        comm.close()
