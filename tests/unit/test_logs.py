"""sparkdl.logs.quiet_tensorflow without ``load``, in fresh interpreters (this one may have
TensorFlow loaded already). Its import with ``load``: test_jobs.py's banner check."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PROBE = """
import json, os, sys
from sparkdl.logs import quiet_tensorflow
quiet_tensorflow(load={load})
print(json.dumps({{"level": os.environ.get("TF_CPP_MIN_LOG_LEVEL"),
                  "loaded": "tensorflow" in sys.modules}}))
"""


def _probe(load: bool, **env: str) -> dict:
    environment = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    environment.update(PYTHONPATH=str(REPO), **env)
    proc = subprocess.run([sys.executable, "-c", PROBE.format(load=load)], env=environment,
                          capture_output=True, text=True, timeout=120, check=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_without_load_it_only_quiets_the_processes_started_later():
    """What the ETL stage's driver does: it sets the log level as every stage does, and does
    not import TensorFlow."""
    found = _probe(load=False)
    assert found == {"level": "2", "loaded": False}


def test_a_users_own_log_level_is_kept():
    found = _probe(load=False, TF_CPP_MIN_LOG_LEVEL="0")
    assert found == {"level": "0", "loaded": False}

