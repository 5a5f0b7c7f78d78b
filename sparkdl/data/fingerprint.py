"""The fingerprint of a DataFrame: the name of its shards in the run store.

Reused data must be provably the same data, so a fingerprint is **reusable** only when every
input of the plan is identified. It is read through public DataFrame APIs that classic Spark
and Spark Connect both offer (``explain``, ``semanticHash``, ``inputFiles``, ``schema``):

- the optimized logical plan's text (expression ids removed, every field shown), the schema
  with its column metadata (Spark ML's ``ml_attr``: e.g. a ``StringIndexer``'s labels) and the
  writing options (feature shape, label kind, classes, columns);
- **plain file scans** (Parquet, CSV, JSON, ORC, text, Avro, ...) by their files with sizes and
  modification times (``inputFiles``) and the plan's ``semanticHash``, which covers the reader
  options (``header``, ``sep``, ``mode``, ``nullValue``, ...) the plan's text does not show;
  ``range`` and one-row plans by their text;
- what the text cannot identify -- local rows (``createDataFrame``), an RDD, a Scala/Java UDF
  (Spark ML transformers, ``vector_to_array``: the plan shows ``UDF(...)``, not the function
  or its captured state, such as a fitted ``MinMaxScaler``'s ranges) -- by a **digest of the
  DataFrame's content**: one Spark job counting the rows and summing two 64-bit hashes of each.

Anything else makes the fingerprint *salted* (random, so never reused, and ``why`` says why):
a leaf of another kind (JDBC and other non-file relations, catalog tables read through Hive,
data source V2, cached ``InMemoryRelation``\\ s, streams), a plan that calls a Python or R
function (UDFs, ``pandas_udf``, ``mapInPandas``, ...: the digest would run them once more, and
their output may differ from run to run), or an input file that cannot be listed.

Limits: files changed without a change of size or modification time are not noticed (unless
the plan is digested); a Scala/Java UDF registered under a name shows as a plain function call.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import re
import secrets
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sparkdl.data.metadata import resolve

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

_EXPR_ID = re.compile(r"#\d+L?")
# plan nodes that run Python or R code the plan does not show
_FOREIGN_FUNCTION = re.compile(r"Python|Pandas|InArrow$|InR$|InRWithArrow$")
# a plan line: tree drawing, an optional whole-stage-codegen id, the node's name
_NODE = re.compile(r"^([ :|+\-]*)(?:\*\(\d+\) )?([A-Za-z]\w*)")
_RELATION = re.compile(r"^Relation (?:\S+)?\[.*?\] (\S+)")
# the short names of Spark's file formats (a HadoopFsRelation prints its format's short name)
_FILE_FORMATS = frozenset({"parquet", "csv", "json", "orc", "text", "avro", "binaryFile",
                           "libsvm", "image", "xml"})
_DIGESTED_LEAVES = {"LocalRelation": "local rows", "LogicalRDD": "an RDD",
                    "ExternalRDD": "an RDD"}
_TEXT_LEAVES = frozenset({"Range", "OneRowRelation"})
_SCALA_UDF = re.compile(r"\bUDF\(")
_SEEDS = (23, 42)  # the two hashes of the content digest


@dataclass(frozen=True)
class Fingerprint:
    """The store key of a DataFrame's shards.

    ``reusable``: the key names provably the same data (else it is random); ``why``: what the
    key covers, or why the data cannot be proven the same (for the store's log line).
    """

    key: str
    reusable: bool
    why: str


def fingerprint(df: DataFrame, options: dict[str, Any] | None = None) -> Fingerprint:
    """The fingerprint of ``df`` written with ``options`` (see the module doc)."""
    optimized, physical = _plan_text(df)
    doubts: list[str] = []
    functions = sorted({name for _, name in _nodes(optimized + physical)
                        if _FOREIGN_FUNCTION.search(name)})
    if functions:
        doubts.append(f"the plan calls Python/R functions ({', '.join(functions)}) whose "
                      "code and captured state it does not show")
    kinds: list[str] = []
    digested: list[str] = ["a Scala UDF"] if _SCALA_UDF.search(optimized) else []
    for line in _leaves(optimized):
        kind, doubt = _leaf_kind(line)
        if doubt:
            doubts.append(doubt)
        elif kind in _DIGESTED_LEAVES:
            digested.append(_DIGESTED_LEAVES[kind])
        else:
            kinds.append(kind)
    parts: dict[str, Any] = {"plan": _EXPR_ID.sub("", optimized), "schema": df.schema.json(),
                             "options": options or {}}
    files: list[list[Any]] = []
    if not doubts:
        files, unlisted = _file_stamps(df.inputFiles())
        doubts.extend(f"input file {uri} cannot be listed" for uri in unlisted)
    if doubts:
        parts["salt"] = secrets.token_hex(16)
    elif digested:
        parts["digest"], digest_doubt = _digest(df)
        if digest_doubt:
            doubts.append(digest_doubt)
            parts["salt"] = secrets.token_hex(16)
    else:
        parts["semantic_hash"] = df.semanticHash()  # the reader options the text leaves out
    parts["files"] = files
    text = json.dumps(parts, sort_keys=True, default=str)
    key = hashlib.sha256(text.encode()).hexdigest()[:32]
    if doubts:
        return Fingerprint(key, False, "; ".join(dict.fromkeys(doubts)))
    covered = [f"{len(files)} input file(s) with unchanged sizes and modification times"
               if files else "", ", ".join(sorted(set(kinds) - {"files"})),
               f"a digest of the content ({', '.join(dict.fromkeys(digested))})"
               if digested else ""]
    return Fingerprint(key, True, "same plan, schema and write options over "
                       + ("; ".join(c for c in covered if c) or "no input"))


def _plan_text(df: DataFrame) -> tuple[str, str]:
    """The optimized logical plan's and the physical plan's text, every field shown (Spark
    truncates wide plans by default), from ``explain`` (classic Spark prints it, Spark
    Connect too)."""
    conf = df.sparkSession.conf
    key = "spark.sql.debug.maxToStringFields"
    previous = conf.get(key, None)
    conf.set(key, str(2**31 - 1))
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            df.explain(extended=True)
    finally:
        if previous is None:
            conf.unset(key)
        else:
            conf.set(key, previous)
    text = out.getvalue()
    optimized = text.split("== Optimized Logical Plan ==", 1)[-1]
    optimized, _, physical = optimized.partition("== Physical Plan ==")
    return optimized.strip(), physical.strip()


def _nodes(text: str) -> list[tuple[int, str]]:
    """``(depth, name)`` of each node line of a plan's text."""
    found = []
    for line in text.splitlines():
        match = _NODE.match(line)
        if match:
            found.append((len(match.group(1)), match.group(2)))
    return found


def _leaves(text: str) -> list[str]:
    """The lines of a plan's leaves (nodes the next line does not go deeper than)."""
    lines = [line for line in text.splitlines() if _NODE.match(line)]
    depths = [len(_NODE.match(line).group(1)) for line in lines]  # type: ignore[union-attr]
    return [line.lstrip(" :|+-") for i, line in enumerate(lines)
            if i + 1 == len(lines) or depths[i + 1] <= depths[i]]


def _leaf_kind(line: str) -> tuple[str, str | None]:
    """A leaf's kind, and why its data cannot be proven unchanged (``None`` if it can)."""
    relation = _RELATION.match(line)
    if relation:
        source = relation.group(1)
        if source in _FILE_FORMATS:
            return "files", None
        return "Relation", (f"{source} is not a file scan: its data can change while the "
                            "plan stays the same")
    name = _NODE.match(line).group(2)  # type: ignore[union-attr]
    if name in _DIGESTED_LEAVES or name in _TEXT_LEAVES:
        return name, None
    return name, (f"{name} is not a file scan, local data or a range: its data cannot be "
                  "proven unchanged")


def _digest(df: DataFrame) -> tuple[list[str], str | None]:
    """The row count and two sums of 64-bit row hashes (order-free: a multiset's digest)."""
    from pyspark.sql import functions as F

    columns = [F.col(f"`{name}`") for name in df.columns]
    sums = [F.sum(F.xxhash64(F.lit(seed), *columns).cast("decimal(38,0)")) for seed in _SEEDS]
    try:
        row = df.agg(F.count(F.lit(1)), *sums).collect()[0]
    except Exception as exc:  # e.g. map columns, which Spark does not hash
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        return [], f"the content digest failed: {first}"
    return [str(value) for value in row], None


def _file_stamps(uris: list[str]) -> tuple[list[list[Any]], list[str]]:
    """``[uri, size, mtime_ns]`` of each file, and the files pyarrow cannot list."""
    stamps, unlisted = [], []
    for uri in sorted(uris):
        try:
            fs, path = resolve(uri)
            info = fs.get_file_info(path)
            stamps.append([uri, info.size, info.mtime_ns])
        except Exception:
            unlisted.append(uri)
    return stamps, unlisted


__all__ = ["Fingerprint", "fingerprint"]
