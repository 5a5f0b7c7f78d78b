"""Turning data errors found on executors into one clear :class:`DataError` on the driver.

Executor-side checks either raise :class:`DataError` inside a pandas UDF (its message reaches
the driver inside a ``PythonException``) or use :func:`fail_when` (SQL ``raise_error``, no
Python). Both carry a marker; :func:`spark_data_errors` finds the marked message in whatever
exception Spark raises and re-raises it alone, without the JVM stack trace.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from sparkdl.errors import DataError, SparkDLError

if TYPE_CHECKING:
    from pyspark.sql import Column

MARK = "SPARKDL-DATA-ERROR<<"
END = ">>"
_MARKED = re.compile(re.escape(MARK) + r"(.*?)" + re.escape(END), re.DOTALL)


def marked(message: str) -> str:
    """``message`` wrapped in the marker (newlines flattened), for errors raised on executors."""
    return f"{MARK}{' '.join(message.split())}{END}"


def executor_error(message: str) -> DataError:
    """A :class:`DataError` to raise inside a UDF; the driver re-raises just ``message``."""
    return DataError(marked(message))


def fail_when(condition: Column, message: Column) -> Column:
    """A column that raises a marked error (SQL ``raise_error``) for rows where ``condition``."""
    from pyspark.sql import functions as F

    return F.when(
        condition, F.raise_error(F.concat(F.lit(MARK), message, F.lit(END)))
    )


def find_marked(exc: BaseException) -> str | None:
    """The first marked message in ``exc`` (or its causes), if any."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        match = _MARKED.search(str(current))
        if match:
            return match.group(1)
        current = current.__cause__ or current.__context__
    return None


@contextmanager
def spark_data_errors(context: str | None = None) -> Iterator[None]:
    """Re-raise a marked executor error as one :class:`DataError`; other errors pass through
    (wrapped in a :class:`DataError` naming ``context`` when ``context`` is given)."""
    try:
        yield
    except SparkDLError as exc:
        message = find_marked(exc)
        if message is None:
            raise
        raise DataError(message) from None
    except Exception as exc:
        message = find_marked(exc)
        if message is not None:
            raise DataError(message) from None
        if context is None:
            raise
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise DataError(f"{context}: {first}") from exc


_TRACEBACK = "Traceback (most recent call last):"
_RAISED = re.compile(r"^[A-Za-z_][\w.]*: \S.*$|^[A-Za-z_][\w.]*(?:Error|Exception)$")


def task_failure_cause(exc: BaseException) -> str:
    """One line saying why a Spark job failed: the exception a Python worker raised (its
    traceback's last line, ``ZeroDivisionError: float division by zero``), else the first line
    of Spark's message (``[DIVIDE_BY_ZERO] Division by zero. ...``)."""
    text = str(exc)
    if _TRACEBACK in text:
        for line in text[text.rindex(_TRACEBACK) + len(_TRACEBACK):].splitlines():
            if _RAISED.match(line):
                return line.strip()
    lines = [line.strip().removeprefix(": ") for line in text.splitlines() if line.strip()]
    useful = [line for line in lines if not line.startswith("An error occurred while calling")]
    return (useful or lines or [type(exc).__name__])[0]


@contextmanager
def dataframe_errors(what: str) -> Iterator[None]:
    """Re-raise a Spark failure while computing the user's DataFrame (a Python UDF that
    raises, an ANSI-mode division by zero) as one :class:`DataError` naming ``what`` and the
    cause, without the JVM's or Py4J's traceback. sparkdl's own errors pass through."""
    try:
        yield
    except SparkDLError:
        raise
    except Exception as exc:
        if not _from_spark(exc):
            raise
        message = find_marked(exc)
        if message is None:
            message = f"{what}: the DataFrame failed on Spark: {task_failure_cause(exc)}"
        raise DataError(message) from None


def _from_spark(exc: BaseException) -> bool:
    """Whether ``exc`` is an error of Spark's (PySpark's captured errors, Py4J's)."""
    module = type(exc).__module__ or ""
    return module.startswith(("pyspark.", "py4j."))


#: Spark's loggers that print a failed task's whole JVM stack trace (60-90 lines) before the
#: one clear :class:`DataError` line: off in the driver's log4j 2 configuration of a session
#: sparkdl starts (``sparkdl/log4j2.properties``; no public API, classic or Connect, changes a
#: running JVM's loggers).
NOISY_LOGGERS = (
    "org.apache.spark.executor.Executor",
    "org.apache.spark.scheduler.TaskSetManager",
    "org.apache.spark.scheduler.TaskSchedulerImpl",
    "org.apache.spark.sql.execution.datasources.FileFormatWriter",
    "org.apache.spark.sql.execution.streaming.FileStreamSink",
)
