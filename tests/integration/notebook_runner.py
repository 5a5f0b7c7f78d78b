"""Runs Databricks source notebooks and Zeppelin notes the way those tools do: code cells in
order, in one namespace, with the ``spark`` session (and ``sc``) the tool would provide.

Databricks source format: ``# Databricks notebook source`` on the first line, cells separated
by ``# COMMAND ----------``; ``# MAGIC`` lines (``%md``, ``%pip``, ...) are not Python and are
skipped. Zeppelin ``.zpln``: JSON whose ``paragraphs[].text`` start with the interpreter
(``%pyspark`` runs; ``%md`` and others are skipped).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

DATABRICKS_HEADER = "# Databricks notebook source"
DATABRICKS_SEPARATOR = "# COMMAND ----------"
MAGIC = "# MAGIC"


class NotebookCellError(AssertionError):
    """A cell raised: says which notebook and cell, with the cell's source."""


def databricks_cells(path: str | Path) -> list[str]:
    """The Python code cells of a Databricks source notebook (``# MAGIC`` lines dropped)."""
    text = Path(path).read_text()
    first, _, body = text.partition("\n")
    if first.strip() != DATABRICKS_HEADER:
        raise ValueError(f"{path}: first line is {first!r}, not {DATABRICKS_HEADER!r}")
    cells = []
    for chunk in body.split(DATABRICKS_SEPARATOR):
        code = "\n".join(line for line in chunk.splitlines() if not line.startswith(MAGIC))
        if code.strip():
            cells.append(code.strip("\n") + "\n")
    return cells


def zeppelin_paragraphs(path: str | Path, interpreter: str = "%pyspark") -> list[str]:
    """The code of a Zeppelin note's paragraphs bound to ``interpreter`` (its line removed)."""
    note = json.loads(Path(path).read_text())
    paragraphs = note.get("paragraphs")
    if not isinstance(paragraphs, list):
        raise ValueError(f"{path}: no 'paragraphs' list in the note")
    code = []
    for index, paragraph in enumerate(paragraphs):
        text = paragraph.get("text") or ""
        head, _, body = text.lstrip().partition("\n")
        if not head.startswith("%"):
            raise ValueError(f"{path}: paragraph {index} names no interpreter (%pyspark, %md)")
        if head.split()[0] == interpreter and body.strip():
            code.append(body)
    return code


def run_cells(cells: list[str], namespace: dict[str, Any], name: str) -> dict[str, Any]:
    """Executes ``cells`` in order in ``namespace``; a failing cell raises NotebookCellError."""
    for index, source in enumerate(cells):
        try:
            exec(compile(source, f"{name}[cell {index}]", "exec"), namespace)
        except Exception as exc:
            raise NotebookCellError(
                f"{name}: cell {index} raised {type(exc).__name__}: {exc}\n--- cell ---\n{source}"
            ) from exc
    return namespace
