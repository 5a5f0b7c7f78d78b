"""Scaling on a multi-host cluster, next to a performance model that predicts it.

``python jobs/benchmark.py scaling --json PATH [--quick] [--cluster STATE_DIR]`` brings up
the network-namespace harness (:mod:`benchmarks.netcluster`, root needed; or attaches to
a running one), and for every cell — link rate (100 Mbit/s, 1 Gbit/s, unlimited) × workers
per host (1, 2) on 2 hosts × mode (sharing, sharing with overlap, averaging, dense) — fits a
1.1M-parameter model (256 → Dense 4096 → 10) through real Spark barrier stages. It reports
the steady-state step time (epochs after the first), the bytes each worker puts on the wire
per step (the communicator's counters), and what the model below predicts. Rates change
between cells with ``tc`` on the running cluster; repeats alternate the order of the modes
and rates, and each figure is the median over repeats.

``--ranks N`` measures instead ``N // 2`` hosts × 2 workers at 100 Mbit/s and 1 Gbit/s for
sharing (``cluster.mesh: plain`` and ``mesh``), dense, and PowerSGD
(``training.compression: powersgd``) (docs/scaling.md); the N-rank terms come from
:mod:`benchmarks.scaling_model`.

``--cpu-only`` measures only ``T_m / T_0`` below (``exchange_cpu_s`` and the paired ratio of
each mode to the plain train step), on this model and on LeNet, without the cluster or root,
and prints the load average beside it: the quick check of the exchanges' CPU overhead. Each
ratio comes with a 95 % interval for its median (order statistics of the rounds' ratios) and
whether that interval meets the mode's target (``met``, ``missed``, or ``within noise``).

Performance model (all parameters measured in the same run, none fitted to the cells)::

    step = C_m(w) + (N-1)·D·s + wire + hops·H + S_p(w)              (synchronous)
    step = max(C_m(w) + (N-1)·D·s, wire + hops·H) + S_1(w)          (overlap)
    C_m(w) = C(w) + (T_m - T_0) · s
    wire = max(0, k·B - min(b, R·p·C_m(w)) / p) / R + B · ρ
    H = F(w) + L_rate - L_unlimited

* ``C(w)``: compute-only step time with ``w`` workers per host, measured on the cluster by a
  fit of the same model with communication off (parameter averaging that never averages
  inside the measured epochs): forward, backward, optimizer, input pipeline, loop overhead,
  and the CPU sharing of the workers on the machine's cores. With repeats, that fit runs at
  both ends of its workers-per-host block (:func:`block_orders`), and ``C(w)`` is the median
  over both.
* ``T_m - T_0``: the CPU work mode ``m``'s exchange adds per step to the plain train step,
  measured in this process with a one-rank communicator (no communication, one TensorFlow
  thread, alternated), once before and once after each workers-per-host block of cells, so
  it is taken at the load those cells ran at: for sharing forming the update, threshold
  selection, encoding one message, decoding it and applying the sum; for dense the gradient
  and a separate apply. It is added to ``C(w)`` (a fixed amount of work per step, stretched
  by ``s`` where workers share cores), not scaled by ``C(w) / T_0``: the loop and input
  costs in ``C(w)`` do not grow with the exchange.
* ``D``: threshold decode of one message of this model's size at the target sparsity, from
  the encoding benchmark's code (:mod:`benchmarks.encoding`; it also reports the
  encode time ``E``, part of ``T_m``); every worker decodes the ``N-1`` other messages too;
  ``s = max(1, N / cores)`` is the CPU-sharing factor.
* ``B``: bytes one worker sends per step (counters of the cell's own epochs: dense ring
  allreduce ``2(N-1)/N · 4P``; sharing's ring allgather ``(N-1) ·`` message; averaging's
  allreduce of parameters and optimizer state every ``f`` steps).
* ``k``: ring edges ``r -> r+1`` that leave (or enter) the busiest host: only edges between
  hosts use a rate-limited link; ranks on one host share their host's link. The placement of
  ranks on hosts comes from the fit's executor addresses. Topology: one flat ring.
* ``R``: the link's goodput under the ring's own traffic, where every host sends and receives
  at once: the bytes the ring probe's allreduces of the model's size put on the busiest
  host's link, over their time (the slowest rank's median) less the hops' fixed cost and
  ``ρ`` (below), at each limited rate (:func:`ring_goodput`). Two opposite TCP transfers at
  once get less than one alone (at 100 Mbit/s here 7.4 against 12.3 MB/s each), and a ring
  sends both ways for part of each collective, so its rate lies between the two. For the
  unlimited link, and where the probe did not run, ``R`` is the goodput of one TCP transfer
  between two hosts (``NetCluster.transfer_seconds``), which includes TCP/IP framing and the
  kernel's copy cost.
* ``ρ``: the ring's own cost per byte a rank sends beyond the wire (copying into and out of
  its buffers, summing chunks, framing), from the same probe: 5 allreduces of a vector of the
  model's size at the unlimited rate, the slowest rank's median, less the hops' fixed cost
  and the bytes' time on the unlimited link, divided by the bytes a rank sent.
* ``b``: the token bucket of the link's ``tc tbf`` (10 ms of its rate, at least 32 KiB;
  :mod:`benchmarks.netcluster`): it refills while the link idles, during the computing
  part of the ``p`` steps between two collectives (``p = f`` for averaging, else 1), and
  that many bytes then leave at full speed.
* ``S_p(w)``: waiting for the slowest rank, which a fit with communication off does not
  show: ``E[max over ranks of p steps] / p - E[step]``, drawn from each rank's step
  durations in the compute-only fit's timeline (the ranks independent; where a host has
  fewer cores than ranks, its ranks take turns on them, and the draws are the hosts' mean
  step durations instead, :func:`host_step_seconds`). Those ranks run
  free; where a step waits on the link (``W_link``, the wire term's link part), every rank
  leaves the collective together with its CPU idle and starts the next step in lockstep
  (fair share of the cores), so the spread is absorbed: ``S_eff = max(0, S - W_link)``.
  Where the machine has more workers than cores (``s > 1``), ranks that restart together
  each step share the cores fairly, so the free-running spread overstates the wait, but
  each also waits for the last to be scheduled, which the free-running fit never shows.
  There ``S`` is measured instead by a lockstep fit, sharing with a threshold no element
  reaches (each step one allgather of message headers):
  ``S = max(0, T_lockstep - C(w) - (T_lockstep1 - T_0) · s - (N-1) · H)``
  (:func:`lockstep_seconds`), once per point where every rank waits for all others
  (PowerSGD has two: its allreduces of P, then Q), ``/ f`` for averaging.
* ``hops · H``: sequential messages per step (``2(N-1)`` for a ring allreduce, ``N-1`` for the
  allgather, ``2(N-1)/f`` for averaging) times the fixed cost of one hop: ``F(w)``, the ring's
  own per-hop cost measured on the cluster by the barrier-stage probe (50 allgathers of 64
  bytes on the ring a fit builds, at the unlimited rate: the slowest rank's median over
  ``N-1`` hops; it holds the Python, poll and framing cost of a collective), plus what a
  rate-limited link adds to the one-way latency (half the median round trip of a ping-pong
  at the rate, less the unlimited link's).

The machine's cores are shared: with 2 hosts × 2 workers on 2 cores every worker gets half a
core, which ``C(w)`` (measured at ``w``) and ``s`` account for. TensorFlow runs one thread per
worker (``spark.task.cpus=1``). Other users of the machine are not modelled: the load average
is recorded beside the figures.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.report import (
    median_interval,
    paired_ratios,
    print_table,
    target_verdict,
)

HOSTS = 2
CORES_PER_HOST = 2
RATES: tuple[str | None, ...] = ("100mbit", "1gbit", None)
WORKERS_PER_HOST = (1, 2)
MODES = ("sharing", "sharing_overlap", "averaging", "dense")
INPUT_DIM, HIDDEN, CLASSES = 256, 4096, 10
BATCH = 32
ROWS = 1280  # 20 steps per epoch with 2 workers, 10 with 4 (a multiple of the averaging f)
QUICK_ROWS = 640  # --quick: 10 steps per epoch with its 2 workers
#: --quick: unlimited first, so each fit's warm-up epoch (the pass's first rate) is not spent
#: at 100 Mbit/s; both kinds of cell (a limited and the unlimited link) are still measured
QUICK_RATES: tuple[str | None, ...] = (None, "100mbit")
AVERAGING_FREQUENCY = 5
COMPUTE_EPOCHS = 6  # the compute-only fit: a warm-up epoch, then the steps C and S come from
SPARSITY = 1e-3
#: The lockstep fit's threshold: no element reaches it, so each step sends a message's header
LOCKSTEP_TAU = 1e30
#: Points per step where every rank waits for every other (PowerSGD allreduces P, then Q)
SYNC_POINTS = {"powersgd": 2}
SMALL_COLLECTIVES = 50  # 64-byte allgathers the ring probe times
LARGE_COLLECTIVES = 5  # allreduces of the model's size the ring probe times
RATE_COLLECTIVES = 3  # the same at each limited rate (the ring's goodput)
DENSE_FLOATS = INPUT_DIM * HIDDEN + HIDDEN + HIDDEN * CLASSES + CLASSES
# ``--ranks N``: N // 2 hosts x 2 workers, one warm-up epoch and one per rate (twice)
RANKS_MODES = ("sharing", "sharing_mesh", "dense", "powersgd")
RANKS_RATES: tuple[str | None, ...] = ("100mbit", "1gbit")


@dataclass
class Cell:
    """One measured configuration and its prediction."""

    rate: str | None
    workers_per_host: int
    mode: str
    step_s: list[float] = field(default_factory=list)
    bytes_per_step: list[float] = field(default_factory=list)
    phases: dict[str, float] = field(default_factory=dict)
    hosts_of_ranks: list[str] = field(default_factory=list)
    sparsity: float | None = None
    predicted_s: float | None = None
    terms: dict[str, float] = field(default_factory=dict)
    missing: str | None = None
    final_loss: float | None = None
    loads: list[float] = field(default_factory=list)  # 1-minute load average after each fit

    @property
    def key(self) -> str:
        return f"{self.mode}/{_rate_name(self.rate)}/{self.workers_per_host}x{HOSTS}"

    @property
    def measured_s(self) -> float | None:
        return statistics.median(self.step_s) if self.step_s else None

    @property
    def load(self) -> float | None:
        """The highest 1-minute load average after any of its fits (a cell measured in
        several fits is as good as its busiest one)."""
        return max(self.loads) if self.loads else None


def _rate_name(rate: str | None) -> str:
    return rate or "unlimited"


def _grid(ranks: int | None, quick: bool = False) -> None:
    """The hosts and data size of the run: 2 hosts (the default grid; ``--quick``: half the
    rows, 10 steps per epoch, still a multiple of the averaging f), or ``ranks // 2`` hosts x
    2 workers for ``--ranks`` (10 steps per epoch at 8 ranks)."""
    global HOSTS, ROWS
    if ranks is None:
        HOSTS, ROWS = 2, QUICK_ROWS if quick else 1280
        return
    if ranks < 4 or ranks % 2:
        raise ValueError(f"--ranks: expected an even number of ranks >= 4, got {ranks}")
    HOSTS, ROWS = ranks // 2, 10 * BATCH * ranks


def run(options: dict[str, Any]) -> dict[str, Any]:
    from benchmarks.netcluster import NetCluster, check_privileges

    if options.get("cpu_only"):
        return run_cpu_only(options)
    ranks = options.get("ranks")
    quick = bool(options.get("quick"))
    _grid(ranks, quick)
    rates = RANKS_RATES if ranks else QUICK_RATES if quick else RATES
    per_host = (2,) if ranks else (1,) if quick else WORKERS_PER_HOST
    repeats = int(options.get("repeats") or (1 if quick or ranks else 2))
    check_privileges()
    attach = options.get("cluster")
    workdir = Path(tempfile.mkdtemp(prefix="sparkdl-scaling-"))
    if attach:
        cluster = NetCluster.attach(attach)
        owned = False
    else:
        cluster = NetCluster(HOSTS, CORES_PER_HOST, state_dir=workdir / "cluster",
                             name="sdlr" if ranks else "sdlb",
                             subnet="10.77.6" if ranks else "10.77.5")
        owned = True
    original_rate = cluster.rate
    started = time.time()
    load_before = os.getloadavg()
    try:
        if owned:
            cluster.up()
        links = {_rate_name(r): _measure_link(cluster, r) for r in dict.fromkeys((*rates, None))}
        _print_links(links)
        codec = _measure_codec()
        modes = RANKS_MODES if ranks else MODES
        cpu: dict[str, float] = {}  # the first block's "before" figures (reported)
        cpu_ratios: dict[str, float] = {}
        cpu_intervals: dict[str, tuple[float, float]] = {}
        cpu_by_wph: dict[int, dict[str, float]] = {}
        cells: dict[str, Cell] = {}
        compute: dict[int, list[float]] = {}
        lockstep: dict[int, list[float]] = {}
        oversubscribed: dict[int, bool] = {}
        steps_of_ranks: dict[int, list[list[float]]] = {}
        uri = None
        probes: dict[int, list[dict[str, Any]]] = {}
        ring_probes: dict[int, dict[str, list[dict[str, Any]]]] = {}
        passes = pass_schedules(rates, repeats)
        for wph in per_host:
            with _session(cluster, wph) as spark:
                uri = uri or _write_data(workdir)
                cluster.set_rate(None)
                probes[wph] = shm_links(spark, wph * HOSTS)
                for rate in rates:  # the link's goodput under the ring's own traffic
                    if rate is not None:
                        cluster.set_rate(rate)
                        ring_probes.setdefault(wph, {})[rate] = shm_links(
                            spark, wph * HOSTS, small=False, large=RATE_COLLECTIVES)
                cluster.set_rate(None)
                # each mode's CPU work, measured around this block's cells (the same load)
                before, ratios, intervals = measure_exchange_cpu(
                    ("compute", "lockstep", *modes))
                if not cpu:
                    cpu, cpu_ratios, cpu_intervals = before, ratios, intervals
                # more workers than the machine's cores: ranks take turns on them, and the
                # straggler term comes from a fit whose ranks meet every step
                oversubscribed[wph] = cpu_share(wph * HOSTS) > 1.0
                measured = _fit(spark, cluster, uri, "compute", wph, [None] * COMPUTE_EPOCHS,
                                timeline=f"file://{workdir}/timeline-compute-{wph}")
                steps_of_ranks[wph] = rank_step_seconds(measured["timeline"])
                if wph > len(cluster.hosts[0].cpus or os.sched_getaffinity(0)):
                    # a host's ranks take turns on its cores: the hosts wait for each other
                    steps_of_ranks[wph] = host_step_seconds(steps_of_ranks[wph],
                                                            measured["hosts"])
                compute[wph] = measured["step_s"][1:]
                if oversubscribed[wph]:
                    lockstep[wph] = _fit(spark, cluster, uri, "lockstep", wph,
                                         [None] * COMPUTE_EPOCHS)["step_s"][1:]
                _print_references(compute, lockstep, wph, started)
                for order, schedule in zip(block_orders(modes, wph, len(passes)), passes):
                    for mode in order:
                        measured = _fit(spark, cluster, uri, mode, wph, schedule)
                        for epoch, rate in enumerate(schedule[1:], start=1):
                            cell = cells.setdefault(f"{mode}/{_rate_name(rate)}/{wph}",
                                                    Cell(rate, wph, mode))
                            _record(cell, measured, epoch)
                        _progress(cells, mode, wph, rates, started)
                if len(passes) > 1:  # the references again, in mirror order: see block_orders
                    if oversubscribed[wph]:
                        lockstep[wph] += _fit(spark, cluster, uri, "lockstep", wph,
                                              [None] * COMPUTE_EPOCHS)["step_s"][1:]
                    compute[wph] += _fit(spark, cluster, uri, "compute", wph,
                                         [None] * COMPUTE_EPOCHS)["step_s"][1:]
                    _print_references(compute, lockstep, wph, started)
                after, _, _ = measure_exchange_cpu(("compute", "lockstep", *modes))
                cpu_by_wph[wph] = {m: (before[m] + after[m]) / 2 for m in before}
            cluster.set_rate(None)
    finally:
        if owned:
            cluster.down()
        else:
            with contextlib.suppress(Exception):
                cluster.set_rate(original_rate)  # as it was before the benchmark
    compute_s = {wph: statistics.median(v) for wph, v in compute.items()}
    lockstep_s = {wph: statistics.median(v) for wph, v in lockstep.items()}
    hop_s = {wph: fixed_hop_seconds(p) for wph, p in probes.items()}
    # what meeting every step costs beyond the CPU work and the hops, with nothing to send
    sync_s = {wph: lockstep_seconds(lockstep_s[wph], compute_s[wph],
                                    cpu_by_wph[wph], cpu_share(wph * HOSTS),
                                    hop_s[wph] * hops_per_step("sharing", wph * HOSTS))
              for wph in lockstep_s}
    unlimited = links[_rate_name(None)]
    byte_s = {wph: ring_seconds_per_byte(p, hop_s[wph], unlimited) for wph, p in probes.items()}
    ring_rate = {wph: {rate: ring_goodput(p, hop_s[wph] + max(
                           0.0, links[rate]["latency_s"] - unlimited["latency_s"]), byte_s[wph])
                       for rate, p in by_rate.items()}
                 for wph, by_rate in ring_probes.items()}
    for cell in cells.values():
        if not cell.missing:
            wph = cell.workers_per_host
            cost = cpu_by_wph[wph]
            share = cpu_share(wph * HOSTS)
            mode_compute = compute_s[wph] + (cost[cell.mode] - cost["compute"]) * share
            link = dict(links[_rate_name(cell.rate)])
            goodput = ring_rate.get(wph, {}).get(_rate_name(cell.rate))
            if goodput:
                link["bytes_per_s"] = goodput
            period = AVERAGING_FREQUENCY if cell.mode == "averaging" else 1
            if oversubscribed[wph]:  # the ranks share cores and restart each step together
                jitter = sync_s[wph] * SYNC_POINTS.get(cell.mode, 1) / period
            else:
                jitter = straggler_seconds(steps_of_ranks[wph], period)
            predict(cell, mode_compute, codec, link,
                    hop_s=hop_s[wph] + max(0.0, link["latency_s"] - unlimited["latency_s"]),
                    ring_byte_s=byte_s[wph], jitter_s=jitter,
                    bucket_bytes=bucket_bytes(cell.rate))
    figures = _figures(cells, compute_s, codec, links, repeats, passes)
    figures["load_average_by_cell"] = {c.key: c.load for c in cells.values() if c.load}
    figures["exchange_cpu_s"] = cpu
    figures["exchange_cpu_ratio"] = cpu_ratios
    figures["exchange_cpu_ratio_interval"] = {m: list(i) for m, i in cpu_intervals.items()}
    figures["exchange_cpu_s_by_block"] = {f"{w}x{HOSTS}": c for w, c in cpu_by_wph.items()}
    figures["fixed_hop_s"] = {f"{w}x{HOSTS}": h for w, h in hop_s.items()}
    figures["straggler_s"] = {f"{w}x{HOSTS}": straggler_seconds(r, 1)
                              for w, r in steps_of_ranks.items()}
    figures["lockstep_step_s"] = {f"{w}x{HOSTS}": v for w, v in lockstep_s.items()}
    figures["lockstep_wait_s"] = {f"{w}x{HOSTS}": v for w, v in sync_s.items()}
    figures["oversubscribed"] = {f"{w}x{HOSTS}": v for w, v in oversubscribed.items()}
    figures["ring_seconds_per_byte"] = {f"{w}x{HOSTS}": b for w, b in byte_s.items()}
    figures["ring_goodput_bytes_per_s"] = {f"{w}x{HOSTS}": r for w, r in ring_rate.items()}
    figures.update(load_average_before=load_before, load_average_after=os.getloadavg(),
                   shm_used_between_hosts=any(shm_between_hosts(p) for p in probes.values()),
                   ring_links={f"{w}x{HOSTS}": p for w, p in probes.items()},
                   cluster_seconds=round(time.time() - started, 1))
    _print_ring_goodput(links, ring_rate)
    _print_cells(cells, figures)
    return figures


# Measurements --------------------------------------------------------------------------


def _measure_link(cluster: Any, rate: str | None) -> dict[str, float]:
    """Goodput (bytes/s) and one-way latency (s) between host 0 and host 1 at ``rate``."""
    cluster.set_rate(rate)
    nbytes = 4 << 20 if rate == "100mbit" else 32 << 20
    transfer = statistics.median(cluster.transfer_seconds(0, 1, nbytes) for _ in range(3))
    latency = cluster.round_trip_seconds(0, 1) / 2
    return {"bytes_per_s": nbytes / max(transfer - 2 * latency, 1e-9), "latency_s": latency}


def _measure_codec() -> dict[str, float]:
    """Encode and decode seconds of one update of the model's size (encoding benchmark)."""
    from benchmarks import encoding

    params = num_parameters()
    result = encoding.run({"sizes": [params], "sparsities": [SPARSITY], "repeats": 7})
    by_op = {case["op"]: case["seconds"] for case in result["cases"]}
    return {"encode_s": by_op["encode"], "decode_s": by_op["decode"], "parameters": params}


CPU_TARGETS = {"sharing": 1.15, "dense": 1.10, "averaging": 1.05}
#: Floors of the sharing step, each measured in the step's own setting (the plain train
#: step, then a host pass over a float32 vector of the model's size). ``ONE_PASS``: one
#: read, the design's reference for encoding; no exchange that keeps a residual of the
#: update's size and reads it once per step costs less. ``SWEEP``: the threshold encoder's
#: own pass (``threshold_encode`` with the finiteness check, nothing reaching tau), to which
#: sharing adds tau's selection, the candidates, the frame, decoding and applying.
ONE_PASS = "plain + one pass"
SWEEP = "plain + threshold sweep"


def run_cpu_only(options: dict[str, Any]) -> dict[str, Any]:
    """``--cpu-only``: the in-process measurement alone (no cluster, no root), on the scaling
    model and on LeNet, with the load average beside it."""
    repeats = int(options.get("repeats") or (10 if options.get("quick") else 40))
    load_before = os.getloadavg()
    figures: dict[str, Any] = {}
    for name in ("scaling", "lenet"):
        seconds, ratios, intervals = measure_exchange_cpu(("compute", *MODES),
                                                          repeats=repeats, model=name,
                                                          floor=True)
        figures[name] = {"exchange_cpu_s": seconds, "ratio_to_plain_step": ratios,
                         "ratio_interval": {m: list(i) for m, i in intervals.items()},
                         "verdict": {m: target_verdict(intervals[m], t)
                                     for m, t in CPU_TARGETS.items() if m in intervals}}
    figures.update(load_average_before=load_before, load_average_after=os.getloadavg(),
                   targets=CPU_TARGETS)
    print(f"load average before {_load(load_before)}, after {_load(os.getloadavg())}")
    return figures


def _load(load: tuple[float, ...]) -> str:
    return " ".join(f"{v:.2f}" for v in load)


def measure_exchange_cpu(modes: tuple[str, ...], repeats: int = 15, model: str = "scaling",
                         floor: bool = False
                         ) -> tuple[dict[str, float], dict[str, float],
                                    dict[str, tuple[float, float]]]:
    """Seconds per step of each mode's exchange in this process with a one-rank communicator
    (no communication; one TensorFlow thread, as a worker): its CPU work alone. Alternated;
    also each mode's paired ratio to ``compute`` (the plain train step), when measured, and a
    95 % interval for that ratio's median (:func:`~benchmarks.report.median_interval`).
    Averaging's step is the mean over ``f`` steps, one of which ends with an average
    through the one-rank communicator (the parameters and optimizer state read in place
    through the step's own reads, copied into the result and written back), which one rank
    alone would skip.
    ``model``: ``scaling`` (256 -> Dense 4096 -> 10, batch 32) or ``lenet`` (28x28x1, batch
    32). ``floor`` (with ``compute`` among the modes): also :data:`ONE_PASS` and
    :data:`SWEEP`, the plain step followed by a host pass over a vector of the model's size,
    alternated with the rest."""
    import secrets

    from benchmarks.report import alternate_samples
    from sparkdl.comm import create_communicator
    from sparkdl.compression.encoding import threshold_encode
    from sparkdl.compression.threshold import MAX_TAU
    from sparkdl.training.exchanges.averaging import ParameterAveragingExchange
    from sparkdl.training.worker.run_worker import configure_tensorflow

    configure_tensorflow(1)
    comm = create_communicator("tcp", 0, 1, lambda message: [message],
                               secret=secrets.token_bytes(32), timeout_s=60.0,
                               default_host="127.0.0.1")
    rng = np.random.default_rng(1)
    shape = (INPUT_DIM,) if model == "scaling" else (28, 28, 1)
    x = rng.normal(0, 1, (BATCH, *shape)).astype(np.float32)
    y = rng.integers(0, CLASSES, BATCH).astype(np.int64)
    counter = iter(range(10**9))
    build = _model if model == "scaling" else _lenet
    exchanges = {mode: _master(mode, 1).create_exchange(build(), comm, job_id=1)
                 for mode in modes}
    candidates = {mode: (lambda e=e: e.step(x, y, next(counter)))
                  for mode, e in exchanges.items()}
    # averaging's round: a step that ends with an average through the one-rank communicator
    # (which a fit would skip)
    averaging = exchanges.get("averaging")
    if isinstance(averaging, ParameterAveragingExchange):
        candidates["averaging round"] = lambda: averaging.step_with_average(
            x, y, next(counter))
    plain = exchanges.get("compute")
    if floor and plain is not None:
        vector = rng.normal(0.0, 1.0, plain.trainable.size).astype(np.float32)
        candidates[ONE_PASS] = lambda: (plain.step(x, y, next(counter)), vector.sum())
        # nothing reaches MAX_TAU: the sweep reads the vector and leaves it as it is
        candidates[SWEEP] = lambda: (plain.step(x, y, next(counter)),
                                     threshold_encode(vector, MAX_TAU, check_finite=True))
    try:
        for exchange in exchanges.values():
            exchange.metrics.build(x, y)
        samples = alternate_samples(candidates, repeats=repeats, warmup=3)
        if isinstance(averaging, ParameterAveragingExchange):  # one step in f averages
            rounds = samples.pop("averaging round")
            f = averaging.averaging_frequency
            samples["averaging"] = [step + (last - step) / f
                                    for step, last in zip(samples["averaging"], rounds)]
        for exchange in exchanges.values():
            exchange.finish()
            exchange.close()
    finally:
        comm.close()
    seconds = {mode: statistics.median(t) for mode, t in samples.items()}
    plain = samples.get("compute")
    rounds = ({mode: paired_ratios(t, plain) for mode, t in samples.items()}
              if plain is not None else {})
    ratios = {mode: statistics.median(r) for mode, r in rounds.items()}
    intervals = {mode: median_interval(r) for mode, r in rounds.items()}
    print_table(f"{model}: one step's CPU work per mode, one process, no communication "
                f"(ms, median of {repeats}; ratio: paired, to the plain train step, with a "
                f"95 % interval for its median)",
                ["mode", "ms", "ratio", "interval", "target", "verdict"],
                [_cpu_row(mode, t, ratios.get(mode), intervals.get(mode))
                 for mode, t in seconds.items()])
    return seconds, ratios, intervals


def _cpu_row(mode: str, seconds: float, ratio: float | None,
             interval: tuple[float, float] | None) -> tuple[object, ...]:
    """One row of the in-process table: the mode's time, its ratio to the plain step and
    the interval of that ratio's median, its target and whether the interval meets it."""
    target = CPU_TARGETS.get(mode)
    span = f"{interval[0]:.3f}-{interval[1]:.3f}" if interval else "-"
    verdict = target_verdict(interval, target) if interval and target else "-"
    return (mode, seconds * 1e3, "-" if ratio is None else ratio, span,
            "-" if target is None else target, verdict)


def _lenet() -> Any:
    import keras

    from sparkdl.models import lenet

    keras.utils.set_random_seed(1)
    model = lenet((28, 28, 1), CLASSES)
    model.compile(optimizer=keras.optimizers.SGD(0.01, momentum=0.9),
                  loss="sparse_categorical_crossentropy")
    return model


def num_parameters() -> int:
    return INPUT_DIM * HIDDEN + HIDDEN + HIDDEN * CLASSES + CLASSES


@contextlib.contextmanager
def _session(cluster: Any, workers_per_host: int) -> Iterator[Any]:
    """A SparkSession on the cluster: one executor per host with ``workers_per_host`` cores,
    one task (and one TensorFlow thread) per core."""
    from pyspark.sql import SparkSession

    repo = str(Path(__file__).resolve().parents[1])  # the checkout this module is in
    # a SparkContext in a running interpreter takes its workers' Python from the environment
    # (spark.pyspark.python is read by spark-submit only)
    os.environ["PYSPARK_PYTHON"] = os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    args = cluster.submit_args()
    builder = SparkSession.builder.master(cluster.master_url).appName(
        f"sparkdl-scaling-{workers_per_host}")
    for key, value in (a.split("=", 1) for a in args[1::2]):
        builder = builder.config(key, value)
    conf = {
        "spark.executor.cores": str(workers_per_host),
        "spark.cores.max": str(workers_per_host * len(cluster.hosts)),
        "spark.task.cpus": "1",
        "spark.default.parallelism": str(workers_per_host * len(cluster.hosts)),
        "spark.executorEnv.PYTHONPATH": repo,
        "spark.ui.showConsoleProgress": "false",
    }
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    try:
        _wait_for_executors(spark, len(cluster.hosts))
        yield spark
    finally:
        spark.stop()


def _wait_for_executors(spark: Any, count: int, timeout_s: float = 120.0) -> None:
    # the harness drives its own classic standalone cluster, so it may ask the classic
    # session's status tracker (Spark Connect has no executor list)
    tracker = spark.sparkContext._jsc.sc().statusTracker()  # classic-only
    deadline = time.monotonic() + timeout_s
    while len(tracker.getExecutorInfos()) - 1 < count:  # the driver is listed too
        if time.monotonic() > deadline:
            raise TimeoutError(f"only {len(tracker.getExecutorInfos()) - 1} of {count} "
                               f"executors registered within {timeout_s:g} s")
        time.sleep(0.5)


def _write_data(workdir: Path) -> str:
    """The cells' shards (class clusters in 256 dimensions, ``ROWS`` rows in 8 files, row
    groups of ``BATCH``), written from this process with pyarrow: the hosts share the
    filesystem, and a Spark job for a few hundred rows cost tens of seconds of executor
    start-up on a loaded machine."""
    from benchmarks.timeline import write_shards

    return "file://" + write_shards(workdir / "data", rows=ROWS, num_files=8)


def _model() -> Any:
    import keras

    keras.utils.set_random_seed(1)
    model = keras.Sequential([
        keras.Input((INPUT_DIM,)),
        keras.layers.Dense(HIDDEN, activation="relu"),
        keras.layers.Dense(CLASSES, activation="softmax"),
    ])
    model.compile(optimizer=keras.optimizers.SGD(0.01, momentum=0.9),
                  loss="sparse_categorical_crossentropy")
    return model


def _master(mode: str, num_workers: int) -> Any:
    from sparkdl.compression import FixedThreshold, TargetSparsityThreshold
    from sparkdl.training.masters import (
        DenseTrainingMaster,
        ParameterAveragingTrainingMaster,
        SharedTrainingMaster,
    )

    common = {"batch_size_per_worker": BATCH, "num_workers": num_workers}
    if mode == "powersgd":
        from sparkdl.compression.powersgd import PowerSGDCompressorConfig

        return SharedTrainingMaster(**common, compressor=PowerSGDCompressorConfig())
    if mode.startswith("sharing"):
        extra = {"overlap": True} if mode == "sharing_overlap" else {}
        return SharedTrainingMaster(**common, threshold=TargetSparsityThreshold(SPARSITY),
                                    **extra)
    if mode == "averaging":
        return ParameterAveragingTrainingMaster(**common, averaging_frequency=AVERAGING_FREQUENCY)
    if mode == "lockstep":  # every step meets the others, with nothing to send
        return SharedTrainingMaster(**common, threshold=FixedThreshold(LOCKSTEP_TAU))
    if mode == "compute":  # communication off: never averages inside the epochs
        return ParameterAveragingTrainingMaster(**common, averaging_frequency=10**9)
    return DenseTrainingMaster(**common)


def pass_schedules(rates: tuple[str | None, ...], repeats: int) -> list[list[str | None]]:
    """Per repeat (a pass: one fit of each mode), the link rate of each epoch of its fits: a
    warm-up epoch at the pass's first rate (it traces the step functions; not measured),
    then the rates, in reverse order on every other pass."""
    passes = []
    for repeat in range(repeats):
        order = list(rates) if repeat % 2 == 0 else list(reversed(rates))
        passes.append([order[0], *order])
    return passes


def block_orders(modes: tuple[str, ...], workers_per_host: int, passes: int
                 ) -> list[tuple[str, ...]]:
    """The order of the modes' fits in each pass of a workers-per-host block: rotated by the
    block, and reversed on every other pass. With the references before the passes and again
    after them, two repeats make the block a palindrome (``C A B D D B A C``): while the load
    drifts through a block, every figure of it is measured at the same mean time, and the
    drift does not end up in the model's error."""
    start = (workers_per_host - 1) % len(modes)
    rotated = modes[start:] + modes[:start]
    return [rotated if index % 2 == 0 else rotated[::-1] for index in range(passes)]


def _fit(spark: Any, cluster: Any, uri: str, mode: str, workers_per_host: int,
         schedule: list[str | None], timeline: str | None = None) -> dict[str, Any]:
    """One fit whose epoch ``e`` runs at link rate ``schedule[e]``: a driver callback changes
    the rate at each epoch end, while every rank waits for the driver's answer. With
    ``timeline`` (a URI) it records the ranks' timelines there."""
    import keras

    from sparkdl.config import ClusterConfig
    from sparkdl.spark_model import SparkModel

    class RateSchedule(keras.callbacks.Callback):
        def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
            if epoch + 1 < len(schedule) and schedule[epoch + 1] != schedule[epoch]:
                cluster.set_rate(schedule[epoch + 1])

    cluster.set_rate(schedule[0])
    workers = workers_per_host * HOSTS
    # one flat ring of all ranks (the model's k); the per-host accumulator is another topology
    mesh = "mesh" if mode == "sharing_mesh" else "plain"
    cluster_config = ClusterConfig(topology="flat", mesh=mesh)
    fit = SparkModel(spark, _model(), _master(mode, workers), cluster=cluster_config).fit(
        uri, epochs=len(schedule), verbose=0, log_every_steps=10**6,
        callbacks=[RateSchedule()], **({"timeline": timeline} if timeline else {}))
    steps = fit.metrics["steps_per_epoch"]
    return {
        "step_s": [seconds / steps for seconds in fit.history["epoch_s"]],
        "bytes_per_step": list(fit.history["bytes_sent_per_step"]),
        "phases": fit.metrics["step_timings_s"],
        "sparsity": fit.metrics["step_stats"].get("sparsity"),
        "hosts": [a.rsplit(":", 1)[0] for a in fit.metrics["executor_addresses"]],
        "timeline": list(fit.metrics.get("timeline") or []),
        "loss": list(fit.history.get("loss") or []),
    }


def _print_references(compute: dict[int, list[float]], lockstep: dict[int, list[float]],
                      wph: int, started: float) -> None:
    print(f"[{time.time() - started:6.0f} s] compute only {wph}x{HOSTS}: step "
          f"{statistics.median(compute[wph]) * 1e3:.1f} ms" + (
              f", in lockstep {statistics.median(lockstep[wph]) * 1e3:.1f} ms"
              if wph in lockstep else ""), file=sys.stderr, flush=True)


def _progress(cells: dict[str, Cell], mode: str, wph: int, rates: tuple[str | None, ...],
              started: float) -> None:
    for rate in rates:
        cell = cells[f"{mode}/{_rate_name(rate)}/{wph}"]
        steps = ", ".join(f"{v * 1e3:.1f}" for v in cell.step_s)
        print(f"[{time.time() - started:6.0f} s] {cell.key}: step ms {steps}; "
              f"{cell.bytes_per_step[-1]:.0f} B/step", file=sys.stderr, flush=True)


def _record(cell: Cell, measured: dict[str, Any], epoch: int) -> None:
    cell.step_s.append(measured["step_s"][epoch])
    cell.bytes_per_step.append(measured["bytes_per_step"][epoch])
    cell.phases = measured["phases"]
    cell.hosts_of_ranks = measured["hosts"]
    cell.sparsity = measured["sparsity"]
    cell.final_loss = measured["loss"][-1] if measured["loss"] else None
    cell.loads.append(os.getloadavg()[0])


def shm_links(spark: Any, num_workers: int, small: bool = True,
              large: int = LARGE_COLLECTIVES) -> list[dict[str, Any]]:
    """Build the TCP ring in a barrier stage exactly as a fit does, and report for each rank
    its host, whether its links (prev -> me, me -> next) use shared memory, and the median
    time of ``SMALL_COLLECTIVES`` 64-byte allgathers (with ``small``) and of ``large``
    allreduces of the model's size."""
    import secrets

    from sparkdl.comm import create_communicator

    secret = secrets.token_bytes(32)

    def probe(_: Any) -> Iterator[dict[str, Any]]:
        from pyspark import BarrierTaskContext

        context = BarrierTaskContext.get()
        rank, infos = context.partitionId(), context.getTaskInfos()
        host = infos[rank].address.rsplit(":", 1)[0]
        comm = create_communicator("tcp", rank, len(infos),
                                   lambda message: list(context.allGather(message)),
                                   secret=secret, timeout_s=60.0, default_host=host)
        try:
            comm.allreduce(np.ones(1 << 18, np.float32))
            shm_in, shm_out = getattr(comm, "shared_memory", (False, False))
            small_s = []
            for _ in range(SMALL_COLLECTIVES if small else 0):  # its fixed cost per collective
                started = time.perf_counter()
                comm.allgather(b"x" * 64)
                small_s.append(time.perf_counter() - started)
            large_s, gradient = [], np.ones(DENSE_FLOATS, np.float32)
            sent_before = comm.counters.bytes_sent
            for _ in range(large):  # its cost per byte: copies and sums (and the link's)
                started = time.perf_counter()
                comm.allreduce(gradient)
                large_s.append(time.perf_counter() - started)
            sent = (comm.counters.bytes_sent - sent_before) / large
        finally:
            comm.close()
        yield {"rank": rank, "host": host, "shm_in": shm_in, "shm_out": shm_out,
               **({"small_allgather_s": statistics.median(small_s)} if small_s else {}),
               "large_allreduce_s": statistics.median(large_s), "large_allreduce_bytes": sent}

    def probe_task(batches: Iterator[Any]) -> Iterator[Any]:
        import pickle

        import pyarrow as pa

        for link in probe(batches):
            yield pa.RecordBatch.from_pydict({
                "rank": pa.array([link["rank"]], pa.int32()),
                "result": pa.array([pickle.dumps(link)], pa.binary()),
            })

    import pickle

    rows = spark.range(0, num_workers, 1, num_workers).mapInArrow(
        probe_task, "rank int, result binary", barrier=True).collect()
    return [pickle.loads(row["result"]) for row in sorted(rows, key=lambda r: r["rank"])]


def fixed_hop_seconds(links: list[dict[str, Any]]) -> float:
    """The ring's fixed cost of one hop, from the probe's 64-byte allgathers: the slowest
    rank's median (a collective ends when its last rank does) over the ``N - 1`` hops."""
    hops = max(1, len(links) - 1)
    return max((link.get("small_allgather_s", 0.0) for link in links), default=0.0) / hops


def _slowest_allreduce(links: list[dict[str, Any]]) -> tuple[float, float, float] | None:
    """From the probe's allreduces of the model's size: the bytes a rank sent, the slowest
    rank's median seconds, and the bytes on the busiest host's link (None: not measured)."""
    if not links or "large_allreduce_s" not in links[0]:
        return None
    sent = max(link["large_allreduce_bytes"] for link in links)
    seconds = max(link["large_allreduce_s"] for link in links)
    return sent, seconds, ring_crossings([link["host"] for link in links]) * sent


def ring_seconds_per_byte(links: list[dict[str, Any]], hop_s: float,
                          unlimited: dict[str, float]) -> float:
    """The ring's own cost per byte a rank sends (copies, sums, framing) beyond the wire,
    from the probe's allreduces of the model's size at the unlimited rate: the slowest rank's
    median, less its hops' fixed cost and the bytes' time on the unlimited link."""
    measured = _slowest_allreduce(links)
    if measured is None or measured[0] <= 0:
        return 0.0
    sent, seconds, on_link = measured
    hops = 2.0 * (len(links) - 1)
    wire = on_link / unlimited["bytes_per_s"]
    return max(0.0, seconds - hops * hop_s - wire) / sent


def ring_goodput(links: list[dict[str, Any]], hop_s: float, byte_s: float) -> float | None:
    """The link's goodput (bytes/s) under the ring's own traffic, from the probe's
    allreduces of the model's size at a limited rate: the bytes that cross the busiest host's
    link, over the slowest rank's median less its hops' fixed cost (``hop_s`` each, the
    rate's latency included) and the ring's own cost per byte (``byte_s``). None when there
    is nothing to go by."""
    measured = _slowest_allreduce(links)
    if measured is None:
        return None
    sent, seconds, on_link = measured
    busy = seconds - 2.0 * (len(links) - 1) * hop_s - sent * byte_s
    return on_link / busy if on_link > 0 and busy > 0 else None


def shm_between_hosts(links: list[dict[str, Any]]) -> bool:
    """Whether any ring link between two different hosts uses shared memory."""
    n = len(links)
    return any(link["shm_out"] and links[(i + 1) % n]["host"] != link["host"]
               for i, link in enumerate(links))


def rank_step_seconds(traces: list[str]) -> list[list[float]]:
    """Each rank's step durations (s) after the first epoch (it traces), from its timeline."""
    from benchmarks.timeline import load

    per_rank = []
    for trace in traces:
        events, _ = load([trace.removeprefix("file://")])
        per_rank.append([e["dur"] / 1e6 for e in events
                         if e["name"] == "step" and e["args"]["epoch"] > 0])
    return [steps for steps in per_rank if steps]


def host_step_seconds(steps_of_ranks: list[list[float]],
                      hosts_of_ranks: list[str]) -> list[list[float]]:
    """Per host, the mean over its ranks of each step's duration. Ranks that outnumber
    their host's cores take turns on them, so one rank's slow step is another's fast one;
    what the hosts wait for each other is the spread of these means, not of single ranks."""
    by_host: dict[str, list[list[float]]] = {}
    for steps, host in zip(steps_of_ranks, hosts_of_ranks):
        by_host.setdefault(host, []).append(steps)
    means = []
    for ranks in by_host.values():
        count = min(len(steps) for steps in ranks)
        means.append([float(v) for v in np.mean([steps[:count] for steps in ranks], axis=0)])
    return means


def straggler_seconds(steps_of_ranks: list[list[float]], period: int = 1,
                      samples: int = 4000) -> float:
    """What waiting for the slowest rank adds per step when the ranks meet every ``period``
    steps: ``E[max_r sum of period steps of r] / period - E[step]``, from each rank's own
    step durations with communication off (drawn independently, seeded)."""
    if len(steps_of_ranks) < 2:
        return 0.0
    rng = np.random.default_rng(0)
    draws = np.stack([rng.choice(np.asarray(steps), (samples, period)).sum(axis=1)
                      for steps in steps_of_ranks])
    mean = float(np.mean([np.mean(steps) for steps in steps_of_ranks]))
    return max(0.0, float(np.mean(draws.max(axis=0))) / period - mean)


def cpu_share(workers: int) -> float:
    """``s``: how many one-thread workers share each of the machine's cores (at least 1)."""
    return max(1.0, workers / (os.cpu_count() or 1))


def lockstep_seconds(step_s: float, compute_s: float, cpu: dict[str, float], share: float,
                     hops_s: float) -> float:
    """What meeting every step adds where ranks share cores: the lockstep fit's step
    (sharing with nothing to send) less the compute-only step, the CPU work that sharing
    adds (``cpu``: per mode, one rank, stretched by ``share`` as in the cells) and its hops'
    fixed cost. The free-running spread overstates it there: ranks that restart together
    share the cores fairly, but every one waits for the last to be scheduled."""
    added = (cpu["lockstep"] - cpu["compute"]) * share
    return max(0.0, step_s - compute_s - added - hops_s)


def bucket_bytes(rate: str | None) -> float:
    """The token bucket of the harness's ``tc tbf`` at ``rate`` (bytes; 0 when unlimited):
    bytes a link sends at full speed after it idled long enough to refill it."""
    from benchmarks.netcluster import _tbf, rate_bits_per_s

    bits = rate_bits_per_s(rate)
    if bits is None:
        return 0.0
    spec = _tbf(str(rate), bits)
    return float(spec[spec.index("burst") + 1])


# The model ------------------------------------------------------------------------------


def ring_crossings(hosts_of_ranks: list[str]) -> int:
    """Most ring edges ``r -> r + 1`` that leave one host (or, equally, enter one)."""
    n = len(hosts_of_ranks)
    if n < 2:
        return 0
    leaving: dict[str, int] = {}
    entering: dict[str, int] = {}
    for rank, host in enumerate(hosts_of_ranks):
        nxt = hosts_of_ranks[(rank + 1) % n]
        if nxt != host:
            leaving[host] = leaving.get(host, 0) + 1
            entering[nxt] = entering.get(nxt, 0) + 1
    return max([*leaving.values(), *entering.values(), 0])


def bruck_link_bytes(hosts_of_ranks: list[str], bytes_sent: float) -> float:
    """Bytes the busiest host link carries in a Bruck allgather (``cluster.mesh: mesh``)
    where every rank sends ``bytes_sent`` in all: step ``k`` (distance ``d = 2^k``) sends
    ``min(d, N - d)`` messages from each rank ``r`` to ``r + d``; the steps are sequential, so
    each step's busiest link (leaving or entering a host) adds up."""
    from sparkdl.comm.mesh import distances

    n = len(hosts_of_ranks)
    steps = list(distances(n)) if n > 1 else []
    counts = [min(d, n - d) for d in steps]
    if not counts:
        return 0.0
    message = bytes_sent / sum(counts)
    total = 0.0
    for d, count in zip(steps, counts, strict=True):
        leaving: dict[str, int] = {}
        entering: dict[str, int] = {}
        for rank, host in enumerate(hosts_of_ranks):
            peer = hosts_of_ranks[(rank + d) % n]
            if peer != host:
                leaving[host] = leaving.get(host, 0) + 1
                entering[peer] = entering.get(peer, 0) + 1
        total += max([*leaving.values(), *entering.values(), 0]) * count * message
    return total


def hops_per_step(mode: str, num_workers: int) -> float:
    """Sequential messages a step waits for (:func:`scaling_model.collective_cost`; averaging
    allreduces every ``f`` steps)."""
    from benchmarks.scaling_model import collective_cost

    if mode == "averaging":
        return 2.0 * (num_workers - 1) / AVERAGING_FREQUENCY
    return collective_cost(mode, num_workers).hops


def predict(cell: Cell, compute_s: float, codec: dict[str, float],
            link: dict[str, float], hop_s: float | None = None,
            ring_byte_s: float = 0.0, jitter_s: float = 0.0, bucket_bytes: float = 0.0
            ) -> None:
    """Fill ``cell.predicted_s`` and the model's terms (see the module docstring).

    ``compute_s`` is ``C_m(w)``: the cell's mode's CPU work per step (one rank's encode and
    decode included) at ``w`` workers per host. ``hop_s``: the fixed cost of one sequential
    hop of a collective (default: the link's one-way latency); ``ring_byte_s``: the ring's
    own cost per byte sent beyond the wire (copies, sums); ``jitter_s``: what waiting for the
    slowest rank adds per step (:func:`straggler_seconds`); ``bucket_bytes``: the link's token
    bucket, refilled while the step computes and then sent at full speed."""
    workers = len(cell.hosts_of_ranks) or cell.workers_per_host * HOSTS
    share = cpu_share(workers)
    sharing = cell.mode.startswith("sharing")  # the N - 1 others' messages to decode
    decode = codec["decode_s"] * (workers - 1) * share if sharing else 0.0
    bytes_per_step = statistics.median(cell.bytes_per_step)
    if cell.mode == "sharing_mesh":
        on_link = bruck_link_bytes(cell.hosts_of_ranks, bytes_per_step)
    else:
        on_link = ring_crossings(cell.hosts_of_ranks) * bytes_per_step
    # bytes the bucket lets through at full speed: what refilled while the link idled (the
    # computing part of the steps between two collectives), at most the bucket
    period = AVERAGING_FREQUENCY if cell.mode == "averaging" else 1
    credit = min(bucket_bytes, link["bytes_per_s"] * period * compute_s) / period
    link_wait = max(0.0, on_link - credit) / link["bytes_per_s"]
    wire = link_wait + bytes_per_step * ring_byte_s
    jitter_s = max(0.0, jitter_s - link_wait)  # absorbed while every rank waits on the link
    latency = hops_per_step(cell.mode, workers) * (link["latency_s"] if hop_s is None else hop_s)
    if cell.mode == "sharing_overlap":
        predicted = max(compute_s + decode, wire + latency) + jitter_s
    else:
        predicted = compute_s + decode + wire + latency + jitter_s
    cell.terms = {"compute_s": compute_s, "decode_others_s": decode, "wire_s": wire,
                  "latency_s": latency, "straggler_s": jitter_s, "cpu_share": share}
    cell.predicted_s = predicted


# Figures --------------------------------------------------------------------------------


def _figures(cells: dict[str, Cell], compute_s: dict[int, float], codec: dict[str, float],
             links: dict[str, dict[str, float]], repeats: int,
             passes: list[list[str | None]]) -> dict[str, Any]:
    def measured(mode: str, rate: str, wph: int = 1) -> float | None:
        cell = cells.get(f"{mode}/{rate}/{wph}")
        return cell.measured_s if cell else None

    def ratio(a: float | None, b: float | None) -> float | None:
        return a / b if a and b else None

    errors = [abs(c.predicted_s - c.measured_s) / c.measured_s
              for c in cells.values() if c.predicted_s and c.measured_s]
    dense_bytes = 4.0 * codec["parameters"] * 2 * (HOSTS - 1) / HOSTS
    sharing_bytes = [statistics.median(c.bytes_per_step) for c in cells.values()
                     if c.mode == "sharing" and c.workers_per_host == 1 and c.bytes_per_step]
    return {
        "sharing_vs_dense_step_speedup_100mbit": ratio(measured("dense", "100mbit"),
                                                       measured("sharing", "100mbit")),
        "overlap_vs_compute_only_100mbit": ratio(compute_s.get(1),
                                                 measured("sharing_overlap", "100mbit")),
        "sharing_vs_compute_only_100mbit": ratio(compute_s.get(1),
                                                 measured("sharing", "100mbit")),
        "model_error_max": max(errors) if errors else None,
        "model_error_median": statistics.median(errors) if errors else None,
        "sharing_compression": (dense_bytes / statistics.median(sharing_bytes)
                                if sharing_bytes else None),
        "num_parameters": codec["parameters"],
        "repeats": repeats,
        "epoch_rates_per_pass": [[_rate_name(r) for r in schedule] for schedule in passes],
        "batch_size_per_worker": BATCH,
        "hosts": HOSTS,
        "compute_only_step_s": {f"{w}x{HOSTS}": s for w, s in compute_s.items()},
        "encode_s": codec["encode_s"],
        "decode_s": codec["decode_s"],
        "links": links,
        "cells": {
            cell.key: {
                "mode": cell.mode,
                "rate": _rate_name(cell.rate),
                "workers_per_host": cell.workers_per_host,
                "hosts": HOSTS,
                "measured_step_s": cell.measured_s,
                "measured_step_s_repeats": cell.step_s,
                "predicted_step_s": cell.predicted_s,
                "model_error": (abs(cell.predicted_s - cell.measured_s) / cell.measured_s
                                if cell.predicted_s and cell.measured_s else None),
                "bytes_per_step": (statistics.median(cell.bytes_per_step)
                                   if cell.bytes_per_step else None),
                "terms": cell.terms,
                "phases": cell.phases,
                "sparsity": cell.sparsity,
                "ranks_on_hosts": cell.hosts_of_ranks,
                "missing": cell.missing,
                "final_loss": cell.final_loss,
                "load1": cell.load,
                "load1_per_fit": cell.loads,
            }
            for cell in cells.values()
        },
    }


def _print_links(links: dict[str, dict[str, float]]) -> None:
    print_table("links between hosts (measured TCP goodput, one-way latency)",
                ["rate", "MB/s", "latency ms"],
                [(name, v["bytes_per_s"] / 1e6, v["latency_s"] * 1e3)
                 for name, v in links.items()])


def _print_ring_goodput(links: dict[str, dict[str, float]],
                        ring_rate: dict[int, dict[str, float | None]]) -> None:
    rows = [(f"{rate} {wph}x{HOSTS}", links[rate]["bytes_per_s"] / 1e6,
             goodput / 1e6 if goodput else "-")
            for wph, by_rate in ring_rate.items() for rate, goodput in by_rate.items()]
    if rows:
        print_table("link goodput (MB/s): one TCP transfer, and under the ring's allreduces",
                    ["link", "one transfer", "ring"], rows)


def _print_cells(cells: dict[str, Cell], figures: dict[str, Any]) -> None:
    rows = []
    for cell in sorted(cells.values(), key=lambda c: (c.workers_per_host, str(c.rate), c.mode)):
        if cell.missing:
            rows.append((cell.key, "missing", "-", "-", "-", "-"))
            continue
        t = cell.terms
        rows.append((cell.key, cell.measured_s * 1e3, cell.predicted_s * 1e3,
                     (cell.predicted_s - cell.measured_s) / cell.measured_s,
                     f"{statistics.median(cell.bytes_per_step):.0f}",
                     f"C{t['compute_s'] * 1e3:.0f}+D{t['decode_others_s'] * 1e3:.1f}"
                     f"+W{t['wire_s'] * 1e3:.0f}"
                     f"+L{t['latency_s'] * 1e3:.1f}+S{t['straggler_s'] * 1e3:.1f}"))
    print_table(f"step time per cell (ms, medians of {figures['repeats']}), model terms in ms",
                ["cell", "measured", "predicted", "error", "bytes/step", "model"], rows)
    for key in ("sharing_vs_dense_step_speedup_100mbit", "sharing_vs_compute_only_100mbit",
                "overlap_vs_compute_only_100mbit", "model_error_max", "sharing_compression"):
        print(f"{key}: {figures[key]}")
