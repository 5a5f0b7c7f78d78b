"""The scaling benchmark (``jobs/benchmark.py scaling --quick``) on the network-namespace
cluster (the shared one of tests/cluster/conftest.py): it runs end to end and reports, for
every cell, a measured and a predicted step time (no timing assertions: the figures are for
the report). Needs root; skipped elsewhere."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.scaling import (
    Cell,
    block_orders,
    bruck_link_bytes,
    bucket_bytes,
    cpu_share,
    host_step_seconds,
    lockstep_seconds,
    pass_schedules,
    predict,
    ring_crossings,
    ring_goodput,
    shm_between_hosts,
    straggler_seconds,
)

REPO = Path(__file__).resolve().parents[2]
KEYS = ("sharing_vs_dense_step_speedup_100mbit", "overlap_vs_compute_only_100mbit",
        "model_error_max", "sharing_compression")

@pytest.mark.slow
def test_quick_scaling_benchmark_reports_every_cell(cluster, tmp_path):
    """On the shared cluster (``--cluster``: attached, not brought up)."""
    out = tmp_path / "scaling.json"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run(
        [sys.executable, "jobs/benchmark.py", "scaling", "--quick", "--json", str(out),
         "--cluster", str(cluster.state_dir)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=1200, check=False,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    figures = json.loads(out.read_text())
    for key in KEYS:
        assert key in figures, key
    assert figures["shm_used_between_hosts"] is False
    cells = figures["cells"]
    modes = {cell["mode"] for cell in cells.values()}
    assert {"sharing", "averaging", "dense"} <= modes
    assert {cell["rate"] for cell in cells.values()} >= {"100mbit", "unlimited"}
    for name, cell in cells.items():
        if cell["missing"]:  # sharing with overlap where this build has none
            assert cell["mode"] == "sharing_overlap", name
            continue
        assert cell["measured_step_s"] > 0, name
        assert cell["predicted_step_s"] > 0, name
        assert cell["bytes_per_step"] > 0, name
        assert set(cell["terms"]) >= {"compute_s", "wire_s", "latency_s"}, name
        # a load for each fit that measured the cell, the highest reported
        assert len(cell["load1_per_fit"]) == len(cell["measured_step_s_repeats"]), name
        assert cell["load1"] == max(cell["load1_per_fit"]), name
    assert figures["sharing_compression"] > 1
    assert figures["model_error_max"] is not None
    # each in-process ratio with the interval of its median
    intervals = figures["exchange_cpu_ratio_interval"]
    assert set(intervals) == set(figures["exchange_cpu_ratio"])
    for mode, (low, high) in intervals.items():
        assert low <= figures["exchange_cpu_ratio"][mode] <= high, mode
    # the 100 Mbit/s link's goodput under the ring's traffic: measured, and below the rate
    ring = figures["ring_goodput_bytes_per_s"]["1x2"]["100mbit"]
    assert 1e6 < ring < 12.5e6, ring


def test_ring_crossings_counts_edges_between_hosts():
    assert ring_crossings(["a", "b"]) == 1
    assert ring_crossings(["a", "a", "b", "b"]) == 1
    assert ring_crossings(["a", "b", "a", "b"]) == 2
    assert ring_crossings(["a", "a"]) == 0


def test_shm_between_hosts_looks_only_at_links_that_leave_a_host():
    same_host = [{"host": "a", "shm_out": True}, {"host": "a", "shm_out": False},
                 {"host": "b", "shm_out": True}, {"host": "b", "shm_out": False}]
    assert not shm_between_hosts(same_host)
    across = [{"host": "a", "shm_out": True}, {"host": "b", "shm_out": False}]
    assert shm_between_hosts(across)


def test_each_pass_warms_up_then_runs_the_rates_in_alternating_order():
    assert pass_schedules(("100mbit", "1gbit", None), 2) == [
        ["100mbit", "100mbit", "1gbit", None], [None, None, "1gbit", "100mbit"]]
    assert pass_schedules(("100mbit",), 1) == [["100mbit", "100mbit"]]


def test_a_blocks_fits_run_as_a_palindrome_rotated_by_the_block():
    modes = ("a", "b", "c", "d")
    assert block_orders(modes, 1, 2) == [("a", "b", "c", "d"), ("d", "c", "b", "a")]
    assert block_orders(modes, 2, 3) == [("b", "c", "d", "a"), ("a", "d", "c", "b"),
                                         ("b", "c", "d", "a")]
    assert block_orders(modes, 1, 1) == [modes]


def test_a_cells_load_is_the_highest_after_any_of_its_fits():
    cell = Cell("100mbit", 1, "sharing")
    assert cell.load is None
    cell.loads += [0.4, 1.7, 0.9]  # the palindrome's fits: the busiest one speaks for it
    assert cell.load == 1.7


def test_predict_adds_wire_time_of_the_busiest_host_link():
    link = {"bytes_per_s": 1e6, "latency_s": 1e-3}
    codec = {"decode_s": 0.0, "encode_s": 0.0, "parameters": 1}
    dense = Cell("100mbit", 2, "dense", step_s=[1.0], bytes_per_step=[2e5],
                 hosts_of_ranks=["a", "b", "a", "b"])  # every ring edge crosses: k = 2
    predict(dense, 0.05, codec, link)
    assert dense.predicted_s == pytest.approx(0.05 + 2 * 2e5 / 1e6 + 6 * 1e-3)
    overlap = Cell("100mbit", 1, "sharing_overlap", step_s=[1.0], bytes_per_step=[1e4],
                   hosts_of_ranks=["a", "b"])
    predict(overlap, 0.05, codec, link)
    assert overlap.predicted_s == pytest.approx(0.05)  # the wire (11 ms) hides behind compute


def test_predict_lets_the_token_bucket_refilled_while_computing_through_at_full_speed():
    link = {"bytes_per_s": 1e6, "latency_s": 0.0}
    codec = {"decode_s": 0.0, "encode_s": 0.0, "parameters": 1}
    dense = Cell("100mbit", 1, "dense", step_s=[1.0], bytes_per_step=[2e5],
                 hosts_of_ranks=["a", "b"])
    predict(dense, 0.05, codec, link, bucket_bytes=1e5)  # refilled in 0.1 s: half of it
    assert dense.predicted_s == pytest.approx(0.05 + (2e5 - 0.05 * 1e6) / 1e6)
    predict(dense, 0.5, codec, link, bucket_bytes=1e5)  # full bucket
    assert dense.predicted_s == pytest.approx(0.5 + 1e5 / 1e6)
    averaging = Cell("100mbit", 1, "averaging", step_s=[1.0], bytes_per_step=[2e5],
                     hosts_of_ranks=["a", "b"])  # every 5 steps: 5 steps refill the bucket
    predict(averaging, 0.05, codec, link, bucket_bytes=1e5)
    assert averaging.terms["wire_s"] == pytest.approx((2e5 - 1e5 / 5) / 1e6)
    assert bucket_bytes(None) == 0 and bucket_bytes("100mbit") == 125_000
    assert bucket_bytes("1mbit") == 32 * 1024


def test_straggler_seconds_is_what_the_slowest_rank_adds():
    assert straggler_seconds([[0.01] * 5, [0.01] * 5]) == 0.0  # no spread: nothing to wait
    assert straggler_seconds([[0.01, 0.03]]) == 0.0  # one rank waits for nobody
    # two ranks each 10 or 30 ms at random: the slower is 30 ms 3/4 of the time: 25 vs 20
    assert straggler_seconds([[0.01, 0.03], [0.01, 0.03]]) == pytest.approx(0.005, abs=6e-4)
    # meeting every 5 steps averages the spread out
    assert straggler_seconds([[0.01, 0.03], [0.01, 0.03]], period=5) < 0.004


def test_ranks_taking_turns_on_a_hosts_cores_straggle_as_their_host():
    # two ranks on one core alternate slow and fast steps: the host's step is steady
    ranks = [[0.01, 0.03, 0.01], [0.03, 0.01, 0.03, 0.05], [0.02, 0.02, 0.02]]
    hosts = host_step_seconds(ranks, ["h0", "h0", "h1"])
    assert hosts == [pytest.approx([0.02] * 3), pytest.approx([0.02] * 3)]
    assert straggler_seconds(hosts) == pytest.approx(0.0, abs=1e-12)
    assert straggler_seconds(ranks) > 0.004


def test_lockstep_wait_is_what_the_lockstep_step_holds_beyond_work_and_hops():
    cpu = {"compute": 0.004, "lockstep": 0.005}
    # 40 ms in lockstep = 20 ms compute only + 1 ms more work x 4 workers per core + 2 ms of
    # hops + 14 ms of waiting for the last rank to be scheduled
    assert lockstep_seconds(0.040, 0.020, cpu, 4.0, 0.002) == pytest.approx(0.014)
    assert lockstep_seconds(0.020, 0.020, cpu, 1.0, 0.0) == 0.0  # never below nothing
    assert cpu_share(1) == 1.0
    assert cpu_share(64 * (os.cpu_count() or 1)) == 64.0


def test_ring_goodput_is_the_busiest_links_bytes_over_the_allreduces_own_link_time():
    # 2 ranks on 2 hosts each send 4 MB per allreduce of 0.5 s: 2 hops of 10 ms and 1 s/GB
    # of the ring's own cost (4 ms) leave 476 ms for the 4 MB each host's link carries
    links = [{"host": host, "large_allreduce_s": seconds, "large_allreduce_bytes": 4e6}
             for host, seconds in (("a", 0.5), ("b", 0.45))]
    assert ring_goodput(links, 0.010, 1e-9) == pytest.approx(4e6 / 0.476)
    # 4 ranks placed a, a, b, b: one ring edge leaves each host
    four = [{**links[0], "host": host} for host in "aabb"]
    assert ring_goodput(four, 0.010, 0.0) == pytest.approx(4e6 / 0.44)
    assert ring_goodput([{"host": "a", "small_allgather_s": 0.001}], 0.01, 0.0) is None
    assert ring_goodput(links, 1.0, 0.0) is None  # nothing left for the bytes


def test_predict_absorbs_the_straggler_spread_while_every_rank_waits_on_the_link():
    link = {"bytes_per_s": 1e6, "latency_s": 0.0}
    codec = {"decode_s": 0.0, "encode_s": 0.0, "parameters": 1}
    dense = Cell("100mbit", 1, "dense", step_s=[1.0], bytes_per_step=[5e3],
                 hosts_of_ranks=["a", "b"])  # 5 ms on the link
    predict(dense, 0.05, codec, link, jitter_s=0.02)
    assert dense.terms["straggler_s"] == pytest.approx(0.015)
    predict(dense, 0.05, codec, link, jitter_s=0.004)
    assert dense.terms["straggler_s"] == 0.0


def test_predict_counts_log2_hops_and_each_bruck_steps_busiest_link_in_mesh_mode():
    link = {"bytes_per_s": 1e6, "latency_s": 1e-3}
    codec = {"decode_s": 0.0, "encode_s": 0.0, "parameters": 1}
    hosts = ["a", "b", "c", "d", "a", "b", "c", "d"]  # 8 ranks, two per host, interleaved
    mesh = Cell("100mbit", 2, "sharing_mesh", step_s=[1.0], bytes_per_step=[7e3],
                hosts_of_ranks=hosts)
    predict(mesh, 0.0, codec, link)
    assert mesh.terms["latency_s"] == pytest.approx(3 * 1e-3)  # ⌈log2 8⌉ steps, not 7
    # 1 KB messages; steps of distance 1, 2, 4 send 1, 2, 4 of them; distance 4 stays on the
    # host (rank r and r + 4 share it), the others leave every host twice
    assert bruck_link_bytes(hosts, 7e3) == pytest.approx(2 * 1e3 + 2 * 2e3)
    assert mesh.terms["wire_s"] == pytest.approx(6e3 / 1e6)


def test_ranks_option_takes_an_even_count_of_at_least_four():
    from benchmarks import scaling

    try:
        scaling._grid(8)
        assert (scaling.HOSTS, scaling.ROWS) == (4, 2560)
        with pytest.raises(ValueError, match="--ranks: expected an even number"):
            scaling._grid(7)
    finally:
        scaling._grid(None)
    assert (scaling.HOSTS, scaling.ROWS) == (2, 1280)
