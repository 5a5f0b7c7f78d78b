"""sparkdl.main_guard in real Python processes: a script's unguarded top-level call is found
(with its line), a guarded one or one without a script file is not."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

PROBE = "from sparkdl.main_guard import unguarded_main_line\n"


def run(argv: list[str], cwd: Path) -> str:
    proc = subprocess.run([sys.executable, *argv], cwd=cwd, capture_output=True, text=True,
                          timeout=60, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def script(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "train job.py"  # a space: paths are taken as given
    path.write_text(PROBE + textwrap.dedent(body))
    return path


@pytest.mark.parametrize(("body", "line"), [
    ("print(unguarded_main_line())\n", 2),
    ("def fit():\n    return unguarded_main_line()\n\nx = 1\nprint(fit())\n", 6),
    ("if True:\n    print(\n        unguarded_main_line()\n    )\n", 4),  # the call's line
    ("if __name__ != '__main__':\n    pass\nelse:\n    pass\nprint(unguarded_main_line())\n", 6),
])
def test_an_unguarded_top_level_call_is_found_with_its_line(tmp_path, body, line):
    path = script(tmp_path, body)
    assert run([str(path)], tmp_path) == repr((str(path), line))


@pytest.mark.parametrize("body", [
    "if __name__ == '__main__':\n    print(unguarded_main_line())\n",
    "def main():\n    print(unguarded_main_line())\n\nif '__main__' == __name__:\n    main()\n",
])
def test_a_guarded_call_is_not(tmp_path, body):
    assert run([str(script(tmp_path, body))], tmp_path) == "None"


def test_no_script_file_means_nothing_to_find(tmp_path):
    assert run(["-c", PROBE + "print(unguarded_main_line())"], tmp_path) == "None"


def test_a_module_run_with_dash_m_is_a_script_too(tmp_path):
    (tmp_path / "job_module.py").write_text(PROBE + "print(unguarded_main_line())\n")
    assert run(["-m", "job_module"], tmp_path) == repr((str(tmp_path / "job_module.py"), 2))
