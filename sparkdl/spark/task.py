"""The executor program of the training stage: one barrier task per worker.

Each task pins its GPUs, finds its peers through ``BarrierTaskContext.allGather``, opens the
configured transport and runs :func:`sparkdl.training.worker.task.run_task`; its result goes back
to the driver as one Arrow row (rank, pickled :class:`~sparkdl.training.summary.WorkerResult`).
A failure is recorded as a :class:`~sparkdl.spark.attempts.TaskFailure` before it propagates.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import pickle
import socket
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pyarrow as pa

    from sparkdl.config import ClusterConfig

#: The training stage's output: one row per worker.
RESULT_SCHEMA = "rank int, result binary"


def training_function(
    spec_bytes: bytes, cluster: ClusterConfig, secret: bytes, attempts_uri: str
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The ``mapInArrow`` function of the training stage. Everything it needs travels in its
    closure (cloudpickled with the function); ``spec_bytes`` is the cloudpickled spec, so
    that a custom layer defined in ``__main__`` arrives by value. The driver's S3 settings
    (:func:`~sparkdl.storage.s3_environment`) travel with it: checkpoints, the attempt log and
    the shards may be on S3."""
    from sparkdl.storage import s3_environment

    environment = s3_environment()

    def train(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import pyarrow as pa

        from sparkdl.storage import apply_environment

        apply_environment(environment)
        for _ in batches:  # the stage's input is one row per task: its rank
            pass
        rank, result = _train(spec_bytes, cluster, secret, attempts_uri)
        yield pa.RecordBatch.from_pydict(
            {"rank": [rank], "result": [pickle.dumps(result)]},
            schema=pa.schema([("rank", pa.int32()), ("result", pa.binary())]),
        )

    return train


def _train(
    spec_bytes: bytes, cluster: ClusterConfig, secret: bytes, attempts_uri: str
) -> tuple[int, Any]:
    from pyspark import BarrierTaskContext

    from sparkdl.spark.attempts import AttemptLog, TaskFailure

    context = BarrierTaskContext.get()
    rank = context.partitionId()
    addresses = [info.address for info in context.getTaskInfos()]
    address = addresses[rank]
    try:
        result = _run(context, rank, addresses, spec_bytes, cluster, secret)
    except BaseException as exc:
        # a barrier stage attempt launches all its tasks at once, with consecutive task ids in
        # partition order: task id - rank names the stage attempt (pyspark exposes no stage
        # attempt number to Python)
        AttemptLog(attempts_uri).record(
            TaskFailure.of(context.taskAttemptId() - rank, rank, address, exc)
        )
        raise
    result.executor_address = address
    return rank, result


def _run(context: Any, rank: int, addresses: list[str], spec_bytes: bytes,
         cluster: ClusterConfig, secret: bytes) -> Any:
    """Meet the other tasks (``addresses``: every task's executor, ``host:port``, by rank),
    then train."""
    from sparkdl.comm import create_communicator
    from sparkdl.comm.network import parse_port_range, split_host_port
    from sparkdl.cpus import current_cpus, local_group, plan_cores, sharing_key
    from sparkdl.gpu import pin_gpus, task_gpu_addresses
    from sparkdl.training.worker.task import run_task

    gpus = task_gpu_addresses()
    pin_gpus(gpus, role="train")  # before the spec (and TensorFlow with it) is loaded
    spec = pickle.loads(spec_bytes)
    world = len(addresses)
    # every rank's host, the same list on every rank: the topology needs no round to learn it
    hosts = [split_host_port(executor)[0] for executor in addresses]
    host = hosts[rank]
    with contextlib.suppress(OSError):
        host = socket.gethostbyname(host)
    affinity = cluster.cpu_affinity

    def rendezvous() -> tuple[list[int] | None, Any]:
        # the cores' sharing key rides on the communicator's first round. The same on every
        # rank: all send it or none.
        cpus = current_cpus()
        key = sharing_key(host, cpus) if affinity != "off" else None
        keys: list[str] = []
        with _all_gather(context, spec, secret, rank, world, cluster.transport,
                         cluster.timeout_s) as all_gather:

            def exchange(message: str) -> list[str]:
                if key is None or keys:
                    return all_gather(message)
                replies = [json.loads(reply)
                           for reply in all_gather(json.dumps([key, message]))]
                keys.extend(their_key for their_key, _ in replies)
                return [their_message for _, their_message in replies]

            communicator = create_communicator(
                cluster.transport, rank, world, exchange,
                secret=secret, timeout_s=cluster.timeout_s,
                network_mask=cluster.network_mask, default_host=host,
                port_range=parse_port_range(cluster.port_range),
                wire_integrity=cluster.wire_integrity,
                topology=cluster.topology, mesh=cluster.mesh,
                hosts=hosts,
            )
            if key is None:
                return None, communicator
            if not keys:  # the transport exchanged nothing on connecting (Spark RPC)
                keys.extend(all_gather(key) if world > 1 else [key])
        return plan_cores(cpus, *local_group(keys, rank), spec.threads, affinity), communicator

    return run_task(spec, rendezvous, secret=secret, gpus=gpus)


@contextlib.contextmanager
def _all_gather(context: Any, spec: Any, secret: bytes, rank: int, world: int,
                transport: str, timeout_s: float) -> Iterator[Callable[[str], list[str]]]:
    """Gather one message from every rank, for the rendezvous: through the driver's event
    channel for the TCP transport (answered as soon as the last rank arrives; each round of
    Spark's barrier ``allGather`` takes at least a second), through the barrier for the
    Spark-RPC transport, whose collectives are the barrier's rounds."""
    if transport != "tcp" or spec.events is None or world == 1:
        yield lambda message: list(context.allGather(message))
        return
    from sparkdl.comm.channel import ChannelClient

    # a barrier stage attempt's tasks have consecutive ids in partition order, so task id -
    # rank names the attempt: Spark launches all of them in one scheduling round, giving ids
    # from one counter as it takes tasks from its pending list, which it fills in reverse
    # partition order and takes from the end; the stage's input (spark.range) has no
    # preferred locations, so every task comes from that one list
    attempt = context.taskAttemptId() - rank
    client = ChannelClient(spec.events.address, secret, timeout_s=timeout_s)
    rounds = itertools.count()
    try:
        yield lambda message: client.gather(attempt, next(rounds), rank, world, message)
    finally:
        client.close()
