"""Why each task attempt of a training stage failed, as structured records.

Spark reports only a stage's last failure, and as text (Py4J on classic Spark, gRPC on Spark
Connect). So the executor task writes one JSON record per failed task (rank, executor,
exception type, message, traceback) and the driver reads them back to say what failed each
time.
"""

from __future__ import annotations

import contextlib
import json
import logging
import traceback
from dataclasses import asdict, dataclass

log = logging.getLogger("sparkdl")

_MESSAGE_LIMIT = 2000
_TRACEBACK_LIMIT = 8000


@dataclass(frozen=True)
class TaskFailure:
    """One failed training task, as the task itself saw it."""

    stage_attempt: int  # first task id of the stage attempt (ids are consecutive by rank)
    rank: int
    executor: str
    error_type: str
    message: str
    traceback: str = ""

    @classmethod
    def of(cls, stage_attempt: int, rank: int, executor: str, exc: BaseException) -> TaskFailure:
        return cls(stage_attempt, rank, executor, type(exc).__name__,
                   str(exc)[:_MESSAGE_LIMIT],
                   "".join(traceback.format_exception(exc))[-_TRACEBACK_LIMIT:])

    def describe(self) -> str:
        """``rank R on HOST: Error: message``."""
        return f"rank {self.rank} on {self.executor}: {self.error_type}: {self.message}"


class AttemptLog:
    """The failed tasks of one training stage, one JSON file each.

    Kept under the checkpoint directory when there is one (shared storage, reachable from
    every executor); else in a driver-local temporary directory, which executors on the
    driver's machine (local and local-cluster masters, a local Connect server) reach.
    """

    def __init__(self, uri: str, owned_dir: str | None = None) -> None:
        self.uri = uri
        self._owned_dir = owned_dir

    @classmethod
    def create(cls, checkpoint_uri: str | None) -> AttemptLog:
        import tempfile

        from sparkdl.run_layout import RunLayout

        uri = RunLayout(checkpoint_dir=checkpoint_uri).attempts_uri()
        if uri is not None:
            return cls(uri)
        tmp = tempfile.mkdtemp(prefix="sparkdl-attempts-")
        return cls(f"file://{tmp}", owned_dir=tmp)

    def record(self, failure: TaskFailure) -> None:
        """Record one failed task (on the executor). Never raises: the task's own failure
        matters more than this record."""
        from sparkdl.storage import resolve

        name = f"{failure.stage_attempt:012d}-{failure.rank:05d}.json"
        try:
            fs, root = resolve(self.uri)
            fs.create_dir(root, recursive=True)
            with fs.open_output_stream(f"{root}/{name}") as f:
                f.write(json.dumps(asdict(failure)).encode())
        except Exception as error:
            log.warning("could not record a failed task in %s: %s", self.uri, error)

    def failures(self) -> list[TaskFailure]:
        """Every recorded failure, by stage attempt then rank."""
        import pyarrow.fs as pafs

        from sparkdl.storage import resolve

        try:
            fs, root = resolve(self.uri)
            infos = fs.get_file_info(pafs.FileSelector(root, allow_not_found=True))
            found = []
            for info in sorted(infos, key=lambda i: i.base_name):
                with fs.open_input_stream(info.path) as f:
                    found.append(TaskFailure(**json.loads(f.read())))
        except Exception as error:
            log.warning("could not read the failed tasks in %s: %s", self.uri, error)
            return []
        return found

    def read(self) -> list[str]:
        """One line per failed task: ``attempt K, rank R on HOST: Error: message``, K counting
        the stage attempts from 0."""
        failures = self.failures()
        index = {key: i for i, key in enumerate(dict.fromkeys(f.stage_attempt for f in failures))}
        return [f"attempt {index[f.stage_attempt]}, {f.describe()}" for f in failures]

    def close(self) -> None:
        import shutil

        from sparkdl.storage import resolve

        if self._owned_dir:
            shutil.rmtree(self._owned_dir, ignore_errors=True)
        else:
            with contextlib.suppress(Exception):
                fs, root = resolve(self.uri)
                fs.delete_dir(root)


def stage_error(failures: list[TaskFailure], exc: BaseException) -> str:
    """The training stage's error: every recorded task failure, or, when no task recorded
    one (an executor was lost, the job was cancelled), the line of Spark's own that says
    what went wrong."""
    if failures:
        attempts = len({f.stage_attempt for f in failures})
        index = {key: i for i, key in enumerate(dict.fromkeys(f.stage_attempt for f in failures))}
        detail = "; ".join(f"attempt {index[f.stage_attempt]}, {f.describe()}" for f in failures)
        return f"the training stage failed ({attempts} attempt(s)): {detail}"
    from sparkdl.data.spark_errors import task_failure_cause

    return f"the training stage failed (1 attempt(s)): {short(task_failure_cause(exc))}"


def short(text: str, limit: int = 300) -> str:
    """The first line of a failure's text, at most ``limit`` characters."""
    line = next((line for line in text.splitlines() if line.strip()), text)
    return line if len(line) <= limit else line[: limit - 1] + "…"
