"""Bad inputs on a real local Spark: each one clear sparkdl error naming the file or key, and
nothing touched or half-written. The ones that need no Spark are in tests/unit/test_bad_inputs.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from sparkdl.data import write_shards
from sparkdl.errors import DataError

pytestmark = pytest.mark.spark

SHAPE = [4]


def _df(spark, n: int = 40):
    rows = [([float(i), 1.0, 2.0, 3.0], i % 2) for i in range(n)]
    return spark.createDataFrame(rows, "features array<float>, label long")


def test_overwrite_keeps_a_user_folder(spark, tmp_path: Path) -> None:
    folder = tmp_path / "train"
    folder.mkdir()
    (folder / "notes.txt").write_text("mine")
    with pytest.raises(DataError, match=r"train holds files sparkdl did not write \(notes.txt"):
        write_shards(_df(spark), folder.as_uri(), feature_shape=SHAPE, classes=["a", "b"],
                     overwrite=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["train"]
    assert [p.name for p in folder.iterdir()] == ["notes.txt"]
    # sparkdl's own shards (and an empty directory) are still replaced
    write_shards(_df(spark), folder.with_name("mine").as_uri(), feature_shape=SHAPE,
                 classes=["a", "b"])
    write_shards(_df(spark, 20), folder.with_name("mine").as_uri(), feature_shape=SHAPE,
                 classes=["a", "b"], overwrite=True)
