"""HostViews: in-place sparse additions through cached numpy views of variable buffers."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from sparkdl.training.exchanges.host_views import HostViews


def _address(variable: tf.Variable) -> int:
    return int(np.asarray(variable.read_value_no_copy()).ctypes.data)


def _reference_add(
    flat: list[np.ndarray], index: np.ndarray, values: np.ndarray, offsets: list[int]
) -> None:
    for i, value in zip(index.tolist(), values.tolist(), strict=True):
        v = next(k for k in range(len(flat)) if offsets[k] <= i < offsets[k + 1])
        flat[v][i - offsets[v]] = np.float32(flat[v][i - offsets[v]] + np.float32(value))


def _variables(rng: np.random.Generator) -> tuple[list[tf.Variable], list[int]]:
    shapes = [(7, 5), (3,), (0,), (4, 2, 3), (1,)]
    variables = [tf.Variable(rng.normal(size=s).astype(np.float32)) for s in shapes]
    offsets = np.concatenate([[0], np.cumsum([int(np.prod(s)) for s in shapes])]).tolist()
    return variables, offsets


def test_scatter_add_matches_reference_and_reuses_views() -> None:
    rng = np.random.default_rng(3)
    variables, offsets = _variables(rng)
    expected = [v.numpy().reshape(-1).copy() for v in variables]
    views = HostViews(variables)
    cached: list[object] = []
    for step in range(6):
        size = offsets[-1] if step == 5 else int(rng.integers(0, 20))
        index = np.sort(rng.choice(offsets[-1], size=size, replace=False))
        values = rng.normal(size=index.size).astype(np.float32)
        reads = views.reads() if step % 2 else None
        views.scatter_add(index.astype(np.int64), values, offsets, reads)
        _reference_add(expected, index, values, offsets)
        for variable, flat in zip(variables, expected, strict=True):
            assert variable.numpy().reshape(-1).tobytes() == flat.tobytes()
        current = [entry[1] if entry else None for entry in views._views]
        if cached:  # the same view objects, once made
            assert all(c is None or c is n for c, n in zip(cached, current, strict=True))
        cached = current
    assert all(entry is not None for i, entry in enumerate(views._views) if i != 2)  # 2: empty


def test_a_reallocated_buffer_gets_a_new_view() -> None:
    rng = np.random.default_rng(4)
    variables, offsets = _variables(rng)
    views = HostViews(variables)
    everything = np.arange(offsets[-1], dtype=np.int64)
    views.scatter_add(everything, np.ones(offsets[-1], np.float32), offsets)
    old_view = views._views[0]
    assert old_view is not None
    before = _address(variables[0])
    variables[0].assign(tf.fill((7, 5), 2.0))  # takes a new buffer
    assert _address(variables[0]) != before
    views.scatter_add(np.array([0, 34], np.int64), np.float32([0.5, 0.25]), offsets)
    new_view = views._views[0]
    assert new_view is not None and new_view[1] is not old_view[1]
    assert new_view[0] == _address(variables[0])
    want = np.full(35, 2.0, np.float32)
    want[0], want[34] = 2.5, 2.25
    assert variables[0].numpy().reshape(-1).tobytes() == want.tobytes()
    # the view of an unchanged buffer is kept
    assert views._views[1] is not None
    kept = views._views[1][1]
    views.scatter_add(np.array([35], np.int64), np.float32([1.0]), offsets)
    assert views._views[1][1] is kept


def test_read_all_reads_every_buffer_in_place_in_one_traced_call() -> None:
    variables, _ = _variables(np.random.default_rng(5))
    views = HostViews(variables)
    for _ in range(3):
        reads = views.read_all()
        assert [int(np.asarray(r).ctypes.data) for r in reads if r.shape.num_elements()] == [
            _address(v) for v in variables if v.shape.num_elements()]
        for read, variable in zip(reads, variables, strict=True):
            assert np.asarray(read).tobytes() == variable.numpy().tobytes()
        del reads
    assert views._read_all.experimental_get_tracing_count() == 1
