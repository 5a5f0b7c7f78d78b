"""Concrete ETL pipelines, by name: each is ``run(spark, output_dir, **options) -> dict``."""

from __future__ import annotations

from collections.abc import Callable
from importlib import import_module
from typing import Any

from sparkdl.errors import ConfigurationError

PIPELINES: dict[str, str] = {
    "digits": "pipelines.digits:run",
    "digits_split": "pipelines.digits_split:run",
    "iris": "pipelines.iris:run",
    "mnist": "pipelines.mnist:run",
    "csv": "pipelines.csvfile:run",
    "images": "pipelines.images:run",
}


def get_pipeline(name: str) -> Callable[..., dict[str, Any]]:
    """The ``run`` function of the pipeline registered as ``name``."""
    target = PIPELINES.get(name)
    if target is None:
        raise ConfigurationError(
            f"unknown pipeline {name!r}; known pipelines: {', '.join(sorted(PIPELINES))}"
        )
    module, _, attr = target.partition(":")
    return getattr(import_module(module), attr)
