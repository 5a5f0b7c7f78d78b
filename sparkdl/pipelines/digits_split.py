"""A two-input, two-output (MultiDataSet) pipeline over scikit-learn's 8x8 digits.

Inputs: ``top`` and ``bottom``, the upper and lower halves of each image (4x8x1 each, pixel
values scaled to [0, 1]). Outputs: ``digit``, the class (10 classes), and ``ink``, a regression
target: the mean pixel value of the whole image in [0, 1]. Written with named columns and
``inputs`` / ``outputs`` metadata (shard format version 2); readers yield dicts by name.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sparkdl.data.metadata import TensorSpec
from sparkdl.data.writer import write_shards
from sparkdl.etl.samples import DIGITS_CLASSES, load_digits_df
from sparkdl.pipelines.common import _remove, check_common, no_unknown, option, split

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

INPUTS = [TensorSpec("top", [4, 8, 1]), TensorSpec("bottom", [4, 8, 1])]
OUTPUTS = [TensorSpec("digit", [], "class", list(DIGITS_CLASSES)),
           TensorSpec("ink", [1], "regression")]


def run(
    spark: SparkSession,
    output_dir: str,
    *,
    test_fraction: float = 0.2,
    seed: int = 42,
    num_files: int | None = None,
    num_workers: int | None = None,
    rows_per_group: int = 64,
    overwrite: bool = False,
    pipeline: str = "digits_split",
    **unknown: Any,
) -> dict[str, Any]:
    """Write ``<output_dir>/train`` and ``<output_dir>/test`` two-input, two-output shards."""
    from pyspark.sql import functions as F

    no_unknown(pipeline, unknown)
    option("overwrite", overwrite, bool)
    check_common(test_fraction=test_fraction, seed=seed, normalizer=None, nan_policy="fail",
                 num_files=num_files, num_workers=num_workers, rows_per_group=rows_per_group)
    pixels = F.transform(F.col("features"), lambda v: v / F.lit(16.0))
    df = load_digits_df(spark).select(
        F.slice(pixels, 1, 32).alias("top"),
        F.slice(pixels, 33, 32).alias("bottom"),
        F.col("label").alias("digit"),
        (F.aggregate(F.col("features"), F.lit(0.0), lambda acc, v: acc + v) / F.lit(64 * 16.0))
        .alias("ink"),
    )
    base = output_dir.rstrip("/")
    out: dict[str, Any] = {}
    written = []
    for name, part in split(df, test_fraction, seed).items():
        uri = f"{base}/{name}"
        try:
            meta = write_shards(
                part, uri, inputs=INPUTS, outputs=OUTPUTS, num_files=num_files,
                num_workers=num_workers, rows_per_group=rows_per_group, overwrite=overwrite,
                seed=seed, extra={"pipeline": pipeline, "split": name, "seed": seed,
                                  "source": "sklearn.datasets.load_digits",
                                  "test_fraction": test_fraction},
            )
        except Exception:
            _remove(written)  # no train split without its test split
            raise
        written.append(uri)
        out[name], out[f"{name}_rows"] = uri, meta.num_rows
    return out
