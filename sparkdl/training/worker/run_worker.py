"""What one worker does, given a communicator: set TensorFlow up, load the model, train.

Knows TensorFlow but not Spark: the Spark launcher (``sparkdl.spark_model``) and
``ParallelWrapper`` both call :func:`run_worker` with their own communicator. Importing this
module imports no TensorFlow: :func:`configure_tensorflow` must run first in a task.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import sys
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from sparkdl.comm.communicator import Communicator
from sparkdl.errors import SparkDLError, TrainingError
from sparkdl.training.summary import WorkerResult
from sparkdl.training.worker.loop import CallbackList, TrainingLoop, WorkerCallback

if TYPE_CHECKING:

    from sparkdl.data.metadata import ShardMetadata
    from sparkdl.data.reader import WorkerSlice
    from sparkdl.fit_options import FitOptions
    from sparkdl.training.exchanges.exchange import StepResult, UpdateExchange
    from sparkdl.training.masters import TrainingMaster
    from sparkdl.training.model_files import ModelRef
    from sparkdl.training.worker.checkpoint import (
        Checkpoint,
        CheckpointPolicy,
        CheckpointStore,
        TrainingState,
    )

log = logging.getLogger("sparkdl.training")


@dataclass
class ValidationSpec:
    """Validation shards, evaluated by every rank on its share of the files."""

    uri: str
    metadata_json: str
    files: list[str]
    batch_size: int
    freq: int = 1


@dataclass
class EventsSpec:
    """Where rank 0 reports to the driver (see :mod:`sparkdl.training.driver.events`)."""

    address: str
    log_every_steps: int = 0
    send_weights: bool = False
    timeout_s: float = 120.0


@dataclass(frozen=True)
class CheckpointSpec:
    """Where and how often the workers checkpoint, and the run they checkpoint (its id in
    the checkpoint directory's ``_run.json``)."""

    policy: CheckpointPolicy
    run_id: str

    @property
    def uri(self) -> str:
        return self.policy.uri


@dataclass
class WorkerSpec:
    """Everything a worker needs, as plain picklable data (small: the model travels as a
    file, :mod:`sparkdl.training.model_files`)."""

    model: ModelRef  # the model to train
    model_dir: str  # where rank 0 writes the trained model
    master_config: dict[str, object]  # TrainingMaster.get_config(); see :attr:`master`
    data_uri: str
    metadata_json: str
    slices: list[WorkerSlice]  # one per rank
    steps_per_epoch: int
    job_id: int
    options: FitOptions  # the fit's (FitOptions.for_workers: no callbacks, shuffle resolved)
    custom_objects: dict[str, object] | None = None
    threads: int = 1
    checkpoint: CheckpointSpec | None = None
    validation: ValidationSpec | None = None
    events: EventsSpec | None = None
    elastic: bool = False  # the ranks report their world size per epoch

    @property
    def master(self) -> TrainingMaster:
        """The training master, rebuilt from :attr:`master_config`."""
        from sparkdl.training.masters import master_from_config

        return master_from_config(self.master_config)


def replan(spec: WorkerSpec, world: int) -> WorkerSpec:
    """``spec`` for ``world`` workers: the shard slices and steps per epoch re-planned, the
    master's ``num_workers`` updated."""
    from sparkdl.data.metadata import ShardMetadata
    from sparkdl.data.reader import plan_slices

    master_config = {**spec.master_config, "num_workers": world}
    metadata = ShardMetadata.from_json(spec.metadata_json)
    slices, steps_per_epoch = plan_slices(metadata, world, spec.master.batch_size_per_worker)
    return dataclasses.replace(
        spec, slices=slices, steps_per_epoch=steps_per_epoch, master_config=master_config
    )


def make_worker_spec(
    model: ModelRef,
    model_dir: str,
    master: TrainingMaster,
    data_uri: str,
    metadata: ShardMetadata,
    options: FitOptions,
    *,
    custom_objects: dict[str, object] | None,
    threads: int,
    checkpoint: CheckpointSpec | None = None,
    validation: ValidationSpec | None = None,
) -> WorkerSpec:
    """Plan every worker's slice of the shards; ``model`` is the model's file, ``model_dir``
    where rank 0 writes the trained one, ``options`` the fit's as the workers get them
    (:meth:`FitOptions.for_workers`)."""
    import secrets

    from sparkdl.data.reader import plan_slices
    from sparkdl.errors import DataError

    try:
        slices, steps_per_epoch = plan_slices(
            metadata, master.num_workers, master.batch_size_per_worker
        )
    except DataError as exc:
        raise DataError(f"{data_uri}: {exc}") from None
    return WorkerSpec(
        model=model,
        model_dir=model_dir,
        master_config=master.get_config(),
        data_uri=data_uri,
        metadata_json=metadata.to_json(),
        slices=slices,
        steps_per_epoch=steps_per_epoch,
        job_id=secrets.randbits(63),
        options=options,
        custom_objects=custom_objects,
        threads=threads,
        checkpoint=checkpoint,
        validation=validation,
    )


#: glibc's ``mallopt`` parameter for the most malloc arenas (``M_ARENA_MAX``).
_M_ARENA_MAX = -8


def limit_malloc_arenas() -> None:
    """One glibc malloc arena for the threads this process starts from now on (TensorFlow's
    pools, the reader's and the collectives' threads), unless ``MALLOC_ARENA_MAX`` says
    otherwise: each thread's own arena keeps the step's freed buffers resident, and a
    ResNet-50's worker peaked 30-95 MB lower (0.1-0.35x its state) with one, its step no
    slower. Nothing happens where the C library is not glibc."""
    if os.environ.get("MALLOC_ARENA_MAX") or not sys.platform.startswith("linux"):
        return
    import contextlib
    import ctypes

    with contextlib.suppress(OSError, AttributeError):  # not glibc (musl has no mallopt)
        ctypes.CDLL("libc.so.6").mallopt(_M_ARENA_MAX, 1)


def configure_tensorflow(threads: int, gpu_addresses: list[str] | None = None) -> None:
    """Pin TensorFlow to the cores and GPUs this task was given (and limit the malloc arenas
    first, :func:`limit_malloc_arenas`).

    GPU visibility must be set before TensorFlow initializes its devices: through
    ``CUDA_VISIBLE_DEVICES`` when TensorFlow is not yet imported in this process, else through
    ``tf.config.set_visible_devices`` (effective only before the first op). On CPU-only
    tasks nothing GPU-related changes.
    """
    from sparkdl.logs import quiet_tensorflow

    limit_malloc_arenas()
    quiet_tensorflow()
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


class Checkpointing(WorkerCallback):
    """Every rank stages its own state and rank 0 publishes the checkpoint when
    ``policy.due`` says so (every N epochs or steps)."""

    timeline_name = "checkpoint"

    def __init__(self, policy: CheckpointPolicy, store: CheckpointStore, run_id: str) -> None:
        self.policy = policy
        self.store = store
        self.run_id = run_id

    def on_step_end(
        self, loop: TrainingLoop, epoch: int, step: int, outcome: StepResult
    ) -> None:
        last = step == loop.steps_per_epoch - 1
        if not last and self.policy.due(loop.global_step, False, epoch):
            self._save(loop, epoch, step + 1)

    def on_epoch_end(self, loop: TrainingLoop, epoch: int, logs: dict[str, float]) -> None:
        if self.policy.due(loop.global_step, True, epoch):
            self._save(loop, epoch + 1, 0)

    def _save(self, loop: TrainingLoop, epoch: int, step: int) -> None:
        import tempfile
        from pathlib import Path

        from sparkdl.run_output import MODEL_FILE
        from sparkdl.training.serialization import save_model_file
        from sparkdl.training.worker.checkpoint import TrainingState

        exchange, comm, global_step = loop.exchange, loop.comm, loop.global_step
        exchange.finish()
        # every rank stages its own exchange state, then rank 0 publishes
        self.store.save_worker_state(self.run_id, global_step, comm.rank, exchange.get_state())
        comm.barrier()
        if comm.rank != 0:
            return
        state = TrainingState(self.run_id, global_step, epoch, step, list(loop.history),
                              _exchange_state(exchange), world_size=comm.world_size,
                              steps_per_epoch=loop.steps_per_epoch)
        with tempfile.TemporaryDirectory(prefix="sparkdl-checkpoint-") as tmp:
            model_file = Path(tmp, MODEL_FILE)
            save_model_file(exchange.model, model_file)  # through disk, not memory
            path = self.store.save(state, model_file, keep=self.policy.keep)
        log.info("checkpoint %s written (epoch %d, step %d)", path, epoch, step)


class DroppedRows(WorkerCallback):
    """Every epoch's ``rows_dropped``: the rows no worker read (beyond the equal steps)."""

    def __init__(self, rows: int) -> None:
        self.rows = rows

    def on_epoch_end(self, loop: TrainingLoop, epoch: int, logs: dict[str, float]) -> None:
        logs["rows_dropped"] = self.rows


class WorldSize(WorkerCallback):
    """An elastic fit's per-epoch ``workers`` figure: how many ranks trained the epoch."""

    def on_epoch_end(self, loop: TrainingLoop, epoch: int, logs: dict[str, float]) -> None:
        logs["workers"] = loop.comm.world_size


class Validation(WorkerCallback):
    """Evaluate the validation shards at the end of every ``freq``-th epoch: each rank reads
    its share of the files, then loss and compiled metrics are combined exactly."""

    timeline_name = "validation"

    def __init__(self, spec: ValidationSpec) -> None:
        from sparkdl.data.metadata import ShardMetadata

        self.spec = spec
        self.metadata = ShardMetadata.from_json(spec.metadata_json)

    def on_epoch_end(self, loop: TrainingLoop, epoch: int, logs: dict[str, float]) -> None:
        from sparkdl.data.reader import batch_rows, iter_batches
        from sparkdl.training.weights import model_batch

        if (epoch + 1) % self.spec.freq:
            return
        exchange, comm = loop.exchange, loop.comm
        exchange.finish()  # every replica holds the same weights (averaging: averaged now)
        exchange.metrics.reset()
        totals = np.zeros(2, np.float64)  # loss × rows, rows
        files = self.spec.files[comm.rank :: comm.world_size]
        if files:
            for batch in iter_batches(self.spec.uri, files, self.spec.batch_size,
                                      metadata=self.metadata):
                x, y = model_batch(batch)
                rows = batch_rows(batch[1])
                totals += (exchange.evaluate_batch(x, y) * rows, rows)
        state = np.concatenate([totals, exchange.metrics.state()])
        if comm.world_size > 1:
            state = comm.allreduce(state, "sum")
        logs["val_loss"] = state[0] / max(state[1], 1.0)
        for name, value in exchange.metrics.results_from_state(state[2:]).items():
            logs[f"val_{name}"] = value
        exchange.metrics.reset()


def run_worker(
    spec: WorkerSpec, comm: Communicator, *, secret: bytes | None = None
) -> WorkerResult:
    """Train on this worker's slice; returns its measurements (rank 0 adds the model).

    ``secret`` authenticates rank 0's event channel to the driver (``spec.events``).
    With ``spec.options.timeline`` it records the fit (see
    :mod:`sparkdl.training.worker.timeline`) and writes the trace at the end, also when the
    fit fails.
    """
    if not spec.options.timeline:
        return _run_worker(spec, comm, secret)
    from sparkdl.training.worker.timeline import Timeline, TracedCommunicator, recording

    recorder = Timeline(comm.rank)
    written: str | None = None
    try:
        with recording(recorder):
            result = _run_worker(spec, TracedCommunicator(comm), secret)
    finally:
        try:
            written = recorder.write(spec.options.timeline)
            log.info("worker %d: timeline written to %s", comm.rank, written)
        except Exception as exc:  # never hide the fit's own outcome
            log.warning("worker %d: could not write the timeline to %s: %s",
                        comm.rank, spec.options.timeline, exc)
    result.timeline = written
    return result


def _run_worker(spec: WorkerSpec, comm: Communicator, secret: bytes | None) -> WorkerResult:
    import keras

    started_at = time.time()
    from sparkdl.data.metadata import ShardMetadata
    from sparkdl.data.reader import ShardReader, global_shuffle, rows_dropped_per_epoch
    from sparkdl.training.exchanges.variables import weights_checksum
    from sparkdl.training.model_files import load_model, write_model
    from sparkdl.training.serialization import load_model_file
    from sparkdl.training.worker.checkpoint import CheckpointStore, TrainingState

    master = spec.master
    store: CheckpointStore | None = None
    resumed: Checkpoint | None = None
    run_id = spec.checkpoint.run_id if spec.checkpoint else ""
    if spec.checkpoint:
        store = CheckpointStore(spec.checkpoint.uri)
        store.check_failure()
        resumed = store.latest(run_id)
    start = resumed.state if resumed else TrainingState(run_id, 0, spec.options.initial_epoch, 0)
    if resumed and start.steps_per_epoch not in (0, spec.steps_per_epoch):
        start = _replanned_position(start, spec.steps_per_epoch)
    # Seeds depend on the position, so a resumed attempt does not replay the same dropout.
    keras.utils.set_random_seed((master.seed + comm.rank + 7919 * start.global_step) % 2**32)
    if resumed:
        with resumed.model_file() as local:
            model = load_model_file(local, spec.custom_objects)
    else:
        model = load_model(spec.model, spec.custom_objects)
    if resumed:
        log.warning(
            "worker %d resuming from checkpoint %s at epoch %d, step %d (global step %d)",
            comm.rank, resumed.path, start.epoch, start.step_in_epoch, start.global_step,
        )
    metadata = ShardMetadata.from_json(spec.metadata_json)
    exchange = master.create_exchange(model, comm, job_id=spec.job_id)
    exchange.accumulate(spec.options.accumulate_steps)
    if resumed:
        assert store is not None
        _restore_exchange_state(exchange, _saved_states(resumed, store, comm), comm.rank)
    dropped = DroppedRows(rows_dropped_per_epoch(
        metadata, comm.world_size, master.batch_size_per_worker, spec.steps_per_epoch))
    callbacks = CallbackList([dropped, *_worker_callbacks(spec, comm, secret, store)])
    epoch_slices = None
    if spec.options.shuffle == "global":
        epoch_slices = global_shuffle(metadata, comm.world_size, master.batch_size_per_worker,
                                      comm.rank, master.seed)
    reader = ShardReader(
        spec.data_uri,
        metadata,
        spec.slices[comm.rank],
        master.batch_size_per_worker,
        spec.steps_per_epoch,
        shuffle=spec.options.shuffle != "none",
        seed=master.seed,
        epoch_slices=epoch_slices,
        prefetch=spec.options.prefetch,
        decode_threads=spec.options.decode_threads,
    )
    batches: Any = reader.epoch
    if spec.options.class_weight:  # Keras's class_weight: per-row sample weights of the labels
        from sparkdl.training.weights import class_weight_table, with_class_weights

        table = class_weight_table(spec.options.class_weight, metadata.num_classes)
        batches = lambda epoch: with_class_weights(reader.epoch(epoch), table)  # noqa: E731
    global_step_at_start = start.epoch * spec.steps_per_epoch + start.step_in_epoch
    try:
        loop = TrainingLoop(
            exchange,
            comm,
            batches,
            epochs=spec.options.epochs,
            steps_per_epoch=spec.steps_per_epoch,
            batch_size=master.batch_size_per_worker,
            start_epoch=start.epoch,
            start_step=start.step_in_epoch,
            history=start.history,
            callbacks=callbacks,
        ).run()
    except TrainingError as exc:
        if store is not None:
            store.record_failure(str(exc))  # a retry would fail the same way: fail fast
        raise
    finally:
        exchange.close()  # the overlap's thread, if any
        reader.close()
        callbacks.close()
    return WorkerResult(
        rank=comm.rank,
        checksum=weights_checksum(model.trainable_variables),
        loop=loop,
        num_parameters=exchange.trainable.size,
        trained_steps=loop.steps - global_step_at_start,
        started_at=started_at,
        resumed_from=resumed.path if resumed else None,
        model=write_model(model, spec.model_dir) if comm.rank == 0 else None,
    )


def _worker_callbacks(
    spec: WorkerSpec, comm: Communicator, secret: bytes | None, store: CheckpointStore | None
) -> CallbackList:
    """The worker loop's callbacks, in order: validation adds ``val_*`` to an epoch's figures
    before the driver sees them; checkpoints come last (they hold the driver's decisions)."""
    callbacks: list[WorkerCallback] = []
    if spec.elastic:
        callbacks.append(WorldSize())
    if spec.validation is not None:
        callbacks.append(Validation(spec.validation))
    if spec.events is not None:
        from sparkdl.comm.channel import ChannelClient
        from sparkdl.training.driver.events import DriverLink

        client = None
        if comm.rank == 0:
            if secret is None:
                raise TrainingError("the event channel to the driver needs the job secret")
            client = ChannelClient(spec.events.address, secret, timeout_s=spec.events.timeout_s)
        callbacks.append(DriverLink(client, log_every_steps=spec.events.log_every_steps,
                                    send_weights=spec.events.send_weights,
                                    model_dir=spec.model_dir))
    if spec.checkpoint is not None and store is not None:
        callbacks.append(Checkpointing(spec.checkpoint.policy, store, spec.checkpoint.run_id))
    return CallbackList(callbacks)


def _exchange_state(exchange: UpdateExchange) -> dict[str, Any]:
    """Rank 0's scalar exchange state (e.g. its τ) for ``state.json``, for people reading the
    checkpoint; every rank restores its whole state from its own ``workers/rank-N``."""
    return {
        key: value for key, value in exchange.get_state().items()
        if isinstance(value, (int, float)) and math.isfinite(value)
    }


def _saved_states(
    resumed: Checkpoint, store: CheckpointStore, comm: Communicator
) -> list[dict[str, Any]] | None:
    """The saved exchange states this rank resumes from: its own, plus, when the checkpoint
    was written by more ranks than there are now (an elastic relaunch), those of the lost
    ranks it absorbs (:func:`sparkdl.training.elastic.absorbed_ranks`). ``None`` when its
    own was not saved."""
    from sparkdl.training.elastic import absorbed_ranks

    old_world = resumed.state.world_size
    if old_world <= comm.world_size:
        data = resumed.worker_state(store, comm.rank)
        return None if data is None else [data]
    saved = [resumed.worker_state(store, r)
             for r in absorbed_ranks(comm.rank, old_world, comm.world_size)]
    states = [data for data in saved if data is not None]
    if len(states) < len(saved):
        raise TrainingError(
            f"worker {comm.rank}: checkpoint {resumed.path} lacks the state of a rank of its "
            f"{old_world} ranks, so their residuals cannot be folded into {comm.world_size}"
        )
    log.warning("worker %d absorbs ranks %s of the %d that wrote checkpoint %s", comm.rank,
                absorbed_ranks(comm.rank, old_world, comm.world_size)[1:], old_world,
                resumed.path)
    return states


def _replanned_position(start: TrainingState, steps_per_epoch: int) -> TrainingState:
    """``start`` under a plan of ``steps_per_epoch`` (an elastic relaunch with another world
    size): the same epoch, the same fraction of it, the global step counted anew."""
    from sparkdl.training.elastic import resume_step

    step = resume_step(start.step_in_epoch, start.steps_per_epoch, steps_per_epoch)
    return dataclasses.replace(start, step_in_epoch=step, steps_per_epoch=steps_per_epoch,
                               global_step=start.epoch * steps_per_epoch + step)


def _restore_exchange_state(
    exchange: UpdateExchange, data: list[dict[str, Any]] | None, rank: int
) -> None:
    """Give this rank its own saved exchange state back (``data``: the checkpoint's
    ``workers/rank-N``, then those of the lost ranks it absorbs, whose residuals are folded
    into its own); a checkpoint without it resumes with rank 0's optimizer state from the
    model file and a fresh residual and threshold, with a warning."""
    from sparkdl.training.elastic import fold_states

    if data is None:
        log.warning(
            "worker %d resumes without its own exchange state (none was saved): fresh "
            "residual and threshold, rank 0's optimizer state", rank,
        )
        return
    try:
        exchange.set_state(fold_states(data))
    except (SparkDLError, ValueError, KeyError) as exc:
        raise TrainingError(f"worker {rank}: cannot restore its checkpointed state: {exc}") from exc
