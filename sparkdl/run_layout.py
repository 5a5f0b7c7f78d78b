"""Where everything of a run lives: one :class:`RunLayout` owns every path, and each file
name is defined here once (as Horovod's ``Store`` or Ray Train's ``StorageContext`` do).

A run's places, each a URI (or local path) on any filesystem :mod:`sparkdl.storage` reaches:

================= =============================================================================
``data_dir``      the ETL's shards: ``train/`` and ``test/`` (:attr:`RunLayout.train_shards`)
``output_dir``    the published outputs (:meth:`RunLayout.output`, a
                  :class:`~sparkdl.run_output.RunOutput`): ``model.keras``, ``metrics.json``,
                  ``history.csv``, ``report.html``, ``evaluation.json``, ``predictions/``,
                  ``savedmodel/``
``checkpoint_dir`` the checkpoints (:meth:`RunLayout.checkpoints`, a
                  :class:`~sparkdl.training.worker.checkpoint.CheckpointStore`) and the training
                  stage's attempt log (:meth:`RunLayout.attempts_uri`, under ``_attempts/``)
``store_dir``     the run store of shards written from DataFrames (:meth:`RunLayout.run_store`,
                  a :class:`~sparkdl.data.store.RunStore`; ``None``: a temporary directory)
================= =============================================================================

Importing this module imports neither Spark nor TensorFlow.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sparkdl.errors import ConfigurationError

if TYPE_CHECKING:
    from sparkdl.config import JobConfig
    from sparkdl.data.store import RunStore
    from sparkdl.run_output import RunOutput
    from sparkdl.training.worker.checkpoint import CheckpointStore

# The shards (data_dir) ----------------------------------------------------------------------
TRAIN_SHARDS = "train"
TEST_SHARDS = "test"

# The checkpoints (checkpoint_dir) -----------------------------------------------------------
ATTEMPTS_DIR = "_attempts"


@dataclass(frozen=True)
class RunLayout:
    """Every path of one run (``None``: the run has no such place)."""

    data_dir: str | None = None
    output_dir: str | None = None
    checkpoint_dir: str | None = None
    store_dir: str | None = None

    @classmethod
    def from_config(cls, config: JobConfig) -> RunLayout:
        """A job's places: ``data.dir``, ``output.dir``, ``training.checkpoint_dir`` and
        ``training.store``, local paths made absolute ``file://`` URIs."""
        from sparkdl.storage import as_uri

        training = config.training
        return cls(
            data_dir=as_uri(config.data.dir).rstrip("/"),
            output_dir=config.output.dir,
            checkpoint_dir=as_uri(training.checkpoint_dir) if training.checkpoint_dir else None,
            store_dir=training.store,
        )

    # Shards ---------------------------------------------------------------------------------

    @property
    def train_shards(self) -> str:
        return f"{self._required('data_dir', self.data_dir)}/{TRAIN_SHARDS}"

    @property
    def test_shards(self) -> str:
        return f"{self._required('data_dir', self.data_dir)}/{TEST_SHARDS}"

    def run_store(self, *, keep: bool = False) -> RunStore:
        """The run store of DataFrame shards (this process's, for ``store_dir``)."""
        from sparkdl.data.store import open_store

        return open_store(self.store_dir, keep=keep)

    # Outputs --------------------------------------------------------------------------------

    def output(self) -> RunOutput:
        """``output_dir`` as a :class:`RunOutput`, created if needed (one clear error naming
        ``output.dir`` if it cannot be)."""
        from sparkdl.run_output import RunOutput

        return RunOutput(self._required("output_dir", self.output_dir))

    # Checkpoints and attempts ---------------------------------------------------------------

    def checkpoints(self) -> CheckpointStore:
        from sparkdl.training.worker.checkpoint import CheckpointStore

        return CheckpointStore(self._required("checkpoint_dir", self.checkpoint_dir))

    def attempts_uri(self) -> str | None:
        """A fresh directory for one training stage's attempt log: under the checkpoint
        directory (shared storage every executor reaches); ``None`` without one (the
        launcher then uses a driver-local temporary directory)."""
        if not self.checkpoint_dir:
            return None
        return f"{self.checkpoint_dir.rstrip('/')}/{ATTEMPTS_DIR}/{uuid.uuid4().hex[:12]}"

    @staticmethod
    def _required(name: str, value: str | None) -> str:
        if not value:
            raise ConfigurationError(f"this run has no {name}")
        return value.rstrip("/") or value
