"""The per-worker body every launcher runs (no Spark).

A launcher (a barrier-mode Spark stage, :mod:`sparkdl.spark.launcher`; or local processes,
:mod:`sparkdl.parallel`) starts one task per worker; each task pins its GPUs, then calls
:func:`run_task` with a way to open its :class:`~sparkdl.comm.Communicator` (rendezvous
through ``BarrierTaskContext.allGather`` or a local TCP store).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sparkdl.comm import Communicator
    from sparkdl.training.summary import WorkerResult
    from sparkdl.training.worker import WorkerSpec


def run_task(
    spec: WorkerSpec,
    communicator_factory: Callable[[], Communicator],
    *,
    secret: bytes,
    gpus: Sequence[str] | None = None,
    cores: Sequence[int] | None = None,
) -> WorkerResult:
    """One worker: run on ``cores`` (every thread; restored after, see :mod:`sparkdl.cpus`),
    configure TensorFlow for its threads and GPUs (the GPUs already pinned by the launcher,
    before TensorFlow loaded), open the communicator, train, close it."""
    from sparkdl.cpus import pinned
    from sparkdl.training.worker import configure_tensorflow, run_worker

    with pinned(cores) as cpus:
        configure_tensorflow(spec.threads, list(gpus) if gpus else None)
        comm = communicator_factory()
        try:
            result = run_worker(spec, comm, secret=secret)
        finally:
            comm.close()
    result.cpus = cpus
    return result
