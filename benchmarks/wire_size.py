"""Collectives at model size: ``python jobs/benchmark.py wire-size``.

Each rank is a process of its own (no TensorFlow) holding one communicator of each kind in
turn: the TCP ring with same-host shared memory and without it, the log-depth mesh, the
hierarchical topology (two fake hosts of two ranks) and the Spark-RPC transport
(:class:`~sparkdl.comm.AllGatherCommunicator`, here over the rendezvous store, the exchange
that stands in for ``BarrierTaskContext.allGather``). On a vector of ``--elements`` float32
(default 300M: 1.2 GB) each rank times ``allreduce(out=)``, ``allreduce_pieces(out=)`` (the
vector as 161 pieces, as a model's gradients are) and ``broadcast_into``, each twice, and
measures what the collective itself adds to the process's memory: the peak resident set
(``VmHWM``, reset through ``/proc/self/clear_refs`` before each call) less the resident set
just before it, with the input and the result buffer already allocated and touched. A
second full-size copy would show as 1.0× the vector or more. Every result is checked.
"""

from __future__ import annotations

import itertools
import multiprocessing as mp
import os
import secrets
import time
from typing import Any

import numpy as np

from benchmarks.report import print_table

TRANSPORTS = ("ring-shm", "ring-tcp", "mesh", "hierarchical", "spark-rpc")
COLLECTIVES = ("allreduce", "allreduce_pieces", "broadcast_into")
PIECES = 161  # about a ResNet-50's or a BERT's count of weight tensors


def _status_kb(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def _reset_peak() -> None:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets VmHWM to the current resident set


def _communicator(kind: str, rank: int, world: int, address: str, secret: bytes) -> Any:
    from sparkdl.comm import (
        AllGatherCommunicator,
        connect_ring,
        create_communicator,
        store_exchange,
    )

    exchange = store_exchange(address, rank, world, key=kind, secret=secret, timeout_s=300)
    if kind in ("ring-shm", "ring-tcp"):
        return connect_ring(rank, world, exchange, secret=secret, timeout_s=300,
                            shared_memory=kind == "ring-shm")
    if kind == "mesh":
        return create_communicator("tcp", rank, world, exchange, secret=secret, timeout_s=300,
                                   mesh="mesh")
    if kind == "hierarchical":
        return create_communicator("tcp", rank, world, exchange, secret=secret, timeout_s=300,
                                   topology="hierarchical", host_id="ab"[rank * 2 // world])
    return AllGatherCommunicator(rank, world, exchange, timeout_s=300)


def _rank(conn: Any, rank: int, world: int, kind: str, elements: int, address: str,
          secret: bytes) -> None:
    try:
        comm = _communicator(kind, rank, world, address, secret)
        vector = np.full(elements, rank + 1, np.float32)
        result = np.zeros(elements, np.float32)  # zeros: touched below, so resident
        result[:] = np.nan
        cuts = np.linspace(0, elements, PIECES + 1).astype(int)
        pieces = [vector[a:b] for a, b in itertools.pairwise(cuts)]
        expected = world * (world + 1) / 2
        comm.allreduce(np.ones(1024, np.float32))  # links and shared memory set up
        rows = []
        for name in COLLECTIVES:
            for call in (1, 2):
                comm.barrier()
                before = _status_kb("VmRSS")
                _reset_peak()
                start = time.perf_counter()
                if name == "allreduce":
                    comm.allreduce(vector, out=result)
                    ok = result[0] == expected and result[-1] == expected
                elif name == "allreduce_pieces":
                    comm.allreduce_pieces(pieces, out=result)
                    ok = result[0] == expected and result[-1] == expected
                else:
                    target = vector if rank == 0 else result
                    comm.broadcast_into(target, 0)
                    ok = target[0] == 1 and target[-1] == 1
                seconds = time.perf_counter() - start
                grown = (_status_kb("VmHWM") - before) * 1024
                rows.append((name, call, seconds, grown, bool(ok)))
        comm.close()
        conn.send(("ok", rows))
    except BaseException as exc:
        conn.send(("error", f"rank {rank}: {type(exc).__name__}: {exc}"))


def _measure(kind: str, elements: int, timeout_s: float) -> list[list[Any]]:
    from sparkdl.comm import TcpStoreServer

    world = 4 if kind == "hierarchical" else 2
    secret = secrets.token_bytes(32)
    ctx = mp.get_context("spawn")
    with TcpStoreServer(secret) as server:
        pipes, procs = [], []
        for rank in range(world):
            here, there = ctx.Pipe()
            proc = ctx.Process(target=_rank, args=(there, rank, world, kind, elements,
                                                   server.address, secret), daemon=True)
            proc.start()
            pipes.append(here)
            procs.append(proc)
        answers = []
        deadline = time.monotonic() + timeout_s
        for rank, pipe in enumerate(pipes):
            if not pipe.poll(max(0.0, deadline - time.monotonic())):
                for proc in procs:
                    proc.kill()
                raise TimeoutError(f"{kind}: rank {rank} did not finish within {timeout_s} s")
            answers.append(pipe.recv())
        for proc in procs:
            proc.join(10)
    errors = [a[1] for a in answers if a[0] != "ok"]
    if errors:
        raise RuntimeError(f"{kind}: " + "; ".join(errors))
    return [a[1] for a in answers]


def run(options: dict[str, Any]) -> dict[str, Any]:
    elements = int(options.get("elements") or 300_000_000)
    kinds = options.get("transports") or TRANSPORTS
    vector_bytes = elements * 4
    cells = []
    for kind in kinds:
        load = os.getloadavg()[0]
        per_rank = _measure(kind, elements, float(options.get("timeout_s") or 1800))
        for i, (name, call, _, _, _) in enumerate(per_rank[0]):
            seconds = max(r[i][2] for r in per_rank)
            grown = max(r[i][3] for r in per_rank)
            cells.append({
                "transport": kind, "collective": name, "call": call,
                "seconds": seconds, "peak_growth_bytes": grown,
                "growth_per_vector": grown / vector_bytes,
                "correct": all(r[i][4] for r in per_rank), "load": load,
            })
    print_table(
        f"Collectives on {elements:,} float32 ({vector_bytes / 1e9:.2f} GB) per rank: the "
        "largest rank's peak memory growth during the call, against the vector",
        ["transport", "collective", "call", "s (slowest rank)", "growth MB", "growth / vector",
         "correct", "load"],
        [[c["transport"], c["collective"], c["call"], f"{c['seconds']:.2f}",
          f"{c['peak_growth_bytes'] / 1e6:.0f}", f"{c['growth_per_vector']:.3f}",
          "yes" if c["correct"] else "NO", f"{c['load']:.2f}"] for c in cells],
    )
    return {"elements": elements, "vector_bytes": vector_bytes, "cells": cells}
