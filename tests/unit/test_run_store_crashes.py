"""Run store deletions killed midway: a crash at any step leaves either the whole entry or an
entry no reader uses, and the next user of the key cleans up without waiting on the dead
process again and again, and never reuses half-deleted shards."""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from sparkdl.data import store
from sparkdl.data.metadata import METADATA_FILE
from sparkdl.data.store import LEASES, TEMPORARY, RunStore

KEY = "fedcba9876543210fedcba9876543210"
FILES = 200

# what write_shards does, small: the files go to a hidden sibling renamed into place whole
WRITE = textwrap.dedent(f"""
    def write(uri):
        folder = Path(uri.removeprefix("file://"))
        tmp = folder.with_name("." + folder.name + ".tmp-" + str(os.getpid()))
        tmp.mkdir()
        for i in range({FILES}):
            (tmp / f"part-{{i:05d}}.parquet").write_bytes(b"x")
        (tmp / "{METADATA_FILE}").write_text("{{}}")
        tmp.rename(folder)
""")

# a process that writes the temporary entry KEY and deletes it at exit, stopping at the step
# named by argv[2] (with "half": after deleting half the files moved away) until killed
DELETER = textwrap.dedent("""
    import os, sys, time
    from pathlib import Path
    from sparkdl.data import store

    root, stop = sys.argv[1], sys.argv[2]
    step, half = stop.removesuffix("-half"), stop.endswith("-half")

    def hook(name):
        if name != step:
            return
        if half:
            leases = Path(root) / store.LEASES / "{key}"
            for retired in leases.glob(store.RETIRED + "*"):
                for f in sorted(retired.iterdir())[::2]:
                    f.unlink()
        print(name, flush=True)
        time.sleep(600)

    store._retire_step = hook
""").format(key=KEY) + WRITE + textwrap.dedent(f"""
    s = store.RunStore(root)
    print(s.shards("{KEY}", write), flush=True)
    s.cleanup()
    print("finished", flush=True)
""")

STEPS = ["marked", "unpublished", "untemporary", "moved", "moved-half", "unmarked",
         "unmarked-half"]


def _write(uri: str) -> None:
    namespace = {"Path": Path, "os": os}
    exec(WRITE, namespace)
    namespace["write"](uri)


@pytest.fixture
def warnings_logged():
    """The sparkdl logger's records (it may not propagate to pytest's caplog)."""
    records: list[logging.LogRecord] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = records.append  # type: ignore[method-assign]
    logger = logging.getLogger("sparkdl")
    logger.addHandler(handler)
    try:
        yield records
    finally:
        logger.removeHandler(handler)


def _killed_at(root: Path, step: str) -> int:
    """Run DELETER until it stops at ``step``; kill it there. Returns its pid."""
    proc = subprocess.Popen([sys.executable, "-c", DELETER, str(root), step], text=True,
                            stdout=subprocess.PIPE)
    try:
        assert proc.stdout.readline().strip().endswith(KEY)
        assert proc.stdout.readline().strip() == step.removesuffix("-half")
    finally:
        proc.kill()
        proc.wait(timeout=30)
    return proc.pid


def _entry(root: Path) -> Path:
    return root / KEY


def _whole(root: Path) -> bool:
    names = {p.name for p in _entry(root).iterdir()}
    return names == {METADATA_FILE, *(f"part-{i:05d}.parquet" for i in range(FILES))}


def _leases(root: Path) -> set[str]:
    return {p.name for p in (root / LEASES / KEY).iterdir()}


def _backdate_markers(root: Path, seconds: float) -> None:
    """As if the next fit came ``seconds`` after the crash."""
    then = time.time() - seconds
    for marker in (root / LEASES / KEY).glob(store.RETIRING + "*"):
        os.utime(marker, (then, then))


@pytest.mark.parametrize("step", STEPS)
def test_a_deletion_killed_at_any_step_leaves_the_whole_entry_or_one_nobody_reuses(
        tmp_path, step, warnings_logged):
    pid = _killed_at(tmp_path, step)
    metadata_left = (_entry(tmp_path) / METADATA_FILE).is_file()
    assert metadata_left == (step == "marked")
    if metadata_left:
        assert _whole(tmp_path)
    marker_left = any(n.startswith(store.RETIRING) for n in _leases(tmp_path))
    assert marker_left == (step not in ("unmarked", "unmarked-half"))

    # the next fit of the same data, an hour later: no wait, no half-deleted shards
    _backdate_markers(tmp_path, 3600)
    written: list[str] = []
    later = RunStore(str(tmp_path))
    start = time.monotonic()
    try:
        uri = later.shards(KEY, lambda u: written.append(u) or _write(u))
        assert time.monotonic() - start < 10  # far below RETIRE_WAIT_S (60 s)
        assert uri.endswith(f"/{KEY}")
        assert written == ([] if metadata_left else [uri])  # reused only when whole
        assert _whole(tmp_path)
        leases = _leases(tmp_path)
        assert not any(n.startswith((store.RETIRING, store.RETIRED)) for n in leases), leases
        messages = [r.getMessage() for r in warnings_logged]
        stale = [m for m in messages if "never finished" in m]
        if marker_left:
            assert len(stale) == 1, messages
            assert f"host {socket.gethostname()}, process {pid}, started 36" in stale[0]
        else:
            assert not stale, messages

        # and the one after it waits neither
        again = RunStore(str(tmp_path))
        start = time.monotonic()
        assert again.shards(KEY, _write) == uri
        assert time.monotonic() - start < 5
        again.cleanup()
    finally:
        later.cleanup()
    # the last user deletes the entry: nothing left but an empty lease folder
    assert not _entry(tmp_path).exists()
    assert _leases(tmp_path) == set()


def test_a_marker_left_just_now_is_waited_on_once_within_the_bound(tmp_path, monkeypatch):
    monkeypatch.setattr(store, "RETIRE_WAIT_S", 1.0)
    _killed_at(tmp_path, "unpublished")
    first = RunStore(str(tmp_path))
    second = RunStore(str(tmp_path))
    try:
        start = time.monotonic()
        first.shards(KEY, _write)
        assert 0.0 < time.monotonic() - start < 8  # waited for the bound, then cleaned
        assert _whole(tmp_path)
        start = time.monotonic()
        second.shards(KEY, _must_not_write)
        assert time.monotonic() - start < 0.9  # the marker is gone: no second wait
    finally:
        first.cleanup()
        second.cleanup()


def test_an_entry_whose_marker_the_user_deleted_is_written_again_not_reused(tmp_path):
    _killed_at(tmp_path, "untemporary")
    for marker in (tmp_path / LEASES / KEY).glob(store.RETIRING + "*"):
        marker.unlink()
    written: list[str] = []
    later = RunStore(str(tmp_path), keep=True)
    try:
        later.shards(KEY, lambda u: written.append(u) or _write(u))
    finally:
        later.cleanup()
    assert len(written) == 1 and _whole(tmp_path)
    assert TEMPORARY not in _leases(tmp_path)  # the kept entry is nobody's to delete


def _must_not_write(uri: str) -> None:
    raise AssertionError(f"expected to reuse the shards, asked to write {uri}")
