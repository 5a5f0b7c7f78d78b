"""Measuring helpers: alternate candidates in one run, report medians and ratios."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping, Sequence


def alternate(
    candidates: Mapping[str, Callable[[], object]],
    repeats: int = 7,
    warmup: int = 1,
) -> dict[str, float]:
    """Time each candidate ``repeats`` times, interleaved (A B C, B C A, C A B, ...), after
    ``warmup`` untimed rounds; return the median seconds per candidate.

    Interleaving spreads the noise of a shared machine evenly over all candidates, so their
    ratio is meaningful even when absolute times are not; rotating the order each round
    keeps any one candidate from always running right after another (whose after-effects,
    such as background threads still winding down, would otherwise land on it alone).
    """
    for _ in range(warmup):
        for fn in candidates.values():
            fn()
    samples: dict[str, list[float]] = {name: [] for name in candidates}
    names = list(candidates)
    for round_index in range(repeats):
        shift = round_index % len(names) if names else 0
        for name in names[shift:] + names[:shift]:
            fn = candidates[name]
            start = time.perf_counter()
            fn()
            samples[name].append(time.perf_counter() - start)
    return {name: statistics.median(times) for name, times in samples.items()}


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
