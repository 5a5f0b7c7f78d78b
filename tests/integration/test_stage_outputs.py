"""The train and evaluate stages publish their outputs as one unit (real Spark, real
TensorFlow): a train-only rerun leaves no evaluation of the model it replaced, and a train
stage that cannot publish leaves the previous good run as it was."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

pytestmark = pytest.mark.spark


def _snapshot(run: Path) -> dict[str, bytes]:
    return {str(p.relative_to(run)): p.read_bytes() for p in run.rglob("*") if p.is_file()}


def test_a_train_rerun_replaces_the_whole_run_and_a_failed_one_changes_nothing(
        spark, tmp_path: Path, digits_shards) -> None:
    from sparkdl.config import load_config
    from sparkdl.errors import DataError
    from sparkdl.stages import run_evaluate, run_train

    run = tmp_path / "run"
    base = [f"data.dir={digits_shards['train'].rsplit('/', 1)[0]}", f"output.dir={run}",
            "training.num_workers=2", "training.epochs=1", "training.mode=dense"]
    run_train(load_config(None, [*base, "output.export=savedmodel"]), spark)
    run_evaluate(load_config(None, base), spark)
    assert "test accuracy" in (run / "report.html").read_text()
    assert {"model.keras", "evaluation.json", "metrics.json", "report.html",
            "savedmodel/saved_model.pb"} <= set(_snapshot(run))

    # the export cannot be written: a user's file is where the SavedModel goes
    shutil.move(run / "savedmodel", tmp_path / "savedmodel")
    (run / "savedmodel").write_text("a user's file")
    good = _snapshot(run)
    with pytest.raises(DataError, match=r"output\.dir: cannot publish savedmodel: "
                                        r".*savedmodel is a file sparkdl did not write"):
        run_train(load_config(None, [*base, "output.export=savedmodel"]), spark)
    assert _snapshot(run) == good  # the previous good model and its evaluation, untouched
    assert not [p.name for p in run.iterdir() if p.name.startswith(".")]
    (run / "savedmodel").unlink()
    shutil.move(tmp_path / "savedmodel", run / "savedmodel")

    run_train(load_config(None, [*base, "training.seed=7"]), spark)  # train only, no export
    assert (run / "model.keras").read_bytes() != good["model.keras"]
    assert not (run / "evaluation.json").exists()  # it described the old model
    assert not (run / "savedmodel").exists()  # so did the old export
    metrics = json.loads((run / "metrics.json").read_text())
    assert not [key for key in metrics if key.startswith("test_")]
    assert "test accuracy" not in (run / "report.html").read_text()
