"""Feature normalizers fitted on Spark (DL4J's NormalizerStandardize / NormalizerMinMaxScaler).

Statistics are per element of an ``array<float>`` column, computed in one pass with Spark's
``Summarizer`` (JVM-side, no Python UDF). ``transform`` applies them on Spark with SQL
higher-order functions; ``apply_numpy`` applies the identical math (float64 arithmetic, float32
result) to raw inputs later, e.g. at inference. ``to_config`` gives the JSON-safe dict stored in
the shards' ``_sparkdl.json``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from sparkdl.errors import ConfigurationError, DataError, unknown_name

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame


def _summarize(df: DataFrame, column: str) -> dict[str, Any]:
    """Per-element count, mean, population variance, min and max of an array column."""
    from pyspark.ml.functions import array_to_vector
    from pyspark.ml.stat import Summarizer
    from pyspark.sql import functions as F

    if column not in df.columns:
        raise DataError(f"cannot fit a normalizer: no column {column!r} in {df.columns}")
    summarizer = Summarizer.metrics("count", "mean", "variance", "min", "max")
    size = F.size(column)
    sizes_of = [F.min(size).alias("lo"), F.max(size).alias("hi")]
    # One Spark query: the lengths and the statistics together. Rows of different lengths
    # fail the summary; the lengths alone then tell which error that is.
    try:
        result = df.select(*sizes_of, summarizer.summary(
            array_to_vector(F.col(column))).alias("s")).collect()[0]
    except Exception:
        _check_sizes(column, df.select(*sizes_of).collect()[0])
        raise
    _check_sizes(column, result)
    row = result["s"]
    n = int(row["count"])
    var = row["variance"].toArray() * ((n - 1) / n if n > 1 else 0.0)  # sample -> population
    stats = {
        "count": n,
        "mean": row["mean"].toArray(),
        "std": np.sqrt(np.maximum(var, 0.0)),
        "min": row["min"].toArray(),
        "max": row["max"].toArray(),
    }
    for name in ("mean", "std", "min", "max"):
        if not np.all(np.isfinite(stats[name])):
            raise DataError(
                f"column {column!r} has NaN or infinite values: cannot fit a normalizer"
            )
    return stats


def _check_sizes(column: str, sizes: Any) -> None:
    """The DataError of an empty DataFrame or of rows of different lengths (``lo``, ``hi``)."""
    if sizes["lo"] is None:
        raise DataError(f"cannot fit a normalizer on column {column!r}: the DataFrame is empty")
    if sizes["lo"] != sizes["hi"]:
        raise DataError(
            f"cannot fit a normalizer on column {column!r}: rows have from {sizes['lo']} to "
            f"{sizes['hi']} values"
        )


def _affine_column(column: str, shift: np.ndarray, scale: np.ndarray,
                   offset: float = 0.0, factor: float = 1.0) -> Column:
    """Spark column ``(x - shift[i]) / scale[i] * factor + offset`` per element, as float."""
    from pyspark.sql import functions as F

    shift_arr = F.array(*[F.lit(float(v)) for v in shift])
    scale_arr = F.array(*[F.lit(float(v)) for v in scale])

    def f(x: Column, i: Column) -> Column:
        y = (x.cast("double") - F.get(shift_arr, i)) / F.get(scale_arr, i)
        if factor != 1.0:
            y = y * F.lit(float(factor))
        if offset != 0.0:
            y = y + F.lit(float(offset))
        return y.cast("float")

    return F.transform(F.col(column), f)


def _affine_numpy(x: np.ndarray, shift: np.ndarray, scale: np.ndarray,
                  offset: float = 0.0, factor: float = 1.0) -> np.ndarray:
    size = shift.shape[0]
    flat = np.asarray(x).reshape(-1, size).astype(np.float64)
    y = (flat - shift) / scale
    if factor != 1.0:
        y = y * factor
    if offset != 0.0:
        y = y + offset
    return y.astype(np.float32).reshape(np.shape(x))


class Normalizer:
    """Base class: fit on Spark, transform on Spark, apply on numpy, round-trip a config."""

    class_name: ClassVar[str] = "Normalizer"

    def __init__(self, column: str = "features") -> None:
        self.column = column
        self.count = 0

    @property
    def fitted(self) -> bool:
        """Whether statistics are available."""
        return self.count > 0

    def _require_fitted(self) -> None:
        if not self.fitted:
            raise ConfigurationError(f"{self.class_name} is not fitted: call fit(df) first")

    def fit(self, df: DataFrame, column: str | None = None) -> Normalizer:
        """Compute the statistics of ``column`` on Spark in one pass; returns ``self``."""
        raise NotImplementedError

    def transform(self, df: DataFrame) -> DataFrame:
        """Return ``df`` with the normalized column (same name), computed on Spark."""
        raise NotImplementedError

    def apply_numpy(self, x: np.ndarray) -> np.ndarray:
        """Normalize raw inputs of shape (..., n) or (batch, *feature_shape); float32 result."""
        raise NotImplementedError

    def _check_width(self, x: np.ndarray, size: int) -> None:
        if np.size(x) % size:
            raise DataError(
                f"{self.class_name}: input with shape {np.shape(x)} does not hold rows of "
                f"{size} values"
            )

    def to_config(self) -> dict[str, Any]:
        """A JSON-safe dict with ``class_name``."""
        raise NotImplementedError

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> Normalizer:
        """Rebuild from :meth:`to_config` output."""
        name = config.get("class_name")
        if cls is Normalizer:
            return normalizer_from_config(config)
        if name != cls.class_name:
            raise ConfigurationError(f"config class_name {name!r} is not {cls.class_name!r}")
        return cls._from_config(config)

    @classmethod
    def _from_config(cls, config: dict[str, Any]) -> Normalizer:
        raise NotImplementedError


def _vector(config: dict[str, Any], key: str, class_name: str) -> np.ndarray:
    if key not in config:
        raise ConfigurationError(f"{class_name} config is missing key {key!r}")
    try:
        return np.asarray(config[key], dtype=np.float64).reshape(-1)
    except (TypeError, ValueError):
        raise ConfigurationError(
            f"{class_name} config key {key!r} is not a list of numbers"
        ) from None


class StandardizeNormalizer(Normalizer):
    """Per-element zero mean, unit (population) standard deviation; zero std divides by 1."""

    class_name = "StandardizeNormalizer"

    def __init__(self, column: str = "features") -> None:
        super().__init__(column)
        self.mean = np.zeros(0)
        self.std = np.zeros(0)

    @property
    def scale(self) -> np.ndarray:
        """The divisor: ``std`` with zeros replaced by 1."""
        return np.where(self.std > 0, self.std, 1.0)

    def fit(self, df: DataFrame, column: str | None = None) -> StandardizeNormalizer:
        self.column = column or self.column
        stats = _summarize(df, self.column)
        self.count, self.mean, self.std = stats["count"], stats["mean"], stats["std"]
        return self

    def transform(self, df: DataFrame) -> DataFrame:
        self._require_fitted()
        return df.withColumn(self.column, _affine_column(self.column, self.mean, self.scale))

    def apply_numpy(self, x: np.ndarray) -> np.ndarray:
        self._require_fitted()
        self._check_width(x, self.mean.shape[0])
        return _affine_numpy(x, self.mean, self.scale)

    def to_config(self) -> dict[str, Any]:
        return {
            "class_name": self.class_name, "column": self.column, "count": self.count,
            "mean": self.mean.tolist(), "std": self.std.tolist(),
        }

    @classmethod
    def _from_config(cls, config: dict[str, Any]) -> StandardizeNormalizer:
        out = cls(config.get("column", "features"))
        out.mean = _vector(config, "mean", cls.class_name)
        out.std = _vector(config, "std", cls.class_name)
        out.count = int(config.get("count", 1))
        if out.mean.shape != out.std.shape:
            raise ConfigurationError(f"{cls.class_name} config: 'mean' and 'std' lengths differ")
        return out


class MinMaxNormalizer(Normalizer):
    """Per-element scaling of ``[min, max]`` to ``feature_range``; zero range divides by 1."""

    class_name = "MinMaxNormalizer"

    def __init__(
        self, column: str = "features", feature_range: tuple[float, float] = (0.0, 1.0)
    ) -> None:
        super().__init__(column)
        lo, hi = (float(v) for v in feature_range)
        if not hi > lo:
            raise ConfigurationError(f"feature_range must be (low, high) with low < high, "
                                     f"got {feature_range}")
        self.feature_range = (lo, hi)
        self.min = np.zeros(0)
        self.max = np.zeros(0)

    @property
    def scale(self) -> np.ndarray:
        """The divisor: ``max - min`` with zeros replaced by 1."""
        rng = self.max - self.min
        return np.where(rng > 0, rng, 1.0)

    def _affine(self) -> tuple[np.ndarray, np.ndarray, float, float]:
        lo, hi = self.feature_range
        return self.min, self.scale, lo, hi - lo

    def fit(self, df: DataFrame, column: str | None = None) -> MinMaxNormalizer:
        self.column = column or self.column
        stats = _summarize(df, self.column)
        self.count, self.min, self.max = stats["count"], stats["min"], stats["max"]
        return self

    def transform(self, df: DataFrame) -> DataFrame:
        self._require_fitted()
        shift, scale, offset, factor = self._affine()
        return df.withColumn(
            self.column, _affine_column(self.column, shift, scale, offset, factor)
        )

    def apply_numpy(self, x: np.ndarray) -> np.ndarray:
        self._require_fitted()
        self._check_width(x, self.min.shape[0])
        shift, scale, offset, factor = self._affine()
        return _affine_numpy(x, shift, scale, offset, factor)

    def to_config(self) -> dict[str, Any]:
        return {
            "class_name": self.class_name, "column": self.column, "count": self.count,
            "min": self.min.tolist(), "max": self.max.tolist(),
            "feature_range": list(self.feature_range),
        }

    @classmethod
    def _from_config(cls, config: dict[str, Any]) -> MinMaxNormalizer:
        out = cls(config.get("column", "features"),
                  tuple(config.get("feature_range", (0.0, 1.0))))  # type: ignore[arg-type]
        out.min = _vector(config, "min", cls.class_name)
        out.max = _vector(config, "max", cls.class_name)
        out.count = int(config.get("count", 1))
        if out.min.shape != out.max.shape:
            raise ConfigurationError(f"{cls.class_name} config: 'min' and 'max' lengths differ")
        return out


class ImageScaler(Normalizer):
    """Pixel values [0, ``max_value``] → ``feature_range`` (DL4J's ImagePreProcessingScaler).

    The scale is fixed, not learned: ``fit`` only counts rows and checks (in one Spark pass)
    that no value lies outside [0, ``max_value``], naming the bad extreme otherwise.
    """

    class_name = "ImageScaler"

    def __init__(
        self, column: str = "features", max_value: float = 255.0,
        feature_range: tuple[float, float] = (0.0, 1.0),
    ) -> None:
        super().__init__(column)
        lo, hi = (float(v) for v in feature_range)
        if not hi > lo or not float(max_value) > 0:
            raise ConfigurationError(
                f"ImageScaler needs max_value > 0 and feature_range low < high, got "
                f"{max_value} and {feature_range}"
            )
        self.max_value = float(max_value)
        self.feature_range = (lo, hi)

    def fit(self, df: DataFrame, column: str | None = None) -> ImageScaler:
        from pyspark.sql import functions as F

        self.column = column or self.column
        if self.column not in df.columns:
            raise DataError(f"cannot fit ImageScaler: no column {self.column!r} in {df.columns}")
        x = F.col(self.column)
        row = df.agg(F.count(F.lit(1)), F.min(F.array_min(x)), F.max(F.array_max(x))).collect()[0]
        if not row[0]:
            raise DataError(f"cannot fit ImageScaler on column {self.column!r}: the DataFrame "
                            f"is empty")
        if row[1] < 0 or row[2] > self.max_value:
            raise DataError(
                f"column {self.column!r} holds values from {row[1]} to {row[2]}, outside the "
                f"ImageScaler range [0, {self.max_value}]"
            )
        self.count = int(row[0])
        return self

    def _affine(self) -> tuple[np.ndarray, np.ndarray, float, float]:
        lo, hi = self.feature_range
        return np.zeros(1), np.full(1, self.max_value), lo, hi - lo

    def transform(self, df: DataFrame) -> DataFrame:
        from pyspark.sql import functions as F

        self._require_fitted()
        _, _, offset, factor = self._affine()
        scale = factor / self.max_value

        def f(v: Column) -> Column:
            return (v.cast("double") * F.lit(scale) + F.lit(offset)).cast("float")

        return df.withColumn(self.column, F.transform(F.col(self.column), f))

    def apply_numpy(self, x: np.ndarray) -> np.ndarray:
        self._require_fitted()
        _, _, offset, factor = self._affine()
        scale = factor / self.max_value
        return (np.asarray(x, np.float64) * scale + offset).astype(np.float32)

    def to_config(self) -> dict[str, Any]:
        return {
            "class_name": self.class_name, "column": self.column, "count": self.count,
            "max_value": self.max_value, "feature_range": list(self.feature_range),
        }

    @classmethod
    def _from_config(cls, config: dict[str, Any]) -> ImageScaler:
        out = cls(config.get("column", "features"), float(config.get("max_value", 255.0)),
                  tuple(config.get("feature_range", (0.0, 1.0))))  # type: ignore[arg-type]
        out.count = int(config.get("count", 1))
        return out


NORMALIZERS: dict[str, type[Normalizer]] = {
    "standardize": StandardizeNormalizer,
    "minmax": MinMaxNormalizer,
    "image": ImageScaler,
}


def get_normalizer(name: str, **kwargs: Any) -> Normalizer:
    """A new, unfitted normalizer by short name (``standardize``, ``minmax``, ``image``)."""
    cls = NORMALIZERS.get(name)
    if cls is None:
        raise unknown_name("normalizer", name, NORMALIZERS)
    return cls(**kwargs)


def normalizer_from_config(config: dict[str, Any]) -> Normalizer:
    """Rebuild any normalizer from its ``to_config`` dict."""
    name = config.get("class_name") if isinstance(config, dict) else None
    for cls in NORMALIZERS.values():
        if cls.class_name == name:
            return cls.from_config(config)
    raise unknown_name("normalizer class_name", name, (c.class_name for c in NORMALIZERS.values()))
