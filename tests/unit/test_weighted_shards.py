"""Shards with a sample-weight column: every reader keeps each row's weight beside it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sparkdl.data.metadata import FORMAT_VERSION, ShardFile, ShardMetadata, write_metadata
from sparkdl.data.reader import ShardReader, iter_batches, plan_slices, read_all
from sparkdl.errors import DataError

GROUPS = [[12, 12, 5], [12, 9]]


def _shards(root: Path, bad_weight: float | None = None) -> tuple[str, ShardMetadata]:
    root.mkdir()
    files, start = [], 0
    for k, groups in enumerate(GROUPS):
        name = f"part-{k:05d}.parquet"
        writer = None
        for n in groups:
            ids = np.arange(start, start + n)
            weights = (ids * 0.5).astype(np.float32)
            if bad_weight is not None and start == 0:
                weights[3] = bad_weight
            table = pa.table({"features": pa.array([[float(i), 1.0] for i in ids]),
                              "label": pa.array(ids % 2), "sample_weight": pa.array(weights)})
            writer = writer or pq.ParquetWriter(root / name, table.schema)
            writer.write_table(table, row_group_size=n)
            start += n
        assert writer is not None
        writer.close()
        files.append(ShardFile(name, sum(groups), list(groups)))
    meta = ShardMetadata(format_version=FORMAT_VERSION, feature_shape=[2],
                         feature_dtype="float32", label_kind="class", classes=["a", "b"],
                         label_shape=[], num_rows=start, files=files,
                         weight_column="sample_weight")
    write_metadata(str(root), meta)
    return str(root), meta


def _check_aligned(x: np.ndarray, y: np.ndarray, w: np.ndarray) -> None:
    ids = x[:, 0].astype(int)
    assert (y == ids % 2).all() and np.array_equal(w, (ids * 0.5).astype(np.float32))


def test_weights_stay_with_their_rows_in_every_reader(tmp_path):
    uri, meta = _shards(tmp_path / "s")
    x, y, w = read_all(uri)
    _check_aligned(x, y, w)
    assert len(w) == meta.num_rows
    for batch in iter_batches(uri, [f.path for f in meta.files], 7, metadata=meta):
        _check_aligned(*batch)
    slices, steps = plan_slices(meta, 2, 4)
    for shuffle in (True, False):
        with ShardReader(uri, meta, slices[0], 4, steps, shuffle=shuffle, seed=3) as reader:
            batches = list(reader.epoch(1))
        assert len(batches) == steps
        for batch in batches:
            assert len(batch) == 3
            _check_aligned(*batch)


@pytest.mark.parametrize("bad", [-1.0, float("nan")])
def test_a_negative_or_nan_weight_is_named_with_its_file_and_row(tmp_path, bad):
    uri, _ = _shards(tmp_path / "s", bad_weight=bad)
    with pytest.raises(DataError, match=r"part-00000.parquet: column 'sample_weight' row 3 "
                       r"holds .*finite and >= 0"):
        read_all(uri)


def test_metadata_naming_a_missing_weight_column_is_refused_naming_the_file(tmp_path):
    uri, meta = _shards(tmp_path / "s")
    meta.weight_column = "w"
    write_metadata(uri, meta)
    with pytest.raises(DataError, match=r"part-00000.parquet: missing sample-weight column 'w'"):
        read_all(uri)
