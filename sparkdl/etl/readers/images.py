"""Image-folder record reader (DataVec's ``ImageRecordReader`` + ``ParentPathLabelGenerator``).

``root/<label>/<file>.png|jpg|jpeg``: files are listed and read by Spark's ``binaryFile``
source; each executor decodes, resizes and converts its images with TensorFlow's image ops
(``tf.io.decode_image``, ``tf.image.resize``) in a pandas UDF, so nothing but the final
DataFrame's rows moves. The label is the name of the file's parent folder.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from sparkdl.data.spark_errors import executor_error, spark_data_errors
from sparkdl.errors import ConfigurationError, DataError

if TYPE_CHECKING:
    import pandas as pd
    from pyspark.sql import DataFrame, SparkSession

EXTENSIONS = ("png", "jpg", "jpeg")
SHAPE_KEY = "sparkdl_shape"
SCHEMA = "path string, label string, image array<float>"


def with_shape(df: DataFrame, column: str, shape: Sequence[int]) -> DataFrame:
    """Record an image column's (height, width, channels) in the column's Spark metadata."""
    from pyspark.sql import functions as F

    return df.withColumn(
        column, F.col(column).alias(column, metadata={SHAPE_KEY: [int(d) for d in shape]})
    )


def shape_of(df: DataFrame, column: str) -> list[int] | None:
    """The recorded shape of an image column, if any."""
    shape = df.schema[column].metadata.get(SHAPE_KEY)
    return [int(d) for d in shape] if shape else None


def _decoder(height: int, width: int, channels: int) -> Any:
    def decode(batches: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        import numpy as np
        import pandas as pd
        import tensorflow as tf

        for batch in batches:
            images = []
            for path, content in zip(batch["path"], batch["content"]):
                try:
                    img = tf.io.decode_image(
                        bytes(content), channels=channels, expand_animations=False
                    )
                except (tf.errors.InvalidArgumentError, ValueError) as exc:
                    reason = " ".join(str(exc).split())[:200]
                    raise executor_error(f"image file {path} cannot be decoded: {reason}") from None
                if img.shape[0] != height or img.shape[1] != width:
                    img = tf.image.resize(img, (height, width), antialias=True)
                images.append(np.asarray(img, np.float32).reshape(-1))
            yield pd.DataFrame({"path": batch["path"], "label": batch["label"], "image": images})

    return decode


def read_images(
    spark: SparkSession,
    path: str,
    *,
    height: int,
    width: int,
    channels: int = 3,
    extensions: Sequence[str] = EXTENSIONS,
) -> DataFrame:
    """Images under ``path/<label>/`` as columns ``path``, ``label`` (the folder name) and
    ``image`` (``array<float>``, height × width × channels values in [0, 255], row-major HWC).

    An image that does not decode fails the job with one :class:`DataError` naming the file.
    """
    from pyspark.sql import functions as F
    from pyspark.sql.utils import AnalysisException

    for name, value in (("height", height), ("width", width)):
        if not isinstance(value, int) or value < 1:
            raise ConfigurationError(f"{name} must be a positive integer, got {value!r}")
    if channels not in (1, 3):
        raise ConfigurationError(f"channels must be 1 (grayscale) or 3 (RGB), got {channels!r}")
    exts = sorted({e.lower().lstrip(".") for e in extensions} | {e.upper().lstrip(".")
                                                                 for e in extensions})
    try:
        with spark_data_errors():
            files = (
                spark.read.format("binaryFile")
                .option("recursiveFileLookup", True)
                .option("pathGlobFilter", "*.{" + ",".join(exts) + "}")
                .load(path)
            )
    except AnalysisException as exc:
        raise DataError(f"cannot read images under {path}: {str(exc).splitlines()[0]}") from None
    labelled = files.select(
        "path", F.regexp_extract("path", r"([^/]+)/[^/]+$", 1).alias("label"), "content"
    )
    decoded = labelled.mapInPandas(_decoder(height, width, channels), SCHEMA)
    return with_shape(decoded, "image", (height, width, channels))
