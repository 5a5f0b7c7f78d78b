"""``allreduce_pieces(pieces)``: the allreduce of the pieces' concatenation, with the bits of
``allreduce(np.concatenate(pieces))`` on every transport, read in place by the TCP ring;
bad pieces are one clear error."""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np
import pytest
from _comm_harness import check_cases, run_allgather_transport, run_threads

from sparkdl.comm import AllGatherCommunicator, create_communicator
from sparkdl.comm.communicator import Segments
from sparkdl.errors import ConfigurationError

# (total length, cut points): pieces that start and end inside the ring's chunks, an empty
# piece, one piece; the last case spans several ring blocks and the shared-memory slots
SPLITS = [
    (1, []),
    (7, [0, 3, 3]),
    (1001, [1, 500, 999]),
    (300_001, [4096, 4096 + 10, 150_000, 299_999]),
]


def _cases(rank: int, comm: Any) -> list[tuple[str, bool, str]]:
    out = []
    for dtype in ("float32", "float64", "bfloat16"):
        if dtype == "bfloat16" and isinstance(comm, AllGatherCommunicator):
            continue  # that transport sums float32 and float64 only
        for length, cuts in SPLITS:
            rng = np.random.default_rng([rank, length])
            x = rng.standard_normal(length).astype(np.dtype(getattr(ml_dtypes, dtype, dtype)))
            pieces = [p.copy() for p in np.split(x, cuts)]
            before = [p.tobytes() for p in pieces]
            for op in ("sum", "mean"):
                whole = comm.allreduce(x, op)
                got = comm.allreduce_pieces(pieces, op)
                buffer = np.full_like(x, np.nan)
                into = comm.allreduce_pieces(pieces, op, out=buffer)
                ok = (got.shape == (length,) and got.tobytes() == whole.tobytes()
                      and into is buffer and into.tobytes() == whole.tobytes()
                      and [p.tobytes() for p in pieces] == before)
                out.append((f"{dtype}/{length}/{op}", ok, got.tobytes().hex()[:64]))
    return out


def _check(results: list[list[tuple[str, bool, str]]]) -> None:
    check_cases(results, "the pieces' allreduce differs from the whole's")


@pytest.mark.parametrize("world", [1, 2, 3])
@pytest.mark.parametrize("mesh", ["plain", "mesh"])
def test_the_ring_and_the_mesh_reduce_pieces_with_the_bits_of_their_concatenation(world, mesh):
    _check(run_threads(world, _cases, mesh=mesh))


def test_pieces_with_a_mac_on_every_record():
    _check(run_threads(2, _cases, wire_integrity="mac"))


def test_the_hierarchical_communicator_reduces_pieces():
    _check(run_threads(4, _cases, hosts=["a", "a", "b", "b"], topology="auto"))


@pytest.mark.parametrize("hosts", [["a", "a", "b", "b"], ["a", "b", "b"], ["a", "b", "a"]])
def test_the_hierarchical_communicator_reads_pieces_in_place_and_copies_once(monkeypatch, hosts):
    """Each host's ring reads the pieces where they are (nothing concatenates them into a new
    array; a host of one rank copies them into ``out``), and the world's sum reaches every
    rank's ``out``, the same bits everywhere."""
    concatenate = Segments.concatenate

    def into_out_only(self: Segments, out: Any = None) -> np.ndarray:
        if out is None:
            raise AssertionError("the pieces were concatenated into a new array")
        return concatenate(self, out)

    monkeypatch.setattr(Segments, "concatenate", into_out_only)

    def run(rank: int, comm: Any) -> tuple[bool, np.ndarray, np.ndarray]:
        rng = np.random.default_rng(rank)
        pieces = [rng.standard_normal(n).astype(np.float32) for n in (1000, 0, 70_001)]
        out = np.full(71_001, np.nan, np.float32)
        got = comm.allreduce_pieces(pieces, "mean", out=out)
        return got is out, out.copy(), np.concatenate(pieces)

    results = run_threads(len(hosts), run, hosts=hosts, topology="auto")
    assert [r[0] for r in results] == [True] * len(hosts)
    assert all(r[1].tobytes() == results[0][1].tobytes() for r in results)
    expected = np.mean([r[2] for r in results], axis=0)
    np.testing.assert_allclose(results[0][1], expected, rtol=1e-5, atol=1e-6)


def test_the_allgather_transport_reduces_pieces():
    _check(run_allgather_transport(_cases, 2))


def test_segments_read_ranges_across_pieces_in_place():
    a, b, c = np.arange(3, dtype=np.float32), np.zeros(0, np.float32), np.arange(3, 8,
                                                                             dtype=np.float32)
    seg = Segments([a, b, c])
    assert seg.size == 8
    parts = seg.parts(2, 5)
    assert [(p.tolist(), at) for p, at in parts] == [([2.0], 0), ([3.0, 4.0], 1)]
    assert all(np.shares_memory(p, src) for (p, _), src in zip(parts, [a, c]))
    out = np.full(4, 10, np.float32)
    seg.add(out, 1, out)
    assert out.tolist() == [11, 12, 13, 14]


def test_bad_pieces_are_one_clear_error():
    comm = create_communicator("tcp", 0, 1, lambda s: [s], secret=b"s" * 32, timeout_s=10)
    x = np.ones(8, np.float32)
    try:
        for pieces, out, error, match in [
            ([], None, ConfigurationError, "non-empty sequence of arrays"),
            ([x, np.ones(2, np.float64)], None, ConfigurationError,
             "piece 1 must be a C-contiguous float32 array .* got a C-contiguous float64"),
            ([np.ones(16, np.float32)[::2]], None, ConfigurationError, "non-contiguous"),
            ([x, [1.0]], None, ConfigurationError, "sequence of arrays"),
            ([np.ones(2, np.int32)], None, ConfigurationError, "expected float32, float64"),
            ([x[:4], x[4:]], x, ConfigurationError, "must not share memory"),
            ([x], np.empty(7, np.float32), ConfigurationError, r"shape \(8,\)"),
        ]:
            with pytest.raises(error, match=match):
                comm.allreduce_pieces(pieces, out=out)
        with pytest.raises(ConfigurationError, match="'sum' or 'mean'"):
            comm.allreduce_pieces([x], "max")
    finally:
        comm.close()
