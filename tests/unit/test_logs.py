"""sparkdl.logs.quiet_tensorflow without ``load``, tensorflow_imported_meanwhile, and which
``sparkdl validate`` stages import TensorFlow, in fresh interpreters (this one may have
TensorFlow loaded already). quiet_tensorflow's import with
``load``: test_jobs.py's banner check."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PROBE = """
import json, os, sys
from sparkdl.logs import quiet_tensorflow
quiet_tensorflow(load=False)
print(json.dumps({"level": os.environ.get("TF_CPP_MIN_LOG_LEVEL"),
                  "loaded": "tensorflow" in sys.modules}))
"""


def _probe(**env: str) -> dict:
    environment = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    environment.update(PYTHONPATH=str(REPO), **env)
    proc = subprocess.run([sys.executable, "-c", PROBE], env=environment,
                          capture_output=True, text=True, timeout=120, check=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_without_load_it_only_quiets_the_processes_started_later():
    """What the ETL stage's driver does: it sets the log level as every stage does, and does
    not import TensorFlow."""
    found = _probe()
    assert found == {"level": "2", "loaded": False}


def test_a_users_own_log_level_is_kept():
    found = _probe(TF_CPP_MIN_LOG_LEVEL="0")
    assert found == {"level": "0", "loaded": False}



MEANWHILE = """
import subprocess, sys, threading
from sparkdl.logs import tensorflow_imported_meanwhile
with tensorflow_imported_meanwhile() as real_stderr:
    helper = [t.name for t in threading.enumerate() if t.name == "sparkdl-import-tensorflow"]
    # what a driver JVM started here does: write to the descriptor it was handed
    subprocess.run([sys.executable, "-c", "import sys; print('child line', file=sys.stderr)"],
                   stderr=real_stderr, check=True, timeout=60)
print(helper, "tensorflow" in sys.modules)
"""


def test_tensorflow_imports_on_a_helper_thread_while_a_child_writes_to_the_real_stderr():
    environment = {**os.environ, "PYTHONPATH": str(REPO), "TF_CPP_MIN_LOG_LEVEL": "0"}
    proc = subprocess.run([sys.executable, "-c", MEANWHILE], env=environment,
                          capture_output=True, text=True, timeout=180, check=True)
    assert proc.stdout.split() == ["['sparkdl-import-tensorflow']", "True"]
    assert "child line" in proc.stderr  # not lost in the banner filter's capture
    # at level 0 TensorFlow prints its banner: the helper's filter dropped it
    assert "oneDNN" not in proc.stderr and "absl::InitializeLog" not in proc.stderr, proc.stderr


def test_a_failed_import_is_raised_at_the_end_of_the_block(tmp_path):
    broken = tmp_path / "tensorflow"
    broken.mkdir()
    (broken / "__init__.py").write_text("raise ImportError('libtensorflow_cc.so.2: not found')\n")
    probe = ("from sparkdl.logs import tensorflow_imported_meanwhile\n"
             "with tensorflow_imported_meanwhile():\n"
             "    print('block ran')\n")
    environment = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{REPO}"}
    proc = subprocess.run([sys.executable, "-c", probe], env=environment,
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 1
    assert proc.stdout == "block ran\n"
    assert "ImportError: libtensorflow_cc.so.2: not found" in proc.stderr


@pytest.mark.parametrize(("stage", "loads"), [("evaluate", False), ("predict", False),
                                               ("train", True)])
def test_validate_imports_tensorflow_only_to_check_a_model(stage, loads):
    environment = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "sparkdl.cli", "validate", "--stage", stage,
         "--conf", str(REPO / "conf" / "digits.yaml")],
        env=environment, cwd=REPO, capture_output=True, text=True, timeout=180, check=True)
    imported = [ln.rsplit("|", 1)[-1].strip() for ln in proc.stderr.splitlines()
                if ln.startswith("import time:")]
    assert ("tensorflow" in imported) is loads
