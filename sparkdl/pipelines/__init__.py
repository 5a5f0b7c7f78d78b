"""Concrete ETL pipelines, by name: each is ``run(spark, output_dir, **options) -> dict``."""

from __future__ import annotations

from collections.abc import Callable
from importlib import import_module
from typing import Any

from sparkdl.errors import unknown_name

PIPELINES: dict[str, str] = {
    "digits": "sparkdl.pipelines.digits:run",
    "digits_split": "sparkdl.pipelines.digits_split:run",
    "iris": "sparkdl.pipelines.iris:run",
    "mnist": "sparkdl.pipelines.mnist:run",
    "csv": "sparkdl.pipelines.csvfile:run",
    "images": "sparkdl.pipelines.images:run",
}


def get_pipeline(name: str) -> Callable[..., dict[str, Any]]:
    """The ``run`` function of the pipeline registered as ``name``."""
    target = PIPELINES.get(name)
    if target is None:
        raise unknown_name("pipeline", name, PIPELINES)
    module, _, attr = target.partition(":")
    return getattr(import_module(module), attr)
