"""shuffle="global": a new seeded assignment of row groups to workers every epoch, with equal
rows (so equal steps) per worker, the same assignment again on a resume; rows dropped said."""

from __future__ import annotations

import pytest
from test_data_reader import _ids, make_shards

from sparkdl.data.reader import (
    ShardReader,
    global_shuffle,
    plan_slices,
    rows_dropped_per_epoch,
    shuffle_mode,
)
from sparkdl.errors import ConfigurationError
from sparkdl.training.driver.progress import ProgressLogger

GROUPS = [[10] * 6 + [7], [10] * 5 + [3], [10] * 7]  # 20 row groups, 200 rows
WORKERS, BATCH, SEED = 3, 8, 4


def test_every_epoch_plan_reassigns_row_groups_with_the_same_rows_per_worker(tmp_path):
    _, meta = make_shards(tmp_path / "s", GROUPS)
    base, steps = plan_slices(meta, WORKERS, BATCH)
    plans = [plan_slices(meta, WORKERS, BATCH, seed=SEED, epoch=e) for e in range(4)]
    for slices, epoch_steps in plans:
        assert epoch_steps == steps
        assert [s.rows for s in slices] == [s.rows for s in base]
        pieces = [p for s in slices for p in s.pieces]
        assert sorted(pieces) == sorted(p for s in base for p in s.pieces)  # disjoint, all
    assignments = {tuple(tuple(s.pieces) for s in slices) for slices, _ in plans}
    assert len(assignments) == 4  # a new assignment every epoch
    assert plan_slices(meta, WORKERS, BATCH, seed=SEED, epoch=2) == plans[2]  # reproducible
    assert plan_slices(meta, WORKERS, BATCH, seed=SEED + 1, epoch=2) != plans[2]


def test_global_shuffle_readers_read_disjoint_rows_and_a_resumed_reader_the_same(tmp_path):
    uri, meta = make_shards(tmp_path / "s", GROUPS)
    slices, steps = plan_slices(meta, WORKERS, BATCH)

    def reader(worker: int) -> ShardReader:
        return ShardReader(uri, meta, slices[worker], BATCH, steps, seed=SEED,
                           epoch_slices=global_shuffle(meta, WORKERS, BATCH, worker, SEED))

    readers = [reader(w) for w in range(WORKERS)]
    try:
        seen: list[list[int]] = []
        for epoch in range(3):
            rows = [[i for x, _ in r.epoch(epoch) for i in _ids(x)] for r in readers]
            flat = [i for worker in rows for i in worker]
            assert len(flat) == len(set(flat)) == WORKERS * steps * BATCH
            assert meta.num_rows - len(flat) == rows_dropped_per_epoch(meta, WORKERS, BATCH,
                                                                       steps)
            seen.append(sorted(rows[0]))
        assert seen[0] != seen[1] != seen[2]  # worker 0 reads other row groups every epoch
        with reader(0) as resumed:  # a resumed worker: the same batches of epoch 1
            again = [i for x, _ in resumed.epoch(1) for i in _ids(x)]
        first = [i for x, _ in readers[0].epoch(1) for i in _ids(x)]
        assert again == first
    finally:
        for r in readers:
            r.close()


def test_shuffle_takes_kerass_booleans_or_a_mode_and_names_a_wrong_one():
    assert [shuffle_mode(v) for v in (True, False, "global", "window", "none")] == [
        "global", "none", "global", "window", "none"]
    with pytest.raises(ConfigurationError, match=r"shuffle must be .*got 'batch'"):
        shuffle_mode("batch")


def test_the_progress_line_compares_bytes_with_dense_only_where_they_are_fewer():
    logger = ProgressLogger(2, dense_bytes_per_step=1_700_000)
    logger.set_params({"epochs": 3})
    assert "(85x less than dense)" in logger.line(0, {"bytes_sent_per_step": 20_000})
    dense = logger.line(0, {"bytes_sent_per_step": 1_700_000})
    assert "1.7MB/step" in dense and "less than dense" not in dense


def test_the_progress_line_says_how_many_rows_an_epoch_dropped():
    logger = ProgressLogger(2)
    logger.set_params({"epochs": 3})
    line = logger.line(0, {"loss": 0.5, "rows_dropped": 40})
    assert line.endswith("40 rows dropped") and "rows_dropped" not in line
    assert "dropped" not in logger.line(0, {"loss": 0.5, "rows_dropped": 0})
