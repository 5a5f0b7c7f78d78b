"""The run's history as a CSV file and its training report as one self-contained HTML page.

A run directory (``output.dir``) holds ``metrics.json`` (written by the train stage: job
figures and the per-epoch ``history``) and, after the evaluate stage, ``evaluation.json``
(a confusion matrix). :func:`write_report` turns them into ``report.html``: embedded PNG plots
(matplotlib, Agg) of loss and metrics with their validation curves, bytes per step against the
dense allreduce, τ and sparsity, per-phase time per epoch, throughput and the confusion matrix,
plus a table of headline figures — the role of DL4J's training-stats HTML export.
``sparkdl report RUN_DIR`` regenerates it.
"""

from __future__ import annotations

import base64
import csv
import html
import io
import json
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sparkdl.errors import DataError
from sparkdl.run_output import EVALUATION_FILE, METRICS_FILE, REPORT_FILE

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from sparkdl.evaluation import Evaluation


#: Seconds per epoch by phase (mean over workers), stacked in the phase plot in this order.
PHASES = ("compute_s", "encode_s", "communicate_s", "decode_s", "apply_s", "data_wait_s")
#: sparkdl's own per-epoch figures, in their column order (after loss, metrics and val_*).
FIGURES = (
    "samples_per_second",
    "bytes_sent_per_step",
    "bytes_received_per_step",
    "tau",
    "sparsity",
    "loss_after_averaging",
    *PHASES,
    "epoch_s",
    "workers",
    "rows_dropped",
)

# Headline rows of the report's table: (key in metrics.json, label).
_HEADLINE = (
    ("mode", "exchange mode"),
    ("num_workers", "workers"),
    ("batch_size_per_worker", "batch size per worker"),
    ("epochs", "epochs"),
    ("steps", "steps"),
    ("rows_dropped_per_epoch", "rows dropped per epoch"),
    ("samples_per_second", "samples/s (whole fit)"),
    ("steady_samples_per_second", "samples/s (after epoch 1)"),
    ("bytes_per_step", "bytes sent per step"),
    ("dense_bytes_per_step", "dense allreduce bytes per step"),
    ("compression_ratio", "compression vs dense"),
    ("train_seconds", "training seconds"),
    ("final_loss", "final loss"),
    ("test_accuracy", "test accuracy"),
    ("test_macro_f1", "test macro F1"),
    ("test_top_5_accuracy", "test top-5 accuracy"),
    ("test_auroc", "test AUROC"),
    ("test_macro_auroc", "test macro AUROC"),
    ("test_rmse", "test RMSE"),
    ("test_r2", "test R²"),
    ("test_examples", "test examples"),
    ("replicas_identical", "replicas identical"),
)


def history_columns(history: Mapping[str, Sequence[float]]) -> list[str]:
    """The history's keys in report order: ``loss``, compiled metrics, ``val_*``, figures."""
    keys = list(history)
    figures = [k for k in FIGURES if k in history]
    metrics = [k for k in keys if k != "loss" and not k.startswith("val_") and k not in FIGURES]
    validation = [f"val_{k}" for k in ("loss", *metrics) if f"val_{k}" in history]
    validation += [k for k in keys if k.startswith("val_") and k not in validation]
    return (["loss"] if "loss" in history else []) + metrics + validation + figures


def align_history(
    history: Mapping[str, Sequence[float]], validation_freq: int | None = None
) -> dict[str, list[float]]:
    """Every series as one value per epoch, ``nan`` where an epoch has none.

    The number of epochs is the longest series. A shorter ``val_*`` series (Keras records
    validation only on validation epochs) is placed on the epochs ``e`` with
    ``(e + 1) % validation_freq == 0``; without ``validation_freq`` the frequency is the one
    that gives its length, else it is aligned to the first epochs.
    """
    epochs = max((len(v) for v in history.values()), default=0)
    aligned: dict[str, list[float]] = {}
    for key in history_columns(history):
        values = [_number(v, key) for v in history[key]]
        if len(values) < epochs:
            at = _validation_epochs(epochs, len(values), validation_freq)
            full = [math.nan] * epochs
            for epoch, value in zip(at, values):
                full[epoch] = value
            values = full
        aligned[key] = values
    return aligned


def write_history_csv(
    history: Mapping[str, Sequence[float]],
    path: str | os.PathLike[str],
    *,
    epochs: Sequence[int] | None = None,
    validation_freq: int | None = None,
) -> None:
    """Write one row per epoch: ``epoch``, ``loss``, metrics, ``val_*``, sparkdl's figures.

    Args:
        history: a Keras ``History.history`` dict (lists may differ in length, see
            :func:`align_history`).
        path: the CSV file, replaced atomically.
        epochs: the epoch numbers of the rows (``History.epoch``); default ``0, 1, ...`` as in
            Keras's ``CSVLogger``.
        validation_freq: how often validation ran, to place shorter ``val_*`` series.
    """
    aligned = align_history(history, validation_freq)
    count = max((len(v) for v in aligned.values()), default=0)
    numbers = list(epochs) if epochs is not None else list(range(count))
    if len(numbers) != count:
        raise DataError(f"{len(numbers)} epoch numbers for a history of {count} epochs")
    from sparkdl.storage import atomic_path

    with atomic_path(path) as tmp, open(tmp, "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["epoch", *aligned])
        for row, epoch in enumerate(numbers):
            writer.writerow([int(epoch), *(_cell(v[row]) for v in aligned.values())])


def read_run(run_dir: str | os.PathLike[str]) -> tuple[dict[str, Any], Evaluation | None]:
    """The run's ``metrics.json`` and its evaluation (``None`` before the evaluate stage)."""
    from sparkdl.evaluation import Evaluation
    from sparkdl.evaluation.base import check_sizes

    run = Path(run_dir)
    metrics_path = run / METRICS_FILE
    if not metrics_path.is_file():
        raise DataError(f"no {METRICS_FILE} in {run}: {metrics_path} is missing "
                        f"(run the train stage first)")
    metrics = _read_json(metrics_path)
    history = metrics.get("history", {})
    if not isinstance(history, Mapping) or not all(
        isinstance(v, Sequence) and not isinstance(v, str) for v in history.values()
    ):
        raise DataError(f"{metrics_path}: 'history' must map names to per-epoch lists")
    for key, values in history.items():
        for value in values:
            _number(value, f"{metrics_path}: history[{key!r}]")
    evaluation = None
    evaluation_path = run / EVALUATION_FILE
    if evaluation_path.is_file():
        data = _read_json(evaluation_path)
        try:
            if "num_classes" in data or not ({"evaluations", "outputs"} & set(data)):
                check_sizes(Evaluation, data)
                evaluation = Evaluation.from_dict(data)
        except (KeyError, TypeError, ValueError) as exc:
            raise DataError(f"{evaluation_path} is not an evaluation: {exc}") from None
    return metrics, evaluation


def build_report(run_dir: str | os.PathLike[str]) -> str:
    """The HTML report of a run directory (see the module docstring)."""
    metrics, evaluation = read_run(run_dir)
    history = align_history(metrics.get("history", {}), metrics.get("validation_freq"))
    sections: list[str] = []
    with _plot_style():
        sections += _training_sections(history, metrics)
        if evaluation is not None:
            sections.append(_section("Confusion matrix (test data)", _confusion(evaluation)))
            sections.append(_section("Per-class figures (test data)", _class_table(evaluation)))
        figures = _evaluation_figures(Path(run_dir) / EVALUATION_FILE)
        if figures:
            sections.append(_section("Evaluations (test data)", figures))
    body = [_headline_table(metrics, history), _elastic(metrics), _timeline_links(metrics),
            f'<div class="plots">{"".join(sections)}</div>',
            _history_table(history) if history else ""]
    name = html.escape(Path(run_dir).resolve().name)
    return _PAGE.format(title=f"sparkdl run report: {name}", body="\n".join(body))


#: The training plots last drawn, by what they were drawn from: a pipeline's evaluate stage
#: redraws the report its train stage drew a moment before, with only test figures added.
_drawn: dict[str, list[str]] = {}


def _training_sections(history: Mapping[str, list[float]],
                       metrics: Mapping[str, Any]) -> list[str]:
    """The plots of the fit: learning curves, throughput, bytes, τ, phases. They read the
    history and the fit's metrics, never the test figures (``test_*``) that evaluation adds."""
    fit_metrics = {key: value for key, value in metrics.items() if not key.startswith("test_")}
    key = json.dumps([history, fit_metrics], sort_keys=True, default=str)
    if key not in _drawn:
        sections = [_section(f"{_title(k)}", _learning_curve(history, k))
                    for k in history_columns(history)
                    if not k.startswith("val_") and k not in FIGURES]
        if "samples_per_second" in history:
            sections.append(_section("Throughput", _throughput(history)))
        sections.append(_section("Bytes per step", _bytes(history, fit_metrics)))
        sections.append(_section("Threshold τ and sparsity", _threshold(history, fit_metrics)))
        sections.append(_section("Time per epoch by phase", _phases(history, fit_metrics)))
        _drawn.clear()
        _drawn[key] = sections
    return list(_drawn[key])


def write_report(run_dir: str | os.PathLike[str]) -> Path:
    """Write ``run_dir/report.html`` atomically and return its path."""
    page = build_report(run_dir)
    from sparkdl.storage import write_text_atomically

    path = Path(run_dir).resolve() / REPORT_FILE
    write_text_atomically(path, page)
    return path


# ---------------------------------------------------------------------------------------------
# plots: each returns an <img> (or a short note when there is nothing to plot)


def _learning_curve(history: Mapping[str, list[float]], key: str) -> str:
    fig, ax = _figure()
    epochs = _epochs(history)
    ax.plot(epochs, history[key], marker="o", label=f"train {key}")
    if key == "loss" and _any(history.get("loss_after_averaging")):
        ax.plot(epochs, history["loss_after_averaging"], marker="^", linestyle=":",
                label="loss after averaging")
    val = history.get(f"val_{key}")
    if _any(val):
        shown = [(e, v) for e, v in zip(epochs, val) if not math.isnan(v)]
        ax.plot(*zip(*shown), marker="s", linestyle="--", label=f"validation {key}")
    ax.set_ylabel(key)
    ax.legend()
    return _png(fig, ax, "epoch")


def _throughput(history: Mapping[str, list[float]]) -> str:
    fig, ax = _figure()
    ax.plot(_epochs(history), history["samples_per_second"], marker="o", color="tab:green")
    ax.set_ylabel("samples / s (all workers)")
    ax.set_ylim(bottom=0)
    return _png(fig, ax, "epoch")


def _bytes(history: Mapping[str, list[float]], metrics: Mapping[str, Any]) -> str:
    dense = metrics.get("dense_bytes_per_step")
    sent = history.get("bytes_sent_per_step")
    if not _any(sent) and not dense:
        return _note("No bytes per step were recorded for this run.")
    fig, ax = _figure()
    epochs = _epochs(history)
    if _any(sent):
        ax.plot(epochs, sent, marker="o", label="sent per step (mean over workers)")
    received = history.get("bytes_received_per_step")
    if _any(received):
        ax.plot(epochs, received, marker="s", linestyle="--", label="received per step")
    if not _any(sent):  # only the whole fit's figures were recorded
        for key, label, style in (("bytes_per_step", "sent per step (whole fit)", "-"),
                                  ("steady_bytes_per_step", "sent per step (after epoch 1)",
                                   "--")):
            if metrics.get(key):
                ax.axhline(metrics[key], linestyle=style, color="tab:blue", label=label)
        ax.set_xlim(-0.5, max(len(epochs), 1) - 0.5)
    if dense:
        ax.axhline(dense, color="tab:red", linestyle=":", label="dense allreduce")
    ax.set_yscale("log")
    ax.set_ylabel("bytes per step")
    ratio = metrics.get("compression_ratio")
    if ratio is None and dense and _any(sent):
        ratio = dense / _mean(sent)
    if ratio:
        ax.set_title(f"{_format(ratio)}× fewer bytes than the dense allreduce", fontsize=11)
    ax.legend()
    return _png(fig, ax, "epoch")


def _threshold(history: Mapping[str, list[float]], metrics: Mapping[str, Any]) -> str:
    tau, sparsity = history.get("tau"), history.get("sparsity")
    if not _any(tau) and not _any(sparsity):
        mode = metrics.get("mode", "unknown")
        if mode != "sharing":
            return _note(f"Not a sharing run (mode: {mode}): no threshold τ or sparsity.")
        stats = metrics.get("step_stats") or {}
        means = ", ".join(f"{name} {_format(stats[key])}" for key, name in
                          (("tau", "τ"), ("sparsity", "sparsity")) if key in stats)
        return _note("τ and sparsity were not recorded per epoch for this run"
                     + (f"; whole-fit means: {means}." if means else "."))
    fig, ax = _figure()
    epochs = _epochs(history)
    lines = []
    if _any(tau):
        lines += ax.plot(epochs, tau, marker="o", color="tab:purple", label="τ (threshold)")
        ax.set_ylabel("τ")
        ax.set_yscale("log")
    if _any(sparsity):
        other = ax.twinx() if _any(tau) else ax
        lines += other.plot(epochs, sparsity, marker="s", linestyle="--", color="tab:orange",
                            label="sparsity (fraction sent)")
        other.set_ylabel("fraction of elements sent")
        other.set_yscale("log")
    ax.legend(lines, [line.get_label() for line in lines])
    return _png(fig, ax, "epoch")


def _phases(history: Mapping[str, list[float]], metrics: Mapping[str, Any]) -> str:
    phases = [p for p in PHASES if _any(history.get(p))]
    if not phases:
        return _step_phases(metrics.get("step_timings_s") or {})
    import numpy as np

    fig, ax = _figure()
    epochs = np.asarray(_epochs(history))
    bottom = np.zeros(len(epochs))
    for phase in phases:
        values = np.nan_to_num(np.asarray(history[phase], dtype=float))
        ax.bar(epochs, values, bottom=bottom, label=phase.removesuffix("_s"), width=0.7)
        bottom += values
    if _any(history.get("epoch_s")):
        ax.plot(epochs, history["epoch_s"], marker="_", markersize=30, linestyle="none",
                color="black", label="epoch wall time")
    ax.set_ylabel("seconds per epoch (mean over workers)")
    ax.legend(fontsize=9, ncols=2)
    return _png(fig, ax, "epoch")


def _step_phases(timings: Mapping[str, float]) -> str:
    """One stacked bar of the whole fit's mean seconds per step by phase."""
    phases = [p for p in PHASES if timings.get(p)]
    if not phases:
        return _note("No per-phase times were recorded for this run.")
    fig, ax = _figure((6.4, 2.0))
    left = 0.0
    for phase in phases:
        value = 1e3 * float(timings[phase])
        ax.barh([0], [value], left=left, label=phase.removesuffix("_s"), height=0.6)
        left += value
    ax.set_yticks([0], ["whole fit"])
    ax.legend(fontsize=9, ncols=len(phases), loc="lower center", bbox_to_anchor=(0.5, 1.0))
    ax.grid(True, axis="x", alpha=0.3)
    return (_note("Not recorded per epoch for this run: mean time per step over the fit.")
            + _png(fig, ax, "milliseconds per step (mean over workers)", grid=False))


def _confusion(evaluation: Evaluation) -> str:
    n = evaluation.num_classes
    size = min(8.0, max(4.0, 0.3 * n + 2.6))
    fig, ax = _figure((size + 0.8, size))
    matrix = evaluation.confusion
    image = ax.imshow(matrix, cmap="Blues")
    fig.colorbar(image, ax=ax, fraction=0.046, pad=0.04)
    ticks = range(n)
    ax.set_xticks(ticks, evaluation.labels, rotation=90 if n > 12 else 0)
    ax.set_yticks(ticks, evaluation.labels)
    ax.set_ylabel("actual class")
    ax.set_title(f"accuracy {evaluation.accuracy():.4f}, macro F1 {evaluation.macro_f1():.4f}, "
                 f"{evaluation.count} examples", fontsize=11)
    if n <= 20:
        high = matrix.max() / 2 if matrix.size else 0
        for (row, col), value in _enumerate(matrix):
            if value:
                ax.text(col, row, str(value), ha="center", va="center", fontsize=8,
                        color="white" if value > high else "black")
    return _png(fig, ax, "predicted class", grid=False)


# ---------------------------------------------------------------------------------------------
# tables and page


def _headline_table(metrics: Mapping[str, Any], history: Mapping[str, list[float]]) -> str:
    rows = [(label, metrics[key]) for key, label in _HEADLINE if metrics.get(key) is not None]
    for key in [k for k in history if k.startswith("val_")]:
        last = [v for v in history[key] if not math.isnan(v)]
        if last:
            rows.append((f"final {key}", last[-1]))
    cells = "".join(f"<tr><th>{html.escape(label)}</th><td>{html.escape(_format(value))}</td>"
                    f"</tr>" for label, value in rows)
    return f'<section><h2>Run</h2><table class="headline">{cells}</table></section>'


def _timeline_links(metrics: Mapping[str, Any]) -> str:
    """Links to the per-rank Chrome traces of ``training.timeline`` (none: nothing)."""
    files = metrics.get("timeline")
    if not isinstance(files, list) or not files:
        return ""
    links = ", ".join(
        f'<a href="{html.escape(_href(str(uri)))}">{html.escape(str(uri).rsplit("/", 1)[-1])}</a>'
        for uri in files
    )
    return ("<section><h2>Timeline</h2><p>Chrome traces of every step, one per rank: "
            f"{links}. Open them in <a href=\"https://ui.perfetto.dev\">ui.perfetto.dev</a> "
            "or chrome://tracing.</p></section>")


def _href(uri: str) -> str:
    return uri if "://" in uri else Path(uri).resolve().as_uri()


def _elastic(metrics: Mapping[str, Any]) -> str:
    """One line per relaunch of the training stage (``elastic_events``): an elastic fit's, at
    another world size or the same, and Spark's retry of a failed stage."""
    lines = [
        f"Elastic fit: relaunched at epoch {e['epoch']}, step {e['step']} with the same "
        f"{e['to_workers']} workers after: {e['cause']}"
        if e["to_workers"] == e["from_workers"] else
        f"Elastic fit: continued at epoch {e['epoch']}, step {e['step']} with "
        f"{e['to_workers']} workers instead of {e['from_workers']} after: {e['cause']}"
        for e in metrics.get("elastic_events") or ()
    ]
    return "".join(_note(line) for line in lines)


def _class_table(evaluation: Evaluation) -> str:
    p, r, f = evaluation.precision(), evaluation.recall(), evaluation.f1()
    support = evaluation.confusion.sum(axis=1)
    head = "<tr><th>class</th><th>precision</th><th>recall</th><th>F1</th><th>support</th></tr>"
    body = "".join(
        f"<tr><td>{html.escape(label)}</td><td>{p[i]:.4f}</td><td>{r[i]:.4f}</td>"
        f"<td>{f[i]:.4f}</td><td>{int(support[i])}</td></tr>"
        for i, label in enumerate(evaluation.labels)
    )
    return f'<table class="grid">{head}{body}</table>'


def _evaluation_figures(path: Path) -> str:
    """A table of every evaluation's headline figures (``evaluation.json``'s ``evaluations``
    or per-output ``outputs``); empty for an evaluation file without them."""
    from sparkdl.evaluation import evaluation_from_dict

    if not path.is_file():
        return ""
    data = _read_json(path)
    groups = data.get("outputs") or {"": data.get("evaluations") or []}
    rows = []
    for output, values in groups.items():
        for value in values:
            evaluation = evaluation_from_dict(value, source=str(path))
            for name, figure in evaluation.summary().items():
                rows.append(f"<tr><td>{html.escape(output)}</td>"
                            f"<td>{html.escape(evaluation.kind)}</td>"
                            f"<td>{html.escape(name)}</td><td>{_format(figure)}</td></tr>")
    if not rows:
        return ""
    head = "<tr><th>output</th><th>evaluation</th><th>figure</th><th>value</th></tr>"
    return f'<table class="grid">{head}{"".join(rows)}</table>'


def _history_table(history: Mapping[str, list[float]]) -> str:
    head = "".join(f"<th>{html.escape(k)}</th>" for k in ("epoch", *history))
    rows = "".join(
        f"<tr><td>{e}</td>" + "".join(f"<td>{_cell(v[e], 4)}</td>" for v in history.values())
        + "</tr>"
        for e in _epochs(history)
    )
    return (f"<section><h2>History</h2><details><summary>Every epoch's figures</summary>"
            f'<div class="scroll"><table class="grid"><tr>{head}</tr>{rows}</table></div>'
            f"</details></section>")


def _section(title: str, content: str) -> str:
    return f"<section><h2>{html.escape(title)}</h2>{content}</section>"


def _note(text: str) -> str:
    return f'<p class="note">{html.escape(text)}</p>'


_PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{title}</title>
<style>
body {{ font-family: sans-serif; margin: 1.5em auto; max-width: 1300px; padding: 0 1em;
       color: #222; }}
div.plots {{ display: grid; grid-template-columns: repeat(auto-fit, minmax(480px, 1fr));
            gap: 0 2em; }}
h1 {{ font-size: 1.5em; }} h2 {{ font-size: 1.15em; border-bottom: 1px solid #ccc; }}
img {{ max-width: 100%; }}
table {{ border-collapse: collapse; font-size: 0.9em; }}
table.headline th {{ text-align: left; padding: 2px 1.5em 2px 0; font-weight: normal; }}
table.headline td {{ font-family: monospace; }}
table.grid td, table.grid th {{ border: 1px solid #ddd; padding: 2px 6px; text-align: right; }}
div.scroll {{ overflow-x: auto; }}
p.note {{ color: #666; font-style: italic; }}
</style></head>
<body><h1>{title}</h1>
{body}
</body></html>
"""


# ---------------------------------------------------------------------------------------------
# helpers


def _plot_style() -> Any:
    """matplotlib's default style for the report's figures, restored afterwards.

    Figures are made with :class:`matplotlib.figure.Figure` and drawn by the Agg canvas, so
    neither pyplot nor the user's backend is touched. Mathtext is off: class and metric names
    are the user's text, and ``$...$`` in one is drawn as written, not parsed as TeX.
    """
    import contextlib

    import matplotlib
    import matplotlib.style

    stack = contextlib.ExitStack()
    stack.enter_context(matplotlib.style.context("default"))
    stack.enter_context(matplotlib.rc_context({"text.parse_math": False, "text.usetex": False}))
    return stack


def _figure(size: tuple[float, float] = (6.4, 3.4)) -> tuple[Figure, Any]:
    from matplotlib.figure import Figure

    fig = Figure(figsize=size, dpi=100, layout="constrained")
    return fig, fig.add_subplot()


def _png(fig: Figure, ax: Any, xlabel: str, *, grid: bool = True) -> str:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.ticker import MaxNLocator

    ax.set_xlabel(xlabel)
    if grid:
        ax.grid(True, alpha=0.3)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    buffer = io.BytesIO()
    FigureCanvasAgg(fig).print_png(buffer)
    data = base64.b64encode(buffer.getvalue()).decode("ascii")
    return f'<img src="data:image/png;base64,{data}" alt="{html.escape(ax.get_ylabel())}">'


def _validation_epochs(epochs: int, count: int, freq: int | None) -> list[int]:
    candidates = [freq] if freq else [f for f in range(1, epochs + 1) if epochs // f == count]
    for f in candidates:
        at = [e for e in range(epochs) if (e + 1) % f == 0]
        if len(at) == count:
            return at
    return list(range(count))


def _epochs(history: Mapping[str, list[float]]) -> list[int]:
    return list(range(max((len(v) for v in history.values()), default=0)))


def _number(value: Any, where: str) -> float:
    if value is None:
        return math.nan
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        try:
            return float(value)  # numpy scalars
        except (TypeError, ValueError):
            raise DataError(f"{where}: {value!r} is not a number") from None
    return float(value)


def _any(values: Sequence[float] | None) -> bool:
    return bool(values) and any(not math.isnan(v) for v in values)


def _mean(values: Sequence[float]) -> float:
    finite = [v for v in values if not math.isnan(v)]
    return sum(finite) / len(finite) if finite else math.nan


def _cell(value: float, digits: int | None = None) -> str:
    """A CSV or table cell: empty for ``nan``, else the shortest exact (or ``digits``) form."""
    if math.isnan(value):
        return ""
    return repr(value) if digits is None else f"{value:.{digits}g}"


def _format(value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, int):
        return f"{value:,}"
    if value == 0 or 1e-3 <= abs(value) < 1e6:
        return f"{value:,.4g}" if abs(value) < 1e4 else f"{value:,.0f}"
    return f"{value:.3e}"


def _enumerate(matrix: Any) -> Any:
    import numpy as np

    return ((index, int(value)) for index, value in np.ndenumerate(matrix))


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise DataError(f"cannot read {path}: {exc}") from None
    if not isinstance(data, dict):
        raise DataError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data


def _title(key: str) -> str:
    return "Loss" if key == "loss" else f"Metric: {key}"
