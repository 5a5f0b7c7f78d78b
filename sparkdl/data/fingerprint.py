"""The fingerprint of a DataFrame: the name of its shards in the run store.

Reused data must be provably the same data, so a fingerprint is **reusable** only when every
input of the plan is identified:

- the optimized logical plan's text (expression ids removed) and the schema with its column
  metadata (Spark ML's ``ml_attr``: e.g. a ``StringIndexer``'s labels, which its UDF does not
  show in the plan), and the writing options (feature shape, label kind, classes, columns);
- each leaf of the plan: a **plain file scan** (Parquet, CSV, JSON, ORC, ... through a
  ``HadoopFsRelation``) by its format, reader options (``header``, ``sep``, ``mode``,
  ``nullValue``, ...), schemas and files with their sizes and modification times; local rows
  (``LocalRelation``) by their contents; ``range`` by its text; an RDD
  (``createDataFrame`` of Python data) by the application's and the RDD's id, when the RDD's
  lineage starts only from parallelized collections (data held by this application).

Anything else makes the fingerprint *salted* (random, so never reused, and ``why`` says why):
a leaf of another kind (JDBC and other non-file ``LogicalRelation``\\ s, catalog tables read
through Hive, data source V2, cached ``InMemoryRelation``\\ s, streams, an RDD read from
files), a plan that calls a Python or R function (UDFs, ``pandas_udf``, ``mapInPandas``, ...)
or a Scala/Java UDF other than ``vector_to_array``, ``array_to_vector`` and
``VectorAssembler``'s (Spark ML models' among them: a fitted ``MinMaxScaler``'s ranges live
in its UDF's closure) -- a plan names a function but shows neither its code nor its captured
state -- or an input file that cannot be listed.

Limits: files changed without a change of size or modification time are not noticed.

The Spark JVM is reached only through :func:`_plan_facts` (Spark has no public API for the plan's
leaves and reader options).
"""

from __future__ import annotations

import hashlib
import json
import re
import secrets
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sparkdl.data.metadata import resolve

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

_EXPR_ID = re.compile(r"#\d+L?")
# plan nodes and expressions that run Python or R code the plan does not show
_FOREIGN_FUNCTION = re.compile(r"Python|Pandas|InArrow$|InR$|InRWithArrow$")
# where the Scala UDFs are defined whose result the plan and its inputs determine: Spark's
# vector_to_array / array_to_vector (sparkdl adds vector_to_array itself) and VectorAssembler
_KNOWN_SCALA_UDFS = frozenset({
    "org.apache.spark.sql.ml.InternalFunctionRegistration$",
    "org.apache.spark.ml.functions$",
    "org.apache.spark.ml.feature.VectorAssembler",
})
_CLASS = re.compile(r'"class"\s*:\s*"[\w.$]*?([\w$]+)"')


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
    facts = _plan_facts(df)
    leaves: list[Any] = []
    doubts: list[str] = []
    if facts["functions"]:
        doubts.append(f"the plan calls functions ({', '.join(facts['functions'])}) whose "
                      "code and captured state it does not show")
    for leaf in facts["leaves"]:
        if "doubt" in leaf:
            doubts.append(leaf["doubt"])
        elif "files" in leaf:
            stamps, unlisted = _file_stamps(leaf["files"])
            leaves.append({**leaf, "files": stamps})
            doubts.extend(f"input file {uri} cannot be listed" for uri in unlisted)
        else:
            leaves.append(leaf)
    parts = {"plan": facts["plan"], "schema": df.schema.json(), "options": options or {},
             "leaves": leaves}
    if doubts:
        parts["salt"] = secrets.token_hex(16)
    text = json.dumps(parts, sort_keys=True, default=str)
    key = hashlib.sha256(text.encode()).hexdigest()[:32]
    if doubts:
        return Fingerprint(key, False, "; ".join(dict.fromkeys(doubts)))
    return Fingerprint(key, True, "same plan, schema and write options over the same inputs ("
                       + ", ".join(_describe(leaf) for leaf in leaves) + ")")


def _describe(leaf: dict[str, Any]) -> str:
    if leaf["kind"] == "files":
        return (f"{leaf['format']} scan of {len(leaf['files'])} file(s) with unchanged sizes "
                "and modification times")
    if leaf["kind"] == "rdd":
        return f"RDD {leaf['rdd']} of this application"
    return leaf["kind"]


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


def _plan_facts(df: DataFrame) -> dict[str, Any]:
    """What the fingerprint needs from Spark's JVM: the optimized plan's text, the Python/R
    functions it calls and one dict per leaf (``doubt`` set where the leaf's data cannot be
    identified)."""
    plan = df._jdf.queryExecution().optimizedPlan()
    classes = set(_CLASS.findall(str(plan.toJSON())))
    functions = sorted(name for name in classes if _FOREIGN_FUNCTION.search(name))
    if "ScalaUDF" in classes:
        functions += sorted({f"a Scala UDF of {owner.rstrip('$').rsplit('.', 1)[-1]}"
                             for owner in _scala_udf_owners(plan)
                             if owner not in _KNOWN_SCALA_UDFS})
    leaves = plan.collectLeaves()
    return {
        "plan": _EXPR_ID.sub("", _full_plan_text(df, plan)),
        "functions": functions,
        "leaves": [_leaf_facts(leaves.apply(i)) for i in range(leaves.size())],
    }


def _leaf_facts(leaf: Any) -> dict[str, Any]:
    kind = str(leaf.getClass().getSimpleName())
    if kind == "LogicalRelation":
        relation = leaf.relation()
        name = str(relation.getClass().getSimpleName())
        if name != "HadoopFsRelation":
            return {"kind": kind, "doubt": f"{name} is not a file scan: its data can change "
                    "while the plan stays the same"}
        options: dict[str, str] = {}
        entries = relation.options().iterator()
        while entries.hasNext():
            entry = entries.next()
            options[str(entry._1()).lower()] = str(entry._2())
        return {"kind": "files", "format": str(relation.fileFormat().toString()),
                "options": options, "data_schema": str(relation.dataSchema().json()),
                "partition_schema": str(relation.partitionSchema().json()),
                "files": [str(f) for f in relation.location().inputFiles()]}
    if kind == "LogicalRDD":
        rdd = leaf.rdd()
        sources = _rdd_sources(rdd)
        if sources != {"ParallelCollectionRDD"}:
            return {"kind": kind, "doubt": f"an RDD read from {', '.join(sorted(sources))}, "
                    "whose data can change while the RDD stays the same"}
        return {"kind": "rdd", "app": str(rdd.context().applicationId()), "rdd": int(rdd.id())}
    if kind == "LocalRelation":
        rows = str(leaf.data().toString())
        return {"kind": "local rows", "rows": hashlib.sha256(rows.encode()).hexdigest()}
    if kind in ("Range", "OneRowRelation"):
        return {"kind": kind, "text": _EXPR_ID.sub("", str(leaf.toString()))}
    return {"kind": kind, "doubt": f"{kind} is not a file scan, local data or a range: its "
            "data cannot be proven unchanged"}


def _scala_udf_owners(plan: Any) -> list[str]:
    """The classes defining the Scala/Java UDFs the plan calls."""
    owners, nodes, expressions = [], [plan], []
    while nodes:
        node = nodes.pop()
        for seq, into in ((node.children(), nodes), (node.expressions(), expressions)):
            into.extend(seq.apply(i) for i in range(seq.size()))
    while expressions:
        expression = expressions.pop()
        if expression.getClass().getSimpleName() == "ScalaUDF":
            owners.append(str(expression.function().getClass().getName()).split("$$Lambda")[0])
        children = expression.children()
        expressions.extend(children.apply(i) for i in range(children.size()))
    return owners


def _rdd_sources(rdd: Any) -> set[str]:
    """Class names of the RDDs a lineage starts from (those without dependencies)."""
    sources: set[str] = set()
    pending, seen = [rdd], set()
    while pending:
        current = pending.pop()
        if int(current.id()) in seen:
            continue
        seen.add(int(current.id()))
        dependencies = current.dependencies()
        if dependencies.isEmpty():
            sources.add(str(current.getClass().getSimpleName()))
        for i in range(dependencies.size()):
            pending.append(dependencies.apply(i).rdd())
    return sources


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


__all__ = ["Fingerprint", "fingerprint"]
