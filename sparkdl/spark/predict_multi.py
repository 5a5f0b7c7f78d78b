"""``predict`` for models with several named inputs and/or outputs (DL4J's
ComputationGraph on a MultiDataSet): one prediction column per output.

Columns, for each model output ``<out>`` (in ``model.output_names`` order):
``<predictionCol>_<out>`` (a class output: the class index, double; a regression output: a
double for one value, else a Spark ML vector) and, for a class output,
``<probabilityCol>_<out>`` (a Spark ML vector). The suffix keeps them apart from the shards'
label columns, which carry the outputs' own names.

Inputs: a multi-input shard directory's named columns; on a DataFrame, ``features_col`` as a
dict ``{input name: column}`` (each column as ``fit`` takes one), or, left at its default,
the columns named after the model's inputs.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from sparkdl.errors import ConfigurationError, DataError

if TYPE_CHECKING:
    import pandas as pd
    from pyspark.sql import Column, DataFrame

    from sparkdl.data.metadata import ShardMetadata
    from sparkdl.spark.task_model import FittedModel
    from sparkdl.training.model_files import ModelRef


def is_multi_model(model: Any) -> bool:
    """Whether ``model`` has several inputs or several outputs."""
    return len(model.inputs) > 1 or len(model.outputs) > 1


def model_inputs(model: Any) -> list[tuple[str, list[int]]]:
    """``(name, shape without the batch axis)`` of each model input, in order."""
    out = []
    for tensor in model.inputs:
        shape = [d for d in tensor.shape[1:]]
        if any(d is None for d in shape):
            raise ConfigurationError(
                f"predict(): the model's input {tensor.name!r} has shape {tensor.shape}; "
                "its dimensions must be known"
            )
        out.append((str(tensor.name), [int(d) for d in shape]))
    return out


def output_kinds(
    model: Any, label_kind: str | Mapping[str, str] | None, metadata: ShardMetadata | None,
) -> dict[str, str]:
    """Each output's kind: ``label_kind`` (one for all, or a dict by output name), else the
    shards' output spec, else inferred from the output layer (softmax or one-unit sigmoid:
    ``class``)."""
    import math

    names = [str(n) for n in model.output_names]
    from_shards = {t.name: t.kind for t in metadata.outputs} if metadata else {}
    kinds = {}
    for name, tensor in zip(names, model.outputs, strict=True):
        if isinstance(label_kind, str):
            kind = label_kind
        elif isinstance(label_kind, Mapping) and name in label_kind:
            kind = label_kind[name]
        elif name in from_shards:
            kind = from_shards[name]
        else:
            width = math.prod(int(d) for d in tensor.shape[1:] if d is not None)
            activation = _output_activation(model, name)
            kind = ("class" if activation == "softmax" or (activation == "sigmoid" and width == 1)
                    else "regression")
        if kind not in ("class", "regression"):
            raise ConfigurationError(
                f"label_kind for output {name!r} must be 'class' or 'regression', got {kind!r}"
            )
        kinds[name] = kind
    if isinstance(label_kind, Mapping):
        unknown = sorted(set(label_kind) - set(names))
        if unknown:
            raise ConfigurationError(f"label_kind names {unknown[0]!r}, not an output of the "
                                     f"model (its outputs: {names})")
    return kinds


def _output_activation(model: Any, name: str) -> str:
    try:
        layer = model.get_layer(name)
    except ValueError:
        return ""
    if type(layer).__name__ == "Softmax":
        return "softmax"
    return str(getattr(getattr(layer, "activation", None), "__name__", ""))


def dataframe_inputs(
    df: DataFrame, model: Any, features_col: Any,
) -> list[tuple[str, Column, list[int]]]:
    """``(input name, array<float> column, shape)`` for each model input of ``df``, each
    checked against the input's shape (:func:`sparkdl.data.frames.checked_features_column`)."""
    from sparkdl.data.frames import checked_features_column

    inputs = model_inputs(model)
    if len(inputs) == 1 and not isinstance(features_col, Mapping):
        name, shape = inputs[0]
        return [(name, checked_features_column(df, features_col, shape), shape)]
    if features_col == "features":
        features_col = {name: name for name, _ in inputs}
    if not isinstance(features_col, Mapping):
        raise ConfigurationError(
            f"predict(): the model has inputs {[n for n, _ in inputs]}; features_col must map "
            "each to a column ({input name: column}), or be left out to read the columns of "
            f"their names; got {features_col!r}"
        )
    missing = [name for name, _ in inputs if name not in features_col]
    if missing:
        raise ConfigurationError(f"predict(): features_col names no column for the model's "
                                 f"input {missing[0]!r}")
    return [(name, checked_features_column(df, features_col[name], shape, model_input=name),
             shape) for name, shape in inputs]


def predict_multi(
    spark_model: FittedModel,
    df: DataFrame,
    inputs: list[tuple[str, Column, list[int]]],
    kinds: dict[str, str],
    batch_size: int,
    prediction_col: str,
    probability_col: str,
    *,
    model_file: ModelRef,
) -> DataFrame:
    """``df`` with one prediction column (and a probability column for a class output) per
    model output; ``inputs`` as :func:`dataframe_inputs` returns them."""
    from pyspark.ml.functions import array_to_vector
    from pyspark.sql import functions as F

    names = list(kinds)
    added = []
    for name, kind in kinds.items():
        added.append(f"{prediction_col}_{name}")
        if kind == "class":
            added.append(f"{probability_col}_{name}")
    for column in added:
        if column in df.columns:
            raise DataError(f"predict(): the DataFrame already has a column {column!r}; "
                            "choose other prediction_col / probability_col names")
    udf = _scores_udf(spark_model, [(n, s) for n, _, s in inputs], names, batch_size,
                      model_file)
    scores = "__sparkdl_scores"
    out = df.withColumn(scores, udf(*[column for _, column, _ in inputs]))
    for i, (name, kind) in enumerate(kinds.items()):
        values = F.col(scores)[f"o{i}"]
        width = _width(spark_model.model.outputs[i])
        prediction = f"{prediction_col}_{name}"
        if kind == "regression":
            out = out.withColumn(prediction, values[0].cast("double") if width == 1
                                 else array_to_vector(values))
        elif width == 1:  # a one-unit sigmoid: P(class 1)
            out = (out.withColumn(prediction, (values[0] >= 0.5).cast("double"))
                   .withColumn(f"{probability_col}_{name}",
                               array_to_vector(F.array(1 - values[0], values[0]))))
        else:
            argmax = F.array_position(values, F.array_max(values)) - 1
            out = (out.withColumn(prediction, argmax.cast("double"))
                   .withColumn(f"{probability_col}_{name}", array_to_vector(values)))
    return out.drop(scores)


def _width(tensor: Any) -> int:
    import math

    return int(math.prod(int(d) for d in tensor.shape[1:] if d is not None) or 1)


def _scores_udf(
    spark_model: FittedModel, inputs: list[tuple[str, list[int]]], outputs: list[str],
    batch_size: int, model_file: ModelRef,
) -> Any:
    """A pandas UDF: one ``array<float>`` column per input → a struct of the outputs' values
    (fields ``o0``, ``o1``, ... in output order), with the model of ``model_file``."""
    import numpy as np
    import pandas as pd
    from pyspark.sql.pandas.functions import PandasUDFType, pandas_udf

    from sparkdl.session import task_cpus
    from sparkdl.spark.task_model import load_task_model
    from sparkdl.spark.task_size import check_task_size
    from sparkdl.storage import apply_environment, s3_environment

    threads, custom_objects = task_cpus(spark_model.spark), spark_model.custom_objects
    environment = s3_environment()
    fields = [f"o{i}" for i in range(len(outputs))]

    def predict_scores(batches: Iterator[tuple[pd.Series, ...]]) -> Iterator[pd.DataFrame]:
        apply_environment(environment)
        model = load_task_model(model_file, custom_objects, threads)
        for columns in batches:
            rows = len(columns[0])
            values: list[list[np.ndarray]] = [[] for _ in outputs]
            for start in range(0, rows, batch_size):
                x = {name: np.stack(column.iloc[start : start + batch_size].to_numpy())
                     .astype(np.float32).reshape(-1, *shape)
                     for (name, shape), column in zip(inputs, columns, strict=True)}
                y = model.predict_on_batch(x if len(x) > 1 else next(iter(x.values())))
                if not isinstance(y, Mapping):
                    y = dict(zip(outputs, y if isinstance(y, list | tuple) else [y],
                                 strict=True))
                for i, name in enumerate(outputs):
                    part = np.asarray(y[name], dtype=np.float32)
                    values[i].extend(part.reshape(len(part), -1))
            yield pd.DataFrame({field: pd.Series(v, dtype=object, index=columns[0].index)
                                for field, v in zip(fields, values, strict=True)})

    check_task_size(spark_model.spark, "predict()", predict_scores, custom_objects)
    schema = ", ".join(f"{field}: array<float>" for field in fields)
    with warnings.catch_warnings():  # the hints would be strings here (future annotations)
        warnings.simplefilter("ignore", UserWarning)
        udf = pandas_udf(predict_scores, f"struct<{schema}>", PandasUDFType.SCALAR_ITER)
    return udf.asNondeterministic()  # the model runs once per row, never twice


__all__ = ["dataframe_inputs", "is_multi_model", "output_kinds", "predict_multi"]
