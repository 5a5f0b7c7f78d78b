"""The size of what a stage ships with its tasks, checked before Spark sees it.

The model travels through storage (:mod:`sparkdl.training.model_files`), but the custom
objects a model needs (its layers, losses, metrics) travel by value with the task function:
one that closes over a large array makes the function as large. Spark Connect carries the
function inside the plan, in one gRPC message, whose size the server caps
(``spark.connect.grpc.maxInboundMessageSize``, 128 MiB by default): beyond it the server
refuses the plan with a gRPC error, or runs out of memory copying it into every task. So on
Connect the function's size is measured first, and one error names the limit, the size, the
largest custom object and the setting to change.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from sparkdl import session
from sparkdl.errors import ConfigurationError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

#: The Connect server's default message limit (``spark.connect.grpc.maxInboundMessageSize``).
CONNECT_MESSAGE_LIMIT = 128 << 20
#: What of that limit a task function may take: the rest of the plan rides in the message too.
SHARE_OF_LIMIT = 0.5


def message_limit(spark: SparkSession) -> int | None:
    """The bytes a plan may take on a Spark Connect session (``None`` on classic Spark, which
    broadcasts a large task function instead)."""
    if not session.is_connect(spark):
        return None
    value = session.conf_get(spark, "spark.connect.grpc.maxInboundMessageSize")
    try:
        return _bytes(value) if value else CONNECT_MESSAGE_LIMIT
    except ValueError:
        return CONNECT_MESSAGE_LIMIT


def check_task_size(
    spark: SparkSession, what: str, function: object,
    custom_objects: Mapping[str, object] | None,
) -> None:
    """Refuse a task ``function`` (or its cloudpickled bytes) that a Connect plan cannot
    carry, naming the largest of ``custom_objects`` (what usually makes it large)."""
    limit = message_limit(spark)
    if limit is None:
        return
    from pyspark.serializers import CloudPickleSerializer

    pickler = CloudPickleSerializer()  # type: ignore[no-untyped-call]
    size = len(function if isinstance(function, bytes)
               else pickler.dumps(function))  # type: ignore[no-untyped-call]
    if size <= limit * SHARE_OF_LIMIT:
        return
    largest = ""
    if custom_objects:
        sizes = {name: len(pickler.dumps(value))  # type: ignore[no-untyped-call]
                 for name, value in custom_objects.items()}
        name = max(sizes, key=sizes.__getitem__)
        largest = f"; the largest part is custom_objects[{name!r}], {_mb(sizes[name])}"
    raise ConfigurationError(
        f"{what}: the task function Spark Connect would ship is {_mb(size)}, more than "
        f"{_mb(int(limit * SHARE_OF_LIMIT))} (half of the server's message limit "
        f"spark.connect.grpc.maxInboundMessageSize={_mb(limit)}){largest}. Keep large arrays "
        "out of custom objects (load them from a file inside the layer or loss) or raise "
        "that setting on the Connect server"
    )


def _bytes(value: str) -> int:
    """A Spark size setting (``134217728``, ``128m``, ``4MiB``) in bytes."""
    text = value.strip().lower().removesuffix("ib").removesuffix("b")
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
    if text and text[-1] in units:
        return int(float(text[:-1]) * units[text[-1]])
    return int(text)


def _mb(size: int) -> str:
    return f"{size / (1 << 20):.1f} MiB"


__all__ = ["check_task_size", "message_limit"]
