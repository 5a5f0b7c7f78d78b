"""Benchmark: threshold encode / decode against one numpy copy of the same vector.

Method. For each size (1M, 10M float32 elements) and sparsity p (the fraction of elements
with ``|r| >= tau``: 1e-3, 1e-2, and 0.1 which takes the bitmap path) a standard-normal
residual is generated once and tau set to its exact (1 - p) quantile.

* encode: ``threshold_encode`` modifies the residual, so before *every* timed call (encode
  and its copy baseline alike) a working buffer is restored from the pristine vector with an
  untimed ``np.copyto``. Then the timed region is either ``threshold_encode(work, tau)`` or
  ``np.copyto(dst, work)``: both read the same freshly written input, so the cache state is
  the same. The two alternate (A B A B ...), and medians are compared.
* decode: ``decode_into`` of the message from the encode step, adding into one float32
  output, alternated with ``np.copyto(dst, src)`` via :func:`report.alternate`.

Bandwidth is input bytes per second: ``4 * n`` for encode (the residual read) and for decode
(the vector decoded into), and ``4 * n`` for the copy. ``*_vs_copy`` = our bandwidth / copy
bandwidth (1.0 = as fast as one memory pass; higher is better).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from benchmarks.report import alternate, print_table
from sparkdl.compression.encoding import decode_into, threshold_encode

SIZES = (1_000_000, 10_000_000)
SPARSITIES = (1e-3, 1e-2, 0.1)


def _alternate_with_setup(
    setup: Callable[[], None],
    candidates: dict[str, Callable[[], object]],
    repeats: int,
    warmup: int,
) -> dict[str, float]:
    """Like :func:`report.alternate`, but runs ``setup`` untimed before every timed call."""
    samples: dict[str, list[float]] = {name: [] for name in candidates}
    for round_ in range(warmup + repeats):
        for name, fn in candidates.items():
            setup()
            start = time.perf_counter()
            fn()
            elapsed = time.perf_counter() - start
            if round_ >= warmup:
                samples[name].append(elapsed)
    return {name: statistics.median(times) for name, times in samples.items()}


def _tau_for(values: np.ndarray, sparsity: float) -> tuple[float, int]:
    """Tau such that exactly ``round(sparsity * n)`` elements have ``|r| >= tau``."""
    magnitude = np.abs(values)
    k = max(1, round(sparsity * values.size))
    tau = float(np.partition(magnitude, values.size - k)[values.size - k])
    return tau, k


def run(options: dict[str, Any]) -> dict[str, Any]:
    """Run the encoding benchmark; print a table and return the figures as JSON-ready dict."""
    quick = bool(options.get("quick", False))
    repeats = int(options.get("repeats", 5 if quick else 15))
    warmup = 1
    sizes = tuple(options.get("sizes", SIZES))
    sparsities = tuple(options.get("sparsities", SPARSITIES))
    rng = np.random.default_rng(int(options.get("seed", 0)))
    cases: list[dict[str, Any]] = []
    rows: list[list[object]] = []
    for n in sizes:
        src = rng.standard_normal(n).astype(np.float32)
        work = np.empty_like(src)
        dst = np.empty_like(src)
        out = np.zeros_like(src)

        def restore(src: np.ndarray = src, work: np.ndarray = work) -> None:
            np.copyto(work, src)

        for sparsity in sparsities:
            tau, k = _tau_for(src, sparsity)
            encoded = threshold_encode(src.copy(), tau)
            enc = _alternate_with_setup(
                restore,
                {
                    "encode": lambda work=work, tau=tau: threshold_encode(work, tau),
                    "copy": lambda work=work, dst=dst: np.copyto(dst, work),
                },
                repeats,
                warmup,
            )
            dec = alternate(
                {
                    "decode": lambda e=encoded, n=n, out=out: decode_into(
                        e.encoding, e.payload, n, e.tau, out
                    ),
                    "copy": lambda src=src, dst=dst: np.copyto(dst, src),
                },
                repeats=repeats,
                warmup=warmup,
            )
            nbytes = 4 * n
            for op, timing in (("encode", enc), ("decode", dec)):
                ours, copy = timing[op], timing["copy"]
                case = {
                    "op": op,
                    "num_elements": n,
                    "sparsity": sparsity,
                    "nnz": encoded.nnz,
                    "encoding": encoded.encoding.name.lower(),
                    "payload_bytes": len(encoded.payload),
                    "seconds": ours,
                    "copy_seconds": copy,
                    "bytes_per_second": nbytes / ours,
                    "copy_bytes_per_second": nbytes / copy,
                    "vs_copy": copy / ours,
                }
                cases.append(case)
                rows.append(
                    [
                        op,
                        f"{n:,}",
                        sparsity,
                        case["encoding"],
                        encoded.nnz,
                        ours * 1e3,
                        copy * 1e3,
                        nbytes / ours / 1e9,
                        nbytes / copy / 1e9,
                        copy / ours,
                    ]
                )
            assert k == encoded.nnz or k > encoded.nnz  # ties/rejections can only lower it
    print_table(
        f"threshold encoding vs np.copyto (medians of {repeats}, alternated)",
        ["op", "n", "sparsity", "encoding", "nnz", "ms", "copy ms", "GB/s", "copy GB/s", "vs copy"],
        rows,
    )

    def headline(op: str) -> float | None:
        for case in cases:
            if case["op"] == op and case["num_elements"] == 10_000_000 and case["sparsity"] == 1e-3:
                return float(case["vs_copy"])
        return None

    return {
        "encode_vs_copy": headline("encode"),
        "decode_vs_copy": headline("decode"),
        "repeats": repeats,
        "method": "medians of alternated runs; encode input restored untimed before each run",
        "cases": cases,
    }


if __name__ == "__main__":  # pragma: no cover
    import json
    import sys

    result = run({"quick": "--quick" in sys.argv})
    print(json.dumps({k: v for k, v in result.items() if k != "cases"}, indent=2))
