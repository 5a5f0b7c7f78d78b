"""The Iris pipeline (DL4J's Iris example): CSV records → transform process → shards.

With no ``path``, the CSV is scikit-learn's bundled iris, as CSV text lines parsed by the same
Spark CSV reader. The default transform process drops incomplete rows, maps the species
string to its class index (the mapping is kept in the shard metadata) and assembles the four
measurements. Every option of the csv pipeline may be overridden.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sparkdl.pipelines import csvfile

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

SPECIES = ["setosa", "versicolor", "virginica"]
COLUMNS = {
    "sepal_length": "double", "sepal_width": "double", "petal_length": "double",
    "petal_width": "double", "species": "string",
}
TRANSFORM = {
    "steps": [
        {"op": "filter_missing"},
        {"op": "categorical_to_integer", "column": "species", "categories": SPECIES},
        {"op": "assemble", "features": ["sepal_length", "sepal_width", "petal_length",
                                        "petal_width"], "label": "species"},
    ]
}


def iris_lines() -> list[str]:
    """scikit-learn's iris as CSV lines with a header and species names."""
    from sklearn.datasets import load_iris

    data = load_iris()
    lines = [",".join(COLUMNS)]
    for x, y in zip(data.data, data.target):
        lines.append(",".join(f"{v:g}" for v in x) + f",{SPECIES[int(y)]}")
    return lines


def run(spark: SparkSession, output_dir: str, *, path: Any = None, overwrite: bool = False,
        **options: Any) -> dict[str, Any]:
    """Write ``<output_dir>/train`` and ``<output_dir>/test`` shards of the iris data."""
    # the bundled lines as a one-column DataFrame, which Spark's CSV reader takes on classic
    # Spark and on Spark Connect alike (in order: the first line is the header it drops)
    source = path if path is not None else spark.createDataFrame(
        [(line,) for line in iris_lines()], "value string")
    defaults = {"columns": COLUMNS, "transform": TRANSFORM, "header": True,
                "test_fraction": 0.3, "rows_per_group": 16, "num_files": 4}
    return csvfile.run(spark, output_dir, path=source, overwrite=overwrite, pipeline="iris",
                       **{**defaults, **options})
