"""``allreduce(array, out=buffer)``: the result lands in the caller's buffer, with the bits
of the allocating call, on every transport; a buffer that cannot take it is one clear error."""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np
import pytest
from _comm_harness import check_cases, run_allgather_transport, run_threads

from sparkdl.comm import AllGatherCommunicator, create_communicator
from sparkdl.errors import ConfigurationError

LENGTHS = [0, 1, 7, 1001, 300_001]  # the last: several ring blocks, shared memory


def _cases(rank: int, comm: Any) -> list[tuple[str, bool, str]]:
    out = []
    for dtype in ("float32", "float64", "bfloat16"):
        if dtype == "bfloat16" and isinstance(comm, AllGatherCommunicator):
            continue  # that transport sums float32 and float64 only
        for length in LENGTHS:
            for op in ("sum", "mean"):
                rng = np.random.default_rng([rank, length])
                x = rng.standard_normal(length).astype(np.dtype(getattr(ml_dtypes, dtype, dtype)))
                before = x.copy()
                fresh = comm.allreduce(x, op)
                buffer = np.full_like(x, np.nan)
                got = comm.allreduce(x, op, out=buffer)
                ok = (got is buffer and got.tobytes() == fresh.tobytes()
                      and x.tobytes() == before.tobytes())
                out.append((f"{dtype}/{length}/{op}", ok, got.tobytes().hex()[:64]))
    return out


def _check(results: list[list[tuple[str, bool, str]]]) -> None:
    check_cases(results, "out= differs from the allocating call")


@pytest.mark.parametrize("world", [1, 2, 3, 5])
@pytest.mark.parametrize("mesh", ["plain", "mesh"])
def test_the_ring_and_the_mesh_reduce_into_the_callers_buffer_with_the_same_bits(world, mesh):
    _check(run_threads(world, _cases, mesh=mesh))


def test_the_hierarchical_communicator_reduces_into_the_callers_buffer():
    _check(run_threads(4, _cases, hosts=["a", "a", "b", "b"], topology="auto"))


def test_the_allgather_transport_reduces_into_the_callers_buffer():
    _check(run_allgather_transport(_cases, 2))


def test_a_buffer_that_cannot_take_the_result_is_one_clear_error():
    comm = create_communicator("tcp", 0, 1, lambda s: [s], secret=b"s" * 32, timeout_s=10)
    x = np.ones(8, np.float32)
    try:
        for bad, match in [
            (np.empty(7, np.float32), r"shape \(8,\) and dtype float32, got \(7,\) float32"),
            (np.empty(8, np.float64), "got \\(8,\\) float64"),
            (np.empty(16, np.float32)[::2], "C-contiguous"),
            (np.frombuffer(bytes(32), np.float32), "writable"),
            (x, "share memory"),
            ([0.0] * 8, "got list"),
        ]:
            with pytest.raises(ConfigurationError, match=match):
                comm.allreduce(x, out=bad)
        assert np.array_equal(x, np.ones(8, np.float32))
    finally:
        comm.close()
