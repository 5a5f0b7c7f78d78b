"""The scaling model at N ranks, on paper: bytes, sequential hops and step time per exchange
mode, and its extrapolation to 64–1024 workers (``jobs/benchmark.py scaling-model``).

Per step and per worker, for ``N`` ranks, a message of ``m`` bytes (sharing), ``P`` float32
parameters (dense) and PowerSGD factors of ``f`` bytes (all float32)::

    dense ring allreduce      bytes 2(N-1)/N · 4P     hops 2(N-1)
    sharing, plain (ring)     bytes (N-1) · m         hops N-1            + (N-1) decodes
    sharing, mesh (Bruck)     bytes (N-1) · m         hops ⌈log2 N⌉       + (N-1) decodes
    PowerSGD (ring allreduce  bytes 2(N-1)/N · f      hops 2 · 2(N-1)
      of P, then of Q)

    step = C · s + bytes / R + hops · α + decodes · D · s      (synchronous)
    s    = max(1, workers on a host / its cores)                (CPU oversubscription)

PowerSGD's factors (Vogels et al. 2019; PyTorch's ``powerSGD_hook``): every tensor of more
than one dimension, seen as a matrix ``(prod(shape[:-1]), shape[-1])`` (Keras kernels put the
output units last), is sent as ``P`` (rows · r) and ``Q`` (cols · r) unless that is not smaller
than the matrix; 1-D tensors (biases, normalisation) are summed dense. :func:`powersgd_floats`
computes the sizes from layer shapes only (no compressor, no TensorFlow).

Nothing here imports TensorFlow or Spark; the measured cells are in
:mod:`benchmarks.scaling`, which uses :func:`collective_cost` for its N-rank terms.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from benchmarks.report import print_table

FLOAT = 4
MODES = ("dense", "sharing_plain", "sharing_mesh", "powersgd")
LABELS = {"dense": "dense ring allreduce", "sharing_plain": "sharing, plain ring",
          "sharing_mesh": "sharing, mesh (Bruck)", "powersgd": "PowerSGD (rank 4)"}

# LeNet as sparkdl.models.lenet builds it for 28x28x1 inputs and 10 classes (Keras shapes;
# tests/unit/test_scaling_model.py checks them against the built model)
LENET_SHAPES: tuple[tuple[int, ...], ...] = (
    (5, 5, 1, 20), (20,), (5, 5, 20, 50), (50,), (800, 500), (500,), (500, 10), (10,))


def resnet50_shapes(classes: int = 1000) -> list[tuple[int, ...]]:
    """Trainable tensor shapes of a ResNet-50 (He et al. 2016; Keras ``ResNet50`` layout:
    convolutions with bias, batch normalisation's gamma and beta): 25.6M parameters."""
    shapes: list[tuple[int, ...]] = []

    def conv(k: int, cin: int, cout: int) -> None:
        shapes.extend([(k, k, cin, cout), (cout,), (cout,), (cout,)])  # kernel, bias, BN

    conv(7, 3, 64)
    cin = 64
    for blocks, width in ((3, 64), (4, 128), (6, 256), (3, 512)):
        for block in range(blocks):
            if block == 0:
                conv(1, cin, 4 * width)  # projection shortcut
            conv(1, cin, width)
            conv(3, width, width)
            conv(1, width, 4 * width)
            cin = 4 * width
    shapes.extend([(cin, classes), (classes,)])
    return shapes


def num_parameters(shapes: Iterable[Sequence[int]]) -> int:
    return sum(math.prod(shape) for shape in shapes)


def powersgd_floats(shapes: Iterable[Sequence[int]], rank: int = 4) -> int:
    """Floats one PowerSGD step allreduces (P and Q of each compressed matrix, the whole of
    every other tensor), by the compressor's own rule
    (:func:`sparkdl.compression.powersgd.message_floats`)."""
    from sparkdl.compression.powersgd import message_floats

    return message_floats([tuple(shape) for shape in shapes], rank)


def sharing_message_bytes(parameters: int, sparsity: float, bytes_per_element: float = 4.0,
                          header: int = 64) -> float:
    """One threshold-encoded message: ``sparsity · P`` elements of ``bytes_per_element``
    (the encoding's index-and-sign integer) plus a fixed header."""
    return header + bytes_per_element * sparsity * parameters


def bruck_steps(ranks: int) -> int:
    return math.ceil(math.log2(ranks)) if ranks > 1 else 0


@dataclass(frozen=True)
class Cost:
    """One collective pattern's cost per worker per step."""

    bytes_sent: float
    hops: float
    decodes: int = 0


def collective_cost(mode: str, ranks: int, *, dense_bytes: float = 0.0,
                    message_bytes: float = 0.0, factor_bytes: float = 0.0) -> Cost:
    """Bytes a worker sends per step and the sequential hops it waits for (see the module
    docstring); ``mode``: ``dense``, ``sharing``/``sharing_plain``/``sharing_overlap``,
    ``sharing_mesh`` or ``powersgd``."""
    n = ranks
    if n < 2:
        return Cost(0.0, 0.0)
    ring = 2.0 * (n - 1) / n
    if mode == "dense":
        return Cost(ring * dense_bytes, 2.0 * (n - 1))
    if mode == "powersgd":
        return Cost(ring * factor_bytes, 4.0 * (n - 1))  # P's allreduce, then Q's
    if mode == "sharing_mesh":
        return Cost((n - 1) * message_bytes, float(bruck_steps(n)), n - 1)
    if mode in ("sharing", "sharing_plain", "sharing_overlap"):
        return Cost((n - 1) * message_bytes, float(n - 1), n - 1)
    raise ValueError(f"unknown mode {mode!r}: expected one of {', '.join(MODES)}")


def oversubscription(workers_per_host: int, cores_per_host: int) -> float:
    """How many times slower a CPU-bound step runs when ``workers_per_host`` one-thread
    workers share ``cores_per_host`` cores."""
    return max(1.0, workers_per_host / max(1, cores_per_host))


def collective_steps(collective: str, algorithm: str, ranks: int, nbytes: float
                     ) -> list[float]:
    """Bytes one rank sends in each sequential step of one collective of ``nbytes`` per rank
    (one rank per host: a step's bytes cross its host link). ``collective``: ``allgather``
    or ``allreduce``; ``algorithm``: ``ring`` or ``mesh`` (Bruck's allgather, Rabenseifner's
    halving-doubling allreduce, as :mod:`sparkdl.comm.mesh` runs them)."""
    n = ranks
    if n < 2:
        return []
    if collective == "allgather":
        if algorithm == "ring":
            return [float(nbytes)] * (n - 1)
        from sparkdl.comm.mesh import distances

        return [min(d, n - d) * float(nbytes) for d in distances(n)]
    if algorithm == "ring":  # reduce-scatter then allgather of N chunks
        return [nbytes / n] * (2 * (n - 1))
    power = 1 << (n.bit_length() - 1)
    halving = [nbytes / (1 << (k + 1)) for k in range(power.bit_length() - 1)]
    fold = [float(nbytes)] if n > power else []  # the extra ranks' whole vectors, in and out
    return fold + halving + halving[::-1] + fold


def collective_seconds(steps: Sequence[float], hop_s: float, bytes_per_s: float) -> float:
    """One collective's time: each sequential step takes the longer of its fixed cost
    ``hop_s`` (the ranks' CPU work and wake-ups; stretched by :func:`oversubscription` where
    ranks share cores) and its bytes' time on the link — one step's CPU work overlaps the
    link's transfer of another, so the busier of the two sets the pace."""
    return sum(max(hop_s, b / bytes_per_s) for b in steps)


@dataclass(frozen=True)
class Scenario:
    """What the extrapolation assumes (stated in docs/scaling.md)."""

    name: str
    shapes: tuple[tuple[int, ...], ...]
    compute_s: float  # forward + backward + optimizer per step, one worker
    sparsity: float = 1e-3
    powersgd_rank: int = 4
    hop_s: float = 50e-6  # one sequential message: link latency plus software cost
    decode_s_per_element: float = 20e-9  # measured here: 0.03 ms for 1,093 elements
    decode_fixed_s: float = 8e-6

    @cached_property
    def parameters(self) -> int:
        return num_parameters(self.shapes)

    @cached_property
    def factor_floats(self) -> int:
        return powersgd_floats(self.shapes, self.powersgd_rank)


def step_seconds(scenario: Scenario, mode: str, ranks: int, bytes_per_s: float,
                 workers_per_host: int = 1, cores_per_host: int = 1) -> float:
    """Synchronous step time (no overlap) of ``mode`` at ``ranks`` workers."""
    params = scenario.parameters
    message = sharing_message_bytes(params, scenario.sparsity)
    cost = collective_cost(
        mode, ranks, dense_bytes=FLOAT * params, message_bytes=message,
        factor_bytes=FLOAT * scenario.factor_floats)
    share = oversubscription(workers_per_host, cores_per_host)
    decode = cost.decodes * (scenario.decode_fixed_s
                             + scenario.decode_s_per_element * scenario.sparsity * params)
    return (scenario.compute_s * share + cost.bytes_sent / bytes_per_s
            + cost.hops * scenario.hop_s + decode * share)


def efficiency(scenario: Scenario, mode: str, ranks: int, bytes_per_s: float) -> float:
    """Scaling efficiency: compute-only step ÷ step (throughput per worker vs one worker)."""
    return scenario.compute_s / step_seconds(scenario, mode, ranks, bytes_per_s)


def crossovers(scenario: Scenario, a: str, b: str, bytes_per_s: float,
               max_ranks: int = 4096) -> list[int]:
    """The rank counts (2 to ``max_ranks``) at which the faster of ``a`` and ``b`` changes:
    the first ``N`` with the other order."""
    out = []
    previous = None
    for n in range(2, max_ranks + 1):
        a_faster = step_seconds(scenario, a, n, bytes_per_s) <= step_seconds(
            scenario, b, n, bytes_per_s)
        if previous is not None and a_faster != previous:
            out.append(n)
        previous = a_faster
    return out


def faster_at(scenario: Scenario, a: str, b: str, bytes_per_s: float, ranks: int) -> str:
    return a if step_seconds(scenario, a, ranks, bytes_per_s) <= step_seconds(
        scenario, b, ranks, bytes_per_s) else b


SCENARIOS = (
    # LeNet: batch 32 on one GPU or a few CPU cores; ResNet-50: batch 64 on a V100, fp32
    # (about 380 images/s)
    Scenario("LeNet", LENET_SHAPES, compute_s=5e-3),
    Scenario("ResNet-50 (25.6M)", tuple(resnet50_shapes()), compute_s=0.17),
)
RATES = {"10 Gbit/s": 10e9 / 8 * 0.94, "100 Gbit/s": 100e9 / 8 * 0.94}  # TCP goodput
WORKERS = (64, 256, 1024)


def extrapolate(workers: Sequence[int] = WORKERS) -> dict[str, Any]:
    """Step time and efficiency per scenario, rate, mode and worker count; crossovers."""
    out: dict[str, Any] = {"scenarios": {}}
    for sc in SCENARIOS:
        entry: dict[str, Any] = {
            "parameters": sc.parameters, "compute_s": sc.compute_s, "sparsity": sc.sparsity,
            "powersgd_floats": powersgd_floats(sc.shapes, sc.powersgd_rank),
            "sharing_message_bytes": sharing_message_bytes(sc.parameters, sc.sparsity),
            "hop_s": sc.hop_s, "rates": {}}
        for rate_name, rate in RATES.items():
            cells = {mode: {str(n): {"step_s": step_seconds(sc, mode, n, rate),
                                     "efficiency": efficiency(sc, mode, n, rate)}
                            for n in workers} for mode in MODES}
            crossings = {
                f"{a} vs {b}": {"faster_at_2": faster_at(sc, a, b, rate, 2),
                                "order_changes_at": crossovers(sc, a, b, rate)}
                for a, b in (("sharing_plain", "dense"), ("sharing_mesh", "dense"),
                             ("sharing_mesh", "powersgd"), ("powersgd", "dense"))}
            entry["rates"][rate_name] = {"cells": cells, "crossovers": crossings}
        out["scenarios"][sc.name] = entry
    return out


def chart(path: str, max_ranks: int = 1024) -> None:
    """Scaling efficiency against workers, per scenario (columns) and rate (rows)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ranks = [2 ** k for k in range(1, int(math.log2(max_ranks)) + 1)]
    fig, axes = plt.subplots(len(RATES), len(SCENARIOS), figsize=(11, 7.5), sharex=True,
                             sharey=True, squeeze=False)
    styles = {"dense": "C0-o", "sharing_plain": "C1-s", "sharing_mesh": "C2-^",
              "powersgd": "C3-D"}
    for row, (rate_name, rate) in enumerate(RATES.items()):
        for col, sc in enumerate(SCENARIOS):
            ax = axes[row][col]
            for mode in MODES:
                ax.plot(ranks, [100 * efficiency(sc, mode, n, rate) for n in ranks],
                        styles[mode], label=LABELS[mode], markersize=4)
            if sc.parameters > 10**7:  # Horovod's published point is for large CNNs
                ax.plot([512], [90], "k*", markersize=12,
                        label="Horovod, ResNet-101, 512 GPUs, overlapped (~90 %)")
                ax.legend(fontsize=8, loc="lower left")
            ax.set_xscale("log", base=2)
            ax.set_ylim(0, 105)
            ax.grid(True, alpha=0.3)
            ax.set_title(f"{sc.name}, {sc.parameters / 1e6:.2f}M params, "
                         f"{sc.compute_s * 1e3:g} ms compute — {rate_name}", fontsize=9)
            if row == len(RATES) - 1:
                ax.set_xlabel("workers")
            if col == 0:
                ax.set_ylabel("scaling efficiency, % (synchronous)")
    fig.suptitle("Scaling model extrapolated (docs/scaling.md): compute step ÷ step time",
                 fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run(options: dict[str, Any]) -> dict[str, Any]:
    figures = extrapolate()
    for name, entry in figures["scenarios"].items():
        for rate_name, per_rate in entry["rates"].items():
            rows = []
            for mode in MODES:
                row: list[Any] = [LABELS[mode]]
                for n in WORKERS:
                    c = per_rate["cells"][mode][str(n)]
                    row += [c["step_s"] * 1e3, f"{100 * c['efficiency']:.0f} %"]
                rows.append(tuple(row))
            header = ["mode"] + [x for n in WORKERS for x in (f"{n} ms", f"{n} eff")]
            print_table(f"{name} ({entry['parameters']:,} parameters), {rate_name}", header,
                        rows)
            for key, value in per_rate["crossovers"].items():
                changes = ", ".join(map(str, value["order_changes_at"]))
                print(f"  {key}: {value['faster_at_2']} faster at 2 workers; "
                      + (f"the order changes at {changes} workers" if changes
                         else "the same order up to 4096 workers"))
    if options.get("png"):
        chart(options["png"])
        print(f"chart written to {options['png']}", file=sys.stderr)
    return figures
