"""The benchmarks' measuring helpers: alternation order and paired ratios."""

import pytest

from sparkdl.benchmarks.report import alternate, alternate_samples, paired_ratio


def test_alternate_samples_rotates_the_order_and_keeps_every_round():
    calls = []
    candidates = {name: (lambda name=name: calls.append(name)) for name in "abc"}
    samples = alternate_samples(candidates, repeats=3, warmup=1)
    assert calls == list("abc" "abc" "bca" "cab")
    assert {name: len(times) for name, times in samples.items()} == {"a": 3, "b": 3, "c": 3}
    assert set(alternate(candidates, repeats=2, warmup=0)) == {"a", "b", "c"}


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
