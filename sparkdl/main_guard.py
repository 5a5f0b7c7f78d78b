"""Whether the running script reached this call from top-level code outside its
``if __name__ == "__main__":`` guard.

Spawned worker processes (:class:`~sparkdl.parallel.ParallelWrapper`'s) import the main
script again, as ``__mp_main__``: whatever its top level runs outside the guard runs again in
every worker (its Spark session, its ETL) before Python's spawn check stops it, minutes later.
The parent can tell at once: the main script's module frame is on the call stack, at a line
of a top-level statement that is not the guard.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

__all__ = ["unguarded_main_line"]


def unguarded_main_line() -> tuple[str, int] | None:
    """``(script, line)`` when the caller was reached from the main script's top-level code
    outside an ``if __name__ == "__main__":`` block; None otherwise, and whenever it cannot
    tell (no script file: a notebook, ``python -c``, a console entry point; unreadable or
    unparsable source)."""
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if main is None or not isinstance(path, str) or not path.endswith(".py"):
        return None
    namespace = vars(main)
    frame = sys._getframe(1)
    while frame is not None and not (
        frame.f_globals is namespace and frame.f_code.co_name == "<module>"
    ):
        frame = frame.f_back
    if frame is None:
        return None
    line = frame.f_lineno
    try:
        tree = ast.parse(Path(path).read_text(encoding="utf-8"), filename=path)
    except (OSError, SyntaxError, ValueError):  # ValueError: undecodable bytes too
        return None
    for statement in tree.body:
        if statement.lineno <= line <= (statement.end_lineno or statement.lineno):
            return None if _is_main_guard(statement) else (path, line)
    return None


def _is_main_guard(statement: ast.stmt) -> bool:
    """``if __name__ == "__main__":`` (either operand order)."""
    if not isinstance(statement, ast.If) or not isinstance(statement.test, ast.Compare):
        return False
    test = statement.test
    if len(test.ops) != 1 or not isinstance(test.ops[0], ast.Eq):
        return False
    operands = {_operand(test.left), _operand(test.comparators[0])}
    return operands == {"name", "main"}


def _operand(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name) and node.id == "__name__":
        return "name"
    if isinstance(node, ast.Constant) and node.value == "__main__":
        return "main"
    return None
