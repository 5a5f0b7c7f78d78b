"""The per-worker body every launcher runs (no Spark).

A launcher (a barrier-mode Spark stage, :mod:`sparkdl.spark.launcher`; or local processes,
:mod:`sparkdl.parallel`) starts one task per worker; each task pins its GPUs, then calls
:func:`run_task` with its :data:`Rendezvous`: a function that meets the other workers
(through the driver's event channel on Spark, or a local TCP store) and returns this
worker's cores and its open :class:`~sparkdl.comm.Communicator`.

The rendezvous runs while TensorFlow imports on a helper thread: the import takes seconds of
CPU, and the rendezvous waits for the slowest task to start, so the two overlap instead of
adding up.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sparkdl.comm import Communicator
    from sparkdl.training.summary import WorkerResult
    from sparkdl.training.worker.run_worker import WorkerSpec

#: Meets the other workers; returns this worker's cores (``None``: leave them as they are)
#: and its open communicator.
Rendezvous = Callable[[], "tuple[Sequence[int] | None, Communicator]"]


def run_task(
    spec: WorkerSpec,
    rendezvous: Rendezvous,
    *,
    secret: bytes,
    gpus: Sequence[str] | None = None,
) -> WorkerResult:
    """One worker: meet the others while TensorFlow imports, then run on the cores the
    rendezvous chose (every thread; restored after, see :mod:`sparkdl.cpus`), configure
    TensorFlow for its threads and GPUs (the GPUs already pinned by the launcher, before
    TensorFlow loaded), train, close the communicator."""
    from sparkdl.cpus import pinned
    from sparkdl.training.worker.run_worker import (
        configure_tensorflow,
        limit_malloc_arenas,
        run_worker,
    )

    limit_malloc_arenas()  # before the import's threads start
    cores, comm = meet_while_tensorflow_imports(rendezvous)
    try:
        with pinned(cores) as cpus:
            configure_tensorflow(spec.threads, list(gpus) if gpus else None)
            result = run_worker(spec, comm, secret=secret)
    finally:
        comm.close()
    result.cpus = cpus
    result.topology = comm.topology
    return result


def meet_while_tensorflow_imports(
    rendezvous: Rendezvous,
) -> tuple[Sequence[int] | None, Communicator]:
    """Run ``rendezvous`` while TensorFlow imports on a helper thread
    (:func:`~sparkdl.logs.started_while_tensorflow_imports`); return its result, or raise its
    error, else the import's (closing the communicator the rendezvous opened)."""
    from sparkdl.logs import started_while_tensorflow_imports

    return started_while_tensorflow_imports(lambda _stderr: rendezvous(),
                                            lambda met: met[1].close())
