"""The image-folder pipeline: ``<path>/<label>/*.png|jpg`` → decode, resize → shards.

``data.options``: ``path`` (root folder, any Spark URI), ``height``, ``width``, ``channels``
(1 or 3), and optionally ``classes`` (the folder names in class order; default: every folder
found, sorted), ``transform`` (image steps applied before the label mapping and assembly),
``test_fraction``, ``seed``, ``normalizer`` (default ``image``), ``nan_policy``,
``num_files``, ``num_workers``, ``rows_per_group``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sparkdl.data.spark_errors import spark_data_errors
from sparkdl.errors import ConfigurationError
from sparkdl.etl.readers.images import read_images
from sparkdl.etl.transform import Assemble, CategoricalToInteger, TransformProcess
from sparkdl.pipelines.common import check_common, no_unknown, option, split, write_splits

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def run(
    spark: SparkSession,
    output_dir: str,
    *,
    path: str | None = None,
    height: int = 28,
    width: int = 28,
    channels: int = 1,
    classes: list[str] | None = None,
    transform: Any = None,
    test_fraction: float = 0.2,
    seed: int = 42,
    normalizer: str | None = "image",
    nan_policy: str = "fail",
    num_files: int | None = None,
    num_workers: int | None = None,
    rows_per_group: int = 64,
    overwrite: bool = False,
    **unknown: Any,
) -> dict[str, Any]:
    """Write ``<output_dir>/train`` and ``<output_dir>/test`` shards from an image folder."""
    no_unknown("images", unknown)
    if path is None:
        raise ConfigurationError("data.options.path: the images pipeline needs the root folder "
                                 "of <label>/<image> files (--set data.options.path=...)")
    option("path", path, str)
    for name, value in (("height", height), ("width", width)):
        option(name, value, int, positive=True)
    if channels not in (1, 3):
        raise ConfigurationError(f"data.options.channels: must be 1 or 3, got {channels!r}")
    if classes is not None and not (isinstance(classes, list) and classes):
        raise ConfigurationError(f"data.options.classes: expected a list, got {classes!r}")
    check_common(test_fraction=test_fraction, seed=seed, normalizer=normalizer,
                 nan_policy=nan_policy, num_files=num_files, num_workers=num_workers,
                 rows_per_group=rows_per_group)
    steps = TransformProcess.from_config(transform or [], key="data.options.transform").steps
    steps += [
        CategoricalToInteger(column="label",
                             categories=[str(c) for c in classes] if classes else None),
        Assemble(features=["image"], label="label"),
    ]
    tp = TransformProcess(steps)
    from pyspark import StorageLevel

    with spark_data_errors():  # learning the classes reads the folder names
        data = tp.execute(read_images(spark, path, height=height, width=width,
                                      channels=channels))
    data = data.persist(StorageLevel.MEMORY_AND_DISK)
    try:
        return write_splits(
            output_dir, split(data, test_fraction, seed), pipeline="images",
            feature_shape=tp.feature_shape or [height, width, channels],
            classes=tp.classes() or [], normalizer=normalizer, nan_policy=nan_policy,
            num_files=num_files, num_workers=num_workers, rows_per_group=rows_per_group,
            seed=seed, transform=tp.to_config(), extra={"source": path}, overwrite=overwrite,
        )
    finally:
        data.unpersist()
