"""The driver's side of a fit, shared by every launcher (Spark barrier stage, local processes).

:func:`run_fit` checks the arguments, builds the :class:`~sparkdl.training.worker.WorkerSpec`
once, opens the event channel, runs the workers through a :class:`Launcher` on a background
thread while the driver's Keras callbacks run on the calling thread from the workers' events,
and returns a Keras :class:`~keras.callbacks.History` (:class:`FitResult`) with the trained
model. ``SparkModel`` and ``ParallelWrapper`` differ only in their launcher.
"""

from __future__ import annotations

import logging
import queue
import secrets
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import keras
import numpy as np

from sparkdl.errors import ConfigurationError
from sparkdl.training.summary import WorkerResult, dense_bytes_per_step, summarize_fit
from sparkdl.training.task import Launcher

log = logging.getLogger("sparkdl")


class FitResult(keras.callbacks.History):
    """What ``fit`` returns: Keras's ``History`` (``history``, ``epoch``, ``params``,
    ``model``) plus the job's measurements (``metrics``) and each worker's result."""

    def __init__(self) -> None:
        super().__init__()
        self.epoch: list[int] = []
        self.metrics: dict[str, Any] = {}
        self.workers: list[WorkerResult] = []


@dataclass
class FitOptions:
    """``fit``'s arguments beyond the data, checked once (see ``SparkModel.fit``)."""

    epochs: int = 1
    validation_data: str | None = None
    validation_freq: int = 1
    validation_batch_size: int = 256
    callbacks: Sequence[keras.callbacks.Callback] | None = None
    verbose: int | str = "auto"
    initial_epoch: int = 0
    shuffle: bool | str = True
    log_every_steps: int | None = None
    checkpoint_dir: str | None = None
    checkpoint_every: int = 1
    checkpoint_unit: str = "epochs"
    resume: bool = False
    prefetch: int = 4
    decode_threads: int = 2
    timeline: str | None = None
    class_weight: dict[int, float] | None = None
    accumulate_steps: int = 1

    def check(self) -> None:
        for name in ("epochs", "validation_freq", "validation_batch_size", "checkpoint_every",
                     "prefetch", "decode_threads", "accumulate_steps"):
            _positive_int(name, getattr(self, name))
        if isinstance(self.initial_epoch, bool) or not isinstance(self.initial_epoch, int) or (
            not 0 <= self.initial_epoch < self.epochs
        ):
            raise ConfigurationError(
                f"initial_epoch must be an integer in [0, epochs={self.epochs}), "
                f"got {self.initial_epoch!r}"
            )
        if self.log_every_steps is not None and (
            isinstance(self.log_every_steps, bool) or not isinstance(self.log_every_steps, int)
            or self.log_every_steps < 0
        ):
            raise ConfigurationError(
                f"log_every_steps must be an integer >= 0, got {self.log_every_steps!r}"
            )
        if self.validation_data is not None and not isinstance(self.validation_data, str):
            raise ConfigurationError(
                "validation_data must be the URI of a shard directory, got "
                f"{type(self.validation_data).__name__}"
            )
        for callback in self.callbacks or ():
            if not isinstance(callback, keras.callbacks.Callback):
                raise ConfigurationError(
                    f"callbacks must be keras.callbacks.Callback instances, got "
                    f"{type(callback).__name__}"
                )
        from sparkdl.data.reader import shuffle_mode

        shuffle_mode(self.shuffle)
        if self.resume and not self.checkpoint_dir:
            raise ConfigurationError("resume=True needs a checkpoint_dir to resume from")
        if self.timeline is not None:
            if not isinstance(self.timeline, str) or not self.timeline.strip():
                raise ConfigurationError(
                    f"timeline must be a directory URI, got {self.timeline!r}"
                )
            from sparkdl.storage import resolve

            resolve(self.timeline)  # an unknown filesystem fails here, naming the URI


def run_fit(
    model: keras.Model,
    master: Any,
    launcher: Launcher,
    data_uri: str,
    options: FitOptions,
    *,
    custom_objects: dict[str, Any] | None = None,
    timeout_s: float = 120.0,
    port_range: tuple[int, int] | None = None,
) -> tuple[FitResult, keras.Model]:
    """Train ``model`` with ``master``'s workers on ``launcher``; returns the history and the
    trained model (rank 0's)."""
    from sparkdl.comm.channel import ChannelServer
    from sparkdl.data.files import read_metadata
    from sparkdl.data.reader import rows_dropped_per_epoch, shuffle_mode
    from sparkdl.training.events import DriverCallbacks, needs_weights
    from sparkdl.training.progress import ProgressLogger, resolve_verbose
    from sparkdl.training.serialization import model_from_bytes
    from sparkdl.training.weights import check_class_weight
    from sparkdl.training.worker import EventsSpec, make_worker_spec

    options.check()
    verbose = resolve_verbose(options.verbose)
    metadata = read_metadata(data_uri)
    class_weight = check_class_weight(options.class_weight, metadata, data_uri)
    if options.accumulate_steps > 1 and getattr(master, "mode", None) != "dense":
        raise ConfigurationError(
            f"accumulate_steps={options.accumulate_steps} applies to dense training (mode "
            f"'dense'), not to {type(master).__name__}: its exchange shares optimizer updates "
            "or averages weights, not gradients"
        )
    launcher.check_slots(master.num_workers)
    validation = _validation_spec(options) if options.validation_data else None
    checkpoint = _checkpoint_settings(options)
    callbacks = list(options.callbacks or [])
    log_every = options.log_every_steps
    spec = make_worker_spec(
        model, master, data_uri, metadata, epochs=options.epochs,
        custom_objects=custom_objects, threads=launcher.threads_per_worker,
        shuffle=shuffle_mode(options.shuffle), checkpoint=checkpoint,
        initial_epoch=options.initial_epoch,
        validation=validation, prefetch=options.prefetch, decode_threads=options.decode_threads,
        timeline=options.timeline, class_weight=class_weight,
        accumulate_steps=options.accumulate_steps,
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
    secret = secrets.token_bytes(32)
    log.info(
        "fit: %s, %d workers x batch %d, %d steps/epoch, epochs %d-%d%s",
        master, master.num_workers, master.batch_size_per_worker, spec.steps_per_epoch,
        options.initial_epoch, options.epochs - 1,
        f", validation every {options.validation_freq} epoch(s)" if validation else "",
    )
    with ChannelServer(secret, bind_host=launcher.bind_host,
                       advertise_host=launcher.driver_host, port_range=port_range,
                       timeout_s=timeout_s, max_blob=8 * num_parameters + (64 << 20)) as server:
        spec.events = EventsSpec(server.address, log_every_steps=log_every,
                                 send_weights=needs_weights(callbacks), timeout_s=timeout_s)
        driver.train_begin()
        started = time.perf_counter()
        results = _run_with_events(launcher, spec, secret, server.inbox, driver)
        wall = time.perf_counter() - started
    results.sort(key=lambda r: r.rank)
    final = model_from_bytes(results[0].model_bytes, custom_objects)
    for result in results:
        result.model_bytes = None
    elastic = getattr(launcher, "elastic", None) is not None
    events = [e.to_dict() for e in getattr(launcher, "elastic_events", [])]
    steps_per_epoch = spec.steps_per_epoch
    if len(results) != len(spec.slices):  # an elastic fit ended with another world size
        from sparkdl.training.elastic import replan

        steps_per_epoch = replan(spec, len(results)).steps_per_epoch
    history.metrics = summarize_fit(results, master, steps_per_epoch, wall)
    history.metrics["shuffle"] = spec.shuffle
    history.metrics["rows_dropped_per_epoch"] = rows_dropped_per_epoch(
        metadata, len(results), master.batch_size_per_worker, steps_per_epoch)
    if elastic:
        history.metrics["elastic_events"] = events
        for event in events:
            log.warning("elastic fit: continued at epoch %d, step %d with %d workers instead "
                        "of %d (%s)", event["epoch"], event["step"], event["to_workers"],
                        event["from_workers"], event["cause"])
    history.workers = results
    driver.train_end(final)
    if history.metrics.get("resumed_from"):
        log.warning("fit resumed from checkpoint %s", history.metrics["resumed_from"])
    return history, final


def _run_with_events(
    launcher: Launcher, spec: Any, secret: bytes, inbox: queue.Queue[Any], driver: Any
) -> list[WorkerResult]:
    """Run the launcher on a thread; meanwhile this thread serves the workers' events (so the
    Keras callbacks run where the user called ``fit``)."""
    outcome: dict[str, Any] = {}

    def work() -> None:
        try:
            outcome["results"] = launcher.run(spec, secret)
        except BaseException as exc:  # handed to the calling thread
            outcome["error"] = exc

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
    if "error" in outcome:
        raise outcome["error"]
    return outcome["results"]


def _validation_spec(options: FitOptions) -> Any:
    from sparkdl.data.files import read_metadata
    from sparkdl.training.worker import ValidationSpec

    uri = options.validation_data
    assert uri is not None
    metadata = read_metadata(uri)
    return ValidationSpec(uri, metadata.to_json(), [f.path for f in metadata.files],
                          options.validation_batch_size, options.validation_freq)


def _checkpoint_settings(options: FitOptions) -> dict[str, Any] | None:
    if not options.checkpoint_dir:
        return None
    from sparkdl.training.checkpoint import CheckpointPolicy, CheckpointStore

    policy = CheckpointPolicy(options.checkpoint_dir, options.checkpoint_every,
                              options.checkpoint_unit)
    run_id = CheckpointStore(options.checkpoint_dir).start_run(options.resume)
    return {**vars(policy), "run_id": run_id}


def _positive_int(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigurationError(f"{name} must be a positive integer, got {value!r}")

