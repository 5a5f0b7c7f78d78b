"""A bar of the shard files a Spark write has committed, for a person watching the ETL.

Spark's Parquet writer runs in the JVM and tells Python nothing while it runs, and classic
Spark offers a client no public progress API. What the driver can see is the output: each
write task commits its one ``part-NNNNN`` file into the job's temporary directory (Hadoop's
``FileOutputCommitter``: ``_temporary/<job>/task_*/`` with algorithm 1, the output itself with
algorithm 2) while it is still being written under ``_temporary/<job>/_temporary/attempt_*/``.
A thread lists that directory twice a second and moves the bar by the committed files.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Iterator
from typing import TextIO

import pyarrow.fs as pafs

#: How often the directory is listed.
POLL_S = 0.5
#: A write shorter than this draws no bar (a small ETL would only flash one).
SHOW_AFTER_S = 2.0
WIDTH = 30


def committed_files(fs: pafs.FileSystem, path: str) -> int:
    """How many distinct ``part-NNNNN`` files under ``path`` are committed: not inside a task
    attempt's own directory (``attempt_*``)."""
    selector = pafs.FileSelector(path, recursive=True, allow_not_found=True)
    parts = set()
    for info in fs.get_file_info(selector):
        relative = info.path[len(path):].strip("/").split("/")
        name = relative[-1]
        if (info.type == pafs.FileType.File and name.startswith("part-")
                and not any(d.startswith("attempt_") for d in relative[:-1])):
            parts.add(name.split("-", 2)[1])
    return len(parts)


def _line(label: str, done: int, total: int, seconds: float) -> str:
    filled = WIDTH * min(done, total) // max(total, 1)
    bar = "=" * filled + (">" if filled < WIDTH else "") + "." * (WIDTH - filled - 1)
    return f"\r{label}: [{bar}] {min(done, total)}/{total} files - {seconds:.0f}s"


@contextlib.contextmanager
def files_progress(fs: pafs.FileSystem, path: str, total: int, label: str, *,
                   show: bool = True, out: TextIO | None = None) -> Iterator[None]:
    """While the block writes ``total`` files under ``path``, draw a bar of those committed
    (on ``out``, default standard output), once the block has run :data:`SHOW_AFTER_S`; the
    bar ends with a full line when the block does. With ``show`` false, nothing."""
    if not show:
        yield
        return
    stream = out if out is not None else sys.stdout
    started = time.monotonic()
    stop = threading.Event()
    drawn: list[int] = []  # the counts drawn so far

    def draw(done: int) -> None:
        stream.write(_line(label, done, total, time.monotonic() - started))
        stream.flush()
        drawn.append(done)

    def poll() -> None:
        while not stop.wait(POLL_S):
            if time.monotonic() - started < SHOW_AFTER_S:
                continue
            with contextlib.suppress(OSError):  # a listing that fails: the next one may not
                done = committed_files(fs, path)
                if not drawn or done != drawn[-1]:
                    draw(done)

    thread = threading.Thread(target=poll, name="sparkdl-etl-progress", daemon=True)
    thread.start()
    written = False
    try:
        yield
        written = True
    finally:
        stop.set()
        thread.join(POLL_S + 5.0)
        if drawn or (written and time.monotonic() - started >= SHOW_AFTER_S):
            if written:
                with contextlib.suppress(OSError):
                    draw(committed_files(fs, path))
            stream.write("\n")  # a failed write's error starts on a line of its own
            stream.flush()
