"""sparkdl.run_layout (every path of a run) and sparkdl.storage's atomic local writes."""

from __future__ import annotations

from pathlib import Path

import pytest

from sparkdl import storage
from sparkdl.config import JobConfig
from sparkdl.errors import ConfigurationError
from sparkdl.run_layout import ATTEMPTS_DIR, RunLayout
from sparkdl.run_output import MODEL_FILE


def _config(tmp_path: Path, **training: object) -> JobConfig:
    return JobConfig.model_validate({
        "data": {"dir": str(tmp_path / "data")},
        "output": {"dir": str(tmp_path / "out")},
        "training": training,
    })


def test_a_jobs_layout_names_its_shards_outputs_and_checkpoints(tmp_path: Path) -> None:
    layout = RunLayout.from_config(_config(tmp_path, checkpoint_dir=str(tmp_path / "ckpt")))
    data = (tmp_path / "data").as_uri()
    assert (layout.train_shards, layout.test_shards) == (f"{data}/train", f"{data}/test")
    assert layout.checkpoints().uri == (tmp_path / "ckpt").as_uri()
    attempts = layout.attempts_uri()
    assert attempts is not None
    assert attempts.startswith(f"{(tmp_path / 'ckpt').as_uri()}/{ATTEMPTS_DIR}/")
    assert attempts != layout.attempts_uri()  # one fresh directory per stage
    with layout.output() as out:
        assert out.location(MODEL_FILE) == str(tmp_path / "out" / MODEL_FILE)


def test_a_layout_without_a_place_says_which_one_is_missing(tmp_path: Path) -> None:
    layout = RunLayout.from_config(_config(tmp_path))
    assert layout.checkpoint_dir is None and layout.attempts_uri() is None
    with pytest.raises(ConfigurationError, match="checkpoint_dir"):
        layout.checkpoints()
    with pytest.raises(ConfigurationError, match="data_dir"):
        _ = RunLayout().train_shards


def test_an_atomic_write_that_fails_leaves_the_old_file_and_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "metrics.json"
    storage.write_text_atomically(target, "old")
    with pytest.raises(RuntimeError), storage.atomic_path(target) as tmp:
        tmp.write_text("half")
        raise RuntimeError("killed mid-write")
    assert target.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.json"]


def test_an_atomic_directory_replaces_the_old_one_whole(tmp_path: Path) -> None:
    target = tmp_path / "predictions"
    target.mkdir()
    (target / "old.parquet").write_text("old")
    with storage.atomic_path(target) as tmp:
        tmp.mkdir()
        (tmp / "new.parquet").write_text("new")
        assert not (target / "new.parquet").exists()  # nothing visible before the end
    assert [p.name for p in target.iterdir()] == ["new.parquet"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["predictions"]


def test_a_failed_directory_write_is_removed(tmp_path: Path) -> None:
    target = tmp_path / "savedmodel"
    with pytest.raises(OSError), storage.atomic_path(target) as tmp:
        tmp.mkdir()
        (tmp / "part").write_text("x")
        raise OSError("disk full")
    assert list(tmp_path.iterdir()) == []
