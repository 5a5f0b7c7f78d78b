"""The N-rank scaling model's formulas (benchmarks.scaling_model)."""

from __future__ import annotations

import pytest

from benchmarks.scaling_model import (
    LENET_SHAPES,
    Scenario,
    bruck_steps,
    collective_cost,
    collective_seconds,
    collective_steps,
    crossovers,
    num_parameters,
    oversubscription,
    powersgd_floats,
    resnet50_shapes,
    step_seconds,
)


def test_ring_allgather_sends_n_minus_one_messages_over_n_minus_one_hops() -> None:
    cost = collective_cost("sharing_plain", 8, message_bytes=1000)
    assert (cost.bytes_sent, cost.hops, cost.decodes) == (7000, 7, 7)


def test_bruck_allgather_sends_the_same_bytes_in_log2_steps() -> None:
    assert [bruck_steps(n) for n in (1, 2, 3, 4, 5, 8, 16, 1024)] == [0, 1, 2, 2, 3, 3, 4, 10]
    cost = collective_cost("sharing_mesh", 16, message_bytes=1000)
    assert (cost.bytes_sent, cost.hops) == (15000, 4)


def test_ring_allreduce_sends_two_n_minus_one_over_n_of_the_vector() -> None:
    cost = collective_cost("dense", 4, dense_bytes=4000)
    assert (cost.bytes_sent, cost.hops) == (6000, 6)
    assert collective_cost("dense", 1, dense_bytes=4000).bytes_sent == 0


def test_powersgd_bytes_per_worker_stay_below_twice_its_factors_at_any_n() -> None:
    sizes = [collective_cost("powersgd", n, factor_bytes=1000).bytes_sent
             for n in (2, 16, 1024)]
    assert sizes[0] == 1000 and all(1000 <= s < 2000 for s in sizes)


def test_powersgd_sends_factors_of_matrices_and_small_tensors_whole() -> None:
    # 800x500 kernel: (800+500)*4; 5x5x20x50 conv as a 500x50 matrix: (500+50)*4;
    # 5x5x1x20 conv as 25x20: (25+20)*4; biases dense
    assert powersgd_floats(LENET_SHAPES, rank=4) == (
        (25 + 20) * 4 + 20 + (500 + 50) * 4 + 50 + (800 + 500) * 4 + 500 + (500 + 10) * 4 + 10)
    # a matrix whose factors are not smaller is sent whole
    assert powersgd_floats([(6, 4)], rank=4) == 24


def test_lenet_shapes_are_those_of_the_built_model() -> None:
    pytest.importorskip("keras")
    from sparkdl.models import lenet

    model = lenet((28, 28, 1), 10)
    assert [tuple(w.shape) for w in model.trainable_weights] == list(LENET_SHAPES)
    assert num_parameters(LENET_SHAPES) == model.count_params() == 431080


def test_resnet50_has_its_25_6_million_trainable_parameters() -> None:
    assert num_parameters(resnet50_shapes()) == 25_583_592  # Keras ResNet50's trainable


def test_oversubscribed_workers_share_their_hosts_cores() -> None:
    assert oversubscription(2, 2) == 1 and oversubscription(8, 2) == 4
    slow = Scenario("x", ((10, 10),), compute_s=1.0, hop_s=0.0)
    assert step_seconds(slow, "dense", 1, 1.0, workers_per_host=4, cores_per_host=2) == 2.0


def test_sharing_falls_behind_dense_once_n_exceeds_about_twice_the_compression() -> None:
    # no latency or decoding: sharing's (N-1)m meets dense's 2(N-1)/N·4P at N = 2·4P/m
    sc = Scenario("x", ((1000, 1000),), compute_s=0.0, sparsity=1e-2, hop_s=0.0,
                  decode_s_per_element=0.0, decode_fixed_s=0.0)
    m = 64 + 4 * 1e-2 * 1e6
    assert crossovers(sc, "sharing_plain", "dense", 1e9, max_ranks=1000) == [
        int(2 * 4e6 / m) + 1]


@pytest.mark.parametrize("ranks", [2, 3, 4, 5, 8, 12, 16])
def test_every_collective_algorithm_sends_the_bytes_its_pattern_needs(ranks: int) -> None:
    m = 4096.0
    assert sum(collective_steps("allgather", "ring", ranks, m)) == (ranks - 1) * m
    assert sum(collective_steps("allgather", "mesh", ranks, m)) == (ranks - 1) * m
    assert len(collective_steps("allgather", "mesh", ranks, m)) == bruck_steps(ranks)
    assert sum(collective_steps("allreduce", "ring", ranks, m)) == pytest.approx(
        2 * (ranks - 1) / ranks * m)
    power = 1 << (ranks.bit_length() - 1)
    fold = 2 * m if ranks > power else 0.0  # the extra ranks' vectors, in and back out
    assert sum(collective_steps("allreduce", "mesh", ranks, m)) == pytest.approx(
        2 * (power - 1) / power * m + fold)


def test_a_collective_step_takes_the_longer_of_its_fixed_cost_and_its_bytes() -> None:
    # 1 KB at 1 MB/s is 1 ms, longer than a 0.1 ms step; 64 B is 0.064 ms, shorter
    assert collective_seconds([1000.0, 64.0], 1e-4, 1e6) == pytest.approx(1e-3 + 1e-4)
    assert collective_seconds([], 1e-4, 1e6) == 0.0


def test_the_collectives_benchmark_calibrates_on_small_worlds_and_checks_larger_ones() -> None:
    from benchmarks.mesh import RATES, calibrate, check_model

    hop, goodput = 40e-6, {"100mbit": 12e6, "1gbit": 120e6}

    def cell(rate: str, world: int, kind: str, nbytes: int, slower: float = 1.0) -> dict:
        times = {impl: collective_seconds(collective_steps(kind, impl, world, nbytes),
                                          hop * max(1, world / 2), goodput[rate]) * 1e3
                 for impl in ("ring", "mesh")}
        return {"rate": rate, "world": world, "collective": kind, "bytes": nbytes,
                "ring_ms": times["ring"] * slower, "mesh_ms": times["mesh"] * slower}

    cells = [cell(r, w, k, b) for r in RATES for w in (2, 4) for k in ("allgather", "allreduce")
             for b in (4096, 256 * 1024)]
    assert calibrate(cells, cores=2) is not None
    checked = [cell("1gbit", 16, "allgather", 4096), cell("1gbit", 8, "allreduce", 4096, 1.5)]
    summary = check_model(cells + checked, calibrate(cells, cores=2))
    assert summary["cells"] == 4 and summary["within_0_2"] == 2
    assert summary["error_max"] == pytest.approx(1 - 1 / 1.5)  # the cell 1.5x slower
    assert calibrate([c for c in cells if c["world"] == 2], cores=2) is None  # --quick
