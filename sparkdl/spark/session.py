"""The Spark session as the launcher sees it, on classic Spark and on Spark Connect.

Only public APIs that Spark Connect also offers (``spark.conf``, DataFrames, tags): even the
live core count comes from the plan of ``spark.range``, not from a Spark context.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger("sparkdl")

_SPLITS = re.compile(r"splits=(?:Some\()?(\d+)")
_LOCAL = re.compile(r"^local(?:\[(\*|\d+)(?:,\s*\d+)?\])?$")
_LOCAL_CLUSTER = re.compile(r"^local-cluster\[\s*(\d+)\s*,\s*(\d+)\s*,\s*\d+\s*\]$")


def active_session() -> SparkSession | None:
    """The session of this thread or process (classic or Connect), if there is one."""
    from pyspark.sql import SparkSession

    return SparkSession.getActiveSession()


def is_connect(spark: SparkSession) -> bool:
    """Whether ``spark`` is a Spark Connect client session."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


def conf_get(spark: SparkSession, key: str, default: str | None = None) -> str | None:
    """A Spark setting, ``default`` when unset (the same call on classic and Connect)."""
    value = spark.conf.get(key, default)
    return default if value is None else str(value)


def master(spark: SparkSession) -> str:
    """``spark.master`` (``""`` when the session does not say)."""
    return conf_get(spark, "spark.master", "") or ""


def is_local(spark: SparkSession) -> bool:
    """Whether the executors run on the driver's machine (local and local-cluster)."""
    return master(spark).startswith("local")


def task_cpus(spark: SparkSession) -> int:
    """``spark.task.cpus`` (default 1)."""
    return int(conf_get(spark, "spark.task.cpus", "1") or "1")


def total_cores(spark: SparkSession) -> int | None:
    """The executors' cores now: the partitions a ``range`` gets (Spark's default
    parallelism, which follows executors joining and leaving unless
    ``spark.default.parallelism`` is set), read from its plan on classic and Connect alike;
    else what the master and settings say (:func:`cores_from_settings`)."""
    configured = conf_get(spark, "spark.default.parallelism")
    if configured:
        return max(1, int(configured))
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        spark.range(1).explain()
    found = _SPLITS.search(out.getvalue())
    if found:
        return max(1, int(found.group(1)))
    return cores_from_settings(master(spark), _settings(spark))


def default_parallelism(spark: SparkSession) -> int:
    """Spark's default parallelism (:func:`total_cores`); 2 with one logged line if neither
    the plan nor the settings say."""
    cores = total_cores(spark)
    if cores is None:
        log.info("the default parallelism is unknown (no splits in the plan of spark.range): "
                 "assuming 2")
        return 2
    return cores


def executor_count(spark: SparkSession) -> int | None:
    """How many executors there are, from the master and settings; ``None`` when unknown."""
    return executors_from_settings(master(spark), _settings(spark), total_cores(spark))


_KEYS = ("spark.default.parallelism", "spark.executor.instances", "spark.executor.cores")


def _settings(spark: SparkSession) -> dict[str, str]:
    return {key: value for key in _KEYS if (value := conf_get(spark, key))}


def cores_from_settings(master: str, settings: Mapping[str, str]) -> int | None:
    """Executor cores as the master and settings state them: ``spark.default.parallelism``,
    ``local[N]`` / ``local[*]``, ``local-cluster[N,C,M]``, ``spark.executor.instances`` x
    ``spark.executor.cores``; ``None`` when they do not."""
    if settings.get("spark.default.parallelism"):
        return int(settings["spark.default.parallelism"])
    local = _LOCAL.match(master)
    if local:
        count = local.group(1)
        if count is None:
            return 1
        return (os.cpu_count() or 1) if count == "*" else int(count)
    cluster = _LOCAL_CLUSTER.match(master)
    if cluster:
        return int(cluster.group(1)) * int(cluster.group(2))
    instances, cores = settings.get("spark.executor.instances"), settings.get(
        "spark.executor.cores")
    if instances and cores:
        return int(instances) * int(cores)
    return None


def executors_from_settings(master: str, settings: Mapping[str, str],
                            cores: int | None) -> int | None:
    """How many executors the master and settings state (``cores``: the executors' cores
    in all, divided by ``spark.executor.cores`` as the last resort)."""
    if _LOCAL.match(master):
        return 1
    cluster = _LOCAL_CLUSTER.match(master)
    if cluster:
        return int(cluster.group(1))
    if settings.get("spark.executor.instances"):
        return int(settings["spark.executor.instances"])
    per_executor = settings.get("spark.executor.cores")
    if per_executor and cores:
        return max(1, cores // int(per_executor))
    return None
