"""The ETL's bar of committed files: which files count, and what it draws as they appear."""

from __future__ import annotations

import io
import threading
import time
from pathlib import Path

import pyarrow.fs as pafs

from sparkdl.data import write_progress
from sparkdl.data.write_progress import committed_files, files_progress

FS = pafs.LocalFileSystem()


def _touch(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"x")


def test_only_committed_part_files_count_once_each(tmp_path: Path) -> None:
    job = tmp_path / "_temporary" / "0"
    _touch(job / "_temporary" / "attempt_1_m_000000_0" / "part-00000-a-c000.snappy.parquet")
    _touch(job / "task_1_m_000001" / "part-00001-a-c000.snappy.parquet")  # algorithm 1
    _touch(tmp_path / "part-00002-a-c000.snappy.parquet")  # algorithm 2, or the job committed
    _touch(tmp_path / "part-00002-a-c001.snappy.parquet")  # a second file of one task
    _touch(tmp_path / "_SUCCESS")
    assert committed_files(FS, str(tmp_path)) == 2
    assert committed_files(FS, str(tmp_path / "missing")) == 0


def test_the_bar_moves_with_the_files_and_ends_on_a_line_of_its_own(tmp_path: Path,
                                                                    monkeypatch) -> None:
    monkeypatch.setattr(write_progress, "SHOW_AFTER_S", 0.0)
    monkeypatch.setattr(write_progress, "POLL_S", 0.02)
    out = io.StringIO()
    seen = threading.Event()

    def wait_for(text: str) -> None:
        deadline = time.monotonic() + 10
        while text not in out.getvalue() and time.monotonic() < deadline:
            time.sleep(0.01)
        seen.set()

    with files_progress(FS, str(tmp_path), 3, "writing x", out=out):
        for i in range(3):
            _touch(tmp_path / "_temporary" / "0" / f"task_{i}" / f"part-0000{i}-u.parquet")
            wait_for(f" {i + 1}/3 files")
    drawn = out.getvalue()
    assert seen.is_set() and drawn.endswith("\n") and drawn.count("\n") == 1
    lines = drawn.rstrip("\n").split("\r")[1:]
    counts = [line.split("] ")[1].split(" files")[0] for line in lines]
    assert [c for i, c in enumerate(counts) if c != counts[i - 1] or i == 0][-3:] == [
        "1/3", "2/3", "3/3"]  # the last line (drawn again at the end) full
    assert lines[-1].startswith("writing x: [" + "=" * 30 + "] 3/3 files - ")


def test_a_short_write_or_show_false_draws_nothing(tmp_path: Path) -> None:
    out = io.StringIO()
    with files_progress(FS, str(tmp_path), 3, "writing x", out=out):
        _touch(tmp_path / "part-00000-u.parquet")
    with files_progress(FS, str(tmp_path), 3, "writing x", show=False, out=out):
        pass
    assert out.getvalue() == ""
