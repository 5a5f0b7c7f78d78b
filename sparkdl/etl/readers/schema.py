"""Declared column schemas for record readers: ``"a int, b double"``, ``{a: int}`` or
``[[a, int], ...]`` / ``[{name: a, type: int}, ...]``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sparkdl.errors import ConfigurationError, unknown_name

TYPES = {
    "int": "int", "integer": "int", "long": "bigint", "bigint": "bigint",
    "float": "float", "double": "double", "string": "string", "str": "string",
    "boolean": "boolean", "bool": "boolean", "categorical": "string",
}


def parse_columns(columns: Any, *, key: str = "columns") -> list[tuple[str, str]]:
    """Normalize a declared schema to ``[(name, spark_type), ...]``; raise naming ``key``."""
    pairs: list[tuple[Any, Any]]
    if isinstance(columns, str):
        pairs = []
        for part in columns.split(","):
            bits = part.split()
            if len(bits) != 2:
                raise ConfigurationError(f"{key}: expected 'name type' pairs, got {part.strip()!r}")
            pairs.append((bits[0], bits[1]))
    elif isinstance(columns, Mapping):
        pairs = list(columns.items())
    elif isinstance(columns, Sequence):
        pairs = []
        for item in columns:
            if isinstance(item, Mapping) and set(item) == {"name", "type"}:
                pairs.append((item["name"], item["type"]))
            elif isinstance(item, Sequence) and not isinstance(item, str) and len(item) == 2:
                pairs.append((item[0], item[1]))
            else:
                raise ConfigurationError(
                    f"{key}: each column is [name, type] or {{name, type}}, got {item!r}"
                )
    else:
        raise ConfigurationError(f"{key}: expected a schema, got {type(columns).__name__}")
    if not pairs:
        raise ConfigurationError(f"{key}: no columns declared")
    out: list[tuple[str, str]] = []
    for name, typ in pairs:
        spark_type = TYPES.get(str(typ).lower())
        if spark_type is None:
            raise unknown_name("type", typ, TYPES, where=f"{key}: column {name!r}")
        out.append((str(name), spark_type))
    names = [n for n, _ in out]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ConfigurationError(f"{key}: duplicate column names {dupes}")
    return out


def ddl(columns: list[tuple[str, str]]) -> str:
    """A Spark DDL schema string for parsed columns."""
    return ", ".join(f"`{name}` {typ}" for name, typ in columns)
