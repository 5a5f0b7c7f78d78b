"""Small built-in sample data sets as Spark DataFrames (columns ``features``, ``label``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

SCHEMA = "features array<float>, label long"


def _to_df(spark: SparkSession, x: np.ndarray, y: np.ndarray, num_partitions: int) -> DataFrame:
    """``x`` (rows of features) and ``y`` as a DataFrame of ``num_partitions`` partitions.

    The rows travel as one Arrow table, so Spark keeps them as a local relation in the JVM:
    no Python worker starts to unpickle them and no per-value conversion runs in Python.
    (A list of tuples became a pickled Python RDD: seconds on a cold session for 1,797 rows.)
    Spark splits the table's rows evenly over the default parallelism, as a list's batches
    were split where that parallelism is small (digits: 1 to 4; iris: 1 to 3; the confs run
    local[2]): there the partitions, and so the normalizer's statistics, are bit for bit
    those of the list. Spark Connect made a local relation of a list already."""
    import pyarrow as pa

    flat = np.ascontiguousarray(x, dtype=np.float32).reshape(len(x), -1)
    width = flat.shape[1]
    offsets = pa.array(np.arange(0, flat.size + 1, width, dtype=np.int32))
    table = pa.table({
        "features": pa.ListArray.from_arrays(offsets, pa.array(flat.reshape(-1))),
        "label": pa.array(np.asarray(y, dtype=np.int64)),
    })
    return spark.createDataFrame(table, SCHEMA).repartition(num_partitions)


def load_digits_df(spark: SparkSession, num_partitions: int = 2) -> DataFrame:
    """scikit-learn's bundled digits: 1797 rows, 64 pixel values (8x8, 0..16), 10 classes."""
    x, y = digits_arrays()
    return _to_df(spark, x, y, num_partitions)


def digits_arrays() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's digits as ``load_digits`` gives them: ``(data, target)``, float64
    pixel rows and int labels.

    Read from the file scikit-learn ships (``sklearn/datasets/data/digits.csv.gz``) the way
    ``load_digits`` reads it, without importing scikit-learn: its import takes seconds of a
    job's start. ``load_digits`` itself where that file is not found."""
    import gzip
    import importlib.util
    import os

    spec = importlib.util.find_spec("sklearn")  # finds the package without importing it
    for root in (spec.submodule_search_locations or []) if spec else []:
        path = os.path.join(root, "datasets", "data", "digits.csv.gz")
        if os.path.isfile(path):
            with gzip.open(path, mode="rt", encoding="utf-8") as f:
                data = np.loadtxt(f, delimiter=",")
            return data[:, :-1], data[:, -1].astype(int, copy=False)
    from sklearn.datasets import load_digits

    bunch = load_digits()
    return bunch.data, bunch.target


def load_iris_df(spark: SparkSession, num_partitions: int = 2) -> DataFrame:
    """scikit-learn's bundled iris: 150 rows, 4 measurements, 3 classes."""
    from sklearn.datasets import load_iris

    data = load_iris()
    return _to_df(spark, data.data, data.target, num_partitions)


DIGITS_CLASSES = [str(i) for i in range(10)]
DIGITS_SHAPE = [8, 8, 1]
IRIS_CLASSES = ["setosa", "versicolor", "virginica"]
IRIS_SHAPE = [4]


def digits_28x28(n: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """MNIST-like images from scikit-learn's digits: 8x8 upscaled 3x (nearest) and padded by 2
    to 28x28, values 0..255 as uint8; labels uint8."""
    from sklearn.datasets import load_digits

    data = load_digits()
    x = data.images[:n] if n else data.images
    big = np.kron(x, np.ones((3, 3))) * (255.0 / 16.0)
    images = np.pad(big, ((0, 0), (2, 2), (2, 2))).round().astype(np.uint8)
    return images, data.target[: len(images)].astype(np.uint8)


def write_mnist_sample(root: str, n_train: int = 1400, n_test: int = 397, *,
                       gz: bool = False) -> str:
    """The four MNIST IDX files (MNIST's names) of :func:`digits_28x28` in local dir ``root``."""
    import os

    from sparkdl.etl.readers.idx import write_idx

    os.makedirs(root, exist_ok=True)
    x, y = digits_28x28(n_train + n_test)
    sfx = ".gz" if gz else ""
    write_idx(os.path.join(root, f"train-images-idx3-ubyte{sfx}"), x[:n_train])
    write_idx(os.path.join(root, f"train-labels-idx1-ubyte{sfx}"), y[:n_train])
    write_idx(os.path.join(root, f"t10k-images-idx3-ubyte{sfx}"), x[n_train:])
    write_idx(os.path.join(root, f"t10k-labels-idx1-ubyte{sfx}"), y[n_train:])
    return root


def write_csv_sample(path: str) -> str:
    """scikit-learn's iris as a CSV file with a header (``x0..x3,label``, label the species
    name): the input of ``conf/csv.yaml``."""
    import os

    from sklearn.datasets import load_iris

    data = load_iris()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    lines = ["x0,x1,x2,x3,label"] + [
        ",".join([*(f"{v:g}" for v in row), IRIS_CLASSES[label]])
        for row, label in zip(data.data, data.target, strict=True)
    ]
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    return path


def write_regression_sample(path: str) -> str:
    """scikit-learn's diabetes data (442 rows, 10 numeric features ``x0..x9``, ``target``: a
    disease-progression measure, a number) as a CSV file with a header: the input of
    ``conf/diabetes.yaml``, the regression pipeline."""
    import os

    from sklearn.datasets import load_diabetes

    data = load_diabetes()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    names = [f"x{i}" for i in range(data.data.shape[1])]
    lines = [",".join([*names, "target"])] + [
        ",".join(f"{v:.17g}" for v in (*row, target))
        for row, target in zip(data.data, data.target, strict=True)
    ]
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    return path


def write_image_sample(root: str, per_class: int = 40) -> str:
    """``root/<digit>/<k>.png``: :func:`digits_28x28` as grayscale PNG files, ``per_class``
    per digit: the input of ``conf/images.yaml``. Needs TensorFlow (to encode PNG)."""
    import os

    import tensorflow as tf

    x, y = digits_28x28()
    for digit in range(10):
        folder = os.path.join(root, str(digit))
        os.makedirs(folder, exist_ok=True)
        for k, image in enumerate(x[y == digit][:per_class]):
            png = tf.io.encode_png(image[:, :, None]).numpy()
            with open(os.path.join(folder, f"{k:04d}.png"), "wb") as f:
                f.write(png)
    return root


def write_samples(root: str) -> dict[str, str]:
    """Write the sample inputs of the mnist, csv, diabetes and images confs under ``root`` (their
    default ``data.options.path`` with ``root="data"``), from data scikit-learn ships."""
    import os

    return {
        "mnist": write_mnist_sample(os.path.join(root, "mnist")),
        "csv": write_csv_sample(os.path.join(root, "records.csv")),
        "diabetes": write_regression_sample(os.path.join(root, "diabetes.csv")),
        "images": write_image_sample(os.path.join(root, "images")),
    }

