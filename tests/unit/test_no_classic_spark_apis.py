"""sparkdl talks to Spark through public DataFrame APIs only, which Spark Connect offers too:
no SparkContext, RDDs, Py4J handles (``_jsc``, ``_jdf``, ``_jvm``), broadcasts or job groups."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CLASSIC_ONLY = re.compile(
    r"sparkContext|SparkContext|\._jsc\b|\._jdf\b|\._jvm\b|\.rdd\b|\.parallelize\(|"
    r"\bsc\.broadcast\(|setJobGroup|setLocalProperty"
)
#: the benchmark harnesses drive their own classic standalone cluster: a line there may use
#: a classic-only API when it says so (``# classic-only``)
HARNESS = "benchmarks/"
# get_spark starting a classic session: under spark-submit (its JVM is already running), or
# launching the driver JVM with its stderr named (sparkdl.session.get_spark's jvm_stderr)
ALLOWED = {"from pyspark import SparkConf, SparkContext", "SparkContext._ensure_initialized()",
           "launches_jvm = SparkContext._gateway is None and not _connect(cluster)",
           "SparkContext._ensure_initialized(gateway=gateway)"}


def test_the_library_uses_no_classic_only_spark_api():
    found = []
    for path in sorted((ROOT / "sparkdl").rglob("*.py")):
        name = path.relative_to(ROOT).as_posix()
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if name.startswith(HARNESS) and line.rstrip().endswith("# classic-only"):
                continue
            if CLASSIC_ONLY.search(line.split("#", 1)[0]) and line.strip() not in ALLOWED:
                found.append(f"{name}:{number}: {line.strip()}")
    assert not found, "\n".join(found)
