"""sparkdl.data.spark_errors.task_failure_cause: one line from a failed Spark job's message."""

from __future__ import annotations

import pytest

from sparkdl.data.spark_errors import task_failure_cause

PY4J = """An error occurred while calling o123.collectToPython.
: org.apache.spark.SparkException: Job aborted due to stage failure: Task 0 in stage 3.0 failed
 1 times, most recent failure: Lost task 0.0 (TID 3): org.apache.spark.api.python.PythonException:
 Traceback (most recent call last):
  File "/work/user.py", line 5, in divide
    return a / zero
           ~~^~~~~~
ZeroDivisionError: float division by zero

\tat org.apache.spark.api.python.BasePythonRunner$ReaderIterator.handlePythonException(x.scala:1)
"""

CHAINED = """An exception was thrown from the Python worker. Please see the stack trace below.
Traceback (most recent call last):
  File "a.py", line 1, in f
KeyError: 'x'

During handling of the above exception, another exception occurred:

Traceback (most recent call last):
  File "a.py", line 3, in f
ValueError: bad row 7
"""


@pytest.mark.parametrize(("text", "cause"), [
    (PY4J, "ZeroDivisionError: float division by zero"),
    (CHAINED, "ValueError: bad row 7"),
    ("[DIVIDE_BY_ZERO] Division by zero. Use `try_divide`. SQLSTATE: 22012\n== DataFrame ==\n",
     "[DIVIDE_BY_ZERO] Division by zero. Use `try_divide`. SQLSTATE: 22012"),
    ("An error occurred while calling o9.count.\n: java.lang.OutOfMemoryError: Java heap space\n",
     "java.lang.OutOfMemoryError: Java heap space"),
    ("", "RuntimeError"),
])
def test_the_cause_is_the_line_that_says_what_went_wrong(text, cause):
    assert task_failure_cause(RuntimeError(text)) == cause
