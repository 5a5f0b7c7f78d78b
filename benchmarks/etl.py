"""Benchmark: ETL of a synthetic 1,000,000-row CSV into DataSet shards, with bounded driver
memory.

Method. Spark generates the CSV itself (``spark.range`` + seeded ``rand``/``randn``, 8 numeric
columns and a string label of 4 classes, a few NaN values, 4 files), so nothing passes through
the driver. Then the generic csv pipeline runs once, timed: the CSV reader (executors parse
against the declared schema, malformed records checked), a transform process
(categorical → index with the mapping learned on Spark, a math step, assemble), the NaN policy
(``drop``, with the dropped count), the standardize normalizer fitted on Spark, the seeded
split and the atomic shard writes. ``rows_per_second`` = CSV rows / ETL seconds.

Driver memory: the driver Python process's peak resident set (``ru_maxrss``) before and after
the ETL — it stays flat because no records are collected — and the JVM heap in use afterwards
(in ``local`` mode the driver JVM also runs the executor tasks, so its heap is bounded by
``spark.driver.memory``, set here to 1g).
"""

from __future__ import annotations

import os
import resource
import shutil
import sys
import tempfile
import time
from typing import Any

from benchmarks.report import print_table

FEATURES = [f"x{i}" for i in range(8)]


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _jvm_peak_rss_mb() -> float | None:
    """The peak resident memory of the driver JVM this process started (Linux ``/proc``;
    read from outside the JVM, so without Py4J: ``None`` where it cannot be found)."""
    from pathlib import Path

    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[1]) != os.getpid() or "(java)" not in stat.read_text():
                continue
            for line in (stat.parent / "status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024.0
        except (OSError, ValueError, IndexError):
            continue
    return None


def _spark(driver_memory: str) -> Any:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    spark = (
        SparkSession.builder.master("local[2]").appName("sparkdl-bench-etl")
        .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "8")
        .config("spark.driver.memory", driver_memory).config("spark.log.level", "ERROR")
        .getOrCreate()
    )
    return spark


def _generate(spark: Any, path: str, rows: int) -> None:
    from pyspark.sql import functions as F

    cols = [F.round(F.randn(seed=i) * (i + 1) + i, 4).alias(c) for i, c in enumerate(FEATURES)]
    nan = F.when(F.rand(seed=99) < 1e-4, F.lit(float("nan"))).otherwise(F.col("x0"))
    label = F.element_at(F.array(*[F.lit(s) for s in ("ant", "bee", "cat", "dog")]),
                         (F.col("id") % 4 + 1).cast("int"))
    df = spark.range(rows, numPartitions=4).select(*cols, label.alias("label"))
    df.withColumn("x0", nan).write.option("header", True).csv(path)


def run(options: dict[str, Any]) -> dict[str, Any]:
    """Run the 1M-row CSV ETL benchmark; print a table and return the figures."""
    from sparkdl.pipelines import get_pipeline

    quick = bool(options.get("quick", False))
    rows = int(options.get("rows", 200_000 if quick else 1_000_000))
    driver_memory = str(options.get("driver_memory", "1g"))
    tmp = tempfile.mkdtemp(prefix="sparkdl-bench-etl-")
    spark = _spark(driver_memory)
    try:
        csv_path = f"file://{tmp}/csv"
        started = time.perf_counter()
        _generate(spark, csv_path, rows)
        generate_s = time.perf_counter() - started
        csv_bytes = sum(os.path.getsize(os.path.join(tmp, "csv", f))
                        for f in os.listdir(os.path.join(tmp, "csv")))
        rss_before = _rss_mb()
        started = time.perf_counter()
        result = get_pipeline("csv")(
            spark, f"file://{tmp}/data", path=csv_path, header=True,
            columns={**{c: "double" for c in FEATURES}, "label": "string"},
            transform=[{"op": "categorical_to_integer", "column": "label"},
                       {"op": "math", "columns": ["x7"], "fn": "clip", "min": -50.0,
                        "max": 50.0},
                       {"op": "assemble", "features": FEATURES, "label": "label"}],
            nan_policy="drop", normalizer="standardize", num_workers=4,
            rows_per_group=4096, test_fraction=0.1,
        )
        etl_s = time.perf_counter() - started
        rss_after = _rss_mb()
        jvm_peak = _jvm_peak_rss_mb()
        written = result["train_rows"] + result["test_rows"]
        dropped = result["train_dropped_non_finite"] + result["test_dropped_non_finite"]
        figures = {
            "csv_rows": rows, "csv_mb": csv_bytes / 1e6, "generate_seconds": generate_s,
            "etl_seconds": etl_s, "rows_per_second": rows / etl_s,
            "csv_mb_per_second": csv_bytes / 1e6 / etl_s,
            "rows_written": written, "rows_dropped_non_finite": dropped,
            "classes": result["classes"],
            "driver_python_peak_rss_mb_before": rss_before,
            "driver_python_peak_rss_mb_after": rss_after,
            "driver_python_rss_growth_mb": rss_after - rss_before,
            "driver_jvm_peak_rss_mb": jvm_peak,
            "spark_driver_memory": driver_memory,
        }
        print_table(
            f"CSV ETL -> shards ({rows} rows, {csv_bytes / 1e6:.0f} MB CSV, local[2], "
            f"spark.driver.memory={driver_memory})",
            ["rows", "seconds", "rows/s", "MB/s", "written", "dropped NaN",
             "py peak RSS MB (before/after)", "JVM peak RSS MB"],
            [[rows, etl_s, rows / etl_s, csv_bytes / 1e6 / etl_s, written, dropped,
              f"{rss_before:.0f}/{rss_after:.0f}", "?" if jvm_peak is None else f"{jvm_peak:.0f}"]],
        )
        return figures
    finally:
        spark.stop()
        shutil.rmtree(tmp, ignore_errors=True)
