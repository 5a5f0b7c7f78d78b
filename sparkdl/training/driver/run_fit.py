"""The driver's side of a fit, shared by every launcher (Spark barrier stage, local processes).

:class:`~sparkdl.training.driver.keras_fit.KerasFit` (the Keras-shaped ``fit`` of ``SparkModel``
and ``ParallelWrapper``) builds the :class:`~sparkdl.fit_options.FitOptions` once and calls
:func:`run_fit`, which checks them, builds the
:class:`~sparkdl.training.worker.run_worker.WorkerSpec`
once, opens the event channel, runs the workers through a
:class:`~sparkdl.training.driver.launcher.Launcher` on a background thread while the driver's Keras
callbacks run on the calling thread from the workers' events, and returns a
:class:`FitResult` (Keras's ``History`` plus the job's
:class:`~sparkdl.training.summary.FitMetrics`) with the trained model. ``SparkModel`` and
``ParallelWrapper`` differ only in their launcher.
"""

from __future__ import annotations

import logging
import queue
import secrets
import threading
import time
from typing import TYPE_CHECKING

import keras
import numpy as np

from sparkdl.errors import ConfigurationError
from sparkdl.fit_options import FitOptions
from sparkdl.training.driver.launcher import ChannelSettings, Launcher
from sparkdl.training.summary import WorkerResult, dense_bytes_per_step, summarize_fit

if TYPE_CHECKING:
    from sparkdl.comm.channel import Message
    from sparkdl.training.driver.events import DriverCallbacks
    from sparkdl.training.masters import TrainingMaster
    from sparkdl.training.model_files import ModelRef
    from sparkdl.training.summary import FitMetrics
    from sparkdl.training.worker.run_worker import CheckpointSpec, ValidationSpec, WorkerSpec

log = logging.getLogger("sparkdl")

#: The largest blob a worker's event may carry: none carries a model (rank 0's weights reach
#: the driver's callbacks as a model file, :class:`~sparkdl.training.driver.events.DriverLink`).
_EVENT_BLOB_MAX = 1 << 20


class FitResult(keras.callbacks.History):
    """What ``fit`` returns: Keras's ``History`` (``history``, ``epoch``, ``params``,
    ``model``) plus the job's measurements (``metrics``, set when the fit ends) and each
    worker's result."""

    metrics: FitMetrics
    model_file: ModelRef  # the trained model's file (rank 0 wrote it)

    def __init__(self) -> None:
        super().__init__()
        self.epoch: list[int] = []
        self.workers: list[WorkerResult] = []


def _check_schedule(model: keras.Model, master: TrainingMaster, options: FitOptions,
                    steps_per_epoch: int) -> None:
    """What the plan makes pointless, before the workers start: an accumulation of more
    micro-batches than the fit has steps (no update would ever be applied: refused), and a
    PowerSGD rank that compresses none of the model's matrices (said once)."""
    epochs = options.epochs - options.initial_epoch
    total = steps_per_epoch * epochs
    if options.accumulate_steps > 1 and options.accumulate_steps > total:
        raise ConfigurationError(
            f"accumulate_steps={options.accumulate_steps} is more than the fit's {total} steps "
            f"({steps_per_epoch} steps per epoch x {epochs} epochs): no update would be applied"
        )
    from sparkdl.compression.powersgd import PowerSGDCompressorConfig, rank_too_large

    compressor = getattr(master, "compressor", None)
    if isinstance(compressor, PowerSGDCompressorConfig):
        line = rank_too_large([tuple(w.shape) for w in model.trainable_weights],
                              compressor.rank, compressor.min_compression)
        if line:
            log.warning("%s", line)


def run_fit(
    model: keras.Model,
    master: TrainingMaster,
    launcher: Launcher,
    data_uri: str,
    options: FitOptions,
    *,
    custom_objects: dict[str, object] | None = None,
    channel: ChannelSettings | None = None,
) -> tuple[FitResult, keras.Model]:
    """Train ``model`` with ``master``'s workers on ``launcher``; returns the history and the
    trained model (rank 0's)."""
    from sparkdl.comm.channel import ChannelServer
    from sparkdl.data.files import read_metadata
    from sparkdl.data.reader import rows_dropped_per_epoch, shuffle_mode
    from sparkdl.training.driver.events import DriverCallbacks, needs_weights
    from sparkdl.training.driver.progress import ProgressLogger, resolve_verbose
    from sparkdl.training.model_files import delete_model, write_model
    from sparkdl.training.weights import check_class_weight
    from sparkdl.training.worker.run_worker import EventsSpec, make_worker_spec

    options.check()
    verbose = resolve_verbose(options.verbose)
    metadata = read_metadata(data_uri)
    class_weight = check_class_weight(options.class_weight, metadata, data_uri)
    shuffle = shuffle_mode(options.shuffle)
    if options.accumulate_steps > 1 and master.mode != "dense":
        raise ConfigurationError(
            f"accumulate_steps={options.accumulate_steps} applies to dense training (mode "
            f"'dense'), not to {type(master).__name__}: its exchange shares optimizer updates "
            "or averages weights, not gradients"
        )
    launcher.check_slots(master.num_workers)
    validation = _validation_spec(options) if options.validation_data else None
    checkpoint = _checkpoint_spec(options)
    callbacks = list(options.callbacks or [])
    log_every = options.log_every_steps
    model_dir = launcher.model_dir(data_uri, options.checkpoint_dir)
    initial = write_model(model, model_dir)
    try:
        spec = make_worker_spec(
            initial, model_dir, master, data_uri, metadata,
            options.for_workers(shuffle=shuffle, class_weight=class_weight),
            custom_objects=custom_objects, threads=launcher.threads_per_worker,
            checkpoint=checkpoint, validation=validation,
        )
        _check_schedule(model, master, options, spec.steps_per_epoch)
        if log_every is None:  # a progress bar moves ~20 times an epoch; else epoch events only
            log_every = max(1, spec.steps_per_epoch // 20) if verbose == 1 else 0
        num_parameters = sum(int(np.prod(w.shape)) for w in model.trainable_weights)
        dense = dense_bytes_per_step(num_parameters, master.num_workers)
        if verbose:
            callbacks.append(ProgressLogger(verbose, dense_bytes_per_step=dense))
        history = FitResult()
        params = {"verbose": verbose, "epochs": options.epochs, "steps": spec.steps_per_epoch}
        driver = DriverCallbacks(model, callbacks, history, params)
        channel = channel or ChannelSettings()
        timeout_s = channel.timeout_s
        secret = secrets.token_bytes(32)
        log.info(
            "fit: %s, %d workers x batch %d, %d steps/epoch, epochs %d-%d%s",
            master.describe(), master.num_workers, master.batch_size_per_worker,
            spec.steps_per_epoch,
            options.initial_epoch, options.epochs - 1,
            f", validation every {options.validation_freq} epoch(s)" if validation else "",
        )
        with ChannelServer(secret, bind_host=launcher.bind_host,
                           advertise_host=launcher.driver_host, port_range=channel.port_range,
                           timeout_s=timeout_s, max_blob=_EVENT_BLOB_MAX) as server:
            spec.events = EventsSpec(server.address, log_every_steps=log_every,
                                     send_weights=needs_weights(callbacks), timeout_s=timeout_s)
            driver.train_begin()
            started = time.perf_counter()
            results = _run_with_events(launcher, spec, secret, server.inbox, driver)
            wall = time.perf_counter() - started
    finally:
        delete_model(initial)  # the model to train: every attempt is over
    results.sort(key=lambda r: r.rank)
    trained = results[0].model
    assert trained is not None  # rank 0 returns the model's file
    final = _trained_model(model, trained, custom_objects)
    history.model_file = trained
    steps_per_epoch = spec.steps_per_epoch
    if len(results) != len(spec.slices):  # an elastic fit ended with another world size
        from sparkdl.training.worker.run_worker import replan

        steps_per_epoch = replan(spec, len(results)).steps_per_epoch
    history.metrics = summarize_fit(results, master, steps_per_epoch, wall)
    history.metrics.shuffle = shuffle
    history.metrics.rows_dropped_per_epoch = rows_dropped_per_epoch(
        metadata, len(results), master.batch_size_per_worker, steps_per_epoch)
    events = list(getattr(launcher, "elastic_events", []))
    if getattr(launcher, "elastic", None) is not None or events:  # a retried stage's too
        history.metrics.elastic_events = [event.to_dict() for event in events]
        for event in events:
            log.warning("elastic fit: continued at epoch %d, step %d with %d workers (was %d) "
                        "(%s)", event.epoch, event.step, event.to_workers,
                        event.from_workers, event.cause)
    history.workers = results
    driver.train_end(final)
    if history.metrics.resumed_from:
        log.warning("fit resumed from checkpoint %s", history.metrics.resumed_from)
    return history, final


def _trained_model(model: keras.Model, trained: ModelRef,
                   custom_objects: dict[str, object] | None) -> keras.Model:
    """Rank 0's trained model: its weights and optimizer state loaded into ``model`` (one model
    in the driver's memory, as Keras's ``fit`` trains in place), or, where the structures
    differ, the model of the file."""
    from sparkdl.errors import DataError
    from sparkdl.training.model_files import load_model, load_weights

    try:
        load_weights(model, trained)
        return model
    except DataError:
        raise
    except Exception as exc:  # another structure: load the file as it is
        log.debug("the trained weights did not load into the fitted model (%s): "
                  "loading the trained model anew", exc)
        return load_model(trained, custom_objects)


def _run_with_events(
    launcher: Launcher,
    spec: WorkerSpec,
    secret: bytes,
    inbox: queue.Queue[Message],
    driver: DriverCallbacks,
) -> list[WorkerResult]:
    """Run the launcher on a thread; meanwhile this thread serves the workers' events (so the
    Keras callbacks run where the user called ``fit``)."""
    results: list[list[WorkerResult]] = []
    errors: list[BaseException] = []

    def work() -> None:
        try:
            results.append(launcher.run(spec, secret))
        except BaseException as exc:  # handed to the calling thread
            errors.append(exc)

    thread = threading.Thread(target=work, name="sparkdl-fit", daemon=True)
    thread.start()
    try:
        while thread.is_alive() or not inbox.empty():
            try:
                message = inbox.get(timeout=0.1)
            except queue.Empty:
                continue
            driver.handle(message)
    except BaseException:
        launcher.cancel()  # a callback failed or the user interrupted: stop the workers
        thread.join(timeout=60)
        raise
    thread.join()
    if errors:
        raise errors[0]
    return results[0]


def _validation_spec(options: FitOptions) -> ValidationSpec:
    from sparkdl.data.files import read_metadata
    from sparkdl.training.worker.run_worker import ValidationSpec

    uri = options.validation_data
    assert uri is not None
    metadata = read_metadata(uri)
    return ValidationSpec(uri, metadata.to_json(), [f.path for f in metadata.files],
                          options.validation_batch_size, options.validation_freq)


def _checkpoint_spec(options: FitOptions) -> CheckpointSpec | None:
    if not options.checkpoint_dir:
        return None
    from sparkdl.training.worker.checkpoint import CheckpointPolicy, CheckpointStore
    from sparkdl.training.worker.run_worker import CheckpointSpec

    policy = CheckpointPolicy(options.checkpoint_dir, options.checkpoint_every,
                              options.checkpoint_unit)
    run_id = CheckpointStore(options.checkpoint_dir).start_run(options.resume)
    return CheckpointSpec(policy, run_id)
