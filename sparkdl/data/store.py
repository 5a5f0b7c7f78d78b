"""The run store: DataSet shards written from DataFrames for ``fit`` / ``evaluate`` (Horovod's
Store, DL4J's Export approach).

``SparkModel.fit(df)`` writes ``df`` once as shards into a store directory (any filesystem URI
the shard writer accepts), named by a **fingerprint** of the DataFrame; fitting or evaluating
the same DataFrame again finds the shards there and reuses them. Shards this process wrote are
deleted when it exits (or on :meth:`RunStore.cleanup`) unless ``keep=True``.

The fingerprint is a SHA-256 of:

- the optimized logical plan's text, with expression ids (``#12``) removed;
- the schema with its column metadata (Spark ML's ``ml_attr``: e.g. a ``StringIndexer``'s
  labels, which its UDF does not show in the plan);
- for each leaf of the plan: the input files' paths, sizes and modification times (file
  scans); the RDD's id and the application's id (DataFrames made from Python data or RDDs:
  reused only within one Spark application); the rows themselves (local relations); the text of
  ``range``;
- the writing options (feature shape, label kind, classes, columns).

Limits: a leaf of any other kind (JDBC, streaming, a catalog table without files, ...) gets a
random salt, so such DataFrames are written afresh every time rather than risk stale shards.
The plan does not show the *code* of a Python or Scala UDF, only its name: a UDF changed in
place between two fits of a plan with the same text is not noticed. Files changed without a
change of size or modification time are not noticed either.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import json
import logging
import re
import secrets
import shutil
import tempfile
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pyarrow.fs as pafs

from sparkdl.data.metadata import METADATA_FILE, join, resolve
from sparkdl.errors import ConfigurationError, DataError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

log = logging.getLogger("sparkdl")

_EXPR_ID = re.compile(r"#\d+L?")


def fingerprint(df: DataFrame, options: dict[str, Any] | None = None) -> str:
    """A hex digest that is the same for the same plan over the same inputs (see module doc)."""
    plan = df._jdf.queryExecution().optimizedPlan()
    parts: dict[str, Any] = {
        "plan": _EXPR_ID.sub("", _full_plan_text(df, plan)),
        "schema": df.schema.json(),
        "options": options or {},
        "leaves": _leaf_identities(df, plan),
    }
    text = json.dumps(parts, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def _full_plan_text(df: DataFrame, plan: Any) -> str:
    """The plan's text with every field shown (Spark truncates wide plans by default)."""
    conf = df.sparkSession.conf
    key = "spark.sql.debug.maxToStringFields"
    previous = conf.get(key, None)
    conf.set(key, str(2**31 - 1))
    try:
        return str(plan.toString())
    finally:
        if previous is None:
            conf.unset(key)
        else:
            conf.set(key, previous)


def _leaf_identities(df: DataFrame, plan: Any) -> list[Any]:
    leaves = plan.collectLeaves()
    identities: list[Any] = []
    files_listed = False
    for i in range(leaves.size()):
        leaf = leaves.apply(i)
        kind = leaf.getClass().getSimpleName()
        if kind == "LogicalRelation" and not files_listed:
            identities.append(["files", _file_stamps(df.inputFiles())])
            files_listed = True  # inputFiles() covers every file scan of the plan
        elif kind == "LogicalRelation":
            continue
        elif kind == "LogicalRDD":
            app = df.sparkSession.sparkContext.applicationId
            identities.append(["rdd", app, int(leaf.rdd().id())])
        elif kind == "LocalRelation":
            rows = str(leaf.data().toString())
            identities.append(["local", hashlib.sha256(rows.encode()).hexdigest()])
        elif kind in ("Range", "OneRowRelation"):
            identities.append([kind, _EXPR_ID.sub("", leaf.toString())])
        else:  # unknown source: never reuse
            identities.append([kind, secrets.token_hex(16)])
    return identities


def _file_stamps(uris: list[str]) -> list[list[Any]]:
    """``[uri, size, mtime_ns]`` of every input file (one listing per filesystem)."""
    stamps = []
    for uri in sorted(uris):
        try:
            fs, path = resolve(uri)
            info = fs.get_file_info(path)
            stamps.append([uri, info.size, info.mtime_ns])
        except Exception:  # a filesystem pyarrow cannot open: never reuse
            stamps.append([uri, secrets.token_hex(16)])
    return stamps


class RunStore:
    """A directory of shard sets keyed by fingerprint.

    Args:
        root: URI or path of the store (shared storage on a cluster: ``hdfs://``, ``s3://``, a
            ``file://`` path every executor mounts). ``None``: a temporary directory on the
            driver, which only local masters (executors on the driver's machine) can use.
        keep: keep the shards this store writes (to reuse them in a later process);
            otherwise they are deleted at :meth:`cleanup` or when the process exits.
    """

    def __init__(self, root: str | None = None, *, keep: bool = False) -> None:
        self._owned_root: str | None = None
        if root is None:
            self._owned_root = tempfile.mkdtemp(prefix="sparkdl-store-")
            root = "file://" + self._owned_root
        elif "://" not in root:
            from pathlib import Path

            root = Path(root).expanduser().resolve().as_uri()
        self.root = root.rstrip("/")
        self.keep = keep
        self._written: list[str] = []
        self._lock = threading.Lock()
        atexit.register(self._at_exit)

    def check_reachable(self, master: str) -> None:
        """A driver-local temporary store works only when executors share the driver's disk."""
        if self._owned_root and not master.startswith("local"):
            raise ConfigurationError(
                f"fitting a DataFrame on master {master!r} needs a store on shared storage: "
                "pass store='hdfs://...' (or s3://, or a file:// path every executor mounts) "
                "or set training.store"
            )

    def shards(self, key: str, write: Callable[[str], Any]) -> str:
        """The URI of the shards named ``key``; ``write(uri)`` writes them if absent."""
        uri = join(self.root, key)
        fs, path = resolve(uri)
        if fs.get_file_info(join(path, METADATA_FILE)).type == pafs.FileType.File:
            log.info("reusing shards %s", uri)
            return uri
        try:
            write(uri)
        except DataError:
            # another fit wrote the same shards meanwhile: theirs are as good as ours
            if fs.get_file_info(join(path, METADATA_FILE)).type == pafs.FileType.File:
                return uri
            raise
        if not self.keep:
            with self._lock:
                self._written.append(uri)
        return uri

    def cleanup(self) -> None:
        """Delete the shards this store wrote (none when ``keep``)."""
        with self._lock:
            written, self._written = self._written, []
        for uri in written:
            with contextlib.suppress(Exception):
                fs, path = resolve(uri)
                fs.delete_dir(path)

    def _at_exit(self) -> None:
        self.cleanup()
        if self._owned_root and not self.keep:
            shutil.rmtree(self._owned_root, ignore_errors=True)


_STORES: dict[tuple[str | None, bool], RunStore] = {}
_STORES_LOCK = threading.Lock()


def open_store(root: str | None = None, *, keep: bool = False) -> RunStore:
    """The process's :class:`RunStore` for ``root`` (one per root and ``keep``, so that fits in
    one process find each other's shards; ``None``: one temporary store per process)."""
    with _STORES_LOCK:
        key = (root, keep)
        if key not in _STORES:
            _STORES[key] = RunStore(root, keep=keep)
        return _STORES[key]


__all__ = ["RunStore", "fingerprint", "open_store"]
