"""Run store leases: a process's exit never deletes shards another process is using."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from sparkdl.data.metadata import METADATA_FILE
from sparkdl.data.store import RunStore

KEY = "0123456789abcdef0123456789abcdef"

# a second process: writes the entry KEY, says so, waits for a line on stdin, exits (its
# atexit cleanup runs as at the end of any fit)
WRITER = textwrap.dedent(f"""
    import sys
    from pathlib import Path
    from sparkdl.data.store import open_store

    def write(uri):
        folder = Path(uri.removeprefix("file://"))
        folder.mkdir(parents=True)
        (folder / "{METADATA_FILE}").write_text("{{}}")

    print(open_store(sys.argv[1]).shards("{KEY}", write), flush=True)
    sys.stdin.readline()
""")


def _must_not_write(uri: str) -> None:
    raise AssertionError(f"expected to reuse the shards, asked to write {uri}")


def _entry_complete(root: Path) -> bool:
    return (root / KEY / METADATA_FILE).is_file()


def _writer(root: Path) -> subprocess.Popen:
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(root)], text=True,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    line = writer.stdout.readline()  # bounded: the child writes it or exits
    assert line.strip().endswith(KEY), line
    return writer


def _exit(writer: subprocess.Popen) -> None:
    writer.communicate("\n", timeout=60)
    assert writer.returncode == 0


@pytest.mark.parametrize("keep", [True, False])
def test_a_writers_exit_leaves_the_shards_another_process_reuses(tmp_path, keep):
    writer = _writer(tmp_path)
    reuser = RunStore(str(tmp_path), keep=keep)
    try:
        assert reuser.shards(KEY, _must_not_write).endswith(KEY)
        _exit(writer)
        assert _entry_complete(tmp_path)
    finally:
        writer.kill()
        reuser.cleanup()
    # the last user of a temporary entry deletes it; one that asked to keep it keeps it
    assert _entry_complete(tmp_path) == keep


def test_an_entry_kept_by_its_writer_survives_every_reusers_exit(tmp_path):
    kept = RunStore(str(tmp_path), keep=True)
    kept.shards(KEY, lambda uri: (tmp_path / KEY).mkdir() or
                (tmp_path / KEY / METADATA_FILE).write_text("{}"))
    kept.cleanup()
    other = RunStore(str(tmp_path))
    other.shards(KEY, _must_not_write)
    other.cleanup()
    assert _entry_complete(tmp_path)


def test_a_deletion_that_never_finishes_is_waited_on_for_the_bound_then_cleaned(
        tmp_path, monkeypatch):
    from sparkdl.data import store

    monkeypatch.setattr(store, "RETIRE_WAIT_S", 0.2)
    (tmp_path / KEY).mkdir()
    (tmp_path / KEY / METADATA_FILE).write_text("{}")
    leases = tmp_path / store.LEASES / KEY
    leases.mkdir(parents=True)
    (leases / "retiring-a-host-123-dead").write_text("")
    reuser = RunStore(str(tmp_path), keep=True)
    try:
        # the metadata is still there: the deletion had not begun, the entry is whole
        assert reuser.shards(KEY, _must_not_write).endswith(f"/{KEY}")
        assert not (leases / "retiring-a-host-123-dead").exists()  # no one waits on it again
    finally:
        reuser.cleanup()
    assert _entry_complete(tmp_path)
