"""The benchmarks' measuring helpers: alternation order and paired ratios."""

from collections import Counter
from itertools import pairwise

import pytest

from benchmarks.report import (
    alternate,
    alternate_samples,
    balanced_orders,
    median_interval,
    paired_ratio,
    target_verdict,
)


def test_alternate_samples_follows_the_balanced_orders_and_keeps_every_round():
    calls = []
    candidates = {name: (lambda name=name: calls.append(name)) for name in "abcd"}
    samples = alternate_samples(candidates, repeats=5, warmup=1)
    assert calls == list("abcd" "abdc" "bcad" "cdba" "dacb" "abdc")
    assert {name: len(times) for name, times in samples.items()} == dict.fromkeys("abcd", 5)
    assert set(alternate(candidates, repeats=2, warmup=0)) == set("abcd")


@pytest.mark.parametrize("n", range(1, 8))
def test_in_the_balanced_orders_each_candidate_follows_each_other_equally_often(n):
    orders = balanced_orders(n)
    assert all(sorted(order) == list(range(n)) for order in orders)
    assert Counter(order[0] for order in orders) == dict.fromkeys(range(n), len(orders) // n)
    pairs = Counter((a, b) for order in orders for a, b in pairwise(order))
    expected = 1 if n % 2 == 0 else 2
    assert pairs == {(a, b): expected for a in range(n) for b in range(n) if a != b}


def test_paired_ratio_compares_timings_of_the_same_round():
    # Load slowed the reference alone in round 2 and both in round 3: the ratio of
    # medians (10 / 2 = 5) mixes rounds, the paired ratio does not.
    reference = [1.0, 10.0, 10.0]
    candidate = [2.0, 1.0, 20.0]
    assert paired_ratio(reference, candidate) == pytest.approx(0.5)


@pytest.mark.parametrize("reference, candidate", [([], []), ([1.0, 2.0], [1.0])])
def test_paired_ratio_needs_matching_rounds(reference, candidate):
    with pytest.raises(ValueError, match="same non-zero number of rounds"):
        paired_ratio(reference, candidate)


def test_the_median_interval_is_the_binomial_order_statistics():
    # n = 40: P(Binomial(40, 1/2) <= 13) = 0.019 <= 0.025 < P(<= 14) = 0.040
    assert median_interval([float(v) for v in range(40, 0, -1)]) == (14.0, 27.0)
    assert median_interval(list(range(1, 7))) == (1, 6)  # 1 - 2/64 = 0.969 >= 0.95
    assert median_interval(list(range(1, 6))) == (1, 5)  # too few: the extremes
    assert median_interval([2.5]) == (2.5, 2.5)
    assert median_interval(list(range(1, 41)), confidence=0.5) == (18, 23)
    with pytest.raises(ValueError, match="at least one"):
        median_interval([])
    with pytest.raises(ValueError, match="confidence"):
        median_interval([1.0], confidence=1.0)


@pytest.mark.parametrize("interval, verdict", [
    ((1.02, 1.04), "met"), ((1.02, 1.05), "met"), ((1.04, 1.07), "within noise"),
    ((1.06, 1.09), "missed")])
def test_a_target_is_met_or_missed_only_by_the_whole_interval(interval, verdict):
    assert target_verdict(interval, 1.05) == verdict


def test_the_in_process_measurement_sets_the_sharing_steps_floors_beside_the_modes(capsys):
    from benchmarks.scaling import ONE_PASS, SWEEP, measure_exchange_cpu

    seconds, ratios, intervals = measure_exchange_cpu(("compute", "dense"), repeats=2,
                                                      floor=True)
    assert set(seconds) == {"compute", "dense", ONE_PASS, SWEEP}
    assert all(s > 0 for s in seconds.values())
    assert ratios["compute"] == 1.0 and ratios[ONE_PASS] > 0 and ratios[SWEEP] > 0
    assert set(intervals) == set(seconds) and intervals["compute"] == (1.0, 1.0)
    assert all(low <= ratios[m] <= high for m, (low, high) in intervals.items())
    printed = capsys.readouterr().out
    assert ONE_PASS in printed and SWEEP in printed  # rows of the printed table
    dense_row = next(line for line in printed.splitlines() if line.strip().startswith("dense"))
    low, high = intervals["dense"]
    assert f"{low:.3f}-{high:.3f}" in dense_row
    assert target_verdict(intervals["dense"], 1.10) in dense_row
    seconds, _, intervals = measure_exchange_cpu(("dense",), repeats=1, floor=True)
    assert set(seconds) == {"dense"} and intervals == {}  # no plain step: no ratio


def test_the_sweep_floor_reads_its_vector_and_leaves_it_as_it_is():
    import numpy as np

    from sparkdl.compression.encoding import threshold_encode
    from sparkdl.compression.threshold import MAX_TAU

    vector = np.random.default_rng(1).normal(0.0, 1.0, 300_000).astype(np.float32)
    before = vector.copy()
    assert threshold_encode(vector, MAX_TAU, check_finite=True).nnz == 0
    np.testing.assert_array_equal(vector, before)  # every round sweeps the same vector


def test_first_minute_phases_come_from_the_jobs_own_log_lines():
    from datetime import datetime

    from benchmarks.first_minute import MARKERS, phases

    t0 = datetime(2026, 11, 29, 12, 0, 0).timestamp()
    lines = ["WARNING: Using incubator modules: jdk.incubator.vector"]
    offsets = {"starting Spark": 2.0, "Spark started in 3.0 s": 5.0,
               "etl: 1423 train, 374 test rows written in 4.0 s": 9.5,
               "fit: sharing, 2 workers x batch 32": 10.0, "the workers are ready": 13.0,
               "train: the model and its metrics written to x": 20.0,
               "evaluate: the evaluation and report written to y": 23.0}
    for message, at in offsets.items():
        stamp = datetime.fromtimestamp(t0 + at).strftime("%Y-%m-%d %H:%M:%S,%f")[:-3]
        lines.append(f"{stamp} INFO sparkdl: {message}")
    found = phases("\n".join(lines), t0, t0 + 25.0)
    assert list(found) == [*MARKERS, "exit"]
    assert [round(v, 3) for v in found.values()] == [2.0, 3.0, 4.5, 0.5, 3.0, 7.0, 3.0, 2.0]
