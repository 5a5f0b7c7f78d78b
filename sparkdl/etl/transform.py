"""Transform process: a declarative, ordered list of steps executed on Spark DataFrames
(DataVec's ``TransformProcess``), serializable to and from JSON / YAML.

A conf file defines it as ``{"steps": [{"op": "remove_columns", "columns": ["id"]}, ...]}``.
Steps that learn from the data (a categorical mapping given without its categories) are
fitted on Spark by :meth:`TransformProcess.fit`; the learned state is part of the config, so
the process stored in the shard metadata replays exactly. Every step runs as Spark SQL (built-in
and higher-order functions) except ``image_resize``, a pandas UDF.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from dataclasses import MISSING, dataclass, field, fields
from typing import TYPE_CHECKING, Any, ClassVar

from sparkdl.data.spark_errors import fail_when
from sparkdl.errors import ConfigurationError, unknown_name
from sparkdl.etl.readers.images import shape_of, with_shape

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

STEPS: dict[str, type[Step]] = {}


def _register(cls: type[Step]) -> type[Step]:
    STEPS[cls.op] = cls
    return cls


@dataclass
class Step:
    """One transform step: ``apply`` is lazy Spark; ``fit`` learns state (if any) in one pass."""

    op: ClassVar[str] = ""

    def fit(self, df: DataFrame) -> None:
        """Learn what the step needs from ``df`` (default: nothing)."""

    @property
    def fitted(self) -> bool:
        return True

    def apply(self, df: DataFrame) -> DataFrame:
        raise NotImplementedError

    def to_config(self) -> dict[str, Any]:
        out: dict[str, Any] = {"op": self.op}
        for f in fields(self):
            out[f.name] = copy.deepcopy(getattr(self, f.name))
        return out

    def _need(self, df: DataFrame, *columns: str) -> None:
        missing = [c for c in columns if c not in df.columns]
        if missing:
            raise ConfigurationError(
                f"transform step {self.op!r}: no column(s) {missing} (columns: {df.columns})"
            )

    def _drop_rows_where(self, df: DataFrame, bad: Callable[[str], Column]) -> DataFrame:
        """Drop the rows where ``bad(column)`` holds for any of the step's ``columns``
        (default: every column)."""
        import operator
        from functools import reduce

        from pyspark.sql import functions as F

        columns = getattr(self, "columns", None) or df.columns
        self._need(df, *columns)
        return df.filter(~reduce(operator.or_, (bad(c) for c in columns), F.lit(False)))


def _col(name: str) -> Column:
    from pyspark.sql import functions as F

    return F.col(f"`{name}`")


def _is_array(df: DataFrame, column: str) -> bool:
    from pyspark.sql import types as T

    return isinstance(df.schema[column].dataType, T.ArrayType)


# ---------------------------------------------------------------------------------- columns


@_register
@dataclass
class RemoveColumns(Step):
    """Drop ``columns``."""

    op: ClassVar[str] = "remove_columns"
    columns: list[str] = field(default_factory=list)

    def apply(self, df: DataFrame) -> DataFrame:
        self._need(df, *self.columns)
        return df.drop(*self.columns)


@_register
@dataclass
class RenameColumns(Step):
    """Rename columns: ``mapping`` old → new."""

    op: ClassVar[str] = "rename_columns"
    mapping: dict[str, str] = field(default_factory=dict)

    def apply(self, df: DataFrame) -> DataFrame:
        self._need(df, *self.mapping)
        return df.withColumnsRenamed(dict(self.mapping))


@_register
@dataclass
class ReorderColumns(Step):
    """Put ``columns`` first, in this order; the others follow in their order."""

    op: ClassVar[str] = "reorder_columns"
    columns: list[str] = field(default_factory=list)

    def apply(self, df: DataFrame) -> DataFrame:
        self._need(df, *self.columns)
        rest = [c for c in df.columns if c not in self.columns]
        return df.select(*[_col(c) for c in [*self.columns, *rest]])


# ---------------------------------------------------------------------------------- filters


def _non_finite(df: DataFrame, column: str) -> Column:
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    dtype = df.schema[column].dataType
    inf = F.lit(float("inf"))
    if isinstance(dtype, T.ArrayType):
        return F.exists(_col(column), lambda x: x.isNull() | F.isnan(x) | (F.abs(x) == inf))
    if isinstance(dtype, T.FractionalType):
        return F.isnan(_col(column)) | (F.abs(_col(column)) == inf)
    return F.lit(False)


@_register
@dataclass
class FilterMissing(Step):
    """Remove rows where any of ``columns`` (default: all) is null, an empty string or NaN."""

    op: ClassVar[str] = "filter_missing"
    columns: list[str] | None = None

    def apply(self, df: DataFrame) -> DataFrame:
        from pyspark.sql import functions as F
        from pyspark.sql import types as T

        def missing(c: str) -> Column:
            dtype = df.schema[c].dataType
            cond = _col(c).isNull()
            if isinstance(dtype, T.StringType):
                cond = cond | (F.trim(_col(c)) == "")
            elif isinstance(dtype, T.FractionalType):
                cond = cond | F.isnan(_col(c))
            return cond

        return self._drop_rows_where(df, missing)


@_register
@dataclass
class FilterNonFinite(Step):
    """Remove rows with NaN or ±inf in ``columns`` (numeric or array columns; default: all)."""

    op: ClassVar[str] = "filter_non_finite"
    columns: list[str] | None = None

    def apply(self, df: DataFrame) -> DataFrame:
        from pyspark.sql import functions as F

        return self._drop_rows_where(
            df, lambda c: F.coalesce(_non_finite(df, c), F.lit(False))
        )


_CONDITIONS = ("==", "!=", "<", "<=", ">", ">=", "in", "not_in", "is_null", "not_null")


@_register
@dataclass
class Filter(Step):
    """Keep the rows where ``column <condition> value`` holds (conditions: ==, !=, <, <=, >,
    >=, in, not_in, is_null, not_null)."""

    op: ClassVar[str] = "filter"
    column: str = ""
    condition: str = "=="
    value: Any = None

    def __post_init__(self) -> None:
        if self.condition not in _CONDITIONS:
            raise ConfigurationError(
                f"transform step 'filter': condition must be one of {_CONDITIONS}, got "
                f"{self.condition!r}"
            )

    def apply(self, df: DataFrame) -> DataFrame:
        self._need(df, self.column)
        c, v = _col(self.column), self.value
        cond = {
            "==": lambda: c == v, "!=": lambda: c != v, "<": lambda: c < v,
            "<=": lambda: c <= v, ">": lambda: c > v, ">=": lambda: c >= v,
            "in": lambda: c.isin(list(v)), "not_in": lambda: ~c.isin(list(v)),
            "is_null": lambda: c.isNull(), "not_null": lambda: c.isNotNull(),
        }[self.condition]()
        return df.filter(cond)


# ---------------------------------------------------------------------------------- categorical


@dataclass
class _Categorical(Step):
    column: str = ""
    categories: list[str] | None = None

    @property
    def fitted(self) -> bool:
        return self.categories is not None

    def fit(self, df: DataFrame) -> None:
        """Learn the categories: the distinct non-null values, sorted (computed on Spark)."""
        from pyspark.sql import functions as F

        self._need(df, self.column)
        values = F.sort_array(F.collect_set(_col(self.column).cast("string")))
        self.categories = list(df.agg(values.alias("v")).collect()[0]["v"])
        if not self.categories:
            raise ConfigurationError(
                f"transform step {self.op!r}: column {self.column!r} has no values to learn "
                f"categories from"
            )

    def _index(self, df: DataFrame) -> Column:
        """The 0-based category index; a value outside the categories fails the job naming it."""
        from pyspark.sql import functions as F

        if self.categories is None:
            raise ConfigurationError(f"transform step {self.op!r} on {self.column!r} is not fitted")
        cats = F.array(*[F.lit(str(c)) for c in self.categories])
        value = _col(self.column).cast("string")
        pos = F.array_position(cats, value)
        shown = ", ".join(map(str, self.categories[:20]))
        message = F.concat(
            F.lit(f"column {self.column!r}: value '"), F.coalesce(value, F.lit("null")),
            F.lit(f"' is not one of the declared categories [{shown}]"),
        )
        return F.coalesce(fail_when(pos.isNull() | (pos == 0), message), pos - 1).cast("long")


@_register
@dataclass
class CategoricalToInteger(_Categorical):
    """Replace a categorical (string) column by its 0-based index in ``categories``; the
    mapping is kept in the config. Declared categories make an unknown value an error."""

    op: ClassVar[str] = "categorical_to_integer"

    def apply(self, df: DataFrame) -> DataFrame:
        self._need(df, self.column)
        return df.withColumn(self.column, self._index(df))


@_register
@dataclass
class CategoricalToOneHot(_Categorical):
    """Replace a categorical column by one 0/1 column per category, ``<column>_<category>``."""

    op: ClassVar[str] = "categorical_to_one_hot"

    def apply(self, df: DataFrame) -> DataFrame:
        from pyspark.sql import functions as F

        self._need(df, self.column)
        idx = "__sparkdl_index"
        out = df.withColumn(idx, self._index(df))
        names = [f"{self.column}_{c}" for c in self.categories or []]
        for k, name in enumerate(names):
            out = out.withColumn(name, (F.col(idx) == k).cast("int"))
        before = list(df.columns)
        pos = before.index(self.column)
        order = [*before[:pos], *names, *before[pos + 1:]]
        return out.select(*[_col(c) for c in order])


# ---------------------------------------------------------------------------------- math

_MATH = ("add", "subtract", "multiply", "divide", "log", "log1p", "exp", "abs", "sqrt", "clip")


@_register
@dataclass
class Math(Step):
    """Element-wise math on numeric or array columns: ``add``/``subtract``/``multiply``/
    ``divide`` by ``value``, ``log``, ``log1p``, ``exp``, ``abs``, ``sqrt``, ``clip`` to
    [``min``, ``max``]. The result is double (float for arrays)."""

    op: ClassVar[str] = "math"
    columns: list[str] = field(default_factory=list)
    fn: str = "add"
    value: float | None = None
    min: float | None = None
    max: float | None = None

    def __post_init__(self) -> None:
        if self.fn not in _MATH:
            raise ConfigurationError(
                f"transform step 'math': fn must be one of {_MATH}, got {self.fn!r}"
            )
        if self.fn in ("add", "subtract", "multiply", "divide") and self.value is None:
            raise ConfigurationError(f"transform step 'math' ({self.fn}) needs a 'value'")
        if self.fn == "clip" and self.min is None and self.max is None:
            raise ConfigurationError("transform step 'math' (clip) needs 'min' and/or 'max'")

    def _f(self, x: Column) -> Column:
        from pyspark.sql import functions as F

        x = x.cast("double")
        v = F.lit(float(self.value)) if self.value is not None else None
        if self.fn == "clip":
            if self.min is not None:
                x = F.greatest(x, F.lit(float(self.min)))
            if self.max is not None:
                x = F.least(x, F.lit(float(self.max)))
            return x
        return {
            "add": lambda: x + v, "subtract": lambda: x - v, "multiply": lambda: x * v,
            "divide": lambda: x / v, "log": lambda: F.ln(x), "log1p": lambda: F.log1p(x),
            "exp": lambda: F.exp(x), "abs": lambda: F.abs(x), "sqrt": lambda: F.sqrt(x),
        }[self.fn]()

    def apply(self, df: DataFrame) -> DataFrame:
        from pyspark.sql import functions as F

        self._need(df, *self.columns)
        out = df
        for c in self.columns:
            if _is_array(df, c):
                shape = shape_of(df, c)
                out = out.withColumn(c, F.transform(_col(c), lambda x: self._f(x).cast("float")))
                if shape:
                    out = with_shape(out, c, shape)
            else:
                out = out.withColumn(c, self._f(_col(c)))
        return out


# ---------------------------------------------------------------------------------- images


def _image_shape(step: Step, df: DataFrame, column: str) -> list[int]:
    step._need(df, column)
    shape = shape_of(df, column)
    if not shape or len(shape) != 3:
        raise ConfigurationError(
            f"transform step {step.op!r}: column {column!r} is not an image column with a "
            f"known (height, width, channels) shape"
        )
    return shape


@_register
@dataclass
class ImageResize(Step):
    """Resize an image column to ``height`` × ``width`` (bilinear, antialiased; pandas UDF)."""

    op: ClassVar[str] = "image_resize"
    column: str = "image"
    height: int = 28
    width: int = 28

    def apply(self, df: DataFrame) -> DataFrame:
        h, w, c = _image_shape(self, df, self.column)
        if (h, w) == (self.height, self.width):
            return df
        column, height, width = self.column, int(self.height), int(self.width)

        def resize(batches: Any) -> Any:
            import numpy as np
            import tensorflow as tf

            for batch in batches:
                if len(batch):
                    x = np.stack(batch[column].to_numpy()).astype(np.float32).reshape(-1, h, w, c)
                    y = tf.image.resize(x, (height, width), antialias=True).numpy()
                    batch[column] = list(y.reshape(len(y), -1))
                yield batch

        fields_ = [f"`{f.name}` {f.dataType.simpleString()}" for f in df.schema.fields]
        out = df.mapInPandas(resize, ", ".join(fields_))
        return with_shape(out, column, (height, width, c))


@_register
@dataclass
class ImageGrayscale(Step):
    """RGB → one channel (ITU-R 601 luma: 0.299 R + 0.587 G + 0.114 B), Spark SQL only."""

    op: ClassVar[str] = "image_grayscale"
    column: str = "image"

    def apply(self, df: DataFrame) -> DataFrame:
        from pyspark.sql import functions as F

        h, w, c = _image_shape(self, df, self.column)
        if c == 1:
            return df
        if c != 3:
            raise ConfigurationError(f"image_grayscale needs 1 or 3 channels, got {c}")
        x = _col(self.column)

        def luma(i: Column) -> Column:
            base = i * 3 + 1  # element_at is 1-based
            return (
                F.element_at(x, base) * 0.299 + F.element_at(x, base + 1) * 0.587
                + F.element_at(x, base + 2) * 0.114
            ).cast("float")

        gray = F.transform(F.sequence(F.lit(0), F.lit(h * w - 1)), luma)
        return with_shape(df.withColumn(self.column, gray), self.column, (h, w, 1))


@_register
@dataclass
class ImageScale(Step):
    """Scale pixel values from [0, ``max_value``] to [0, 1] (DL4J's ImagePreProcessingScaler)."""

    op: ClassVar[str] = "image_scale"
    column: str = "image"
    max_value: float = 255.0

    def apply(self, df: DataFrame) -> DataFrame:
        from pyspark.sql import functions as F

        shape = _image_shape(self, df, self.column)
        scaled = F.transform(_col(self.column), lambda v: (v / float(self.max_value)).cast("float"))
        return with_shape(df.withColumn(self.column, scaled), self.column, shape)


# ---------------------------------------------------------------------------------- assemble


@_register
@dataclass
class Assemble(Step):
    """Build the shard columns: ``features`` (``array<float>``, the listed columns' values,
    scalars and arrays concatenated in order) and ``label``; every other column is dropped.
    ``shape`` defaults to an image column's recorded shape, else ``[number of values]``.
    ``weight`` names a numeric column kept as the shards' ``sample_weight``."""

    op: ClassVar[str] = "assemble"
    features: list[str] = field(default_factory=list)
    label: str | None = "label"
    shape: list[int] | None = None
    weight: str | None = None

    def apply(self, df: DataFrame) -> DataFrame:
        from pyspark.sql import functions as F

        if not self.features:
            raise ConfigurationError("transform step 'assemble' needs a list of 'features'")
        self._need(df, *self.features, *([self.label] if self.label else []),
                   *([self.weight] if self.weight else []))
        parts = [
            _col(c).cast("array<float>") if _is_array(df, c) else F.array(_col(c).cast("float"))
            for c in self.features
        ]
        feats = parts[0] if len(parts) == 1 else F.concat(*parts)
        cols = [feats.alias("features")]
        if self.label:
            cols.append(_col(self.label).alias("label"))
        if self.weight:
            cols.append(_col(self.weight).cast("float").alias("sample_weight"))
        return df.select(*cols)

    def feature_shape(self, df: DataFrame) -> list[int] | None:
        """The declared shape, or an image column's, or None (unknown until counted)."""
        if self.shape:
            return [int(d) for d in self.shape]
        if len(self.features) == 1 and self.features[0] in df.columns:
            shape = shape_of(df, self.features[0])
            if shape:
                return shape
        if not any(_is_array(df, c) for c in self.features if c in df.columns):
            return [len(self.features)]
        return None


# ---------------------------------------------------------------------------------- the process


def step_from_config(config: dict[str, Any], *, key: str = "step") -> Step:
    """Build one step from its ``{"op": ..., **params}`` dict; errors name ``key``."""
    if not isinstance(config, dict) or "op" not in config:
        raise ConfigurationError(f"{key}: expected a mapping with an 'op' key, got {config!r}")
    params = dict(config)
    op = params.pop("op")
    cls = STEPS.get(op)
    if cls is None:
        raise unknown_name("step", op, STEPS, where=f"{key}.op")
    names = {f.name: f for f in fields(cls)}
    unknown = sorted(set(params) - set(names))
    if unknown:
        raise ConfigurationError(
            f"{key}: unknown key(s) {unknown} for step {op!r}; expected {sorted(names)}"
        )
    missing = [n for n, f in names.items() if n not in params and f.default is MISSING
               and f.default_factory is MISSING]
    if missing:
        raise ConfigurationError(f"{key}: step {op!r} needs {missing}")
    try:
        return cls(**params)
    except ConfigurationError as exc:
        raise ConfigurationError(f"{key}: {exc}") from None
    except TypeError as exc:
        raise ConfigurationError(f"{key}: {exc}") from None


class TransformProcess:
    """An ordered list of :class:`Step` s; ``execute(df)`` fits unfitted steps and applies all."""

    def __init__(self, steps: list[Step]) -> None:
        self.steps = list(steps)
        self.feature_shape: list[int] | None = None  # set by execute() when it assembles

    # serialization ---------------------------------------------------------------------
    def to_config(self) -> dict[str, Any]:
        return {"steps": [s.to_config() for s in self.steps]}

    @classmethod
    def from_config(cls, config: Any, *, key: str = "transform") -> TransformProcess:
        """From ``{"steps": [...]}`` or a bare list of step dicts."""
        if isinstance(config, TransformProcess):
            return config
        steps = config.get("steps") if isinstance(config, dict) else config
        if isinstance(config, dict) and set(config) - {"steps"}:
            raise ConfigurationError(f"{key}: unknown key(s) {sorted(set(config) - {'steps'})}")
        if not isinstance(steps, list):
            raise ConfigurationError(f"{key}: expected a list of steps, got {config!r}")
        return cls([step_from_config(s, key=f"{key}.steps[{i}]") for i, s in enumerate(steps)])

    def to_json(self) -> str:
        return json.dumps(self.to_config(), indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> TransformProcess:
        try:
            return cls.from_config(json.loads(text))
        except json.JSONDecodeError as exc:
            raise ConfigurationError(f"transform: invalid JSON: {exc}") from None

    def to_yaml(self) -> str:
        import yaml

        return yaml.safe_dump(self.to_config(), sort_keys=False)

    @classmethod
    def from_yaml(cls, text: str) -> TransformProcess:
        import yaml

        try:
            return cls.from_config(yaml.safe_load(text))
        except yaml.YAMLError as exc:
            raise ConfigurationError(f"transform: invalid YAML: {exc}") from None

    # execution -------------------------------------------------------------------------
    def fit(self, df: DataFrame) -> TransformProcess:
        """Fit every unfitted step on the data as transformed by the steps before it."""
        for step in self.steps:
            if not step.fitted:
                step.fit(df)
            df = step.apply(df)
        return self

    def execute(self, df: DataFrame) -> DataFrame:
        """Apply the steps in order (fitting the unfitted ones first); lazy except for fitting."""
        for i, step in enumerate(self.steps):
            try:
                if not step.fitted:
                    step.fit(df)
                if isinstance(step, Assemble):
                    self.feature_shape = step.feature_shape(df)
                df = step.apply(df)
            except ConfigurationError as exc:
                raise ConfigurationError(f"transform.steps[{i}] ({step.op}): {exc}") from None
        return df

    def mapping(self, column: str) -> list[str] | None:
        """The categories a categorical step learned or declared for ``column``."""
        for step in self.steps:
            if isinstance(step, _Categorical) and step.column == column:
                return None if step.categories is None else list(step.categories)
        return None

    @property
    def assemble(self) -> Assemble | None:
        last = self.steps[-1] if self.steps else None
        return last if isinstance(last, Assemble) else None

    def classes(self) -> list[str] | None:
        """The label's class names, from the categorical step on the assembled label column."""
        asm = self.assemble
        return self.mapping(asm.label) if asm and asm.label else None

    def __repr__(self) -> str:
        return f"TransformProcess({[s.op for s in self.steps]})"
