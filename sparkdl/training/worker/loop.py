"""The synchronous worker loop shared by the Spark path and ParallelWrapper.

The loop is Keras-shaped: what happens around a step is a list of :class:`WorkerCallback`
entries (checkpointing, validation, the event stream to the driver and its decisions), not
special cases. Every rank runs the same loop with the same callbacks; a callback that decides
something (stop, a new learning rate) makes every rank decide it at the same step.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from sparkdl.errors import TrainingError
from sparkdl.training.weights import model_batch
from sparkdl.training.worker import timeline

if TYPE_CHECKING:  # this module imports no TensorFlow: the driver reads LoopResult
    from sparkdl.comm.communicator import Communicator
    from sparkdl.training.exchanges.exchange import StepResult, UpdateExchange

log = logging.getLogger("sparkdl.training")

#: ``batches(epoch)``: ``(x, y)`` or ``(x, y, sample_weight)`` batches of an epoch.
BatchSource = Callable[[int], Iterable[tuple[np.ndarray, ...]]]

#: Per-step phase timings an exchange reports (seconds), in the order they are summed.
PHASES = ("compute_s", "encode_s", "communicate_s", "decode_s", "apply_s")
#: Per-step figures an exchange may report in ``StepResult.extra``; the epoch's figure is
#: their mean over the steps (of every rank) that reported one.
STEP_FIGURES = ("tau", "sparsity", "loss_after_averaging")


@dataclass
class LoopResult:
    """What one worker measured over the whole fit."""

    history: list[dict[str, float]] = field(default_factory=list)
    steps: int = 0
    samples: int = 0
    train_seconds: float = 0.0
    data_wait_seconds: float = 0.0
    bytes_sent: int = 0
    bytes_received: int = 0
    timed_steps: int = 0
    steady_bytes_sent: int = 0
    timings: dict[str, float] = field(default_factory=dict)
    extras: dict[str, float] = field(default_factory=dict)
    epochs_run: int = 0
    stopped_early: bool = False


class WorkerCallback:
    """A hook of the worker loop; every rank runs the same list in the same order.

    ``timeline_name`` names the callback's spans in the timeline (default: the class name).
    """

    def on_train_begin(self, loop: TrainingLoop) -> None:
        """Before the first step (also after a resume)."""

    def on_epoch_begin(self, loop: TrainingLoop, epoch: int) -> None:
        """Before the epoch's first step."""

    def on_step_end(self, loop: TrainingLoop, epoch: int, step: int, outcome: StepResult) -> None:
        """After step ``step`` of ``epoch``; ``loop.global_step`` counts it already."""

    def on_epoch_end(self, loop: TrainingLoop, epoch: int, logs: dict[str, float]) -> None:
        """After the epoch, with its figures combined over all ranks. Callbacks may add to
        ``logs`` (it is the history entry) and set ``loop.stop_training``."""

    def on_train_end(self, loop: TrainingLoop) -> None:
        """After the last step, with every replica holding the same weights."""

    def close(self) -> None:
        """Release what the callback holds (also after a failed fit)."""


class CallbackList(WorkerCallback):
    """The worker callbacks as one (as Keras's ``CallbackList``): each hook runs every
    callback's in order; each callback that overrides a hook is a timeline span."""

    def __init__(self, callbacks: Iterable[WorkerCallback] = ()) -> None:
        self.callbacks = list(callbacks)

    def __iter__(self) -> Iterator[WorkerCallback]:
        return iter(self.callbacks)

    def __len__(self) -> int:
        return len(self.callbacks)

    def on_train_begin(self, loop: TrainingLoop) -> None:
        self._notify("on_train_begin", loop)

    def on_epoch_begin(self, loop: TrainingLoop, epoch: int) -> None:
        self._notify("on_epoch_begin", loop, epoch)

    def on_step_end(self, loop: TrainingLoop, epoch: int, step: int, outcome: StepResult) -> None:
        self._notify("on_step_end", loop, epoch, step, outcome)

    def on_epoch_end(self, loop: TrainingLoop, epoch: int, logs: dict[str, float]) -> None:
        self._notify("on_epoch_end", loop, epoch, logs)

    def on_train_end(self, loop: TrainingLoop) -> None:
        self._notify("on_train_end", loop)

    def close(self) -> None:
        """Close every callback, each even when another's close fails (the first error is
        raised after)."""
        errors: list[Exception] = []
        for callback in self.callbacks:
            try:
                callback.close()
            except Exception as exc:
                errors.append(exc)
        if errors:
            raise errors[0]

    def _notify(self, hook: str, *args: Any) -> None:
        for callback in self.callbacks:
            method = getattr(callback, hook)
            if getattr(type(callback), hook, None) is getattr(WorkerCallback, hook):
                method(*args)
                continue
            name = getattr(callback, "timeline_name", None) or type(callback).__name__
            with timeline.span(name, hook=hook):
                method(*args)


class TrainingLoop:
    """Train for ``epochs`` × ``steps_per_epoch`` synchronous steps.

    Args:
        exchange: the per-step update exchange of the training master.
        comm: the communicator (for the per-epoch reduction of figures).
        batches: ``batches(epoch)`` yields this worker's batches of an epoch.
        epochs: the epoch index to stop before (Keras's ``epochs``).
        steps_per_epoch: the same on every rank.
        batch_size: this worker's batch size.
        start_epoch, start_step: where to begin (a resume skips the batches before it: their
            order is deterministic).
        history: the epochs' figures so far (from a checkpoint).
        callbacks: the worker callbacks, run in order.
    """

    def __init__(
        self,
        exchange: UpdateExchange,
        comm: Communicator,
        batches: BatchSource,
        *,
        epochs: int,
        steps_per_epoch: int,
        batch_size: int,
        start_epoch: int = 0,
        start_step: int = 0,
        history: list[dict[str, float]] | None = None,
        callbacks: Iterable[WorkerCallback] = (),
    ) -> None:
        self.exchange = exchange
        self.comm = comm
        self.batches = batches
        self.epochs = epochs
        self.steps_per_epoch = steps_per_epoch
        self.batch_size = batch_size
        self.start_epoch = start_epoch
        self.start_step = start_step
        self.callbacks = (callbacks if isinstance(callbacks, CallbackList)
                          else CallbackList(callbacks))
        self.global_step = start_epoch * steps_per_epoch + start_step
        self.stop_training = False
        self.result = LoopResult(history=list(history or []))
        self._epoch_loss = 0.0
        self._epoch_steps = 0

    @property
    def history(self) -> list[dict[str, float]]:
        return self.result.history

    @property
    def running_loss(self) -> float:
        """This rank's mean loss over the current epoch's steps so far."""
        return self._epoch_loss / max(self._epoch_steps, 1)

    def run(self) -> LoopResult:
        result = self.result
        sent0, received0 = self.comm.counters.snapshot()
        started = time.perf_counter()
        first_global = self.global_step
        self.callbacks.on_train_begin(self)
        for epoch in range(self.start_epoch, self.epochs):
            if self.stop_training:
                break
            if epoch == self.start_epoch + 1:
                result.steady_bytes_sent = self.comm.counters.snapshot()[0]
            with timeline.span("epoch", epoch=epoch):
                logs = self._run_epoch(epoch)
                result.history.append(logs)
                result.epochs_run += 1
                self.callbacks.on_epoch_end(self, epoch, logs)
        result.stopped_early = self.stop_training
        with timeline.span("finish"):
            self.exchange.finish()
        self.callbacks.on_train_end(self)
        result.train_seconds = time.perf_counter() - started
        result.steps = self.global_step
        result.samples = (self.global_step - first_global) * self.batch_size * self.comm.world_size
        sent1, received1 = self.comm.counters.snapshot()
        result.bytes_sent = sent1 - sent0
        result.steady_bytes_sent = sent1 - (result.steady_bytes_sent or sent0)
        result.bytes_received = received1 - received0
        return result

    def _run_epoch(self, epoch: int) -> dict[str, float]:
        """One epoch's steps; returns its figures combined over every rank."""
        epoch_start = time.perf_counter()
        sent0, received0 = self.comm.counters.snapshot()
        # The first epoch traces the step functions; per-step timings skip it when they can.
        steady = epoch > self.start_epoch or self.epochs - self.start_epoch == 1
        figures = _EpochFigures()
        self._epoch_loss, self._epoch_steps = 0.0, 0
        self.exchange.metrics.reset()
        self.callbacks.on_epoch_begin(self, epoch)
        iterator = iter(self.batches(epoch))
        skip = self.start_step if epoch == self.start_epoch else 0
        for _ in range(skip):
            next(iterator)
        for step in range(skip, self.steps_per_epoch):
            with timeline.span("step", epoch=epoch, step=step, global_step=self.global_step):
                self._run_step(iterator, figures, epoch, step, steady)
        close = getattr(iterator, "close", None)
        if close is not None:
            close()
        with timeline.span("end epoch"):
            self.exchange.end_epoch(epoch)
        sent1, received1 = self.comm.counters.snapshot()
        figures.end(time.perf_counter() - epoch_start, sent1 - sent0, received1 - received0)
        with timeline.span("epoch figures"):
            logs = figures.combine(self.comm, self.exchange, self.batch_size)
        log.info("epoch %d: %s", epoch,
                 " - ".join(f"{k} {v:.4g}" for k, v in logs.items() if not k.endswith("_s")))
        return logs

    def _run_step(self, iterator: Any, figures: _EpochFigures, epoch: int, step: int,
              steady: bool) -> None:
        wait_start = time.perf_counter()
        try:
            x, y = model_batch(next(iterator))
        except StopIteration:
            raise TrainingError(
                f"worker {self.comm.rank} ran out of data at epoch {epoch}, step {step} of "
                f"{self.steps_per_epoch}"
            ) from None
        waited = time.perf_counter() - wait_start
        timeline.record("data wait", wait_start, wait_start + waited)
        self.exchange.metrics.build(x, y)
        with timeline.span("exchange"):
            outcome = self.exchange.step(x, y, self.global_step)
        self._check_finite(outcome, epoch, step)
        figures.add_step(outcome, waited)
        self._epoch_loss += outcome.loss
        self._epoch_steps += 1
        self.result.data_wait_seconds += waited
        if steady:
            _accumulate(self.result, outcome)
        self.global_step += 1
        self.callbacks.on_step_end(self, epoch, step, outcome)

    def _check_finite(self, outcome: StepResult, epoch: int, step: int) -> None:
        if math.isfinite(outcome.loss) and outcome.finite_update:
            return
        what = (f"loss {outcome.loss}" if not math.isfinite(outcome.loss)
                else "update (NaN or inf in the gradients or optimizer update)")
        raise TrainingError(
            f"non-finite {what} at epoch {epoch}, step {step} "
            f"(global step {self.global_step}) on worker {self.comm.rank}"
        )


class _EpochFigures:
    """One rank's sums over an epoch, laid out identically on every rank so that a single
    allreduce combines them (with the compiled metrics' state appended)."""

    _NAMES = ("loss", "steps", "data_wait_s", *PHASES, "epoch_s", "bytes_sent",
              "bytes_received", *(f"{n}{part}" for n in STEP_FIGURES for part in ("", "#")))

    def __init__(self) -> None:
        self.sums = dict.fromkeys(self._NAMES, 0.0)

    def add_step(self, outcome: StepResult, waited: float) -> None:
        sums = self.sums
        sums["loss"] += outcome.loss
        sums["steps"] += 1
        sums["data_wait_s"] += waited
        for name in PHASES:
            sums[name] += outcome.timings.get(name, 0.0)
        for name in STEP_FIGURES:
            if name in outcome.extra:
                sums[name] += outcome.extra[name]
                sums[f"{name}#"] += 1

    def end(self, seconds: float, sent: int, received: int) -> None:
        self.sums.update(epoch_s=seconds, bytes_sent=float(sent), bytes_received=float(received))

    def combine(self, comm: Communicator, exchange: UpdateExchange, batch_size: int
                ) -> dict[str, float]:
        local = np.array(list(self.sums.values()), dtype=np.float64)
        metric_state = exchange.metrics.state()
        vector = np.concatenate([local, metric_state])
        if comm.world_size > 1:
            vector = comm.allreduce(vector, "sum")
        sums = dict(zip(self._NAMES, vector[: len(self._NAMES)].tolist()))
        world, steps = comm.world_size, max(sums["steps"], 1.0)
        logs = {"loss": sums["loss"] / steps}
        logs.update(exchange.metrics.results_from_state(vector[len(self._NAMES):]))
        epoch_s = sums["epoch_s"] / world
        logs["samples_per_second"] = sums["steps"] * batch_size / epoch_s if epoch_s else 0.0
        logs["bytes_sent_per_step"] = sums["bytes_sent"] / steps
        logs["bytes_received_per_step"] = sums["bytes_received"] / steps
        for name in STEP_FIGURES:
            if sums[f"{name}#"]:
                logs[name] = sums[name] / sums[f"{name}#"]
        for name in ("data_wait_s", *PHASES):
            if sums[name]:
                logs[name] = sums[name] / world
        logs["epoch_s"] = epoch_s
        return logs


def _accumulate(result: LoopResult, outcome: StepResult) -> None:
    result.timed_steps += 1
    for name, seconds in outcome.timings.items():
        result.timings[name] = result.timings.get(name, 0.0) + seconds
    for name, value in outcome.extra.items():
        result.extras[name] = result.extras.get(name, 0.0) + value


def run_loop(
    exchange: UpdateExchange,
    comm: Communicator,
    batches: BatchSource,
    *,
    callbacks: Sequence[WorkerCallback] = (),
    **options: Any,
) -> LoopResult:
    """Build a :class:`TrainingLoop` and run it (see its arguments)."""
    return TrainingLoop(exchange, comm, batches, callbacks=callbacks, **options).run()
