"""Pinning a task's GPUs before TensorFlow loads.

TensorFlow reads ``CUDA_VISIBLE_DEVICES`` once, when it first initializes CUDA; after that a
process cannot change which GPUs it sees. So every place that runs TensorFlow for a Spark task
or a ParallelWrapper process calls :func:`pin_gpus` first, and this module never imports
TensorFlow. ``SPARKDL_GPU_TRACE=PATH`` makes every pin append one JSON line to ``PATH`` (what
the process saw: the addresses, ``CUDA_VISIBLE_DEVICES``, whether TensorFlow was loaded), which
the cluster tests read.
"""

from __future__ import annotations

import json
import os
import socket
import sys
from collections.abc import Sequence

from sparkdl.errors import TrainingError

ENV_TRACE = "SPARKDL_GPU_TRACE"


def task_gpu_addresses() -> list[str] | None:
    """The GPU addresses Spark assigned to the running task, or ``None`` outside a Spark task
    or when the task was given no GPUs (``spark.task.resource.gpu.amount`` unset)."""
    try:
        from pyspark import TaskContext
    except ImportError:
        return None
    context = TaskContext.get()  # a BarrierTaskContext inside a barrier stage
    if context is None:
        return None
    resources = context.resources()
    if "gpu" not in resources:
        return None
    return [str(a) for a in resources["gpu"].addresses]


def pin_gpus(addresses: Sequence[str] | None, *, role: str = "task") -> None:
    """Make only ``addresses`` visible to TensorFlow in this process, with memory growth on.

    ``None`` (no GPUs assigned) leaves the environment as it is. Raises :class:`TrainingError`
    when TensorFlow is already loaded in this process with a different visibility, since it
    cannot be changed any more (a reused Python worker that ran a task on another GPU: set
    ``spark.python.worker.reuse=false`` for GPU jobs).
    """
    loaded = "tensorflow" in sys.modules
    before = os.environ.get("CUDA_VISIBLE_DEVICES")
    if addresses is not None:
        wanted = ",".join(str(a) for a in addresses)
        if loaded and before != wanted:
            raise TrainingError(
                f"cannot pin this {role} to GPU(s) {wanted!r}: TensorFlow is already loaded in "
                f"process {os.getpid()} with CUDA_VISIBLE_DEVICES={before!r}; TensorFlow must not "
                "be imported before the pin (for Spark GPU jobs set "
                "spark.python.worker.reuse=false)"
            )
        os.environ["CUDA_VISIBLE_DEVICES"] = wanted
        os.environ["TF_FORCE_GPU_ALLOW_GROWTH"] = "true"
    trace = os.environ.get(ENV_TRACE)
    if trace:
        _append_trace(trace, role, addresses, loaded)


def round_robin(devices: Sequence[str], per_worker: int, rank: int) -> list[str]:
    """The ``per_worker`` devices of worker ``rank`` when workers take ``devices`` in turn."""
    if per_worker <= 0 or not devices:
        return []
    start = rank * per_worker
    return [str(devices[(start + k) % len(devices)]) for k in range(per_worker)]


def _append_trace(path: str, role: str, addresses: Sequence[str] | None, loaded: bool) -> None:
    record = {
        "role": role,
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "local_ip": os.environ.get("SPARK_LOCAL_IP"),
        "addresses": None if addresses is None else [str(a) for a in addresses],
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "allow_growth": os.environ.get("TF_FORCE_GPU_ALLOW_GROWTH"),
        "tensorflow_loaded": loaded,
    }
    try:
        from pyspark import TaskContext

        context = TaskContext.get()
        if context is not None:
            record["partition"] = context.partitionId()
            record["stage"] = context.stageId()
    except ImportError:
        pass
    line = json.dumps(record) + "\n"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())  # one write per record: O_APPEND keeps lines whole
    finally:
        os.close(fd)
