"""What a job's own Spark session prints while it starts: nothing of the JVM's chatter."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _startup import STARTUP_CHATTER

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.spark

_SCRIPT = """
import os
from sparkdl.session import get_spark
from sparkdl.session import default_parallelism
spark = get_spark()
print("rows", spark.range(5).count())
print("parallelism as the context says:",
      default_parallelism(spark) == spark.sparkContext.defaultParallelism)
jvm_args = spark.sparkContext._jvm.java.lang.management.ManagementFactory.getRuntimeMXBean()
arguments = list(jvm_args.getInputArguments())
print("C1 only:", "-XX:TieredStopAtLevel=1" in arguments)
pid = spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid()
with open(f"/proc/{pid}/maps") as maps:
    mapped = os.environ["SPARKDL_CACHE_DIR"] in maps.read()
print("class archive:", "mapped" if mapped else "written at exit"
      if any("ArchiveClassesAtExit" in argument for argument in arguments) else "none")
try:
    spark.range(2).selectExpr("raise_error('a bad record')").collect()
except Exception as exc:
    print("failed:", "a bad record" in str(exc))
spark.stop()
"""


def test_a_job_session_starts_and_fails_a_task_without_the_jvms_chatter(tmp_path):
    """Twice, in a new class-archive cache: the first driver JVM writes the archive as it
    exits (sparkdl.class_archive), the second maps it; neither prints the JVM's chatter."""
    cache = tmp_path / "cache"
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable,
           "PYTHONPATH": str(REPO), "SPARKDL_CACHE_DIR": str(cache)}
    env.pop("SPARK_CONF_DIR", None)
    for archive in ("written at exit", "mapped"):
        proc = subprocess.run([sys.executable, "-c", _SCRIPT], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        # a local master's driver JVM compiles with C1 only (sparkdl.session.local_driver_jit)
        assert proc.stdout.splitlines() == ["rows 5", "parallelism as the context says: True",
                                            "C1 only: True", f"class archive: {archive}",
                                            "failed: True"]
        chatter = [line for line in proc.stderr.splitlines() if STARTUP_CHATTER.search(line)]
        assert chatter == [], proc.stderr
        assert "cds" not in proc.stderr, proc.stderr
        # a failed task's JVM stack trace stays out (sparkdl/log4j2.properties)
        assert not [line for line in proc.stderr.splitlines()
                    if "Executor:" in line or "TaskSetManager:" in line], proc.stderr
        # the JVM writes the archive after the Python process is gone: wait for its header
        deadline = time.monotonic() + 240
        while not _archive_complete(cache) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert _archive_complete(cache), sorted(cache.iterdir())


def _archive_complete(cache: Path) -> bool:
    from sparkdl import class_archive

    return any(class_archive._complete(path) for path in cache.glob("*.jsa"))


def test_a_local_masters_driver_compiles_with_c1_unless_the_user_says_otherwise():
    from sparkdl.session import local_driver_jit

    assert local_driver_jit("local[2]", "-Xss4m") == "-Xss4m -XX:TieredStopAtLevel=1"
    assert local_driver_jit("local", "") == "-XX:TieredStopAtLevel=1"
    assert local_driver_jit("local[*]", None) == "-XX:TieredStopAtLevel=1"
    for mine in ("-XX:TieredStopAtLevel=4", "-XX:-TieredCompilation"):
        assert local_driver_jit("local[2]", mine) == mine
    for master in ("spark://host:7077", "local-cluster[2,1,1024]", "yarn", None):
        assert local_driver_jit(master, "-Xss4m") == "-Xss4m"


def test_a_log4j_setting_of_the_users_own_is_kept():
    from sparkdl.session import driver_java_options
    from sparkdl.storage import local_path

    mine = "-Dlog4j2.configurationFile=/etc/mine.properties -Xss4m"
    assert driver_java_options(mine) == mine
    ours = driver_java_options("-Xss4m")
    assert ours.startswith("-Xss4m -Dlog4j2.configurationFile=")
    assert local_path(ours.split("=", 1)[1]).is_file()
