"""No test forks a process that may run TensorFlow's, gRPC's or the JVM gateway's threads.

A child forked from such a process can abort on an abseil mutex a thread held at the fork
("Check w->waitp->cond == nullptr failed"), at random, more often on a loaded machine.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests"

_PROBE = """
import os, subprocess, sys
import _fork_guard
_fork_guard.THREADED_MODULES[:] = ["numpy"]
_fork_guard.install()
import multiprocessing as mp
def nothing():
    pass
if __name__ == "__main__":
    subprocess.run([sys.executable, "-c", "pass"], check=True)  # exempt: exec follows
    proc = mp.get_context("forkserver").Process(target=nothing)  # forks elsewhere
    proc.start(); proc.join(30)
    print("before numpy:", len(_fork_guard.offences))
    import numpy
    subprocess.run([sys.executable, "-c", "pass"], check=True, preexec_fn=lambda: None)
    print("subprocess:", len(_fork_guard.offences))
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    print("fork:", len(_fork_guard.offences))
    print(_fork_guard.offences[-1].splitlines()[0])
"""


def test_the_guard_records_a_fork_taken_while_a_threaded_library_is_imported(tmp_path) -> None:
    script = tmp_path / "probe.py"
    script.write_text(_PROBE)
    done = subprocess.run([sys.executable, str(script)], cwd=TESTS, capture_output=True,
                          text=True, timeout=120, env={"PYTHONPATH": str(TESTS),
                                                       "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "before numpy: 0", "subprocess: 0", "fork: 1", "fork() with numpy imported, from:"
    ], done.stdout


_FORKING_CALLS = {
    ("os", "fork"), ("os", "forkpty"), ("pty", "fork"),
    ("mp", "Process"), ("multiprocessing", "Process"), ("mp", "Pool"),
    ("multiprocessing", "Pool"), ("mp", "set_start_method"),
    ("multiprocessing", "set_start_method"),
}


def _forking_calls(path: Path) -> list[str]:
    """Calls in ``path`` that fork with the default context or ask for ``fork`` by name."""
    name = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path.name
    text = path.read_text()
    if not any(word in text for word in ("fork", "Process", "Pool", "set_start_method")):
        return []
    found = []
    for node in ast.walk(ast.parse(text, str(path))):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if (isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name)
                and (func.value.id, func.attr) in _FORKING_CALLS):
            found.append(f"{name}:{node.lineno}: {func.value.id}.{func.attr}")
        if any(isinstance(arg, ast.Constant) and arg.value == "fork" for arg in node.args):
            found.append(f"{name}:{node.lineno}: a 'fork' context")
    return found


def test_no_source_forks_with_the_fork_context() -> None:
    sources = [p for folder in ("tests", "sparkdl", "jobs", "benchmarks")
               for p in sorted((ROOT / folder).rglob("*.py"))]
    assert len(sources) > 100
    found = [hit for path in sources for hit in _forking_calls(path)]
    assert not found, "\n".join(found)


def test_the_scan_finds_each_way_of_forking(tmp_path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text("import os\nimport multiprocessing as mp\nos.fork()\n"
                     "mp.Process(target=print)\nmp.get_context('fork')\n")
    assert [hit.split(": ", 1)[1] for hit in _forking_calls(probe)] == [
        "os.fork", "mp.Process", "a 'fork' context"]


def test_the_rank_harness_starts_its_ranks_from_a_fork_server() -> None:
    import _comm_harness

    assert _comm_harness._CTX.get_start_method() == "forkserver"
