"""The notebooks in notebooks/ run end to end: Jupyter through a real kernel (nbclient),
Databricks and Zeppelin cell by cell against local Spark, with ``spark`` provided as there."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from notebook_runner import (
    databricks_cells,
    run_cells,
    zeppelin_paragraphs,
)

REPO = Path(__file__).resolve().parents[2]
NOTEBOOKS = REPO / "notebooks"

pytestmark = pytest.mark.spark


def test_jupyter_notebook_runs_with_plots_and_progress(tmp_path, monkeypatch):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    notebook = nbformat.read(NOTEBOOKS / "digits.ipynb", as_version=4)
    monkeypatch.setenv("SPARKDL_NOTEBOOK_DIR", str(tmp_path))
    nbclient.NotebookClient(
        notebook, timeout=300, kernel_name="python3",
        resources={"metadata": {"path": str(REPO)}},
    ).execute()
    outputs = [o for c in notebook.cells if c.cell_type == "code" for o in c.outputs]
    text = "".join(o.get("text", "") for o in outputs)
    assert "Accuracy:" in text
    assert "Epoch 1/" in text  # the driver's progress bar
    assert "/row" in text  # the evaluation's bar of the rows its tasks report
    assert "stopped at epoch" in text  # the callbacks' effect is shown
    assert "recall of 3 and 8 with class weights" in text
    assert text.count("cross-validated accuracy") == 2  # a CrossValidator over two rates
    figures = [o for o in outputs if "image/png" in o.get("data", {})]
    assert len(figures) >= 2, "history curves and confusion matrix were not drawn"


@pytest.mark.slow  # default suite under 20 minutes
def test_databricks_notebook_runs(spark, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SPARKDL_NOTEBOOK_DIR", str(tmp_path))
    monkeypatch.delenv("SPARKDL_DATA_ROOT", raising=False)
    cells = databricks_cells(NOTEBOOKS / "digits_databricks.py")
    namespace = run_cells(cells, {"spark": spark, "sc": spark.sparkContext},
                          "digits_databricks.py")
    assert namespace["evaluation"].accuracy() > 0.85
    assert namespace["history"].metrics["replicas_identical"] is True
    assert (tmp_path / "model.keras").is_file()
    assert "epoch 3/3" in capsys.readouterr().out  # one progress line per epoch


@pytest.mark.slow  # default suite under 20 minutes
def test_zeppelin_note_runs(spark, tmp_path, monkeypatch):
    monkeypatch.setenv("SPARKDL_NOTEBOOK_DIR", str(tmp_path))
    paragraphs = zeppelin_paragraphs(NOTEBOOKS / "mnist_zeppelin.zpln")
    namespace = run_cells(paragraphs, {"spark": spark, "sc": spark.sparkContext},
                          "mnist_zeppelin.zpln")
    assert namespace["local_history"].metrics["replicas_identical"] is True
    assert namespace["spark_history"].metrics["replicas_identical"] is True
    assert namespace["evaluation"].accuracy() > 0.75


def test_runner_reads_cells_and_skips_magic(tmp_path):
    source = tmp_path / "nb.py"
    source.write_text("# Databricks notebook source\n# MAGIC %md # title\n\n"
                      "# COMMAND ----------\n\nx = 1\n\n# COMMAND ----------\n\n"
                      "# MAGIC %pip install sparkdl\ny = x + 1\n")
    assert databricks_cells(source) == ["x = 1\n", "y = x + 1\n"]
    note = tmp_path / "note.zpln"
    note.write_text(json.dumps({"paragraphs": [
        {"text": "%md\n# title"}, {"text": "%pyspark\nz = 3"}, {"text": "%sql\nselect 1"},
    ]}))
    assert zeppelin_paragraphs(note) == ["z = 3"]
    assert run_cells(["a = 2", "b = a * 3"], {}, "cells")["b"] == 6


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("nb.py", "print(1)\n", "not '# Databricks notebook source'"),
        ("note.zpln", '{"name": "x"}', "no 'paragraphs' list"),
        ("note.zpln", '{"paragraphs": [{"text": "print(1)"}]}', "paragraph 0 names no interpreter"),
    ],
)
def test_runner_names_what_is_wrong(tmp_path, name, content, message):
    path = tmp_path / name
    path.write_text(content)
    reader = databricks_cells if name.endswith(".py") else zeppelin_paragraphs
    with pytest.raises(ValueError, match=message):
        reader(path)


def test_failing_cell_names_notebook_and_cell():
    with pytest.raises(AssertionError, match=r"nb: cell 1 raised ZeroDivisionError"):
        run_cells(["a = 1", "a / 0"], {}, "nb")
