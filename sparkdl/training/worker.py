"""What one worker does, given a communicator: set TensorFlow up, load the model, train.

Knows TensorFlow but not Spark: the Spark launcher (``sparkdl.spark_model``) and
``ParallelWrapper`` both call :func:`run_worker` with their own communicator.
"""

from __future__ import annotations

import logging
import os
import sys
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from sparkdl.comm.communicator import Communicator
from sparkdl.errors import TrainingError

log = logging.getLogger("sparkdl.training")


@dataclass
class WorkerSpec:
    """Everything a worker needs, as plain picklable data."""

    model_bytes: bytes
    master_config: dict[str, Any]
    data_uri: str
    metadata_json: str
    slices: list[Any]
    steps_per_epoch: int
    epochs: int
    job_id: int
    custom_objects: dict[str, Any] | None = None
    threads: int = 1
    shuffle: bool = True
    checkpoint: dict[str, Any] | None = None  # CheckpointPolicy fields plus "run_id"
    extra: dict[str, Any] = field(default_factory=dict)


def make_worker_spec(
    model: Any,
    master: Any,
    data_uri: str,
    metadata: Any,
    *,
    epochs: int,
    custom_objects: dict[str, Any] | None,
    threads: int,
    shuffle: bool,
    checkpoint: dict[str, Any] | None = None,
) -> WorkerSpec:
    """Plan every worker's slice of the shards and package the model for the workers."""
    import secrets

    from sparkdl.data.reader import plan_slices
    from sparkdl.errors import DataError
    from sparkdl.training.serialization import model_to_bytes

    try:
        slices, steps_per_epoch = plan_slices(
            metadata, master.num_workers, master.batch_size_per_worker
        )
    except DataError as exc:
        raise DataError(f"{data_uri}: {exc}") from None
    return WorkerSpec(
        model_bytes=model_to_bytes(model),
        master_config=master.get_config(),
        data_uri=data_uri,
        metadata_json=metadata.to_json(),
        slices=slices,
        steps_per_epoch=steps_per_epoch,
        epochs=epochs,
        job_id=secrets.randbits(63),
        custom_objects=custom_objects,
        threads=threads,
        shuffle=shuffle,
        checkpoint=checkpoint,
    )


def configure_tensorflow(threads: int, gpu_addresses: list[str] | None = None) -> None:
    """Pin TensorFlow to the cores and GPUs this task was given.

    GPU visibility must be set before TensorFlow initializes its devices: through
    ``CUDA_VISIBLE_DEVICES`` when TensorFlow is not yet imported in this process, else through
    ``tf.config.set_visible_devices`` (effective only before the first op). On CPU-only
    tasks nothing GPU-related changes.
    """
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if gpu_addresses and "tensorflow" not in sys.modules:
        os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(gpu_addresses)
    import tensorflow as tf

    if gpu_addresses and os.environ.get("CUDA_VISIBLE_DEVICES") != ",".join(gpu_addresses):
        gpus = tf.config.list_physical_devices("GPU")
        wanted = [g for g in gpus if g.name.rsplit(":", 1)[-1] in gpu_addresses]
        try:
            tf.config.set_visible_devices(wanted, "GPU")
        except RuntimeError as exc:  # devices already initialized in a reused worker
            log.warning("could not restrict TensorFlow to GPUs %s: %s", gpu_addresses, exc)
    try:
        tf.config.threading.set_intra_op_parallelism_threads(max(1, threads))
        tf.config.threading.set_inter_op_parallelism_threads(max(1, min(2, threads)))
    except RuntimeError:
        pass  # already set in this (reused) Python worker


def run_worker(spec: WorkerSpec, comm: Communicator) -> dict[str, Any]:
    """Train on this worker's slice; returns its measurements (rank 0 adds the model)."""
    import time

    import keras

    started_at = time.time()
    from sparkdl.data.metadata import ShardMetadata
    from sparkdl.data.reader import ShardReader
    from sparkdl.training.checkpoint import CheckpointPolicy, CheckpointStore, TrainingState
    from sparkdl.training.loop import run_loop
    from sparkdl.training.masters import master_from_config
    from sparkdl.training.serialization import model_from_bytes, model_to_bytes
    from sparkdl.training.variables import weights_checksum

    master = master_from_config(spec.master_config)
    policy, store, run_id, resumed = None, None, "", None
    if spec.checkpoint:
        settings = dict(spec.checkpoint)
        run_id = settings.pop("run_id")
        policy = CheckpointPolicy(**settings)
        store = CheckpointStore(policy.uri)
        store.check_failure()
        resumed = store.latest(run_id)
    start = resumed.state if resumed else TrainingState(run_id, 0, 0, 0)
    # Seeds depend on the position, so a resumed attempt does not replay the same dropout.
    keras.utils.set_random_seed(master.seed + comm.rank + 7919 * start.global_step)
    model = model_from_bytes(
        resumed.model_bytes if resumed else spec.model_bytes, spec.custom_objects
    )
    if resumed:
        log.warning(
            "worker %d resuming from checkpoint %s at epoch %d, step %d (global step %d)",
            comm.rank, resumed.path, start.epoch, start.step_in_epoch, start.global_step,
        )
    metadata = ShardMetadata.from_json(spec.metadata_json)
    classification = metadata.label_kind == "class"
    exchange = master.create_exchange(
        model, comm, job_id=spec.job_id, classification=classification
    )
    _restore_exchange_state(exchange, start.exchange_state)
    compressor = getattr(exchange, "compressor", None)
    if resumed and compressor is not None:
        saved = resumed.worker_state(store, comm.rank)
        if saved is None:
            log.warning("worker %d resumes without its residual (none was saved)", comm.rank)
        else:
            _restore_worker_state(exchange, saved)

    def on_checkpoint(global_step: int, epoch: int, step: int, history: list) -> None:
        if compressor is not None:  # every rank stages its own state, then rank 0 publishes
            store.save_worker_state(run_id, global_step, comm.rank, _worker_state(exchange))
            comm.barrier()
        if comm.rank != 0:
            return
        state = TrainingState(run_id, global_step, epoch, step, list(history),
                              _exchange_state(exchange))
        path = store.save(state, model_to_bytes(model), keep=policy.keep)
        log.info("checkpoint %s written (epoch %d, step %d)", path, epoch, step)
    reader = ShardReader(
        spec.data_uri,
        metadata,
        spec.slices[comm.rank],
        master.batch_size_per_worker,
        spec.steps_per_epoch,
        shuffle=spec.shuffle,
        seed=master.seed,
    )
    try:
        loop = run_loop(
            exchange,
            comm,
            reader.epoch,
            epochs=spec.epochs,
            steps_per_epoch=spec.steps_per_epoch,
            batch_size=master.batch_size_per_worker,
            start_epoch=start.epoch,
            start_step=start.step_in_epoch,
            history=start.history,
            checkpoint_due=policy.due if policy else None,
            on_checkpoint=on_checkpoint if policy else None,
        )
    except TrainingError as exc:
        if store is not None:
            store.record_failure(str(exc))  # a retry would fail the same way: fail fast
        raise
    finally:
        reader.close()
    result: dict[str, Any] = {
        "rank": comm.rank,
        "checksum": weights_checksum(model.trainable_variables),
        "history": loop.history,
        "steps": loop.steps,
        "samples": loop.samples,
        "train_seconds": loop.train_seconds,
        "data_wait_seconds": loop.data_wait_seconds,
        "bytes_sent": loop.bytes_sent,
        "bytes_received": loop.bytes_received,
        "timed_steps": loop.timed_steps,
        "steady_bytes_sent": loop.steady_bytes_sent,
        "timings": loop.timings,
        "extras": loop.extras,
        "num_parameters": exchange.trainable.size,
        "trained_steps": loop.steps - start.global_step,
        "resumed_from": resumed.path if resumed else None,
        "started_at": started_at,
    }
    if comm.rank == 0:
        result["model_bytes"] = model_to_bytes(model)
    return result


def _exchange_state(exchange: Any) -> dict[str, Any]:
    """What a resumed exchange needs beyond the model and the residuals (saved per rank
    beside the checkpoint): the adaptive threshold's τ."""
    threshold = getattr(getattr(exchange, "compressor", None), "threshold", None)
    tau = getattr(threshold, "tau", None)
    return {"tau": float(tau)} if tau is not None else {}


def _worker_state(exchange: Any) -> bytes:
    """A sharing worker's own state: its residual and its optimizer's float variables (each
    worker's optimizer sees only its own gradients, so these differ between workers)."""
    import io

    from sparkdl.training.variables import FlatVariables

    buffer = io.BytesIO()
    np.savez(
        buffer,
        residual=np.ascontiguousarray(exchange.compressor.residual, dtype=np.float32),
        optimizer=FlatVariables(exchange.model.optimizer.variables).read(),
    )
    return buffer.getvalue()


def _restore_worker_state(exchange: Any, data: bytes) -> None:
    import io

    from sparkdl.training.variables import FlatVariables

    with np.load(io.BytesIO(data), allow_pickle=False) as saved:
        residual, optimizer = saved["residual"], saved["optimizer"]
    compressor = exchange.compressor
    if residual.shape != (compressor.num_elements,):
        raise TrainingError(
            f"checkpointed residual has {residual.size} elements, "
            f"the model {compressor.num_elements}"
        )
    setter = getattr(compressor, "set_residual", None)
    if setter is not None:
        setter(residual)
    else:
        compressor.residual[:] = residual
    FlatVariables(exchange.model.optimizer.variables).assign(optimizer)


def _restore_exchange_state(exchange: Any, state: dict[str, Any]) -> None:
    threshold = getattr(getattr(exchange, "compressor", None), "threshold", None)
    if "tau" in state and threshold is not None and hasattr(threshold, "tau"):
        threshold.tau = float(state["tau"])
