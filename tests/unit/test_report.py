"""history.csv, report.html and ``sparkdl report`` on a realistic run directory."""

from __future__ import annotations

import base64
import csv
import io
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from _run_dir import EPOCHS, write_run_dir

from sparkdl.errors import DataError
from sparkdl.report import build_report, write_history_csv, write_report

PNG = re.compile(r'<img src="data:image/png;base64,([A-Za-z0-9+/=]+)"')
REPO = Path(__file__).resolve().parents[2]


def _images(page: str) -> list[bytes]:
    return [base64.b64decode(data, validate=True) for data in PNG.findall(page)]


def _assert_png(data: bytes) -> None:
    from PIL import Image

    assert data.startswith(b"\x89PNG\r\n\x1a\n")
    with Image.open(io.BytesIO(data)) as image:
        image.verify()
        assert image.format == "PNG" and image.size[0] > 300 and image.size[1] > 200


def test_history_csv_column_order_and_values(tmp_path):
    metrics = write_run_dir(tmp_path)
    history = metrics["history"]
    # Put the keys out of order: the CSV orders them, not the dict.
    shuffled = dict(reversed(list(history.items())))
    path = tmp_path / "history.csv"
    write_history_csv(shuffled, path)
    with open(path, newline="") as handle:
        rows = list(csv.reader(handle))
    assert rows[0] == [
        "epoch", "loss", "accuracy", "val_loss", "val_accuracy", "samples_per_second",
        "bytes_sent_per_step", "bytes_received_per_step", "tau", "sparsity", "compute_s",
        "encode_s", "communicate_s", "decode_s", "apply_s", "data_wait_s", "epoch_s",
    ]
    assert [int(r[0]) for r in rows[1:]] == list(range(EPOCHS))
    for column, name in enumerate(rows[0][1:], start=1):
        assert [float(r[column]) for r in rows[1:]] == history[name]  # exact round trip
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp file left


def test_history_csv_shorter_or_nan_padded_validation(tmp_path):
    metrics = write_run_dir(tmp_path, validation_freq=2)
    history = metrics["history"]
    assert len(history["val_loss"]) == EPOCHS // 2
    write_history_csv(history, tmp_path / "short.csv", epochs=range(10, 10 + EPOCHS))
    padded = {**history, "val_loss": [math.nan, history["val_loss"][0], math.nan,
                                      history["val_loss"][1], math.nan, history["val_loss"][2]]}
    write_history_csv(padded, tmp_path / "padded.csv", epochs=range(10, 10 + EPOCHS))
    for name in ("short.csv", "padded.csv"):
        with open(tmp_path / name, newline="") as handle:
            rows = list(csv.DictReader(handle))
        assert [r["epoch"] for r in rows] == [str(e) for e in range(10, 10 + EPOCHS)]
        assert [r["val_loss"] for r in rows][0::2] == ["", "", ""]
        assert [float(r["val_loss"]) for r in rows[1::2]] == history["val_loss"]
        assert all(r["loss"] for r in rows)


def test_history_csv_refuses_wrong_epoch_numbers(tmp_path):
    with pytest.raises(DataError, match="3 epoch numbers for a history of 2 epochs"):
        write_history_csv({"loss": [1.0, 0.5]}, tmp_path / "h.csv", epochs=[0, 1, 2])
    assert not list(tmp_path.iterdir())


def test_report_has_the_plots_and_headline_figures(tmp_path):
    metrics = write_run_dir(tmp_path)
    path = write_report(tmp_path)
    assert path == tmp_path.resolve() / "report.html"
    page = path.read_text()
    images = _images(page)
    # loss, accuracy, throughput, bytes, tau/sparsity, phases, confusion matrix
    assert len(images) == 7
    for data in images:
        _assert_png(data)
    assert "http://" not in page and "https://" not in page  # self-contained
    assert f"<th>compression vs dense</th><td>{metrics['compression_ratio']:.4g}</td>" in page
    assert f"{metrics['test_accuracy']:.4g}" in page
    assert "Confusion matrix" in page and "Not a sharing run" not in page


def test_dollar_signs_in_class_and_metric_names_are_drawn_as_text(tmp_path):
    """matplotlib reads ``$...$`` as mathtext; a user's names are plain text."""
    write_run_dir(tmp_path)
    evaluation = json.loads((tmp_path / "evaluation.json").read_text())
    names = ["$\\notacommand$", "cost $5 or $6", "$x^$", *map(str, range(3, 10))]
    evaluation["labels"] = names
    (tmp_path / "evaluation.json").write_text(json.dumps(evaluation))
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    history = metrics["history"]
    history["$\\bad{$"] = history["accuracy"]
    history["val_$\\bad{$"] = history["val_accuracy"]
    (tmp_path / "metrics.json").write_text(json.dumps(metrics))
    page = write_report(tmp_path).read_text()
    assert len(_images(page)) == 8  # the metric's curve too
    assert "Metric: $\\bad{$" in page and "cost $5 or $6" in page


def test_report_of_an_averaging_run_before_evaluation(tmp_path):
    write_run_dir(tmp_path, mode="averaging", evaluate=False, validation_freq=2)
    page = build_report(tmp_path)
    assert len(_images(page)) == 5  # loss, accuracy, throughput, bytes, phases
    assert "Not a sharing run (mode: averaging)" in page
    assert "Confusion matrix" not in page


def test_the_evaluated_report_reuses_the_training_plots_drawn_just_before(tmp_path, monkeypatch):
    """A pipeline writes the report after training and again after evaluation, which adds
    only test figures: the fit's plots are drawn once, the same bytes as drawn anew."""
    from sparkdl import report

    write_run_dir(tmp_path, evaluate=False)
    report._drawn.clear()
    before = _images(build_report(tmp_path))
    drawn = []
    monkeypatch.setattr(report, "_png", lambda *args, _png=report._png, **kw: drawn.append(1)
                        or _png(*args, **kw))
    write_run_dir(tmp_path)  # the same fit, evaluated
    after = _images(build_report(tmp_path))
    assert len(drawn) == 1  # the confusion matrix only
    assert after[:len(before)] == before and len(after) == len(before) + 1
    report._drawn.clear()
    assert _images(build_report(tmp_path)) == after
    assert len(drawn) == 1 + len(after)
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    metrics["history"]["loss"][0] += 1.0  # another fit: its plots drawn anew
    (tmp_path / "metrics.json").write_text(json.dumps(metrics))
    changed = _images(build_report(tmp_path))
    assert changed[0] != after[0] and changed[1:] == after[1:]
    assert len(drawn) == 1 + 2 * len(after)


def test_report_errors_name_the_file(tmp_path):
    with pytest.raises(DataError, match=re.escape(str(tmp_path / "metrics.json"))):
        write_report(tmp_path)
    (tmp_path / "metrics.json").write_text('{"history": {"loss": [1.0, "high"]}}')
    with pytest.raises(DataError, match=r"metrics.json: history\['loss'\]: 'high' is not a num"):
        write_report(tmp_path)
    assert not list(tmp_path.glob("*.html")) and not list(tmp_path.glob(".*"))


def test_sparkdl_report_command(tmp_path):
    write_run_dir(tmp_path)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH",
                                                                                  "")])}
    done = subprocess.run([sys.executable, "-m", "sparkdl.cli", "report", str(tmp_path)],
                          capture_output=True, text=True, timeout=120, env=env, cwd=REPO)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"report": str(tmp_path.resolve() / "report.html")}
    assert len(_images((tmp_path / "report.html").read_text())) == 7
    missing = subprocess.run([sys.executable, "-m", "sparkdl.cli", "report",
                              str(tmp_path / "nope")],
                             capture_output=True, text=True, timeout=120, env=env, cwd=REPO)
    assert missing.returncode == 2
    assert "metrics.json" in missing.stderr and missing.stdout == ""


def test_report_leaves_pyplot_and_the_backend_alone(tmp_path):
    import matplotlib

    write_run_dir(tmp_path, evaluate=False)
    backend = matplotlib.get_backend()
    rc = dict(matplotlib.rcParams)
    build_report(tmp_path)
    assert matplotlib.get_backend() == backend
    assert dict(matplotlib.rcParams) == rc
    pyplot = sys.modules.get("matplotlib.pyplot")
    assert pyplot is None or pyplot.get_fignums() == []


def test_report_of_whole_fit_figures_only(tmp_path):
    """metrics.json as the train stage writes it before per-epoch figures: still 4 plots."""
    metrics = write_run_dir(tmp_path, evaluate=False)
    metrics["history"] = {k: metrics["history"][k] for k in ("loss", "accuracy")}
    metrics.update(steady_bytes_per_step=300.0, step_stats={"tau": 6.7e-3, "sparsity": 0.044},
                   step_timings_s={"compute_s": 0.006, "encode_s": 4.5e-4,
                                   "communicate_s": 2.3e-3, "decode_s": 5.1e-4})
    (tmp_path / "metrics.json").write_text(json.dumps(metrics))
    page = build_report(tmp_path)
    assert len(_images(page)) == 4  # loss, accuracy, bytes (whole fit lines), step phases
    assert "not recorded per epoch for this run; whole-fit means: τ 0.0067, sparsity 0.044" in page
    assert "mean time per step over the fit" in page
