"""Elastic fits: carry on with fewer workers when hosts are gone for good (no Spark here).

When a training stage fails and fewer task slots are left, the launcher relaunches it with
the workers still available (at least ``min_workers``); the new world resumes from the
latest checkpoint. This module holds what that needs, Spark-free:

* :class:`ElasticPolicy` — ``min_workers`` and ``max_failures`` (``training.elastic``);
* :func:`absorbed_ranks` / :func:`fold_states` — how the old ranks' saved exchange states
  map onto the new ranks: new rank ``i`` keeps old rank ``i``'s own state (optimizer
  variables, threshold) and adds to its residual the residuals of the old ranks
  ``j >= new_world`` with ``j % new_world == i``, so the sum of all residuals (the update
  accumulated but not sent yet) is preserved and no update is lost;
* :func:`resume_step` — where an epoch interrupted mid-way continues under the new plan.

The worker spec for a new world size is :func:`sparkdl.training.worker.run_worker.replan`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np

from sparkdl.errors import ConfigurationError

#: The state keys that hold an error-feedback residual (``Memory.get_state()["residual"]``
#: under the exchange's and compressor's prefixes); every other key is per-rank state that
#: the new rank takes from its own old rank.
RESIDUAL_SUFFIX = "memory.residual"


@dataclass(frozen=True)
class ElasticPolicy:
    """``min_workers``: the fewest workers a relaunch may use (else the fit fails);
    ``max_failures``: how many failed stages the fit survives (each relaunch counts one)."""

    min_workers: int = 1
    max_failures: int = 3

    def __post_init__(self) -> None:
        for name, low in (("min_workers", 1), ("max_failures", 0)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ConfigurationError(
                    f"elastic {name} must be an integer >= {low}, got {value!r}"
                )

    def check(self, num_workers: int) -> None:
        if self.min_workers > num_workers:
            raise ConfigurationError(
                f"elastic min_workers={self.min_workers} is more than num_workers={num_workers}"
            )


@dataclass
class ElasticEvent:
    """One relaunch of the training stage: training continued at ``(epoch, step)`` (the
    checkpoint it resumed from) with ``to_workers`` instead of ``from_workers`` (the same
    number after a relaunch at the same world size or Spark's retry of a failed stage)."""

    epoch: int
    step: int
    from_workers: int
    to_workers: int
    cause: str

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def absorbed_ranks(rank: int, old_world: int, new_world: int) -> list[int]:
    """The old ranks whose saved state new rank ``rank`` takes over: its own (when it existed)
    first, then the lost ranks ``j >= new_world`` with ``j % new_world == rank``."""
    if not 0 <= rank < new_world:
        raise ConfigurationError(f"rank {rank} is outside a world of {new_world}")
    own = [rank] if rank < old_world else []
    return own + [j for j in range(new_world, old_world) if j % new_world == rank]


def fold_states(states: list[dict[str, Any]]) -> dict[str, Any]:
    """One rank's exchange state from the saved states of the old ranks it absorbs
    (``states[0]`` its own): every residual is the sum of theirs (float32, in order), every
    other entry is the first state's."""
    if not states:
        raise ConfigurationError("fold_states needs at least one state")
    folded = dict(states[0])
    for key, value in folded.items():
        if not key.endswith(RESIDUAL_SUFFIX) or len(states) == 1:
            continue
        total = np.array(value, dtype=np.float32, copy=True)
        for other in states[1:]:
            if key not in other or np.shape(other[key]) != total.shape:
                raise ConfigurationError(
                    f"cannot fold {key!r}: the checkpointed ranks' states differ in shape"
                )
            total += np.asarray(other[key], dtype=np.float32)
        folded[key] = total
    return folded


def resume_step(step: int, old_steps_per_epoch: int, new_steps_per_epoch: int) -> int:
    """The step of the epoch to continue at when the checkpoint was taken at ``step`` of
    ``old_steps_per_epoch`` and the new plan has ``new_steps_per_epoch``: the same fraction
    of the epoch (rounded down), so an epoch boundary stays one."""
    if not old_steps_per_epoch or old_steps_per_epoch == new_steps_per_epoch:
        return step
    return min(step * new_steps_per_epoch // old_steps_per_epoch, new_steps_per_epoch - 1)
