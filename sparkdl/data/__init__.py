"""DataSet shards: Parquet + ``_sparkdl.json`` written by Spark, read by training workers.

``metadata``, ``files`` and ``reader`` import pyarrow and numpy only (they run inside training
workers); ``writer`` needs Spark, imported when ``write_shards`` is called.
"""

from sparkdl.data.files import read_metadata
from sparkdl.data.metadata import (
    FORMAT_VERSION,
    METADATA_FILE,
    ShardFile,
    ShardMetadata,
)
from sparkdl.data.reader import (
    ShardReader,
    WorkerSlice,
    iter_batches,
    plan_slices,
    read_all,
    to_tf_dataset,
)
from sparkdl.data.writer import write_shards

__all__ = [
    "FORMAT_VERSION",
    "METADATA_FILE",
    "ShardFile",
    "ShardMetadata",
    "ShardReader",
    "WorkerSlice",
    "iter_batches",
    "plan_slices",
    "read_all",
    "read_metadata",
    "to_tf_dataset",
    "write_shards",
]
