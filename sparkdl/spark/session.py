"""The Spark session as the launcher sees it, on classic Spark and on Spark Connect.

Only public APIs that Spark Connect also offers (``spark.conf``, DataFrames, tags); the one
classic-only figure (the live task-slot count, which follows executors joining and leaving)
is marked ``classic-only`` and comes from the classic session alone.
"""

from __future__ import annotations

import logging
import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger("sparkdl")

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
    """The executors' cores now: the classic session's ``defaultParallelism`` (which follows
    executors joining and leaving unless ``spark.default.parallelism`` is set); on Connect,
    what the master and settings say (``local[N]``, ``local-cluster[N,C,M]``,
    ``spark.executor.instances`` x ``spark.executor.cores``), ``None`` when they do not."""
    if not is_connect(spark):
        return int(spark.sparkContext.defaultParallelism)  # classic-only
    fixed = conf_get(spark, "spark.default.parallelism")
    if fixed:
        return int(fixed)
    name = master(spark)
    local = _LOCAL.match(name)
    if local:
        import os

        count = local.group(1)
        if count is None:
            return 1
        return (os.cpu_count() or 1) if count == "*" else int(count)
    cluster = _LOCAL_CLUSTER.match(name)
    if cluster:
        return int(cluster.group(1)) * int(cluster.group(2))
    instances = conf_get(spark, "spark.executor.instances")
    cores = conf_get(spark, "spark.executor.cores")
    if instances and cores:
        return int(instances) * int(cores)
    return None


def executor_count(spark: SparkSession) -> int | None:
    """How many executors there are, from the master and settings; ``None`` when unknown."""
    name = master(spark)
    if _LOCAL.match(name):
        return 1
    cluster = _LOCAL_CLUSTER.match(name)
    if cluster:
        return int(cluster.group(1))
    instances = conf_get(spark, "spark.executor.instances")
    if instances:
        return int(instances)
    cores, total = conf_get(spark, "spark.executor.cores"), total_cores(spark)
    if cores and total:
        return max(1, total // int(cores))
    return None
