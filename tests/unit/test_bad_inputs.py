"""Bad inputs that need no Spark: each gets one clear sparkdl error (what, where), a non-zero
exit from the CLI, and leaves nothing half-written. The Spark ones are in
tests/integration/test_bad_inputs.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from sparkdl.data.writer import check_replaceable
from sparkdl.errors import DataError


# --- item 1: only what sparkdl wrote is replaced ---------------------------------------------

def test_user_folder_is_not_replaceable(tmp_path: Path) -> None:
    folder = tmp_path / "train"
    folder.mkdir()
    (folder / "thesis.tex").write_text("years of work")
    with pytest.raises(DataError, match=r"train holds files sparkdl did not write \(thesis.tex"):
        check_replaceable(folder.as_uri())
    assert (folder / "thesis.tex").read_text() == "years of work"


def test_a_file_is_not_replaceable(tmp_path: Path) -> None:
    (tmp_path / "train").write_text("x")
    with pytest.raises(DataError, match="train exists and is not a directory"):
        check_replaceable((tmp_path / "train").as_uri())


def test_sparkdl_or_empty_or_absent_is_replaceable(tmp_path: Path) -> None:
    check_replaceable((tmp_path / "absent").as_uri())
    (tmp_path / "empty").mkdir()
    check_replaceable((tmp_path / "empty").as_uri())
    (tmp_path / "shards").mkdir()
    (tmp_path / "shards" / "_sparkdl.json").write_text("{}")
    (tmp_path / "shards" / "part-00000.parquet").write_text("")
    check_replaceable((tmp_path / "shards").as_uri())
    with pytest.raises(DataError, match="no _sparkdl_predictions.json"):
        check_replaceable((tmp_path / "shards").as_uri(), marker="_sparkdl_predictions.json")
