"""Measuring helpers: alternate candidates in one run, report medians and ratios."""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Mapping, Sequence


def alternate_samples(
    candidates: Mapping[str, Callable[[], object]],
    repeats: int = 7,
    warmup: int = 1,
) -> dict[str, list[float]]:
    """Time each candidate ``repeats`` times, interleaved, after ``warmup`` untimed rounds;
    return every candidate's seconds, round by round.

    Interleaving spreads the noise of a shared machine evenly over all candidates, so their
    ratio is meaningful even when absolute times are not. The rounds follow a Williams
    design (:func:`balanced_orders`): within a cycle of rounds every candidate runs right
    after every other one equally often, so the after-effects of one (background threads
    still winding down, a cache it filled) land on all the others alike, not on the one
    that happens to follow it (a plain rotation keeps the cyclic order: B always after A).
    """
    for _ in range(warmup):
        for fn in candidates.values():
            fn()
    samples: dict[str, list[float]] = {name: [] for name in candidates}
    names = list(candidates)
    orders = balanced_orders(len(names))
    for round_index in range(repeats):
        for i in orders[round_index % len(orders)]:
            fn = candidates[names[i]]
            start = time.perf_counter()
            fn()
            samples[names[i]].append(time.perf_counter() - start)
    return samples


def balanced_orders(n: int) -> list[list[int]]:
    """A Williams design for ``n`` candidates: ``n`` orders (``2n`` when ``n`` is odd) in
    which each candidate comes first equally often and runs right after each other candidate
    equally often."""
    if n <= 1:
        return [list(range(n))]
    first = [0]
    for k in range(1, n):
        first.append((k + 1) // 2 if k % 2 else n - k // 2)
    rows = [[(c + i) % n for c in first] for i in range(n)]
    if n % 2:
        rows += [row[::-1] for row in rows]
    return rows


def alternate(
    candidates: Mapping[str, Callable[[], object]],
    repeats: int = 7,
    warmup: int = 1,
) -> dict[str, float]:
    """:func:`alternate_samples`, reduced to the median seconds per candidate."""
    samples = alternate_samples(candidates, repeats, warmup)
    return {name: statistics.median(times) for name, times in samples.items()}


def paired_ratio(reference: Sequence[float], candidate: Sequence[float]) -> float:
    """Median over rounds of ``reference / candidate`` seconds (> 1: the candidate is faster).

    Each round's two timings ran next to each other, under the same load, so a change of load
    between rounds (another job on a shared machine starting or ending) cancels in the ratio;
    a ratio of the two medians would take each median from different rounds.
    """
    return statistics.median(paired_ratios(reference, candidate))


def paired_ratios(reference: Sequence[float], candidate: Sequence[float]) -> list[float]:
    """Each round's ``reference / candidate`` seconds (:func:`paired_ratio` is their median;
    :func:`median_interval` bounds it)."""
    if len(reference) != len(candidate) or not reference:
        raise ValueError(
            f"need the same non-zero number of rounds, got {len(reference)} and {len(candidate)}"
        )
    return [r / c for r, c in zip(reference, candidate)]


def median_interval(values: Sequence[float], confidence: float = 0.95) -> tuple[float, float]:
    """A distribution-free interval that holds the median of what ``values`` sample with
    at least ``confidence``: the ``k``-th smallest and ``k``-th largest value, ``k`` the
    largest with ``P(Binomial(n, 1/2) < k) <= (1 - confidence) / 2``. With too few values
    for that (fewer than 6 at 0.95), the smallest and the largest, which hold it with less."""
    if not values:
        raise ValueError("need at least one value")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence!r}")
    ordered = sorted(values)
    n = len(ordered)
    tail = (1 - confidence) / 2
    k, below = 0, 0.0  # below: P(Binomial(n, 1/2) < k + 1)
    while k < n // 2:
        below += math.comb(n, k) / 2**n
        if below > tail:
            break
        k += 1
    k = max(k, 1)
    return ordered[k - 1], ordered[n - k]


def target_verdict(interval: tuple[float, float], target: float) -> str:
    """Whether a ratio whose median lies in ``interval`` meets an upper ``target``: ``"met"``
    (the whole interval at or below it), ``"missed"`` (the whole interval above it), or
    ``"within noise"``."""
    low, high = interval
    if high <= target:
        return "met"
    return "missed" if low > target else "within noise"


def format_table(title: str, columns: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """Render rows as a fixed-width text table under a title."""

    def cell(value: object) -> str:
        if isinstance(value, float):
            return f"{value:.4g}"
        return str(value)

    text_rows = [[cell(v) for v in row] for row in rows]
    widths = [max(len(c), *(len(r[i]) for r in text_rows)) for i, c in enumerate(columns)]
    line = "  ".join("-" * w for w in widths)
    out = [title, "  ".join(c.ljust(w) for c, w in zip(columns, widths)), line]
    out += ["  ".join(v.rjust(w) for v, w in zip(r, widths)) for r in text_rows]
    return "\n".join(out)


def print_table(title: str, columns: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
    print(format_table(title, columns, rows), flush=True)
