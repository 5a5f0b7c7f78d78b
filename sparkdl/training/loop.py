"""The synchronous worker loop shared by the Spark path and ParallelWrapper."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import numpy as np

from sparkdl.comm.communicator import Communicator
from sparkdl.errors import TrainingError
from sparkdl.training.exchange import StepResult, UpdateExchange

log = logging.getLogger("sparkdl.training")

BatchSource = Callable[[int], Iterable[tuple[np.ndarray, np.ndarray]]]
# on_checkpoint(global_step, next_epoch, next_step_in_epoch, history) at checkpoint points
CheckpointHook = Callable[[int, int, int, list[dict[str, float]]], None]


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


def run_loop(
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
    checkpoint_due: Callable[[int, bool, int], bool] | None = None,
    on_checkpoint: CheckpointHook | None = None,
) -> LoopResult:
    """Train for ``epochs`` × ``steps_per_epoch`` synchronous steps.

    ``batches(epoch)`` yields this worker's batches for an epoch. Per-epoch loss and accuracy
    in the history are means over every worker's steps. A non-finite loss stops training with
    a :class:`TrainingError` naming the epoch and step.

    Training resumes at ``(start_epoch, start_step)`` when given (the batches before it are
    skipped: their order is deterministic). ``on_checkpoint`` runs on every worker whenever
    ``checkpoint_due(global_step, epoch_end, epoch)`` says so.
    """
    result = LoopResult(history=list(history or []))
    sent0, received0 = comm.counters.snapshot()
    start = time.perf_counter()
    global_step = start_epoch * steps_per_epoch + start_step
    first_epoch = start_epoch
    for epoch in range(start_epoch, epochs):
        epoch_start = time.perf_counter()
        totals = np.zeros(3, dtype=np.float64)  # loss sum, accuracy sum, steps
        # The first epoch traces the step functions; per-step timings skip it when they can.
        steady = epoch > first_epoch or epochs - first_epoch == 1
        if epoch == first_epoch + 1:
            result.steady_bytes_sent = comm.counters.snapshot()[0]
        iterator = iter(batches(epoch))
        skip = start_step if epoch == start_epoch else 0
        for _ in range(skip):
            next(iterator)
        for step in range(skip, steps_per_epoch):
            wait_start = time.perf_counter()
            try:
                x, y = next(iterator)
            except StopIteration:
                raise TrainingError(
                    f"worker {comm.rank} ran out of data at epoch {epoch}, step {step} of "
                    f"{steps_per_epoch}"
                ) from None
            result.data_wait_seconds += time.perf_counter() - wait_start
            outcome = exchange.step(x, y, global_step)
            if not math.isfinite(outcome.loss) or not outcome.finite_update:
                what = (f"loss {outcome.loss}" if not math.isfinite(outcome.loss)
                        else "update (NaN or inf in the gradients or optimizer update)")
                raise TrainingError(
                    f"non-finite {what} at epoch {epoch}, step {step} "
                    f"(global step {global_step}) on worker {comm.rank}"
                )
            totals += (outcome.loss, outcome.accuracy, 1.0)
            if steady:
                _accumulate(result, outcome)
            global_step += 1
            last = step == steps_per_epoch - 1
            if on_checkpoint and not last and checkpoint_due and checkpoint_due(
                global_step, False, epoch
            ):
                exchange.finish()
                on_checkpoint(global_step, epoch, step + 1, result.history)
        close = getattr(iterator, "close", None)
        if close is not None:
            close()
        exchange.end_epoch(epoch)
        summed = comm.allreduce(totals, "sum") if comm.world_size > 1 else totals
        entry = {
            "epoch": epoch,
            "loss": summed[0] / summed[2],
            "accuracy": summed[1] / summed[2],
            "seconds": time.perf_counter() - epoch_start,
        }
        result.history.append(entry)
        log.info("epoch %d: loss %.4f accuracy %.4f", epoch, entry["loss"], entry["accuracy"])
        if on_checkpoint and checkpoint_due and checkpoint_due(global_step, True, epoch):
            exchange.finish()
            on_checkpoint(global_step, epoch + 1, 0, result.history)
    exchange.finish()
    result.train_seconds = time.perf_counter() - start
    result.steps = global_step
    trained = global_step - (start_epoch * steps_per_epoch + start_step)
    result.samples = trained * batch_size * comm.world_size
    sent1, received1 = comm.counters.snapshot()
    result.bytes_sent = sent1 - sent0
    result.steady_bytes_sent = sent1 - (result.steady_bytes_sent or sent0)
    result.bytes_received = received1 - received0
    return result


def _accumulate(result: LoopResult, outcome: StepResult) -> None:
    result.timed_steps += 1
    for name, seconds in outcome.timings.items():
        result.timings[name] = result.timings.get(name, 0.0) + seconds
    for name, value in outcome.extra.items():
        result.extras[name] = result.extras.get(name, 0.0) + value
