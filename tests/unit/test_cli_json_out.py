"""``--json-out PATH``: the result line of stdout, also written atomically to a file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from _cli_harness import run_cli as _run
from _run_dir import write_run_dir

REPO = Path(__file__).resolve().parents[2]


def _conf(tmp_path: Path) -> Path:
    conf = tmp_path / "job.yaml"
    conf.write_text(f"data:\n  dir: {tmp_path / 'data'}\noutput:\n  dir: {tmp_path / 'run'}\n")
    return conf


def test_validate_writes_its_result_line_to_json_out(tmp_path, capsys):
    out = tmp_path / "results" / "deep" / "validate.json"  # missing parents are created
    rc, stdout, _ = _run(capsys, ["validate", "--conf", str(_conf(tmp_path)),
                                  "--json-out", str(out)])
    assert rc == 0
    last = stdout.strip().splitlines()[-1]
    assert json.loads(out.read_text()) == json.loads(last)
    assert json.loads(last)["valid"] is True
    assert [p.name for p in out.parent.iterdir()] == ["validate.json"]  # no temporary left


def test_report_writes_json_out_and_replaces_an_old_one(tmp_path, capsys):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    write_run_dir(run_dir)
    out = tmp_path / "report.json"
    out.write_text("old")
    rc, stdout, _ = _run(capsys, ["report", str(run_dir), "--json-out", str(out)])
    assert rc == 0
    assert json.loads(out.read_text()) == {"report": str(run_dir.resolve() / "report.html")}
    assert out.read_text() == stdout.splitlines()[-1] + "\n"


def test_a_failed_command_writes_no_json_out(tmp_path, capsys):
    out = tmp_path / "result.json"
    rc, stdout, err = _run(capsys, ["report", str(tmp_path / "nope"), "--json-out", str(out)])
    assert rc == 2 and stdout == "" and "metrics.json" in err
    assert not out.exists() and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("command", [["validate", "--conf", "CONF"], ["report", "RUN"],
                                     ["samples", "DIR"], ["etl", "--conf", "CONF"]])
def test_an_unwritable_json_out_is_refused_before_the_command_runs(tmp_path, capsys, command):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    conf = _conf(tmp_path)
    argv = [{"CONF": str(conf), "RUN": str(tmp_path / "run"), "DIR": str(tmp_path / "samples")}
            .get(a, a) for a in command]
    for bad, message in [(tmp_path, "is a directory"), (blocker / "r.json", "is not a directory")]:
        rc, stdout, err = _run(capsys, [*argv, "--json-out", str(bad)])
        assert rc == 2 and stdout == "", err
        assert f"--json-out {bad}: " in err and message in err, err
        assert "Traceback" not in err
    assert not (tmp_path / "samples").exists() and not (tmp_path / "run").exists()


def test_a_job_exits_quickly_with_its_status_threads_atexit_handlers_and_output(tmp_path):
    """``exit_quickly`` skips only the interpreter's teardown: the threads Python waits for
    finish, atexit handlers run, buffered output arrives, the status is the job's."""
    import subprocess
    import sys

    script = f"""
import atexit, pathlib, sys, threading, time
from sparkdl.cli import exit_quickly
out = pathlib.Path({str(tmp_path)!r})
def late():
    time.sleep(0.5)
    (out / "thread").write_text("done")
threading.Thread(target=late).start()
atexit.register(lambda: (out / "atexit").write_text((out / "thread").read_text()))
sys.stdout.write("no newline, still buffered")
exit_quickly(3)
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 3, proc.stderr
    assert proc.stdout == "no newline, still buffered"
    assert (tmp_path / "atexit").read_text() == "done"
