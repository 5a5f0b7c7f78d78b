"""The driver's side of a fit, shared by every launcher (Spark barrier stage, local processes).

:class:`KerasFit` is the Keras-shaped ``fit`` of ``SparkModel`` and ``ParallelWrapper``: it
builds the :class:`~sparkdl.training.fit.FitOptions` once and calls :func:`run_fit`, which
checks them, builds the :class:`~sparkdl.training.worker.WorkerSpec` once, opens the event
channel, runs the workers through a :class:`~sparkdl.training.launcher.Launcher` on a
background thread while the driver's Keras callbacks run on the calling thread from the
workers' events, and returns a :class:`~sparkdl.training.fit.FitResult` (Keras's ``History``
plus the job's metrics) with the trained model. ``SparkModel`` and ``ParallelWrapper`` differ
only in their launcher.
"""

from __future__ import annotations

import logging
import queue
import secrets
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import keras
import numpy as np

from sparkdl.errors import ConfigurationError
from sparkdl.training.fit import FitOptions, FitResult
from sparkdl.training.launcher import Launcher
from sparkdl.training.summary import WorkerResult, dense_bytes_per_step, summarize_fit

if TYPE_CHECKING:
    from sparkdl.comm.channel import Message
    from sparkdl.training.events import DriverCallbacks
    from sparkdl.training.masters import TrainingMaster
    from sparkdl.training.worker import CheckpointSpec, ValidationSpec, WorkerSpec

log = logging.getLogger("sparkdl")


@dataclass(frozen=True)
class ChannelSettings:
    """The driver's event channel: how long a worker waits for it, and the ports it may
    listen on (``None``: any)."""

    timeout_s: float = 120.0
    port_range: tuple[int, int] | None = None


def run_fit(
    model: keras.Model,
    master: TrainingMaster,
    launcher: Launcher,
    data_uri: str,
    options: FitOptions,
    *,
    custom_objects: dict[str, object] | None = None,
    channel: ChannelSettings = ChannelSettings(),
) -> tuple[FitResult, keras.Model]:
    """Train ``model`` with ``master``'s workers on ``launcher``; returns the history and the
    trained model (rank 0's)."""
    from sparkdl.comm.channel import ChannelServer
    from sparkdl.data.files import read_metadata
    from sparkdl.training.events import DriverCallbacks, needs_weights
    from sparkdl.training.progress import ProgressLogger, resolve_verbose
    from sparkdl.training.serialization import model_from_bytes
    from sparkdl.training.worker import EventsSpec, make_worker_spec

    options.check()
    verbose = resolve_verbose(options.verbose)
    metadata = read_metadata(data_uri)
    launcher.check_slots(master.num_workers)
    validation = _validation_spec(options) if options.validation_data else None
    checkpoint = _checkpoint_spec(options)
    callbacks = list(options.callbacks or [])
    log_every = options.log_every_steps
    spec = make_worker_spec(
        model, master, data_uri, metadata, epochs=options.epochs,
        custom_objects=custom_objects, threads=launcher.threads_per_worker,
        shuffle=options.shuffle, checkpoint=checkpoint, initial_epoch=options.initial_epoch,
        validation=validation, prefetch=options.prefetch, decode_threads=options.decode_threads,
        timeline=options.timeline,
    )
    if log_every is None:  # a progress bar moves ~20 times an epoch; else epoch events only
        log_every = max(1, spec.steps_per_epoch // 20) if verbose == 1 else 0
    num_parameters = sum(int(np.prod(w.shape)) for w in model.trainable_weights)
    dense = dense_bytes_per_step(num_parameters, master.num_workers)
    if verbose:
        callbacks.append(ProgressLogger(verbose, dense_bytes_per_step=dense))
    history = FitResult()
    params = {"verbose": verbose, "epochs": options.epochs, "steps": spec.steps_per_epoch}
    driver = DriverCallbacks(model, callbacks, history, params)
    timeout_s = channel.timeout_s
    secret = secrets.token_bytes(32)
    log.info(
        "fit: %s, %d workers x batch %d, %d steps/epoch, epochs %d-%d%s",
        master, master.num_workers, master.batch_size_per_worker, spec.steps_per_epoch,
        options.initial_epoch, options.epochs - 1,
        f", validation every {options.validation_freq} epoch(s)" if validation else "",
    )
    with ChannelServer(secret, bind_host=launcher.bind_host,
                       advertise_host=launcher.driver_host, port_range=channel.port_range,
                       timeout_s=timeout_s, max_blob=8 * num_parameters + (64 << 20)) as server:
        spec.events = EventsSpec(server.address, log_every_steps=log_every,
                                 send_weights=needs_weights(callbacks), timeout_s=timeout_s)
        driver.train_begin()
        started = time.perf_counter()
        results = _run_with_events(launcher, spec, secret, server.inbox, driver)
        wall = time.perf_counter() - started
    results.sort(key=lambda r: r.rank)
    assert results[0].model_bytes is not None  # rank 0 returns the model
    final = model_from_bytes(results[0].model_bytes, custom_objects)
    for result in results:
        result.model_bytes = None
    steps_per_epoch = spec.steps_per_epoch
    if len(results) != len(spec.slices):  # an elastic fit ended with another world size
        from sparkdl.training.elastic import replan

        steps_per_epoch = replan(spec, len(results)).steps_per_epoch
    history.metrics = summarize_fit(results, master, steps_per_epoch, wall)
    if getattr(launcher, "elastic", None) is not None:
        events = list(getattr(launcher, "elastic_events", []))
        history.metrics.elastic_events = [event.to_dict() for event in events]
        for event in events:
            log.warning("elastic fit: continued at epoch %d, step %d with %d workers instead "
                        "of %d (%s)", event.epoch, event.step, event.to_workers,
                        event.from_workers, event.cause)
    history.workers = results
    driver.train_end(final)
    if history.metrics.resumed_from:
        log.warning("fit resumed from checkpoint %s", history.metrics.resumed_from)
    return history, final


class KerasFit:
    """``fit`` as Keras's, shared by ``SparkModel`` and ``ParallelWrapper``: a class that
    holds ``model``, ``training_master`` and ``custom_objects`` and makes a
    :class:`Launcher`."""

    model: keras.Model
    training_master: TrainingMaster
    custom_objects: dict[str, object] | None
    last_fit: FitResult | None

    def _launcher(self) -> Launcher:
        raise NotImplementedError

    def _channel_settings(self) -> ChannelSettings:
        """The driver's event channel."""
        raise NotImplementedError

    def fit(
        self,
        data: str,
        epochs: int = 1,
        *,
        validation_data: str | None = None,
        validation_freq: int = 1,
        validation_batch_size: int = 256,
        callbacks: Sequence[keras.callbacks.Callback] | None = None,
        verbose: int | str = "auto",
        initial_epoch: int = 0,
        shuffle: bool = True,
        log_every_steps: int | None = None,
        checkpoint_dir: str | None = None,
        checkpoint_every: int = 1,
        checkpoint_unit: str = "epochs",
        resume: bool = False,
        prefetch: int = 4,
        decode_threads: int = 2,
        timeline: str | None = None,
    ) -> FitResult:
        """Train on the shard directory ``data``, as Keras's ``Model.fit`` does.

        Returns a :class:`keras.callbacks.History` (``history.history`` holds ``loss``, every
        compiled metric, ``val_*`` and sparkdl's per-epoch figures) that also carries the job's
        measurements (``.metrics``); the trained model replaces :attr:`model`.

        Args:
            data: URI of the training shards (written by the ETL / ``write_shards``).
            epochs: train until this epoch index (Keras semantics, with ``initial_epoch``).
            validation_data: URI of validation shards, evaluated distributed at the end of
                every ``validation_freq``-th epoch (``val_loss`` and ``val_<metric>``).
            callbacks: Keras callbacks; they run on the driver. Hooks that fire:
                ``on_train_begin/end``, ``on_epoch_begin/end`` (with the epoch's figures
                combined over all workers), ``on_test_begin/end`` (validation figures),
                ``on_train_batch_end`` every ``log_every_steps`` steps (rank 0's running
                figures). ``model.stop_training`` and a new learning rate set by a callback
                take effect on every worker before the next epoch.
            verbose: 0 silent, 1 progress bar, 2 one line per epoch; ``"auto"`` is 1 in a
                terminal or notebook, else 2.
            log_every_steps: batch events every this many steps (``None``: enough for the bar).
            checkpoint_dir: rank 0 checkpoints there every ``checkpoint_every`` epochs (or
                steps, ``checkpoint_unit="steps"``); a retried stage resumes from the latest
                checkpoint, and ``resume=True`` continues a fit that was killed as a whole.
            prefetch, decode_threads: row groups each worker's reader decodes ahead, on how
                many threads (DL4J's ``workerPrefetchNumBatches``).
            timeline: a directory URI: every worker writes a Chrome trace of its steps there,
                ``rank-<N>.json`` (see :mod:`sparkdl.training.timeline`); the files' URIs are
                in ``history.metrics["timeline"]``.
        """
        return self.fit_with(data, FitOptions(
            epochs=epochs, validation_data=validation_data, validation_freq=validation_freq,
            validation_batch_size=validation_batch_size, callbacks=callbacks, verbose=verbose,
            initial_epoch=initial_epoch, shuffle=shuffle, log_every_steps=log_every_steps,
            checkpoint_dir=checkpoint_dir, checkpoint_every=checkpoint_every,
            checkpoint_unit=checkpoint_unit, resume=resume, prefetch=prefetch,
            decode_threads=decode_threads, timeline=timeline,
        ))

    def fit_with(self, data: str, options: FitOptions) -> FitResult:
        """:meth:`fit` with its options built already (e.g.
        :meth:`FitOptions.from_training_config`)."""
        if not isinstance(data, str):
            raise ConfigurationError(
                f"fit() takes the URI of a shard directory, got {type(data).__name__}"
            )
        from sparkdl.data.metadata import load_metadata
        from sparkdl.training.model_check import check_model_fits_shards

        for uri in (data, options.validation_data):  # on the driver, before any task starts
            if isinstance(uri, str):
                check_model_fits_shards(self.model, load_metadata(uri), uri)
        history, self.model = run_fit(
            self.model, self.training_master, self._launcher(), data, options,
            custom_objects=self.custom_objects, channel=self._channel_settings(),
        )
        self.last_fit = history
        return history


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
    from sparkdl.training.worker import ValidationSpec

    uri = options.validation_data
    assert uri is not None
    metadata = read_metadata(uri)
    return ValidationSpec(uri, metadata.to_json(), [f.path for f in metadata.files],
                          options.validation_batch_size, options.validation_freq)


def _checkpoint_spec(options: FitOptions) -> CheckpointSpec | None:
    if not options.checkpoint_dir:
        return None
    from sparkdl.training.checkpoint import CheckpointPolicy, CheckpointStore
    from sparkdl.training.worker import CheckpointSpec

    policy = CheckpointPolicy(options.checkpoint_dir, options.checkpoint_every,
                              options.checkpoint_unit)
    run_id = CheckpointStore(options.checkpoint_dir).start_run(options.resume)
    return CheckpointSpec(policy, run_id)
