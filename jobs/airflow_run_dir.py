"""Where one Airflow run of ``sparkdl_pipeline`` works: ``<output_root>/<ds>/<run_id>``.

Two runs of one logical date (a manual trigger beside a scheduled run, a re-run after a
``clear`` with a new run id) get different directories; a task's retries keep the run id and
so the directory. The run id becomes one path component that Spark (Hadoop paths: no ``:``)
and every filesystem accept. Standard library only: the DAG imports it while Airflow parses.
"""

from __future__ import annotations

import re
from pathlib import PurePosixPath

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def safe_run_id(run_id: str) -> str:
    """``run_id`` as one path component: every run of characters other than letters, digits,
    ``.``, ``_`` and ``-`` becomes ``_`` (``manual__2026-11-20T00:00:00+00:00`` →
    ``manual__2026-11-20T00_00_00_00_00``)."""
    name = _UNSAFE.sub("_", run_id).strip(".")
    if not name:
        raise ValueError(f"run id {run_id!r} has no character a directory name can hold")
    return name


def run_dir(output_root: str, ds: str, run_id: str) -> str:
    """``<output_root>/<ds>/<safe run id>``."""
    return str(PurePosixPath(output_root) / ds / safe_run_id(run_id))
