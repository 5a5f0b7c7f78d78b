"""The environment of a ``spark-submit`` to the harness from the root namespace."""

from __future__ import annotations

import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def submit_env() -> dict[str, str]:
    """The environment of a ``spark-submit`` from the root namespace (docs/deployment.md):
    this repository on the path, this Python for the driver and the executors."""
    return {**os.environ, "PYTHONPATH": str(REPO), "PYSPARK_PYTHON": sys.executable,
            "PYSPARK_DRIVER_PYTHON": sys.executable}
