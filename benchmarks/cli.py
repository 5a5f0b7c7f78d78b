"""Command line of the benchmark suites (``jobs/benchmark.py``)."""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from collections.abc import Sequence
from importlib import import_module
from pathlib import Path

SUITES = {
    "accuracy": "benchmarks.accuracy",
    "encoding": "benchmarks.encoding",
    "collectives": "benchmarks.collectives",
    "training": "benchmarks.training",
    "reader": "benchmarks.reader",
    "etl": "benchmarks.etl",
    "first-minute": "benchmarks.first_minute",
    "scaling": "benchmarks.scaling",
    "scaling-model": "benchmarks.scaling_model",
    "overlap": "benchmarks.overlap",
    "iteration": "benchmarks.iteration",
    "model-size": "benchmarks.model_size",
    "workers": "benchmarks.workers",
    "wire-size": "benchmarks.wire_size",
}


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in ("timeline", "timeline-png"):
        from benchmarks.timeline import main as timeline_main

        return timeline_main(argv)
    parser = argparse.ArgumentParser(prog="jobs/benchmark.py", description=__doc__)
    parser.add_argument("suite", choices=sorted(SUITES))
    parser.add_argument("--json", dest="json_path", help="write the figures to this JSON file")
    parser.add_argument("--quick", action="store_true", help="fewer repeats (smoke test)")
    parser.add_argument("--cluster", metavar="STATE_DIR",
                        help="scaling: use the running netcluster recorded in STATE_DIR "
                        "instead of bringing one up")
    parser.add_argument("--repeats", type=int, help="scaling: alternating repeats per cell; "
                        "first-minute: runs of each (default 3)")
    parser.add_argument("--cpu-only", action="store_true",
                        help="scaling: only the in-process CPU work per mode (exchange_cpu_s "
                        "and its ratio to the plain step), no cluster")
    parser.add_argument("--mesh", action="store_true",
                        help="collectives: ring vs log-depth (cluster.mesh) collectives, one "
                        "rank per host of the network-namespace harness at 100 Mbit/s and "
                        "1 Gbit/s, 2 to 16 ranks (needs root)")
    parser.add_argument("--ranks", type=int,
                        help="scaling: the 8-rank cells (4 hosts x 2 workers) instead of the "
                        "2-host grid; workers: how many workers (default 8)")
    parser.add_argument("--png", help="scaling-model: write the extrapolation chart here")
    parser.add_argument("--harness", action="store_true",
                        help="workers: fit through Spark on the network-namespace harness "
                        "(ranks // 2 hosts x 2 workers, 1 Gbit/s links; needs root); "
                        "model-size: 2 harness hosts x 1 worker at 1 Gbit/s and 100 Mbit/s, "
                        "each mode against the compute-only step (needs root)")
    parser.add_argument("--scale", type=int,
                        help="etl: the digits ETL on this many copies of its rows instead of "
                        "the CSV, rows handed to Spark as an Arrow table and as Python rows")
    parser.add_argument("--models", help="model-size: the models, comma-separated "
                        "(tiny,resnet50,mlp-40m,bert-base)")
    parser.add_argument("--modes", help="model-size: the modes, comma-separated "
                        "(dense,dense-bf16,sharing,powersgd,averaging)")
    parser.add_argument("--sessions", help="model-size: classic, connect or both, "
                        "comma-separated (default classic)")
    parser.add_argument("--elements", type=int,
                        help="wire-size: float32 elements of the vector (default 300M)")
    parser.add_argument("--transports", help="wire-size: the transports, comma-separated "
                        "(ring-shm,ring-tcp,mesh,hierarchical,spark-rpc)")
    args = parser.parse_args(argv)
    try:
        module = import_module(SUITES[args.suite])
    except ModuleNotFoundError as exc:
        print(f"benchmark suite {args.suite!r} is not available: {exc}", file=sys.stderr)
        return 2
    started = time.time()
    options = {"quick": args.quick, "cluster": args.cluster, "repeats": args.repeats,
               "cpu_only": args.cpu_only or None, "mesh": args.mesh or None,
               "ranks": args.ranks, "png": args.png, "harness": args.harness or None,
               "models": args.models, "modes": args.modes, "sessions": args.sessions,
               "scale": args.scale,
               "elements": args.elements,
               "transports": args.transports.split(",") if args.transports else None}
    figures = module.run({key: value for key, value in options.items() if value is not None})
    figures = {
        "suite": args.suite,
        "quick": args.quick,
        "host": platform.node(),
        "cpus": _cpu_count(),
        "seconds": round(time.time() - started, 1),
        **figures,
    }
    if args.json_path:
        path = Path(args.json_path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(figures, indent=2, sort_keys=True, default=str) + "\n")
        print(f"figures written to {path}")
    return 0


def _cpu_count() -> int:
    import os

    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
