"""Benchmark: the shard reader against pyarrow, and how long LeNet training waits for data.

Method. MNIST-format IDX files are made from scikit-learn's digits upscaled to 28x28 (tiled
to ``rows`` records), run through the mnist pipeline (IDX → image scaling → shards with
``rows_per_group`` rows per row group), and the train shards are read three ways, alternating
(:func:`report.alternate_samples`). Each timing reads the whole data ``passes`` times (default
3), which evens out the jitter of a shared machine:

* ``shard_reader``: :class:`ShardReader` over one worker slice holding every row group, one
  reader for all passes (its epochs, as in training), no shuffle, batches of 256 (row groups
  decoded ahead on two threads, list column → numpy without per-element copy);
* ``iter_batches``: the evaluation reader, same files, same batch size;
* ``pyarrow``: ``pyarrow.parquet.read_table(files)`` then ``features`` flattened ``to_numpy``
  and reshaped, ``label`` ``to_numpy`` (the reference: one bulk read, no batching).

``reader_vs_pyarrow`` = pyarrow seconds / shard_reader seconds, the median over rounds of the
ratio of the two timings of one round (:func:`report.paired_ratio`: the load of a shared machine
changes between rounds, far less within one), 1.0 = as fast as pyarrow, target ≥ 0.9;
``iter_batches_vs_pyarrow`` likewise (target ≥ 0.8). The ratios of the medians are reported
beside them (``*_ratio_of_medians``). Then DL4J's LeNet is trained with ``SparkModel.fit``
(2 workers, gradient sharing, batch 32 per worker) on the same shards for one epoch;
``data_wait_fraction`` is the time workers waited for the next batch divided by the training
time (target ≤ 0.05).
"""

from __future__ import annotations

import os
import shutil
import statistics
import sys
import tempfile
from typing import Any

import numpy as np
import pyarrow.parquet as pq

from benchmarks.report import alternate_samples, paired_ratio, print_table


def _spark() -> Any:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    spark = (
        SparkSession.builder.master("local[2]").appName("sparkdl-bench-reader")
        .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "4")
        .config("spark.driver.memory", "2g").config("spark.log.level", "ERROR").getOrCreate()
    )
    return spark


def _make_idx(root: str, rows: int) -> None:
    from sparkdl.etl.readers.idx import write_idx
    from sparkdl.etl.samples import digits_28x28

    x, y = digits_28x28()
    reps = -(-rows // len(x))
    xs, ys = np.tile(x, (reps, 1, 1))[:rows], np.tile(y, reps)[:rows]
    test = max(64, rows // 10)
    write_idx(os.path.join(root, "train-images-idx3-ubyte"), xs[test:])
    write_idx(os.path.join(root, "train-labels-idx1-ubyte"), ys[test:])
    write_idx(os.path.join(root, "t10k-images-idx3-ubyte"), xs[:test])
    write_idx(os.path.join(root, "t10k-labels-idx1-ubyte"), ys[:test])


def run(options: dict[str, Any]) -> dict[str, Any]:
    """Run the reader benchmark; print a table and return the figures."""
    from sparkdl.data import ShardReader, WorkerSlice, iter_batches, read_metadata
    from sparkdl.pipelines import get_pipeline

    quick = bool(options.get("quick", False))
    rows = int(options.get("rows", 8_000 if quick else 24_000))
    repeats = int(options.get("repeats", 5 if quick else 15))
    passes = int(options.get("passes", 3))  # reads of the whole data per timing
    batch = 256
    tmp = tempfile.mkdtemp(prefix="sparkdl-bench-reader-")
    spark = _spark()
    try:
        _make_idx(tmp, rows)
        shards = get_pipeline("mnist")(spark, f"file://{tmp}/data", path=tmp, num_workers=2,
                                       rows_per_group=512)
        uri = shards["train"]
        meta = read_metadata(uri)
        files = [f"{tmp}/data/train/{f.path}" for f in meta.files]
        pieces = [(f.path, i) for f in meta.files for i in range(len(f.row_groups))]
        whole = WorkerSlice(worker=0, pieces=pieces, rows=meta.num_rows)
        steps = meta.num_rows // batch
        nbytes = passes * meta.num_rows * (meta.feature_size * 4 + 8)

        peak_row_groups = 0

        def shard_reader() -> int:
            nonlocal peak_row_groups
            rows = 0
            with ShardReader(uri, meta, whole, batch, steps, shuffle=False) as reader:
                for epoch in range(passes):  # one reader across epochs, as in training
                    rows += sum(len(x) for x, _ in reader.epoch(epoch))
            peak_row_groups = max(peak_row_groups, reader.stats.peak_buffered_row_groups)
            return rows

        def evaluation_reader() -> int:
            paths = [f.path for f in meta.files]
            return sum(len(x) for _ in range(passes)
                       for x, _ in iter_batches(uri, paths, batch, metadata=meta))

        def pyarrow_reference() -> int:
            rows = 0
            for _ in range(passes):
                table = pq.read_table(files, columns=["features", "label"])
                col = table.column("features").combine_chunks()
                x = col.values.to_numpy().reshape(len(col), meta.feature_size)
                y = table.column("label").to_numpy()
                rows += len(x) + 0 * len(y)
                del table, col, x, y
            return rows

        samples = alternate_samples({"shard_reader": shard_reader,
                                     "iter_batches": evaluation_reader,
                                     "pyarrow": pyarrow_reference}, repeats=repeats)
        times = {name: statistics.median(values) for name, values in samples.items()}
        figures: dict[str, Any] = {
            "rows": meta.num_rows, "files": len(meta.files), "row_groups": meta.num_row_groups,
            "feature_shape": meta.feature_shape, "batch_size": batch, "passes": passes,
            "shard_reader_s": times["shard_reader"], "iter_batches_s": times["iter_batches"],
            "pyarrow_s": times["pyarrow"],
            "shard_reader_mb_per_s": nbytes / times["shard_reader"] / 1e6,
            "pyarrow_mb_per_s": nbytes / times["pyarrow"] / 1e6,
            "reader_vs_pyarrow": paired_ratio(samples["pyarrow"], samples["shard_reader"]),
            "iter_batches_vs_pyarrow": paired_ratio(samples["pyarrow"], samples["iter_batches"]),
            "reader_vs_pyarrow_ratio_of_medians": times["pyarrow"] / times["shard_reader"],
            "iter_batches_vs_pyarrow_ratio_of_medians": times["pyarrow"] / times["iter_batches"],
            "shard_reader_peak_row_groups": peak_row_groups,
        }
        print_table(
            f"shard reader vs pyarrow.read_table+to_numpy ({meta.num_rows} rows x 784 float32, "
            f"{len(meta.files)} files, {meta.num_row_groups} row groups, read {passes}x per "
            f"timing; median of {repeats}; vs pyarrow: median of per-round ratios)",
            ["reader", "seconds", "MB/s", "vs pyarrow"],
            [["ShardReader (batches of 256)", times["shard_reader"],
              figures["shard_reader_mb_per_s"], figures["reader_vs_pyarrow"]],
             ["iter_batches (batches of 256)", times["iter_batches"],
              nbytes / times["iter_batches"] / 1e6, figures["iter_batches_vs_pyarrow"]],
             ["pyarrow read_table + to_numpy", times["pyarrow"], figures["pyarrow_mb_per_s"],
              1.0]],
        )
        figures.update(_lenet(spark, uri, quick))
        print(f"ShardReader held at most {peak_row_groups} of {meta.num_row_groups} row groups "
              f"at a time (read ahead or not yet handed out); pyarrow holds all of them")
        print_table(
            "LeNet training on the same shards (SparkModel.fit, 2 workers x batch 32, sharing)",
            ["epochs", "steps", "samples/s", "data_wait_fraction"],
            [[figures["lenet_epochs"], figures["lenet_steps"],
              figures["lenet_samples_per_second"], figures["data_wait_fraction"]]],
        )
        return figures
    finally:
        spark.stop()
        shutil.rmtree(tmp, ignore_errors=True)


def _lenet(spark: Any, uri: str, quick: bool) -> dict[str, Any]:
    import keras

    from sparkdl.models import lenet
    from sparkdl.spark_model import SparkModel
    from sparkdl.training.masters import SharedTrainingMaster

    keras.utils.set_random_seed(1)
    model = lenet((28, 28, 1), 10)
    model.compile(optimizer=keras.optimizers.Adam(1e-3), loss="sparse_categorical_crossentropy")
    tm = SharedTrainingMaster(batch_size_per_worker=32, num_workers=2)
    epochs = 1
    fit = SparkModel(spark, model, tm).fit(uri, epochs=epochs)
    m = fit.metrics
    return {
        "lenet_epochs": epochs, "lenet_steps": m.steps,
        "lenet_samples_per_second": m.samples_per_second,
        "data_wait_fraction": m.data_wait_fraction,
    }
