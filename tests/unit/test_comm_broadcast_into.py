"""``broadcast_into(array, root)``: the root's array lands in every rank's own array, on every
transport, received in place by the TCP ring; a mismatch or an unusable array is one clear
error."""

from __future__ import annotations

import tracemalloc
from typing import Any

import ml_dtypes
import numpy as np
import pytest
from _comm_harness import check_cases, run_allgather_transport, run_threads

from sparkdl.comm import create_communicator
from sparkdl.errors import CommunicationError, ConfigurationError

SHAPES = [(0,), (1,), (1001,), (300_001,), (3, 5)]  # 300_001: several shared-memory slots


def _cases(rank: int, comm: Any) -> list[tuple[str, bool, str]]:
    out = []
    for dtype in ("float32", "float64", "bfloat16"):
        for shape in SHAPES:
            for root in range(comm.world_size):
                rng = np.random.default_rng([root, int(np.prod(shape))])
                sent = rng.standard_normal(shape).astype(np.dtype(getattr(ml_dtypes, dtype,
                                                                          dtype)))
                array = sent.copy() if rank == root else np.full_like(sent, np.nan)
                got = comm.broadcast_into(array, root)
                ok = got is array and array.tobytes() == sent.tobytes()
                out.append((f"{dtype}/{shape}/root {root}", ok, array.tobytes().hex()[:64]))
    return out


def _check(results: list[list[tuple[str, bool, str]]]) -> None:
    check_cases(results, "the array received differs from the root's")


@pytest.mark.parametrize("world", [1, 2, 3])
@pytest.mark.parametrize("mesh", ["plain", "mesh"])
def test_the_ring_and_the_mesh_broadcast_into_every_ranks_array(world, mesh):
    _check(run_threads(world, _cases, mesh=mesh))


def test_broadcast_into_with_a_mac_on_every_record():
    _check(run_threads(3, _cases, wire_integrity="mac"))


def test_the_hierarchical_communicator_broadcasts_into_arrays():
    _check(run_threads(4, _cases, hosts=["a", "a", "b", "b"], topology="auto"))


def test_the_allgather_transport_broadcasts_into_arrays():
    _check(run_allgather_transport(_cases, 2))


def test_the_ring_receives_in_place_without_a_buffer_of_the_messages_size():
    size = 1 << 21  # 8 MiB of float32

    def run(rank: int, comm: Any) -> int:
        array = np.full(size, rank, np.float32)
        comm.broadcast_into(array, 0)  # warm: links and shared memory set up
        array[:] = rank
        comm.barrier()
        held = 0
        if rank == 1:
            tracemalloc.reset_peak()
            held = tracemalloc.get_traced_memory()[0]
        comm.barrier()
        comm.broadcast_into(array, 0)
        comm.barrier()
        grown = tracemalloc.get_traced_memory()[1] - held if rank == 1 else 0
        comm.barrier()  # before either rank allocates again
        assert (array == 0).all()
        return grown

    tracemalloc.start()
    try:
        peaks = run_threads(2, run)
    finally:
        tracemalloc.stop()
    assert peaks[1] < size  # a message of 4 * size bytes: a received copy would be that


def _mismatched(rank: int, comm: Any) -> str:
    """Rank 0 broadcasts 2 floats into ranks expecting 4: what each rank was told."""
    try:
        comm.broadcast_into(np.zeros(2 if rank == 0 else 4, np.float32), 0)
    except CommunicationError as exc:
        return str(exc)
    return "no error"


def test_a_size_mismatch_and_unusable_arrays_are_one_clear_error():
    said = run_threads(2, _mismatched, comm_timeout_s=10)
    assert said[0] == "no error"
    assert "out of step" in said[1] and "of 16 bytes" in said[1] and "of 8 bytes" in said[1]

    comm = create_communicator("tcp", 0, 1, lambda s: [s], secret=b"s" * 32, timeout_s=10)
    try:
        with pytest.raises(ConfigurationError, match="C-contiguous"):
            comm.broadcast_into(np.zeros(8, np.float32)[::2])
        with pytest.raises(ConfigurationError, match="numpy array"):
            comm.broadcast_into([1.0, 2.0])  # type: ignore[arg-type]
        with pytest.raises(ConfigurationError, match="root: expected 0 <= root < 1"):
            comm.broadcast_into(np.zeros(2, np.float32), root=1)
        read_only = np.zeros(2, np.float32)
        read_only.flags.writeable = False
        assert comm.broadcast_into(read_only) is read_only  # the root only reads it
    finally:
        comm.close()


def test_the_default_path_names_both_sizes_on_a_mismatch():
    said = run_allgather_transport(_mismatched, 2)
    assert said[0] == "no error"
    assert "rank 0 sent 8 bytes, expected 16" in said[1]
