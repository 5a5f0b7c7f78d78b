"""Timelines of the scaling benchmark's model: record one, summarize it, draw one step.

``python jobs/benchmark.py timeline [--out DIR] [--mode sharing] [--epochs 2]`` fits the
scaling benchmark's model (256 → Dense 4096 → 10) with ``ParallelWrapper`` (2 local
workers, no Spark) and ``timeline=DIR/trace``, then writes ``DIR/step.png`` (one step of
every rank) and prints the median time per span. ``python jobs/benchmark.py timeline-png
TRACE... OUT.png [--step N]`` draws a step of existing traces (the before/after pictures).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.scaling import BATCH, CLASSES, INPUT_DIM, ROWS


def load(paths: Sequence[str | Path]) -> tuple[list[dict[str, Any]], dict[tuple[int, int], str]]:
    """The complete events of Chrome trace files and their thread names by ``(pid, tid)``."""
    events: list[dict[str, Any]] = []
    threads: dict[tuple[int, int], str] = {}
    for path in paths:
        document = json.loads(Path(path).read_text())
        for event in document["traceEvents"]:
            if event.get("ph") == "X":
                events.append(event)
            elif event.get("ph") == "M" and event.get("name") == "thread_name":
                threads[(event["pid"], event["tid"])] = event["args"]["name"]
    return events, threads


def self_times(events: list[dict[str, Any]]) -> list[float]:
    """Each event's duration less its direct children's (same pid and tid, nested in time):
    for ``step`` and ``exchange`` that is the Python time between the traced spans."""
    own = [float(e["dur"]) for e in events]
    by_thread: dict[tuple[int, int], list[int]] = defaultdict(list)
    for i, event in enumerate(events):
        by_thread[(event["pid"], event["tid"])].append(i)
    for indices in by_thread.values():
        indices.sort(key=lambda i: (events[i]["ts"], -events[i]["dur"]))
        stack: list[int] = []
        for i in indices:
            start = events[i]["ts"]
            while stack and events[stack[-1]]["ts"] + events[stack[-1]]["dur"] <= start + 1e-3:
                stack.pop()
            if stack:
                own[stack[-1]] -= float(events[i]["dur"])
            stack.append(i)
    return own


def summarize(events: list[dict[str, Any]], skip_epochs: int = 1) -> dict[str, dict[str, float]]:
    """Per span name: count, median and mean duration and median self time (µs), over the
    events after the first ``skip_epochs`` epochs (tracing) of each rank, when there are any."""
    starts = defaultdict(list)
    for event in events:
        if event["name"] == "epoch":
            starts[event["pid"]].append(event["ts"])
    cut = {pid: sorted(ts)[skip_epochs] for pid, ts in starts.items() if len(ts) > skip_epochs}
    own = self_times(events)
    durations: dict[str, list[float]] = defaultdict(list)
    selfs: dict[str, list[float]] = defaultdict(list)
    cpus: dict[str, list[float]] = defaultdict(list)
    for event, mine in zip(events, own):
        if event["ts"] < cut.get(event["pid"], -np.inf):
            continue
        durations[event["name"]].append(float(event["dur"]))
        selfs[event["name"]].append(mine)
        if "cpu_us" in (event.get("args") or {}):
            cpus[event["name"]].append(float(event["args"]["cpu_us"]))
    return {
        name: {"count": len(values), "median_us": statistics.median(values),
               "mean_us": statistics.fmean(values),
               "median_self_us": statistics.median(selfs[name]),
               # the thread's CPU time in the span, where recorded (the overlap's thread)
               **({"median_cpu_us": statistics.median(cpus[name])} if cpus[name] else {})}
        for name, values in sorted(durations.items(), key=lambda kv: -statistics.median(kv[1]))
    }


def pick_step(events: list[dict[str, Any]], step: int | None = None) -> int:
    """The global step to draw: ``step``, else the median-long step of rank 0's last epoch."""
    steps = [e for e in events if e["name"] == "step" and e["pid"] == min(
        x["pid"] for x in events)]
    if not steps:
        raise ValueError("the trace has no 'step' spans")
    if step is not None:
        if step not in {e["args"]["global_step"] for e in steps}:
            raise ValueError(f"the trace has no step {step}")
        return step
    last = max(e["args"]["epoch"] for e in steps)
    candidates = sorted((e for e in steps if e["args"]["epoch"] == last), key=lambda e: e["dur"])
    return int(candidates[len(candidates) // 2]["args"]["global_step"])


def render_step(paths: Sequence[str | Path], out: str | Path, step: int | None = None) -> Path:
    """A Gantt chart of global step ``step`` on every rank in ``paths``: one band per rank
    and thread, nested spans stacked downwards, labels and durations in the bars."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    events, threads = load(paths)
    step = pick_step(events, step)
    windows = {e["pid"]: (e["ts"], e["ts"] + e["dur"]) for e in events
               if e["name"] == "step" and e["args"].get("global_step") == step}
    origin = min(w[0] for w in windows.values())
    end = max(w[1] for w in windows.values())
    shown = [e for e in events if e["pid"] in windows
             and e["ts"] < windows[e["pid"]][1] and e["ts"] + e["dur"] > windows[e["pid"]][0]
             and e["name"] not in ("epoch",)]
    depth = _depths(shown)
    rows: dict[tuple[int, int], int] = {}
    for event in shown:
        key = (event["pid"], event["tid"])
        rows[key] = max(rows.get(key, 0), depth[id(event)] + 1)
    lanes = sorted(rows, key=lambda k: (k[0], threads.get(k, "") != "main", k[1]))
    names = sorted({e["name"] for e in shown}, key=_colour_order)
    cmap = plt.get_cmap("tab20")
    colour = {name: cmap(_colour_order(name)[0]) if name in KNOWN_SPANS else "lightgrey"
              for name in names}
    total_rows = sum(rows[k] for k in lanes) + len(lanes)
    fig, ax = plt.subplots(figsize=(13, 1.6 + 0.42 * total_rows), layout="constrained")
    y, ticks, labels = 0.0, [], []
    for lane in lanes:
        ticks.append(y + rows[lane] / 2 - 0.5)
        labels.append(f"rank {lane[0]}\n{threads.get(lane, lane[1])}")
        for event in (e for e in shown if (e["pid"], e["tid"]) == lane):
            start = (max(event["ts"], origin) - origin) / 1e3
            width = (min(event["ts"] + event["dur"], end) - max(event["ts"], origin)) / 1e3
            row = y + depth[id(event)]
            ax.barh(row, width, left=start, height=0.8, color=colour[event["name"]],
                    edgecolor="black", linewidth=0.4)
            text = f"{event['name']} {event['dur'] / 1e3:.2f} ms"
            nbytes = (event.get("args") or {}).get("bytes_sent")
            if nbytes:
                text += f" · {nbytes / 1024:.1f} KiB"
            char = (end - origin) / 1e3 * 0.0058  # a 7.5 pt character, in ms of the axis
            for label in (text, event["name"]):
                if width > char * (len(label) + 1):
                    ax.text(start + width / 2, row, label, ha="center", va="center",
                            fontsize=7.5, clip_on=True)
                    break
        y += rows[lane] + 1
    ax.set_yticks(ticks, labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(0, (end - origin) / 1e3)
    ax.set_xlabel("milliseconds since the step began")
    ax.grid(True, axis="x", alpha=0.3)
    ax.set_title(f"global step {step}: {(end - origin) / 1e3:.2f} ms", fontsize=10)
    handles = [plt.Rectangle((0, 0), 1, 1, color=colour[n]) for n in names]
    fig.legend(handles, names, fontsize=7.5, ncols=min(len(names), 8),
               loc="outside lower center")
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return out


#: Span names in colour order: the same span has the same colour in every picture.
KNOWN_SPANS = ("step", "data wait", "exchange", "compute", "encode", "communicate", "decode",
               "apply", "hand-off", "allgather", "allreduce", "broadcast", "barrier",
               "overlapped exchange", "event channel", "validation", "checkpoint", "end epoch",
               "epoch figures", "finish", "score")


def _colour_order(name: str) -> tuple[int, str]:
    index = KNOWN_SPANS.index(name) if name in KNOWN_SPANS else len(KNOWN_SPANS)
    return index, name


def _depths(events: list[dict[str, Any]]) -> dict[int, int]:
    """Nesting depth of each event within its thread (0: outermost)."""
    depth: dict[int, int] = {}
    by_thread: dict[tuple[int, int], list[dict[str, Any]]] = defaultdict(list)
    for event in events:
        by_thread[(event["pid"], event["tid"])].append(event)
    for group in by_thread.values():
        group.sort(key=lambda e: (e["ts"], -e["dur"]))
        stack: list[dict[str, Any]] = []
        for event in group:
            while stack and stack[-1]["ts"] + stack[-1]["dur"] <= event["ts"] + 1e-3:
                stack.pop()
            depth[id(event)] = len(stack)
            stack.append(event)
    return depth


def write_shards(root: Path, rows: int = ROWS, seed: int = 0, num_files: int = 4) -> str:
    """The scaling benchmark's data (class clusters in 256 dimensions) as a shard directory
    of ``num_files`` files, row groups of ``BATCH`` rows, written with pyarrow alone (no
    Spark)."""
    rng = np.random.default_rng(seed)
    centers = rng.normal(0, 1, (CLASSES, INPUT_DIM)).astype(np.float32)
    y = rng.integers(0, CLASSES, rows)
    x = centers[y] + rng.normal(0, 1, (rows, INPUT_DIM)).astype(np.float32)
    return write_arrays(root, x, y, classes=CLASSES, batch=BATCH, num_files=num_files)


def write_arrays(root: Path, x: np.ndarray, y: np.ndarray, *, classes: int, batch: int,
                 num_files: int) -> str:
    """Features ``x`` (rows first, any shape) and class labels ``y`` as a shard directory of
    ``num_files`` files, row groups of ``batch`` rows, written with pyarrow alone."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from sparkdl.data.metadata import FORMAT_VERSION, ShardFile, ShardMetadata, write_metadata

    rows, shape = len(x), list(x.shape[1:])
    size = int(np.prod(shape))
    root.mkdir(parents=True, exist_ok=True)
    files = []
    for k, part in enumerate(np.array_split(np.arange(rows), num_files)):
        offsets = pa.array(np.arange(len(part) + 1) * size, pa.int32())
        table = pa.table({
            "features": pa.ListArray.from_arrays(
                offsets, pa.array(x[part].reshape(-1).astype(np.float32))),
            "label": pa.array(y[part], pa.int64()),
        })
        name = f"part-{k:05d}.parquet"
        pq.write_table(table, root / name, row_group_size=batch)
        groups = [min(batch, len(part) - i) for i in range(0, len(part), batch)]
        files.append(ShardFile(name, len(part), groups))
    write_metadata(str(root), ShardMetadata(
        format_version=FORMAT_VERSION, feature_shape=shape, feature_dtype="float32",
        label_kind="class", classes=[str(i) for i in range(classes)], label_shape=[],
        num_rows=rows, files=files,
    ))
    return str(root)


def record(out: Path, mode: str = "sharing", epochs: int = 2) -> list[str]:
    """Fit the scaling model with 2 local workers and a timeline in ``out/trace``; returns the
    per-rank trace URIs."""
    from benchmarks.scaling import _master, _model
    from sparkdl.parallel import ParallelWrapper

    data = write_shards(out / "data")
    wrapper = ParallelWrapper(_model(), _master(mode, 2), timeout_s=120)
    fit = wrapper.fit(data, epochs=epochs, verbose=0, timeline=str(out / "trace"))
    return list(fit.metrics.timeline or [])


def _print_summary(summary: dict[str, dict[str, float]]) -> None:
    print(f"{'span':<22}{'count':>7}{'median µs':>12}{'mean µs':>12}{'median self µs':>16}"
          f"{'median CPU µs':>15}")
    for name, row in summary.items():
        cpu = f"{row['median_cpu_us']:>15.0f}" if "median_cpu_us" in row else f"{'':>15}"
        print(f"{name:<22}{row['count']:>7}{row['median_us']:>12.0f}{row['mean_us']:>12.0f}"
              f"{row['median_self_us']:>16.0f}{cpu}")


def main(argv: Sequence[str]) -> int:
    """``timeline`` and ``timeline-png`` of ``jobs/benchmark.py`` (see the module docstring)."""
    command, rest = argv[0], list(argv[1:])
    parser = argparse.ArgumentParser(prog=f"jobs/benchmark.py {command}", description=__doc__)
    if command == "timeline-png":
        parser.add_argument("paths", nargs="+", metavar="TRACE... OUT.png")
        parser.add_argument("--step", type=int, help="the global step to draw")
        args = parser.parse_args(rest)
        if len(args.paths) < 2:
            parser.error("needs at least one trace file and the output PNG")
        traces, out = args.paths[:-1], args.paths[-1]
        print(render_step(traces, out, args.step))
        _print_summary(summarize(load(traces)[0]))
        return 0
    parser.add_argument("--out", default="runs/timeline", help="working directory")
    parser.add_argument("--mode", default="sharing",
                        choices=["sharing", "sharing_overlap", "dense", "averaging"])
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--step", type=int, help="the global step to draw")
    args = parser.parse_args(rest)
    out = Path(args.out).resolve()
    traces = record(out, args.mode, args.epochs)
    png = render_step(traces, out / "step.png", args.step)
    summary = summarize(load(traces)[0])
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(f"traces: {' '.join(traces)}\npicture: {png}\nsummary: {out / 'summary.json'}")
    _print_summary(summary)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
