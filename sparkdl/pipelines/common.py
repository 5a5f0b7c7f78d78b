"""What every pipeline shares: option checking, the NaN policy, split, normalize, write."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from sparkdl.data.files import WEIGHT
from sparkdl.data.spark_errors import spark_data_errors
from sparkdl.data.writer import write_shards
from sparkdl.errors import ConfigurationError, DataError, unknown_name
from sparkdl.etl.clean import POLICIES, handle_non_finite
from sparkdl.etl.normalizers import NORMALIZERS, get_normalizer
from sparkdl.etl.split import train_test_split

if TYPE_CHECKING:
    from pyspark.sql import DataFrame


def option(name: str, value: Any, types: type | tuple[type, ...], *,
           allow_none: bool = False, positive: bool = False) -> Any:
    """Check one ``data.options.<name>`` value's type (and sign); return it."""
    if value is None and allow_none:
        return None
    ok = isinstance(value, types) and not (isinstance(value, bool) and bool not in (
        types if isinstance(types, tuple) else (types,)))
    if not ok:
        want = " or ".join(t.__name__ for t in (types if isinstance(types, tuple) else (types,)))
        raise ConfigurationError(f"data.options.{name}: expected {want}, got {value!r}")
    if positive and value <= 0:
        raise ConfigurationError(f"data.options.{name}: must be > 0, got {value!r}")
    return value


def no_unknown(pipeline: str, unknown: dict[str, Any]) -> None:
    """Reject options a pipeline does not know."""
    if unknown:
        key = sorted(unknown)[0]
        raise ConfigurationError(
            f"data.options.{key}: unknown option for the {pipeline} pipeline"
        )


def check_common(*, test_fraction: float, seed: int, normalizer: str | None, nan_policy: str,
                 num_files: int | None, num_workers: int | None, rows_per_group: int) -> None:
    """Validate the options every pipeline takes."""
    option("test_fraction", test_fraction, (int, float))
    if not 0.0 < float(test_fraction) < 1.0:
        raise ConfigurationError(
            f"data.options.test_fraction: must be in (0, 1), got {test_fraction!r}"
        )
    option("seed", seed, int)
    if normalizer is not None and normalizer not in (*NORMALIZERS, "none"):
        raise unknown_name("normalizer", normalizer, [*NORMALIZERS, "none"],
                           where="data.options.normalizer")
    if nan_policy not in POLICIES:
        raise ConfigurationError(
            f"data.options.nan_policy: must be one of {POLICIES}, got {nan_policy!r}"
        )
    option("num_files", num_files, int, allow_none=True, positive=True)
    option("num_workers", num_workers, int, allow_none=True, positive=True)
    option("rows_per_group", rows_per_group, int, positive=True)


def feature_shape_of(df: DataFrame, declared: Sequence[int] | None) -> list[int]:
    """The declared feature shape, else ``[length of the features arrays]`` (one Spark pass)."""
    from pyspark.sql import functions as F

    if declared:
        return [int(d) for d in declared]
    n = df.agg(F.max(F.size("features"))).collect()[0][0]
    return [max(int(n or 1), 1)]


def write_splits(
    output_dir: str,
    splits: dict[str, DataFrame],
    *,
    pipeline: str,
    feature_shape: Sequence[int],
    classes: Sequence[str],
    label_kind: str = "class",
    normalizer: str | None = "standardize",
    nan_policy: str = "fail",
    num_files: int | None = None,
    num_workers: int | None = None,
    rows_per_group: int = 256,
    seed: int = 42,
    transform: dict[str, Any] | None = None,
    extra: dict[str, Any] | None = None,
    overwrite: bool = False,
) -> dict[str, Any]:
    """NaN policy on every split, normalizer fitted on ``train`` and applied to all, each split
    written as shards at ``<output_dir>/<split>``. Returns URIs, row counts, dropped counts."""
    with spark_data_errors():
        return _write_splits(
            output_dir, splits, pipeline=pipeline, feature_shape=feature_shape, classes=classes,
            label_kind=label_kind, normalizer=normalizer, nan_policy=nan_policy,
            num_files=num_files, num_workers=num_workers, rows_per_group=rows_per_group,
            seed=seed, transform=transform, extra=extra, overwrite=overwrite,
        )


def _write_splits(output_dir: str, splits: dict[str, DataFrame], *, pipeline: str,
                  feature_shape: Sequence[int], classes: Sequence[str], label_kind: str,
                  normalizer: str | None, nan_policy: str, num_files: int | None,
                  num_workers: int | None, rows_per_group: int, seed: int,
                  transform: dict[str, Any] | None, extra: dict[str, Any] | None,
                  overwrite: bool) -> dict[str, Any]:
    base = output_dir.rstrip("/")
    out: dict[str, Any] = {}
    cleaned: dict[str, DataFrame] = {}
    for split, df in splits.items():
        cleaned[split], dropped = handle_non_finite(df, nan_policy)
        out[f"{split}_dropped_non_finite"] = dropped
    norm = None
    if normalizer and normalizer != "none":
        norm = get_normalizer(normalizer).fit(cleaned["train"])
    config = norm.to_config() if norm else None
    written: list[str] = []
    for split, df in cleaned.items():
        uri = f"{base}/{split}"
        try:
            meta = write_shards(
                norm.transform(df) if norm else df, uri, feature_shape=feature_shape,
                label_kind=label_kind, classes=list(classes), num_files=num_files,
                num_workers=num_workers, rows_per_group=rows_per_group, normalizer=config,
                transform=transform,
                extra={"pipeline": pipeline, **(extra or {}), "split": split},
                overwrite=overwrite, seed=seed, sample_weight=WEIGHT in df.columns,
            )
        except DataError as exc:
            _remove(written)  # no train split without its test split
            source = (extra or {}).get("source")
            where = f"{source}, {split} split" if source else f"{split} split"
            message = f"{where}: {exc}"
            if label_kind == "class" and "outside the" in str(exc):
                message += "; rows with such labels per split: " + ", ".join(
                    f"{name} {_bad_labels(part, len(classes))}"
                    for name, part in cleaned.items()
                )
            raise DataError(message) from None
        except BaseException:
            _remove(written)
            raise
        written.append(uri)
        out[split] = uri
        out[f"{split}_rows"] = meta.num_rows
    out["feature_shape"] = list(feature_shape)
    out["classes"] = list(classes)
    return out


def _bad_labels(df: DataFrame, num_classes: int) -> int:
    from pyspark.sql import functions as F

    label = F.col("label")
    return df.filter(label.isNotNull() & ((label < 0) | (label >= num_classes))).count()


def _remove(uris: list[str]) -> None:
    from sparkdl.data.metadata import resolve

    for uri in uris:
        fs, path = resolve(uri)
        fs.delete_dir(path)


def split(df: DataFrame, test_fraction: float, seed: int) -> dict[str, DataFrame]:
    """The seeded hash split as ``{"train": ..., "test": ...}``."""
    train, test = train_test_split(df, float(test_fraction), seed)
    return {"train": train, "test": test}


def prod(shape: Sequence[int]) -> int:
    return math.prod(int(d) for d in shape)
