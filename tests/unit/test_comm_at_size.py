"""Vectors of model size: the Spark-RPC transport splits long messages into bounded rounds
with the bits of one round, and no transport holds a second copy of a vector while it reduces
or broadcasts it (``jobs/benchmark.py wire-size`` measures the same at 300M elements)."""

from __future__ import annotations

import tracemalloc
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from _comm_harness import run_on_threads, run_threads

from sparkdl.comm import AllGatherCommunicator
from sparkdl.comm import mesh as mesh_module

ROUND = 1000


def _on_rpc(world: int, fn: Callable[[int, Any, Any], Any], round_bytes: int) -> list[Any]:
    """``(fn(rank, chunked, whole), longest)`` on ``world`` threads, each with two Spark-RPC
    communicators over one rendezvous: ``chunked`` in rounds of ``round_bytes``, ``whole``
    unsplit; ``longest`` is the chunked one's longest message."""
    def body(rank: int, exchange: Callable[[str], list[str]]) -> tuple[Any, int]:
        longest = [0]

        def measured(text: str) -> list[str]:
            longest[0] = max(longest[0], len(text))
            return exchange(text)

        chunked = AllGatherCommunicator(rank, world, measured, round_bytes=round_bytes)
        whole = AllGatherCommunicator(rank, world, exchange, round_bytes=1 << 30)
        return fn(rank, chunked, whole), longest[0]

    return run_on_threads(world, body)


def test_the_spark_transport_sends_long_messages_in_rounds_with_the_bits_of_one():
    def cases(rank: int, chunked: Any, whole: Any) -> bool:
        rng = np.random.default_rng(rank)
        same = []
        for length in (0, 1, ROUND // 8, ROUND // 4 + 3, 2_501):  # float32: 0 to 11 rounds
            x = rng.standard_normal(length).astype(np.float32)
            pieces = np.split(x, [length // 3, length // 2])
            for op in ("sum", "mean"):
                same.append(chunked.allreduce(x, op).tobytes() == whole.allreduce(x, op).tobytes())
                into = np.full_like(x, np.nan)
                got = chunked.allreduce_pieces(pieces, op, out=into)
                same.append(got is into and into.tobytes() == whole.allreduce(x, op).tobytes())
            message = bytes(rng.integers(0, 256, length * (rank + 1), np.uint8))
            same.append(chunked.allgather(message) == whole.allgather(message))
            root = length % 3
            sent = chunked.broadcast(message if rank == root else None, root)
            same.append(sent == whole.broadcast(message if rank == root else None, root))
            array = x.copy() if rank == root else np.full_like(x, np.nan)
            chunked.broadcast_into(array, root)
            same.append(array.tobytes() == whole.broadcast(x.tobytes() if rank == root else None,
                                                           root))
        return all(same)

    results = _on_rpc(3, cases, ROUND)
    assert [ok for ok, _ in results] == [True] * 3
    # a round's text: a short header, then the base64 of at most ROUND bytes (4/3 as long)
    assert all(longest < ROUND * 4 / 3 + 100 for _, longest in results)


def _growth(run: Callable[[], Any]) -> int:
    """Peak bytes traced while ``run`` runs, above what was traced before it."""
    held = tracemalloc.get_traced_memory()[0]
    tracemalloc.reset_peak()
    run()
    return tracemalloc.get_traced_memory()[1] - held


SIZE = 1 << 21  # 8 MiB of float32


def _collectives_growth(rank: int, comm: Any) -> list[int]:
    """Traced growth (whole process) over each collective on a vector of SIZE, into buffers
    allocated beforehand (rank 0's counts), and every rank checks its results."""
    vector = np.full(SIZE, rank + 1, np.float32)
    result = np.full(SIZE, np.nan, np.float32)
    pieces = np.split(vector, [SIZE // 7, SIZE // 2])
    world = comm.world_size
    comm.allreduce(vector, out=result)  # links and shared memory set up
    calls = [
        lambda: comm.allreduce(vector, out=result),
        lambda: comm.allreduce_pieces(pieces, out=result),
        lambda: comm.broadcast_into(vector if rank == 0 else result, 0),
    ]
    grown = []
    for call in calls:
        comm.barrier()
        grown.append(_growth(call))  # rank 0's figure counts: the others' overlap it
        comm.barrier()
    assert (result == 1).all() if rank else (result == world * (world + 1) / 2).all()
    return grown


@pytest.mark.parametrize("kind", ["ring", "mesh", "hierarchical", "spark-rpc"])
def test_no_transport_holds_a_second_copy_of_a_large_vector(kind, monkeypatch):
    # above MESH_MAX_BYTES even `mesh` takes the ring; lowered so that 8 MiB is above it
    monkeypatch.setattr(mesh_module, "MESH_MAX_BYTES", SIZE)
    tracemalloc.start()
    try:
        if kind == "spark-rpc":
            grown = _on_rpc(2, lambda rank, chunked, _: _collectives_growth(rank, chunked),
                            64 << 10)[0][0]
        elif kind == "hierarchical":
            grown = run_threads(4, _collectives_growth, hosts=["a", "a", "b", "b"],
                                topology="hierarchical")[0]
        else:
            grown = run_threads(2, _collectives_growth,
                                mesh="mesh" if kind == "mesh" else "plain")[0]
    finally:
        tracemalloc.stop()
    # every rank of the process together: a copy of one rank's vector would be 4 * SIZE bytes.
    # A Spark-RPC round lives some 28 times over while in flight (base64 text, JSON frames, the
    # store's copy, both ranks): 1.8-2.1 MB at 64 KiB rounds, so it gets half a copy's room.
    limit = 2 * SIZE if kind == "spark-rpc" else SIZE
    assert max(grown) < limit, grown
