"""Training checkpoints: written atomically by rank 0, read by every worker on resume.

A checkpoint is a directory ``ckpt-<global step>`` under the job's checkpoint URI holding
``model.keras`` (weights and rank 0's optimizer state), ``state.json`` (position, history,
rank 0's scalar exchange state for reading, the run id) and ``workers/rank-N``: each rank's
whole ``UpdateExchange.get_state()`` as an ``.npz`` (its residual, its own threshold state,
its optimizer variables, ...), which that rank restores on resume. It is
written under a temporary name and renamed when complete, so a worker killed mid-write leaves
no checkpoint that looks whole. Any filesystem pyarrow reaches works (local, HDFS, S3,
fsspec): object stores have no directory rename, so there the files are written in place and
``state.json`` last; a checkpoint without it is never read and is removed on the next start.

Nothing model-sized passes through memory twice: the model file is written to local disk by
:func:`sparkdl.training.serialization.save_model_file` and copied into the store in chunks;
a rank's state is streamed into its ``.npz`` array by array, in chunks, and read back from
a seekable stream array by array; a resumed worker loads the model from a local file (the
checkpoint's own on a local filesystem, else a downloaded copy).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import uuid
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.fs as pafs

from sparkdl.errors import ConfigurationError, DataError, TrainingError
from sparkdl.run_output import MODEL_FILE
from sparkdl.storage import (
    copy_in,
    local_copy,
    move_dir,
    renames_atomically,
    resolve,
    temporary_name,
    write_bytes,
)

log = logging.getLogger("sparkdl.training")

_NAME = re.compile(r"^ckpt-(\d{10})$")
RUN_FILE = "_run.json"
FAILURE_FILE = "_failure.json"
STATE_FILE = "state.json"


@dataclass
class CheckpointPolicy:
    """Where and how often rank 0 checkpoints."""

    uri: str
    every: int = 1
    unit: str = "epochs"  # "epochs" | "steps"
    keep: int = 2

    def __post_init__(self) -> None:
        if self.unit not in ("epochs", "steps"):
            raise ConfigurationError(
                f"checkpoint_unit must be 'epochs' or 'steps', got {self.unit!r}"
            )
        if self.every < 1 or self.keep < 1:
            raise ConfigurationError(
                f"checkpoint_every and keep must be positive, got {self.every}, {self.keep}"
            )

    def due(self, global_step: int, epoch_end: bool, epoch: int) -> bool:
        """Whether to checkpoint after ``global_step`` steps have been taken."""
        if self.unit == "steps":
            return global_step % self.every == 0
        return epoch_end and (epoch + 1) % self.every == 0


@dataclass
class TrainingState:
    """Where training stands: the next step to run is ``(epoch, step_in_epoch)``."""

    run_id: str
    global_step: int
    epoch: int
    step_in_epoch: int
    history: list[dict[str, float]] = field(default_factory=list)
    exchange_state: dict[str, Any] = field(default_factory=dict)
    world_size: int = 0  # the ranks that wrote it (0: not recorded, an older checkpoint)
    steps_per_epoch: int = 0  # their plan's (an elastic relaunch may plan another)


@dataclass
class Checkpoint:
    path: str  # its URI
    state: TrainingState

    @property
    def name(self) -> str:
        return self.path.rsplit("/", 1)[1]

    def model_file(self) -> contextlib.AbstractContextManager[Path]:
        """The checkpoint's ``model.keras`` as a local file while the block runs: the file
        itself on a local filesystem, else a copy downloaded in chunks and deleted after."""
        return local_copy(f"{self.path}/{MODEL_FILE}")

    def worker_state(self, store: CheckpointStore, rank: int) -> dict[str, Any] | None:
        """Rank ``rank``'s own saved state (residual, threshold, optimizer state: what
        :meth:`CheckpointStore.save_worker_state` wrote), if the checkpoint has it; read from a
        seekable stream one array at a time."""
        name = f"{self.name}/workers/rank-{rank:05d}"
        if not store._exists(name):
            return None
        with store.fs.open_input_file(f"{store.root}/{name}") as stream, \
                np.load(stream, allow_pickle=False) as saved:
            return {key: _scalar_or_array(saved[key]) for key in saved.files}


def _scalar_or_array(value: np.ndarray) -> Any:
    """A saved state's 0-d arrays are its numbers."""
    return value.item() if value.ndim == 0 else value


class CheckpointStore:
    """The checkpoints of one training run under a URI."""

    def __init__(self, uri: str) -> None:
        self.uri = uri.rstrip("/")
        self.fs, self.root = resolve(self.uri)

    # Run identity ------------------------------------------------------------------------

    def start_run(self, resume: bool) -> str:
        """Begin a fit: keep the existing run when resuming, else clear old checkpoints."""
        try:
            self.fs.create_dir(self.root, recursive=True)
        except OSError as exc:
            raise DataError(f"checkpoint_dir: cannot create {self.uri}: {exc}") from None
        self._remove_partial_writes()
        current = self._read_json(RUN_FILE)
        if resume and current:
            self._delete(FAILURE_FILE)
            return str(current["run_id"])
        for name in self._checkpoint_names():
            self.fs.delete_dir(f"{self.root}/{name}")
        self._delete(FAILURE_FILE)
        run_id = uuid.uuid4().hex
        self._write_bytes(RUN_FILE, json.dumps({"run_id": run_id}).encode())
        return run_id

    # Reading -----------------------------------------------------------------------------

    def latest(self, run_id: str) -> Checkpoint | None:
        """The newest complete checkpoint of ``run_id``, if any."""
        for name in reversed(self._checkpoint_names()):
            try:
                state = TrainingState(**json.loads(self._read(f"{name}/{STATE_FILE}")))
                if state.run_id != run_id:
                    continue
                return Checkpoint(f"{self.uri}/{name}", state)
            except (OSError, ValueError, TypeError) as exc:
                log.warning("skipping unreadable checkpoint %s/%s: %s", self.uri, name, exc)
        return None

    # Writing -----------------------------------------------------------------------------

    def save_worker_state(self, run_id: str, global_step: int, rank: int,
                          state: Mapping[str, Any]) -> None:
        """Stage one rank's own state (``UpdateExchange.get_state()``: arrays and numbers)
        for the checkpoint at ``global_step`` as an ``.npz``, streamed array by array (every
        rank calls this before rank 0 calls :meth:`save`, which moves the staged states in)."""
        staging = self._staging(run_id, global_step)
        self.fs.create_dir(f"{self.root}/{staging}", recursive=True)
        arrays = {key: np.asarray(value) for key, value in state.items()}
        path = f"{self.root}/{staging}/rank-{rank:05d}"
        # the staging directory's temporary name keeps a half-written state from being read
        with self.fs.open_output_stream(path) as stream:
            np.savez(stream, allow_pickle=False, **arrays)

    def _staging(self, run_id: str, global_step: int) -> str:
        return f".workers-{global_step:010d}.tmp-{run_id[:12]}"

    def save(self, state: TrainingState, model_file: str | os.PathLike[str],
             keep: int = 2) -> str:
        """Write a checkpoint atomically, its model copied in chunks from the local file
        ``model_file``; keep only the newest ``keep``."""
        name = f"ckpt-{state.global_step:010d}"
        renames = renames_atomically(self.fs)
        # where rename is atomic, build the checkpoint aside and rename it into place; on an
        # object store write in place, state.json (what makes it complete) last
        tmp = temporary_name(name) if renames else name
        if not renames and self._exists(name):
            self.fs.delete_dir(f"{self.root}/{name}")
        self.fs.create_dir(f"{self.root}/{tmp}", recursive=True)
        try:
            staging = self._staging(state.run_id, state.global_step)
            if self._exists(staging):
                move_dir(self.fs, f"{self.root}/{staging}", f"{self.root}/{tmp}/workers")
            copy_in(model_file, self.fs, f"{self.root}/{tmp}/{MODEL_FILE}")
            self._write_bytes(f"{tmp}/{STATE_FILE}", json.dumps(asdict(state)).encode())
            if renames:
                if self._exists(name):
                    self.fs.delete_dir(f"{self.root}/{name}")
                self.fs.move(f"{self.root}/{tmp}", f"{self.root}/{name}")
        except BaseException:
            self.fs.delete_dir(f"{self.root}/{tmp}")
            raise
        for old in self._checkpoint_names()[:-keep]:
            self.fs.delete_dir(f"{self.root}/{old}")
        return f"{self.uri}/{name}"

    def record_failure(self, message: str) -> None:
        """Mark the run as failed for a reason a retry cannot fix (non-finite values)."""
        self._write_bytes(FAILURE_FILE, json.dumps({"error": message}).encode())

    def check_failure(self) -> None:
        failure = self._read_json(FAILURE_FILE)
        if failure:
            raise TrainingError(f"an earlier attempt of this run failed: {failure['error']}")

    # Filesystem helpers ------------------------------------------------------------------

    def _checkpoint_names(self) -> list[str]:
        try:
            infos = self.fs.get_file_info(pafs.FileSelector(self.root, allow_not_found=True))
        except OSError:
            return []
        return sorted(i.base_name for i in infos
                      if i.type == pafs.FileType.Directory and _NAME.match(i.base_name))

    def _remove_partial_writes(self) -> None:
        """Delete what a writer killed mid-checkpoint left (never complete, never read): a
        temporary name, or on an object store a checkpoint without its ``state.json``."""
        infos = self.fs.get_file_info(pafs.FileSelector(self.root, allow_not_found=True))
        for info in infos:
            partial = ".tmp-" in info.base_name or (
                _NAME.match(info.base_name) is not None
                and not self._exists(f"{info.base_name}/{STATE_FILE}")
            )
            if not partial:
                continue
            if info.type == pafs.FileType.Directory:
                self.fs.delete_dir(info.path)
            else:
                self.fs.delete_file(info.path)

    def _exists(self, name: str) -> bool:
        return bool(self.fs.get_file_info(f"{self.root}/{name}").type != pafs.FileType.NotFound)

    def _read(self, name: str) -> bytes:
        with self.fs.open_input_stream(f"{self.root}/{name}") as stream:
            return bytes(stream.read())

    def _read_json(self, name: str) -> dict[str, Any] | None:
        if not self._exists(name):
            return None
        document = json.loads(self._read(name))
        if not isinstance(document, dict):
            raise DataError(f"{self.uri}/{name}: expected a JSON object, got {document!r:.80}")
        return document

    def _write_bytes(self, name: str, data: bytes) -> None:
        write_bytes(self.fs, f"{self.root}/{name}", data)

    def _delete(self, name: str) -> None:
        if self._exists(name):
            self.fs.delete_file(f"{self.root}/{name}")
