"""The digits pipeline: scikit-learn's 8x8 digits -> split -> normalize -> train/test shards."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sparkdl.data.writer import write_shards
from sparkdl.etl.normalizers import get_normalizer
from sparkdl.etl.samples import DIGITS_CLASSES, DIGITS_SHAPE, load_digits_df
from sparkdl.etl.split import train_test_split

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def run(
    spark: SparkSession,
    output_dir: str,
    *,
    test_fraction: float = 0.2,
    seed: int = 42,
    num_files: int = 8,
    normalizer: str = "standardize",
    rows_per_group: int = 64,
    num_workers: int | None = None,
    overwrite: bool = False,
) -> dict[str, Any]:
    """Write ``<output_dir>/train`` and ``<output_dir>/test`` shards of the digits data.

    The split is a seeded hash of each row; the normalizer is fitted on the train split only
    and applied to both; its statistics are stored in each shard's metadata.
    Returns ``{"train": uri, "test": uri, "train_rows": n, "test_rows": m}``.
    """
    base = output_dir.rstrip("/")
    df = load_digits_df(spark).cache()
    try:
        train, test = train_test_split(df, test_fraction, seed)
        norm = get_normalizer(normalizer).fit(train)
        config = norm.to_config()
        extra = {"pipeline": "digits", "source": "sklearn.datasets.load_digits",
                 "seed": seed, "test_fraction": test_fraction}
        out: dict[str, Any] = {}
        for split, part in (("train", train), ("test", test)):
            uri = f"{base}/{split}"
            meta = write_shards(
                norm.transform(part), uri, feature_shape=DIGITS_SHAPE, label_kind="class",
                classes=DIGITS_CLASSES, num_files=num_files, rows_per_group=rows_per_group,
                normalizer=config, extra={**extra, "split": split}, overwrite=overwrite,
                seed=seed, num_workers=num_workers,
            )
            out[split] = uri
            out[f"{split}_rows"] = meta.num_rows
        return out
    finally:
        df.unpersist()
