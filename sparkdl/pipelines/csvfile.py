"""The generic CSV pipeline: CSV files → transform process → split → normalize → shards.

``data.options``: ``path`` (CSV file, directory or glob; any Spark URI), ``columns`` (the
declared schema), ``transform`` (steps ending with ``assemble``), and optionally ``header``,
``delimiter``, ``quote``, ``label_kind`` (class | regression), ``classes`` (when the label
column already holds indices), ``feature_shape``, ``test_fraction``, ``seed``, ``normalizer``
(standardize | minmax | image | none), ``nan_policy`` (fail | drop), ``num_files``,
``num_workers``, ``rows_per_group``, ``analysis`` (write ``<dir>/analysis.json`` of the raw
columns).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sparkdl.data.spark_errors import spark_data_errors
from sparkdl.errors import ConfigurationError, DataError
from sparkdl.etl.analysis import analyze, write_analysis
from sparkdl.etl.readers.csv import read_csv
from sparkdl.etl.transform import TransformProcess
from sparkdl.pipelines.common import (
    check_common,
    feature_shape_of,
    no_unknown,
    option,
    split,
    write_splits,
)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def run(
    spark: SparkSession,
    output_dir: str,
    *,
    path: Any = None,
    columns: Any = None,
    transform: Any = None,
    header: bool = False,
    delimiter: str = ",",
    quote: str = '"',
    label_kind: str = "class",
    classes: list[str] | None = None,
    feature_shape: list[int] | None = None,
    test_fraction: float = 0.2,
    seed: int = 42,
    normalizer: str | None = "standardize",
    nan_policy: str = "fail",
    num_files: int | None = None,
    num_workers: int | None = None,
    rows_per_group: int = 256,
    analysis: bool = False,
    overwrite: bool = False,
    pipeline: str = "csv",
    sample_weight_column: str | None = None,
    **unknown: Any,
) -> dict[str, Any]:
    """Write ``<output_dir>/train`` and ``<output_dir>/test`` shards from CSV records."""
    no_unknown(pipeline, unknown)
    if path is None:
        raise ConfigurationError("data.options.path: the csv pipeline needs the CSV path")
    if columns is None:
        raise ConfigurationError("data.options.columns: the csv pipeline needs the declared "
                                 "columns, e.g. {sepal_length: double, species: string}")
    if transform is None:
        raise ConfigurationError("data.options.transform: the csv pipeline needs a transform "
                                 "process ending with an 'assemble' step")
    option("header", header, bool)
    option("analysis", analysis, bool)
    if label_kind not in ("class", "regression"):
        raise ConfigurationError(
            f"data.options.label_kind: must be 'class' or 'regression', got {label_kind!r}"
        )
    check_common(test_fraction=test_fraction, seed=seed, normalizer=normalizer,
                 nan_policy=nan_policy, num_files=num_files, num_workers=num_workers,
                 rows_per_group=rows_per_group)
    try:
        tp = TransformProcess.from_config(transform, key="data.options.transform")
    except ConfigurationError as exc:
        raise ConfigurationError(str(exc)) from None
    if tp.assemble is None:
        raise ConfigurationError("data.options.transform: the last step must be 'assemble'")
    if sample_weight_column is not None:  # data.sample_weight_column: the rows' weights
        tp.assemble.weight = sample_weight_column
    try:
        raw = read_csv(spark, path, columns=columns, header=header, delimiter=delimiter,
                       quote=quote)
    except ConfigurationError as exc:
        raise ConfigurationError(f"data.options.{exc}") from None
    source = str(path) if isinstance(path, str) else "<lines>"
    with spark_data_errors():
        empty = not raw.head(1)
    if empty:
        raise DataError(
            f"CSV {source} is empty: no records"
            + (" after the header line" if header else "")
        )
    base = output_dir.rstrip("/")
    result: dict[str, Any] = {}
    stats = None
    if analysis:
        with spark_data_errors():
            stats = analyze(raw)
    from pyspark import StorageLevel

    with spark_data_errors():
        data = tp.execute(raw).persist(StorageLevel.MEMORY_AND_DISK)
    try:
        if label_kind == "class":
            names = tp.classes() or (list(map(str, classes)) if classes else None)
            if not names:
                raise ConfigurationError(
                    "data.options.classes: the label column is not mapped by a "
                    "categorical_to_integer step, so the class names must be given"
                )
        else:
            names = []
        with spark_data_errors():
            shape = feature_shape_of(data, feature_shape or tp.feature_shape)
        result.update(write_splits(
            output_dir, split(data, test_fraction, seed), pipeline=pipeline,
            feature_shape=shape, classes=names, label_kind=label_kind, normalizer=normalizer,
            nan_policy=nan_policy, num_files=num_files, num_workers=num_workers,
            rows_per_group=rows_per_group, seed=seed, transform=tp.to_config(),
            extra={"source": source, "seed": seed,
                   "test_fraction": test_fraction},
            overwrite=overwrite,
        ))
    finally:
        data.unpersist()
    if stats is not None:  # only once the data passed every check and the shards are written
        write_analysis(stats, f"{base}/analysis.json")
        result["analysis"] = f"{base}/analysis.json"
    return result
