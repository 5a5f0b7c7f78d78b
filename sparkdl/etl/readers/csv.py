"""CSV record reader (DataVec's ``CSVRecordReader``) on Spark's own CSV parser.

Records are parsed on the executors against a declared schema. A record with the wrong number
of fields, or a value that does not parse as its declared type, fails the job with one
:class:`DataError` naming the file and the record; nothing is collected to the driver.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from sparkdl.data.spark_errors import fail_when, spark_data_errors
from sparkdl.errors import ConfigurationError, DataError
from sparkdl.etl.readers.schema import ddl, parse_columns

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

CORRUPT = "__sparkdl_corrupt_record"


def read_csv(
    spark: SparkSession,
    path: str | Sequence[str] | Any,
    *,
    columns: Any,
    header: bool = False,
    delimiter: str = ",",
    quote: str = '"',
    escape: str = "\\",
    null_value: str = "",
    comment: str | None = None,
    encoding: str = "UTF-8",
) -> DataFrame:
    """Read CSV files (a path, glob, list of paths, or a one-column DataFrame of lines) with
    declared ``columns`` (see :func:`~sparkdl.etl.readers.schema.parse_columns`).

    The returned DataFrame is lazy; a malformed record raises when it is computed (the first
    action, e.g. the shard writer's check pass).
    """
    from pyspark.sql import functions as F
    from pyspark.sql.utils import AnalysisException

    cols = parse_columns(columns)
    if len(delimiter) != 1 or len(quote) != 1:
        raise ConfigurationError(
            f"delimiter and quote must be single characters, got {delimiter!r} and {quote!r}"
        )
    reader = (
        spark.read.schema(f"{ddl(cols)}, `{CORRUPT}` string")
        .option("header", bool(header))
        .option("sep", delimiter)
        .option("quote", quote)
        .option("escape", escape)
        .option("nullValue", null_value)
        .option("encoding", encoding)
        .option("mode", "PERMISSIVE")
        .option("columnNameOfCorruptRecord", CORRUPT)
        # Parse every field of every record, so a wrong field count is always detected.
        .option("columnPruning", False)
        .option("enforceSchema", True)
    )
    if comment:
        reader = reader.option("comment", comment)
    source = path if isinstance(path, str | list | tuple) else "<lines>"
    try:
        with spark_data_errors():
            df = reader.csv(list(path) if isinstance(path, tuple) else path)
    except AnalysisException as exc:
        raise DataError(f"cannot read CSV {source}: {str(exc).splitlines()[0]}") from None
    declared = ", ".join(f"{n} {t}" for n, t in cols)
    first = F.coalesce(F.col(f"`{cols[0][0]}`").cast("string"), F.lit(""))
    message = F.concat(
        F.lit("CSV file "), F.input_file_name(),
        F.lit(f": malformed record (expected {len(cols)} fields: {declared}): "),
        F.col(CORRUPT), F.substring(first, 0, 0),
    )
    checked = df.filter(F.coalesce(fail_when(F.col(CORRUPT).isNotNull(), message), F.lit(True)))
    return checked.drop(CORRUPT)
