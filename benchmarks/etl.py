"""Benchmark: ETL of a synthetic 1,000,000-row CSV into DataSet shards, with bounded driver
memory; with ``--scale N``, the digits pipeline on N copies of its 1,797 rows instead.

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

``--scale N`` (``python jobs/benchmark.py etl --scale 100 --repeats 2``): the built-in digits
ETL (split, standardize fitted on the train rows, 8 shard files per split) on the digits rows
tiled N times, in one ``local[2]`` session, its rows handed to Spark two ways alternately:
as one Arrow table, a local relation in the JVM (what ``sparkdl.etl.samples`` does), and, as
the reference, as a list of Python rows (what it did before: a pickled Python RDD that Python
workers convert value by value). The same pipeline code runs after either; the table prints
each run's seconds and the load, and the medians (the first run of each pays the session's
warm-up: alternate at least three times).
"""

from __future__ import annotations

import os
import resource
import shutil
import statistics
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
        .config("spark.ui.showConsoleProgress", "false")
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


def _rows_df(spark: Any, x: Any, y: Any, num_partitions: int) -> Any:
    """The reference: the rows as a list of Python tuples (a pickled Python RDD)."""
    import numpy as np

    from sparkdl.etl.samples import SCHEMA

    rows = list(zip(x.astype(np.float32).tolist(), y.astype(np.int64).tolist(), strict=True))
    return spark.createDataFrame(rows, SCHEMA).repartition(num_partitions)


def run_scaled_samples(scale: int, repeats: int) -> dict[str, Any]:
    """The digits ETL on ``scale`` copies of its rows, Arrow table against list of rows."""
    import numpy as np

    from sparkdl.etl import samples
    from sparkdl.pipelines import digits

    x, y = samples.digits_arrays()
    x, y = np.tile(x, (scale, 1)), np.tile(y, scale)
    ways = {"arrow table (sparkdl)": samples._to_df, "list of rows (reference)": _rows_df}
    spark = _spark("2g")
    tmp = tempfile.mkdtemp(prefix="sparkdl-bench-etl-scaled-")
    original = digits.load_digits_df
    seconds: dict[str, list[float]] = {way: [] for way in ways}
    table = []
    try:
        for repeat in range(repeats):
            for way, to_df in ways.items():
                digits.load_digits_df = lambda spark, to_df=to_df: to_df(spark, x, y, 2)
                load = os.getloadavg()[0]
                started = time.perf_counter()
                result = digits.run(spark, f"file://{tmp}/data", overwrite=True)
                took = time.perf_counter() - started
                seconds[way].append(took)
                table.append([repeat + 1, way, result["train_rows"] + result["test_rows"],
                              f"{took:.1f}", f"{load:.2f}"])
    finally:
        digits.load_digits_df = original
        spark.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    print_table(f"digits ETL x{scale} ({len(x)} rows, local[2]), alternated",
                ["run", "rows to Spark as", "rows written", "seconds", "load (1 min)"], table)
    medians = {way: statistics.median(v) for way, v in seconds.items()}
    arrow, rows = medians.values()
    print(f"median: arrow table {arrow:.1f} s, list of rows {rows:.1f} s: "
          f"{rows / arrow:.2f}x; load {os.getloadavg()[0]:.2f} now")
    return {"scale": scale, "rows": len(x), "seconds": seconds,
            "arrow_over_rows": arrow / rows}


def run(options: dict[str, Any]) -> dict[str, Any]:
    """Run the 1M-row CSV ETL benchmark (or, with ``scale``, the scaled digits ETL); print a
    table and return the figures."""
    from sparkdl.pipelines import get_pipeline

    if options.get("scale"):
        return run_scaled_samples(int(options["scale"]), int(options.get("repeats") or 2))

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
