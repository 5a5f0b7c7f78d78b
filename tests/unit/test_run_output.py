"""A stage's outputs are published as one unit: staged, then swapped in with the completion
file last; the outputs of a later stage that no longer match go; a stage that fails before
it publishes leaves the previous outputs as they were. Local and S3 (moto's server)."""

from __future__ import annotations

from pathlib import Path

import pyarrow.fs as pafs
import pytest

from sparkdl import storage
from sparkdl.errors import DataError
from sparkdl.run_output import STAGING_PREFIX, RunOutput

MARKERS = {"savedmodel": "saved_model.pb", "predictions": "_sparkdl_predictions.json"}
UNIT = ["model.keras", "savedmodel", "report.html", "metrics.json"]
STALE = ["evaluation.json", "predictions"]


def _previous_run(out: RunOutput) -> None:
    """What a train, an evaluate and a predict stage published before."""
    new = out.staging
    for name in ("model.keras", "report.html", "metrics.json", "evaluation.json"):
        (new / name).write_text(f"old {name}")
    for folder, marker in MARKERS.items():
        (new / folder).mkdir()
        (new / folder / "part").write_text(f"old {folder}")
        (new / folder / marker).write_text("old marker")
    out.publish_unit(["model.keras", "savedmodel", "predictions", "evaluation.json",
                      "report.html", "metrics.json"], markers=MARKERS)


def _stage_new(out: RunOutput) -> None:
    new = out.staging
    for name in ("model.keras", "report.html", "metrics.json"):
        (new / name).write_text(f"new {name}")
    (new / "savedmodel").mkdir()
    (new / "savedmodel" / "saved_model.pb").write_text("new marker")


def _files(uri: str) -> dict[str, str]:
    fs, root = storage.resolve(uri)
    return {i.path[len(root) + 1:]: fs.open_input_stream(i.path).read().decode()
            for i in fs.get_file_info(pafs.FileSelector(root, recursive=True))
            if i.type == pafs.FileType.File}


@pytest.fixture(params=["local", "s3"])
def run_uri(request, tmp_path: Path) -> str:
    if request.param == "local":
        return str(tmp_path / "run")
    return f"{request.getfixturevalue('s3_bucket')}/runs/{tmp_path.name}"


def test_a_new_model_replaces_the_old_outputs_and_its_evaluation_goes(run_uri: str) -> None:
    with RunOutput(run_uri) as out:
        _previous_run(out)
    with RunOutput(run_uri) as out:
        _stage_new(out)
        out.publish_unit(UNIT, stale=STALE, markers=MARKERS)
    assert _files(run_uri) == {"model.keras": "new model.keras", "report.html": "new report.html",
                               "metrics.json": "new metrics.json",
                               "savedmodel/saved_model.pb": "new marker"}


def test_a_stage_that_fails_before_publishing_leaves_the_previous_outputs(
        run_uri: str) -> None:
    with RunOutput(run_uri) as out:
        _previous_run(out)
    before = _files(run_uri)
    with pytest.raises(RuntimeError, match="disk full"), RunOutput(run_uri) as out:
        _stage_new(out)
        staging = out.staging
        raise RuntimeError("disk full")  # as an export or a write would fail
    assert _files(run_uri) == before
    assert not staging.exists()


def test_a_target_in_the_way_stops_the_publish_before_anything_changes(tmp_path: Path) -> None:
    with RunOutput(str(tmp_path / "run")) as out:
        _previous_run(out)
    before = _files(str(tmp_path / "run"))
    with RunOutput(str(tmp_path / "run")) as out:
        storage.delete(out.location("savedmodel"))
        (out.dir / "savedmodel").write_text("a user's file")
        before["savedmodel"] = "a user's file"
        del before["savedmodel/part"], before["savedmodel/saved_model.pb"]
        _stage_new(out)
        with pytest.raises(DataError, match=r"cannot publish savedmodel: .*run/savedmodel is a "
                                            r"file sparkdl did not write"):
            out.publish_unit(UNIT, stale=STALE, markers=MARKERS)
    assert _files(str(tmp_path / "run")) == before
    assert not [p for p in (tmp_path / "run").iterdir() if p.name.startswith(STAGING_PREFIX)]


def test_a_stale_folder_without_sparkdls_marker_is_left_alone(tmp_path: Path) -> None:
    run = tmp_path / "run"
    (run / "predictions").mkdir(parents=True)
    (run / "predictions" / "mine.txt").write_text("keep")
    with RunOutput(str(run)) as out:
        _stage_new(out)
        out.publish_unit(UNIT, stale=STALE, markers=MARKERS)
    assert (run / "predictions" / "mine.txt").read_text() == "keep"
    assert (run / "metrics.json").read_text() == "new metrics.json"
