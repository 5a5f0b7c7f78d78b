"""Imports flow one way: every import in ``sparkdl`` (module level, in functions and under
``TYPE_CHECKING``) follows the layer order ``docs/design.md`` writes, and no files import each
other around a circle."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "sparkdl"
DESIGN = ROOT / "docs" / "design.md"


def layers(design: str) -> dict[str, int]:
    """Each part's layer, from the numbered list between the design's two markers."""
    block = design.split("<!-- import layers:", 1)[1].split("<!-- end of import layers", 1)[0]
    found: dict[str, int] = {}
    number = 0
    for line in block.splitlines():
        item = re.match(r"(\d+)\. (.*)", line)
        if item:
            number = int(item.group(1))
            line = item.group(2)
        for name in re.findall(r"`([\w.]+)`", line):
            assert name not in found, f"{name} is listed twice in docs/design.md's layers"
            found[name] = number
    return found


def modules(package: Path = PACKAGE) -> dict[str, Path]:
    """Every module of the package by dotted name (a package by its ``__init__``)."""
    found = {}
    for path in sorted(package.rglob("*.py")):
        parts = list(path.relative_to(package.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The package's modules that ``name`` imports anywhere in its file."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()

    def nearest(dotted: str) -> str | None:
        while dotted and dotted not in known:
            dotted = dotted.rpartition(".")[0]
        return dotted or None

    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                source = ".".join([*base, *([node.module] if node.module else [])])
            else:
                source = node.module or ""
            # ``from pkg import module`` imports the module; ``from module import name`` the
            # module that defines it
            targets = [f"{source}.{alias.name}" if f"{source}.{alias.name}" in known
                       else source for alias in node.names]
        else:
            continue
        out.update(t for t in map(nearest, (t for t in targets if t.split(".")[0] ==
                                            "sparkdl")) if t)
    out.discard(name)
    return out


def part(module: str) -> str:
    """The top-level part a module belongs to: ``sparkdl.training.worker.loop`` → ``training``."""
    pieces = module.split(".")
    return pieces[1] if len(pieces) > 1 else "sparkdl"


def import_graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imports(name, path, known) for name, path in known.items()}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def against_layers(graph: dict[str, set[str]], order: dict[str, int]) -> list[str]:
    wrong = []
    for module, targets in sorted(graph.items()):
        for target in sorted(targets):
            here, there = part(module), part(target)
            if here != there and order[there] >= order[here]:
                wrong.append(f"{module} (layer {order[here]}) imports {target} "
                             f"(layer {order[there]})")
    return wrong


def test_every_part_of_the_package_has_a_layer_in_the_design() -> None:
    order = layers(DESIGN.read_text())
    parts = {part(m) for m in modules()}
    assert parts - set(order) == set(), "parts missing from docs/design.md's layers"
    assert set(order) - parts == set(), "layers in docs/design.md name no part of sparkdl"


def test_no_import_goes_against_the_layers() -> None:
    wrong = against_layers(import_graph(), layers(DESIGN.read_text()))
    assert not wrong, "\n".join(wrong)


def test_no_modules_import_each_other_around_a_circle() -> None:
    found = circles(import_graph())
    assert not found, "\n".join(" <-> ".join(c) for c in found)


def test_the_checks_find_an_import_up_the_layers_and_a_circle(tmp_path: Path) -> None:
    package = tmp_path / "sparkdl"
    (package / "low").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "low" / "__init__.py").write_text("")
    (package / "low" / "a.py").write_text("def f():\n    from sparkdl.high import g\n")
    (package / "low" / "b.py").write_text("from . import c\n")
    (package / "low" / "c.py").write_text("from typing import TYPE_CHECKING\n"
                                          "if TYPE_CHECKING:\n    from sparkdl.low.b import x\n")
    (package / "high.py").write_text("from sparkdl.low.a import f\n")
    known = modules(package)
    graph = {name: imports(name, path, known) for name, path in known.items()}
    order = layers("<!-- import layers: -->\n1. `sparkdl`\n2. `low`\n3. `high`\n"
                   "<!-- end of import layers -->")
    assert against_layers(graph, order) == [
        "sparkdl.low.a (layer 2) imports sparkdl.high (layer 3)"]
    assert circles(graph) == [["sparkdl.high", "sparkdl.low.a"],
                              ["sparkdl.low.b", "sparkdl.low.c"]]


@pytest.mark.parametrize("module", ["sparkdl.training.worker.loop", "sparkdl.session"])
def test_parts_are_subpackages_or_root_modules(module: str) -> None:
    assert part(module) == module.split(".")[1]
