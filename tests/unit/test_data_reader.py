"""plan_slices, ShardReader, read_all and iter_batches on shard dirs built with pyarrow."""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sparkdl.data.metadata import FORMAT_VERSION, ShardFile, ShardMetadata, write_metadata
from sparkdl.data.reader import ShardReader, iter_batches, plan_slices, read_all
from sparkdl.errors import DataError

SHAPE = [2, 3]
SIZE = 6


def _table(ids: np.ndarray, label_kind: str = "class") -> pa.Table:
    # Feature element 0 is the global row id, so tests can tell rows apart.
    x = (ids[:, None] + np.arange(SIZE) / 10.0).astype(np.float32)
    features = pa.ListArray.from_arrays(
        pa.array(np.arange(len(ids) + 1) * SIZE, pa.int32()), pa.array(x.reshape(-1))
    )
    if label_kind == "class":
        label = pa.array(ids % 3, pa.int64())
    else:
        label = pa.ListArray.from_arrays(
            pa.array(np.arange(len(ids) + 1), pa.int32()),
            pa.array(ids.astype(np.float32) * 2),
        )
    return pa.table({"features": features, "label": label})


def make_shards(
    root: Path, files: Sequence[Sequence[int]], label_kind: str = "class"
) -> tuple[str, ShardMetadata]:
    """A shard dir with one file per entry of ``files`` (its row-group sizes)."""
    root.mkdir(parents=True, exist_ok=True)
    entries, next_id = [], 0
    for k, groups in enumerate(files):
        name = f"part-{k:05d}.parquet"
        with pq.ParquetWriter(root / name, _table(np.arange(1), label_kind).schema) as w:
            for n in groups:
                w.write_table(_table(np.arange(next_id, next_id + n), label_kind),
                              row_group_size=n)
                next_id += n
        entries.append(ShardFile(name, sum(groups), list(groups)))
    meta = ShardMetadata(
        format_version=FORMAT_VERSION, feature_shape=SHAPE, feature_dtype="float32",
        label_kind=label_kind, classes=["a", "b", "c"] if label_kind == "class" else [],
        label_shape=[] if label_kind == "class" else [1], num_rows=next_id, files=entries,
    )
    write_metadata(str(root), meta)
    return str(root), meta


def _ids(x: np.ndarray) -> list[int]:
    return x.reshape(len(x), -1)[:, 0].astype(int).tolist()


# ---------------------------------------------------------------------------------- plan_slices


def test_plan_slices_disjoint_balanced() -> None:
    groups = [[50, 50, 17], [64, 64, 3], [40], [64, 64, 64, 10]]
    _, meta = make_shards_meta_only(groups)
    slices, steps = plan_slices(meta, 3, 16)
    pieces = [p for s in slices for p in s.pieces]
    assert len(pieces) == len(set(pieces)) == meta.num_row_groups
    rows = [s.rows for s in slices]
    assert sum(rows) == meta.num_rows
    assert max(rows) - min(rows) <= 64
    assert steps == min(rows) // 16
    assert [s.worker for s in slices] == [0, 1, 2]
    assert plan_slices(meta, 3, 16) == (slices, steps)  # deterministic


def make_shards_meta_only(files: Sequence[Sequence[int]]) -> tuple[None, ShardMetadata]:
    entries = [ShardFile(f"p{k}", sum(g), list(g)) for k, g in enumerate(files)]
    return None, ShardMetadata(
        format_version=FORMAT_VERSION, feature_shape=SHAPE, feature_dtype="float32",
        label_kind="class", classes=["a"], label_shape=[],
        num_rows=sum(e.rows for e in entries), files=entries,
    )


def test_plan_slices_too_few_rows() -> None:
    _, meta = make_shards_meta_only([[10], [10], [10]])
    with pytest.raises(DataError, match=r"30 rows over 3 workers .* 10 rows, fewer than "
                                        r"batch_size 16"):
        plan_slices(meta, 3, 16)


def test_plan_slices_fewer_groups_than_workers() -> None:
    _, meta = make_shards_meta_only([[500], [500]])
    with pytest.raises(DataError, match="2 non-empty row groups, fewer than the 4 workers"):
        plan_slices(meta, 4, 8)


# ---------------------------------------------------------------------------------- ShardReader


@pytest.fixture
def shards(tmp_path: Path) -> tuple[str, ShardMetadata]:
    return make_shards(tmp_path / "train", [[32, 32, 20], [32, 32, 32], [25], [32, 32, 7]])


def _epoch(uri: str, meta: ShardMetadata, workers: int, bs: int, epoch: int, **kw: object):
    slices, steps = plan_slices(meta, workers, bs)
    out = []
    for s in slices:
        with ShardReader(uri, meta, s, bs, steps, **kw) as r:  # type: ignore[arg-type]
            out.append(list(r.epoch(epoch)))
    return out, steps


def test_reader_exact_steps_disjoint(shards: tuple[str, ShardMetadata]) -> None:
    uri, meta = shards
    batches, steps = _epoch(uri, meta, 3, 10, epoch=0)
    seen: list[int] = []
    for worker in batches:
        assert len(worker) == steps
        for x, y in worker:
            assert x.shape == (10, *SHAPE) and x.dtype == np.float32
            assert y.shape == (10,) and y.dtype == np.int64
            ids = _ids(x)
            assert (y == np.array(ids) % 3).all()  # features and labels stay paired
            np.testing.assert_allclose(x.reshape(10, -1)[0], ids[0] + np.arange(SIZE) / 10,
                                       rtol=1e-6)
            seen += ids
    assert len(seen) == len(set(seen)) == 3 * steps * 10


def test_reader_deterministic_and_epochs_differ(shards: tuple[str, ShardMetadata]) -> None:
    uri, meta = shards
    a, _ = _epoch(uri, meta, 2, 8, epoch=0, seed=7)
    b, _ = _epoch(uri, meta, 2, 8, epoch=0, seed=7)
    c, _ = _epoch(uri, meta, 2, 8, epoch=1, seed=7)
    flat = [[_ids(x) for x, _ in w] for w in a]
    assert flat == [[_ids(x) for x, _ in w] for w in b]
    assert flat != [[_ids(x) for x, _ in w] for w in c]
    assert flat[0] != flat[1]


def test_reader_no_shuffle_is_file_order(shards: tuple[str, ShardMetadata]) -> None:
    uri, meta = shards
    (worker,), steps = _epoch(uri, meta, 1, 16, epoch=3, shuffle=False)
    assert [i for x, _ in worker for i in _ids(x)] == list(range(steps * 16))


def test_reader_memory_bounded(tmp_path: Path) -> None:
    uri, meta = make_shards(tmp_path / "big", [[8] * 10 for _ in range(4)])
    slices, steps = plan_slices(meta, 1, 4)
    with ShardReader(uri, meta, slices[0], 4, steps, prefetch=2, shuffle_window=2) as r:
        n = sum(1 for _ in r.epoch(0))
        assert n == steps == 80
        assert r.stats.row_groups_read == 40
        assert r.stats.peak_buffered_row_groups <= 2 + 2 + 1
        assert r.stats.buffered_row_groups == 0


def test_reader_early_stop_ends_threads(shards: tuple[str, ShardMetadata]) -> None:
    uri, meta = shards
    slices, steps = plan_slices(meta, 1, 4)
    before = threading.active_count()
    reader = ShardReader(uri, meta, slices[0], 4, steps, prefetch=2)
    next(reader.epoch(0))
    assert threading.active_count() > before  # decoding threads are running
    next(reader.epoch(1))  # a new epoch stops the unfinished one
    assert reader.stats.buffered_row_groups <= 2
    reader.close()
    assert reader.stats.buffered_row_groups == 0
    assert threading.active_count() == before
    # The reader can start a new epoch after an early stop.
    with reader:
        assert len(list(reader.epoch(1))) == steps
    assert threading.active_count() == before


def test_reader_read_timeout_names_row_group(tmp_path: Path) -> None:
    uri, meta = make_shards(tmp_path / "t", [[8], [8]])
    fifo = Path(uri) / "part-00001.parquet"
    fifo.unlink()
    os.mkfifo(fifo)  # opening it blocks until somebody writes: a hung filesystem
    slices, steps = plan_slices(meta, 1, 4)
    reader = ShardReader(uri, meta, slices[0], 4, steps, shuffle=False, read_timeout=1)
    try:
        with pytest.raises(DataError, match=r"row group 0 of .*part-00001\.parquet was not "
                                            r"read within 1 s"):
            list(reader.epoch(0))
    finally:
        with open(fifo, "wb"):  # unblock the reading thread
            pass
        reader.close()


def test_reader_regression(tmp_path: Path) -> None:
    uri, meta = make_shards(tmp_path / "reg", [[16, 16], [16]], label_kind="regression")
    slices, steps = plan_slices(meta, 1, 8)
    with ShardReader(uri, meta, slices[0], 8, steps) as r:
        for x, y in r.epoch(0):
            assert y.dtype == np.float32 and y.shape == (8, 1)
            np.testing.assert_array_equal(y[:, 0], np.array(_ids(x)) * 2)


def test_corrupt_parquet_names_file(shards: tuple[str, ShardMetadata]) -> None:
    uri, meta = shards
    (Path(uri) / "part-00001.parquet").write_bytes(b"PAR1 this is not parquet")
    slices, steps = plan_slices(meta, 1, 8)
    with (
        ShardReader(uri, meta, slices[0], 8, steps) as r,
        pytest.raises(DataError, match=r"part-00001\.parquet is not a readable Parquet file"),
    ):
        list(r.epoch(0))


def test_missing_column_names_file(tmp_path: Path) -> None:
    uri, meta = make_shards(tmp_path / "t", [[8], [8]])
    pq.write_table(_table(np.arange(8)).drop_columns(["label"]), Path(uri) / "part-00001.parquet")
    with pytest.raises(DataError, match=r"part-00001\.parquet: missing column 'label'"):
        read_all(uri, meta)


def test_wrong_feature_length_names_row(tmp_path: Path) -> None:
    uri, meta = make_shards(tmp_path / "t", [[4]])
    bad = pa.ListArray.from_arrays(pa.array([0, 6, 12, 17, 23], pa.int32()),
                                   pa.array(np.zeros(23, np.float32)))
    pq.write_table(pa.table({"features": bad, "label": pa.array([0, 1, 2, 0], pa.int64())}),
                   Path(uri) / "part-00000.parquet")
    with pytest.raises(DataError, match=r"part-00000\.parquet: column 'features' row 2 has 5 "
                                        r"values, expected 6"):
        read_all(uri, meta)


def test_row_groups_differ_from_metadata(tmp_path: Path) -> None:
    uri, meta = make_shards(tmp_path / "t", [[4, 4]])
    pq.write_table(_table(np.arange(8)), Path(uri) / "part-00000.parquet")
    with pytest.raises(DataError, match=r"row groups \[8\] differ from the metadata \[4, 4\]"):
        read_all(uri, meta)


# ------------------------------------------------------------------------ read_all, iter_batches


def test_read_all_and_iter_batches(shards: tuple[str, ShardMetadata]) -> None:
    uri, meta = shards
    x, y = read_all(uri)
    assert x.shape == (meta.num_rows, *SHAPE) and y.shape == (meta.num_rows,)
    assert _ids(x) == list(range(meta.num_rows))
    files = [f.path for f in meta.files[1:3]]
    batches = list(iter_batches(uri, files, 25))
    rows = meta.files[1].rows + meta.files[2].rows  # 96 + 25
    assert [len(b[0]) for b in batches] == [25] * (rows // 25) + [rows % 25]
    start = meta.files[0].rows
    assert [i for b in batches for i in _ids(b[0])] == list(range(start, start + rows))


def test_iter_batches_unlisted_file_and_early_stop(shards: tuple[str, ShardMetadata]) -> None:
    uri, meta = shards
    with pytest.raises(DataError, match=r"nope\.parquet is not listed in the shard metadata"):
        next(iter_batches(uri, ["nope.parquet"], 4, metadata=meta))
    before = threading.active_count()
    batches = iter_batches(uri, [f.path for f in meta.files], 4, metadata=meta, prefetch=2)
    assert len(next(batches)[0]) == 4
    assert threading.active_count() > before  # decoding ahead
    batches.close()
    assert threading.active_count() == before


def test_to_tf_dataset(shards: tuple[str, ShardMetadata]) -> None:
    tf = pytest.importorskip("tensorflow")
    from sparkdl.data.reader import to_tf_dataset

    uri, meta = shards
    slices, steps = plan_slices(meta, 2, 8)
    with ShardReader(uri, meta, slices[1], 8, steps) as r:
        ds = to_tf_dataset(r, 0)
        assert int(ds.cardinality()) == steps
        items = list(ds)
    assert len(items) == steps
    assert items[0][0].shape == (8, *SHAPE) and items[0][1].dtype == tf.int64


def test_max_open_files(tmp_path: Path) -> None:
    uri, meta = make_shards(tmp_path / "many", [[4, 4]] * 6)
    slices, steps = plan_slices(meta, 1, 4)
    with ShardReader(uri, meta, slices[0], 4, steps, max_open_files=2) as r:
        assert len(list(r.epoch(0))) == steps == 12
        handles = r._fetcher._handles
        assert handles and all(len(per_thread) <= 2 for per_thread in handles)


def test_worker_modules_do_not_import_spark_or_tensorflow() -> None:
    import subprocess
    import sys

    code = (
        "import sys, sparkdl.data, sparkdl.data.metadata, sparkdl.data.reader\n"
        "bad = [m for m in sys.modules if m.split('.')[0] in ('pyspark', 'tensorflow', 'py4j')]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
