"""The MNIST pipeline: IDX files (gzipped or not) → image scaling → shards for the LeNet.

``data.options``: ``path`` (directory holding the four IDX files: ``train-images-idx3-ubyte``,
``train-labels-idx1-ubyte``, ``t10k-images-idx3-ubyte``, ``t10k-labels-idx1-ubyte``, each
optionally ``.gz``), and optionally ``files`` (other names for those four, keys
``train_images``, ``train_labels``, ``test_images``, ``test_labels``), ``transform`` (image
steps before assembly), ``normalizer`` (default ``image``: [0, 255] → [0, 1]), ``nan_policy``,
``num_files``, ``num_workers``, ``rows_per_group``, ``chunk_rows``, ``seed``. The IDX files'
own train/test split is kept.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pyarrow.fs as pafs

from sparkdl.data.metadata import resolve
from sparkdl.errors import ConfigurationError, DataError
from sparkdl.etl.readers.idx import read_idx
from sparkdl.etl.transform import Assemble, TransformProcess
from sparkdl.pipelines.common import check_common, no_unknown, option, write_splits

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

FILES = {
    "train_images": "train-images-idx3-ubyte", "train_labels": "train-labels-idx1-ubyte",
    "test_images": "t10k-images-idx3-ubyte", "test_labels": "t10k-labels-idx1-ubyte",
}
CLASSES = [str(i) for i in range(10)]


def _find(base: str, name: str, key: str) -> str:
    fs, path = resolve(base)
    for candidate in (name, f"{name}.gz"):
        if fs.get_file_info(f"{path.rstrip('/')}/{candidate}").type == pafs.FileType.File:
            return f"{base.rstrip('/')}/{candidate}"
    raise DataError(f"IDX file {base.rstrip('/')}/{name}[.gz] ({key}) does not exist")


def run(
    spark: SparkSession,
    output_dir: str,
    *,
    path: str | None = None,
    files: dict[str, str] | None = None,
    transform: Any = None,
    normalizer: str | None = "image",
    nan_policy: str = "fail",
    num_files: int | None = None,
    num_workers: int | None = None,
    rows_per_group: int = 256,
    chunk_rows: int = 10_000,
    seed: int = 42,
    overwrite: bool = False,
    **unknown: Any,
) -> dict[str, Any]:
    """Write ``<output_dir>/train`` and ``<output_dir>/test`` shards from MNIST IDX files."""
    no_unknown("mnist", unknown)
    if path is None:
        raise ConfigurationError("data.options.path: the mnist pipeline needs the directory of "
                                 "the IDX files (--set data.options.path=...)")
    option("path", path, str)
    option("chunk_rows", chunk_rows, int, positive=True)
    names = dict(FILES)
    for key, value in (files or {}).items():
        if key not in FILES:
            raise ConfigurationError(f"data.options.files.{key}: unknown; expected {list(FILES)}")
        names[key] = option(f"files.{key}", value, str)
    check_common(test_fraction=0.5, seed=seed, normalizer=normalizer, nan_policy=nan_policy,
                 num_files=num_files, num_workers=num_workers, rows_per_group=rows_per_group)
    steps = TransformProcess.from_config(transform or [], key="data.options.transform").steps
    if not any(isinstance(s, Assemble) for s in steps):
        steps.append(Assemble(features=["image"], label="label"))
    tp = TransformProcess(steps)
    uris = {key: _find(path, name, key) for key, name in names.items()}
    splits = {}
    for split in ("train", "test"):
        df = read_idx(spark, uris[f"{split}_images"], uris[f"{split}_labels"],
                      chunk_rows=chunk_rows)
        splits[split] = tp.execute(df)
    shape = tp.feature_shape or [28, 28, 1]
    return write_splits(
        output_dir, splits, pipeline="mnist", feature_shape=shape, classes=CLASSES,
        normalizer=normalizer, nan_policy=nan_policy, num_files=num_files,
        num_workers=num_workers, rows_per_group=rows_per_group, seed=seed,
        transform=tp.to_config(), extra={"source": uris}, overwrite=overwrite,
    )
