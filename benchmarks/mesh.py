"""Ring vs log-depth ("mesh") collectives across hosts: ``jobs/benchmark.py collectives --mesh``.

Every rank is a process (no TensorFlow) alone on its own host of the network-namespace harness
(:mod:`benchmarks.netcluster`, network only: one namespace, veth and ``tc tbf`` limit per
host), so every byte crosses a rate-limited link; shared memory is off. Each process holds one
:class:`~sparkdl.comm.mesh.MeshCommunicator` and times its ring (``comm.ring``, what
``cluster.mesh: plain`` uses) and its log-depth algorithms alternately, on the same sockets,
at each rate, rank count and message size. Figures per cell: median seconds per collective
(slowest rank), the paired median ratio mesh / ring, payload-plus-framing bytes received per
worker per collective, and the 1-minute load average beside them. Needs root.

Then, at the same rates, bytes per worker per step against the rank count (2, 4, 8, 16) for
the three exchanges of the scaling benchmark's model (:mod:`benchmarks.scaling`,
1.09M parameters): threshold sharing (ring allgather of one message at its target sparsity),
PowerSGD (ring allreduce of its rank-4 factors and small tensors, sizes from
:func:`benchmarks.scaling_model.powersgd_floats`) and dense (ring allreduce of the
float32 gradient), from the communicators' counters (payload plus framing), with their
time per step.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import secrets
import statistics
import time
from typing import Any

import numpy as np

from benchmarks.report import alternate_samples, paired_ratio, print_table

KB = 1 << 10
RATES = ("100mbit", "1gbit")
WORLDS = (2, 4, 8, 16)
SIZES = (1 * KB, 4 * KB, 16 * KB, 64 * KB, 256 * KB)
REDUCE_SIZES = (4 * KB, 64 * KB, 1024 * KB)


def _worker(
    conn: Any, rank: int, world: int, address: str, secret: bytes, netns: str, ip: str
) -> None:
    try:
        from benchmarks.netcluster import join_netns

        join_netns(netns)
        from sparkdl.comm import connect_mesh, store_exchange

        exchange = store_exchange(address, rank, world, key=f"mesh-{world}", secret=secret,
                                  timeout_s=120)
        comm: Any = connect_mesh(rank, world, exchange, secret=secret, timeout_s=120,
                                 bind_host=ip, shared_memory=False, mode="mesh")
        conn.send(("ready", None))
        while True:
            cmd = conn.recv()
            if cmd[0] == "stop":
                break
            kind, impl, nbytes, reps = cmd
            target = comm.ring if impl == "ring" else comm
            comm.ring.barrier()
            received = comm.counters.bytes_received
            sent = comm.counters.bytes_sent
            start = time.perf_counter()
            if kind == "allgather":
                message = bytes(nbytes)
                for _ in range(reps):
                    target.allgather(message)
            else:
                array = np.ones(nbytes // 4, np.float32)
                for _ in range(reps):
                    target.allreduce(array)
            elapsed = time.perf_counter() - start
            conn.send(("ok", (elapsed, (comm.counters.bytes_received - received) / reps,
                              (comm.counters.bytes_sent - sent) / reps)))
        comm.close()
    except BaseException as exc:
        conn.send(("error", f"rank {rank}: {type(exc).__name__}: {exc}"))


def _reps(nbytes: int, world: int, rate_bits: float) -> int:
    """Collectives per sample: about 50 ms of wire time, at least 2, at most 40."""
    wire = max(1, world - 1) * nbytes * 8 / rate_bits
    return max(2, min(40, int(0.05 / max(wire, 1e-4))))


def _measure(
    group: Any, kind: str, nbytes: int, reps: int, repeats: int
) -> tuple[dict[str, list[float]], dict[str, float]]:
    """Seconds per collective (slowest rank) per round, ring and mesh alternated; bytes
    received per worker per collective."""
    times: dict[str, list[float]] = {"ring": [], "mesh": []}
    wire: dict[str, float] = {}

    def call(impl: str) -> None:
        out = group.call(kind, impl, nbytes, reps, timeout=300)
        wire[impl] = statistics.mean(b for _, b, _ in out)
        times[impl].append(max(t for t, _, _ in out) / reps)

    alternate_samples({"ring": lambda: call("ring"), "mesh": lambda: call("mesh")}, repeats,
                      warmup=1)
    return {k: v[1:] for k, v in times.items()}, wire  # without the warm-up round


def exchange_bytes() -> dict[str, tuple[str, int]]:
    """Each exchange's collective and payload bytes per step for the scaling benchmark's
    model: sharing's message at its target sparsity, PowerSGD's factors, dense's gradient."""
    from benchmarks import scaling
    from benchmarks.scaling_model import powersgd_floats, sharing_message_bytes

    shapes = [(scaling.INPUT_DIM, scaling.HIDDEN), (scaling.HIDDEN,),
              (scaling.HIDDEN, scaling.CLASSES), (scaling.CLASSES,)]
    params = scaling.num_parameters()
    return {
        "sharing": ("allgather", int(sharing_message_bytes(params, scaling.SPARSITY))),
        "powersgd": ("allreduce", 4 * powersgd_floats(shapes, rank=4)),
        "dense": ("allreduce", 4 * params),
    }


def bytes_against_ranks(groups: dict[int, Any], rate: str, worlds: tuple[int, ...]
                        ) -> list[dict[str, Any]]:
    """Bytes each worker sends and receives per step (counters, mean over ranks) and the
    slowest rank's seconds per step, per exchange and rank count, on the ring."""
    cells = []
    rows = []
    for name, (kind, nbytes) in exchange_bytes().items():
        for world in worlds:
            out = groups[world].call(kind, "ring", nbytes, 2, timeout=300)
            cell = {"rate": rate, "exchange": name, "world": world, "payload_bytes": nbytes,
                    "tx_bytes_per_worker": statistics.mean(s for _, _, s in out),
                    "rx_bytes_per_worker": statistics.mean(r for _, r, _ in out),
                    "step_ms": max(t for t, _, _ in out) / 2 * 1e3,
                    "load1": os.getloadavg()[0]}
            cells.append(cell)
            rows.append((name, world, int(cell["tx_bytes_per_worker"]),
                         int(cell["rx_bytes_per_worker"]),
                         cell["tx_bytes_per_worker"] / nbytes, cell["step_ms"],
                         f"{cell['load1']:.1f}"))
    print_table(f"bytes per worker per step against ranks at {rate} (ring; counters, payload "
                f"plus framing; x payload: sent / one worker's payload)",
                ["exchange", "ranks", "tx B/worker", "rx B/worker", "x payload", "ms/step",
                 "load1"], rows)
    return cells


def calibrate(cells: list[dict[str, Any]], cores: int) -> dict[str, Any] | None:
    """The collective model's constants (:func:`~benchmarks.scaling_model.
    collective_seconds`), from cells it is not checked on: each rate's goodput from the
    2-rank 256 KB ring allgather (one step, bandwidth-bound) and the fixed cost of one step
    from the 4-rank cells of at most 4 KB at the fastest rate (latency-bound), per its
    oversubscription. None without those cells (``--quick``)."""
    from benchmarks.scaling_model import collective_steps, oversubscription

    goodput = {c["rate"]: c["bytes"] / (c["ring_ms"] / 1e3) for c in cells
               if c["world"] == 2 and c["collective"] == "allgather" and c["bytes"] == 256 * KB}
    fastest = RATES[-1]
    hops = [c[f"{impl}_ms"] / 1e3 / len(collective_steps(c["collective"], impl, 4, c["bytes"]))
            / oversubscription(4, cores)
            for c in cells if c["world"] == 4 and c["rate"] == fastest and c["bytes"] <= 4 * KB
            for impl in ("ring", "mesh")]
    if set(goodput) != set(RATES) or not hops:
        return None
    return {"bytes_per_s": goodput, "hop_s": statistics.median(hops), "cores": cores}


def auto_algorithm(collective: str, world: int, nbytes: int) -> str:
    """What ``cluster.mesh: auto`` runs for this collective (:mod:`sparkdl.comm.mesh`)."""
    from sparkdl.comm.mesh import AUTO_MAX_GATHER_BYTES, AUTO_MAX_REDUCE_BYTES, AUTO_MIN_RANKS

    limit = AUTO_MAX_GATHER_BYTES if collective == "allgather" else AUTO_MAX_REDUCE_BYTES
    return "mesh" if world >= AUTO_MIN_RANKS and nbytes <= limit else "ring"


def check_model(cells: list[dict[str, Any]], calibration: dict[str, Any]) -> dict[str, Any]:
    """Add each cell's predicted ring and mesh times and errors; summarise the errors of the
    8- and 16-rank cells (not used to calibrate), over all cells and over what
    ``cluster.mesh: auto`` would run."""
    from benchmarks.scaling_model import (
        collective_seconds,
        collective_steps,
        oversubscription,
    )

    errors: list[float] = []
    chosen: list[float] = []
    rows = []
    for c in cells:
        hop = calibration["hop_s"] * oversubscription(c["world"], calibration["cores"])
        rate = calibration["bytes_per_s"][c["rate"]]
        for impl in ("ring", "mesh"):
            steps = collective_steps(c["collective"], impl, c["world"], c["bytes"])
            predicted = collective_seconds(steps, hop, rate) * 1e3
            c[f"{impl}_model_ms"] = predicted
            c[f"{impl}_model_error"] = error = predicted / c[f"{impl}_ms"] - 1
            if c["world"] >= 8:
                errors.append(abs(error))
                if impl == auto_algorithm(c["collective"], c["world"], c["bytes"]):
                    chosen.append(abs(error))
        if c["world"] >= 8:
            rows.append((c["rate"], f"{c['collective']} {c['bytes'] // KB} KB", c["world"],
                         c["ring_ms"], c["ring_model_ms"], c["ring_model_error"],
                         c["mesh_ms"], c["mesh_model_ms"], c["mesh_model_error"]))
    print_table(
        f"the collective model against the 8- and 16-rank cells (calibrated on 2 and 4 ranks: "
        f"one step {calibration['hop_s'] * 1e6:.1f} us x ranks/cores, goodput "
        + ", ".join(f"{r} {b * 8 / 1e6:.0f} Mbit/s"
                    for r, b in calibration["bytes_per_s"].items()) + ")",
        ["rate", "collective", "ranks", "ring ms", "model", "error", "mesh ms", "model",
         "error"], rows)
    summary = {
        **calibration,
        "error_max": max(errors), "error_median": statistics.median(errors),
        "within_0_2": sum(e <= 0.2 for e in errors), "cells": len(errors),
        "auto_error_max": max(chosen), "auto_error_median": statistics.median(chosen),
        "auto_within_0_2": sum(e <= 0.2 for e in chosen), "auto_cells": len(chosen),
    }
    print(f"model error at 8 and 16 ranks: median {summary['error_median']:.2f}, max "
          f"{summary['error_max']:.2f}, {summary['within_0_2']} of {len(errors)} within 0.2; "
          f"what cluster.mesh: auto runs: median {summary['auto_error_median']:.2f}, max "
          f"{summary['auto_error_max']:.2f}, {summary['auto_within_0_2']} of {len(chosen)} "
          f"within 0.2", flush=True)
    return summary


def run(options: dict[str, Any]) -> dict[str, Any]:
    """The grid: rates x rank counts x sizes, ring vs mesh, allgather (and allreduce)."""
    from benchmarks.collectives import _Group
    from benchmarks.netcluster import NetCluster, rate_bits_per_s
    from sparkdl.comm import TcpStoreServer

    quick = bool(options.get("quick", False))
    repeats = int(options.get("repeats") or (3 if quick else 5))
    worlds = (2, 16) if quick else WORLDS
    bytes_worlds = WORLDS
    sizes = (4 * KB,) if quick else SIZES
    reduce_sizes = () if quick else REDUCE_SIZES
    secret = secrets.token_bytes(32)
    forkserver = mp.get_context("forkserver")
    cluster = NetCluster(max(worlds), rate=RATES[0], name="sdlm", subnet="10.78.0",
                         state_dir="/tmp/sparkdl-netcluster-mesh")
    result: dict[str, Any] = {"repeats": repeats, "cells": [], "bytes_vs_ranks": []}
    groups: dict[int, _Group] = {}
    cluster.up_network()
    try:
        store = TcpStoreServer(secret, host=cluster.master_ip, start=False)
        try:
            for world in sorted({*worlds, *bytes_worlds}):
                groups[world] = _Group(
                    f"mesh-{world}w", forkserver, _worker,
                    [(r, world, store.address, secret, cluster.hosts[r].netns,
                      cluster.hosts[r].ip) for r in range(world)],
                )
            store.start()
            for g in groups.values():
                g.ready(120)
            for rate in RATES:
                cluster.set_rate(rate)
                bits = rate_bits_per_s(rate) or 1e9
                rows = []
                cases = [("allgather", s) for s in sizes]
                cases += [("allreduce", s) for s in reduce_sizes]
                for world in worlds:
                    group = groups[world]
                    for kind, nbytes in cases:
                        reps = _reps(nbytes, world, bits)
                        times, wire = _measure(group, kind, nbytes, reps, repeats)
                        ratio = 1 / paired_ratio(times["ring"], times["mesh"])
                        load = os.getloadavg()[0]
                        cell = {
                            "rate": rate, "world": world, "collective": kind, "bytes": nbytes,
                            "ring_ms": statistics.median(times["ring"]) * 1e3,
                            "mesh_ms": statistics.median(times["mesh"]) * 1e3,
                            "mesh_vs_ring": ratio,
                            "ring_rx_bytes": wire["ring"], "mesh_rx_bytes": wire["mesh"],
                            "load1": load,
                        }
                        result["cells"].append(cell)
                        rows.append((f"{kind} {nbytes // KB} KB", world, cell["ring_ms"],
                                     cell["mesh_ms"], ratio, int(wire["ring"]),
                                     int(wire["mesh"]), f"{load:.1f}"))
                print_table(
                    f"ring vs mesh at {rate} per host link, one rank per host (median of "
                    f"{repeats}, alternated; ratio: paired median mesh/ring time)",
                    ["collective", "ranks", "ring ms", "mesh ms", "mesh/ring",
                     "ring rx B/worker", "mesh rx B/worker", "load1"],
                    rows,
                )
                result["bytes_vs_ranks"] += bytes_against_ranks(groups, rate, bytes_worlds)
        finally:
            for g in groups.values():
                g.close()
            store.close()
    finally:
        cluster.down()
    calibration = calibrate(result["cells"], os.cpu_count() or 1)
    if calibration is not None:
        result["model"] = check_model(result["cells"], calibration)
    target = [c for c in result["cells"] if c["rate"] == "1gbit" and c["world"] == 16
              and c["collective"] == "allgather" and c["bytes"] == 4 * KB]
    psgd = {c["world"]: c["tx_bytes_per_worker"] for c in result["bytes_vs_ranks"]
            if c["exchange"] == "powersgd" and c["rate"] == "1gbit"}
    if psgd:
        result["powersgd_bytes_16_vs_2"] = psgd[max(psgd)] / psgd[min(psgd)]
    if target:
        result["mesh_vs_ring_4kb_16w_1gbit"] = target[0]["mesh_vs_ring"]
        print(f"16 ranks, 1 Gbit/s, 4 KB allgather: mesh takes "
              f"{target[0]['mesh_vs_ring']:.2f}x the ring's time (target <= 0.5)", flush=True)
    return result
