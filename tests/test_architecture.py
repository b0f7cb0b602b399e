"""The floor plan holds: no import cycles in ``kernelexec/``, lazy imports included.

A lazy import inside a function hides a cycle from Python, not from the reader: it still ties two
modules into one knot. Imports under ``if TYPE_CHECKING:`` are for annotations only and are left out.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "kernelexec"


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(module: str, tree: ast.AST) -> set[str]:
    """The kernelexec modules ``module`` imports anywhere (module level or inside functions)."""
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.ImportFrom):
            if node.level:  # from . import x / from .x import y
                base = node.module or ""
                if base:
                    found.add(base.split(".")[0])
                else:
                    found.update(alias.name for alias in node.names)
            elif node.module and node.module.startswith("kernelexec."):
                found.add(node.module.split(".")[1])
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("kernelexec."):
                    found.add(alias.name.split(".")[1])
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    modules = {p.stem for p in PACKAGE.glob("*.py")}
    return {m for m in found if m in modules and m != module}


def import_graph() -> dict[str, set[str]]:
    return {p.stem: _imports(p.stem, ast.parse(p.read_text())) for p in sorted(PACKAGE.glob("*.py"))}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every elementary cycle's nodes, found by depth-first search (the graph is small)."""
    found: list[list[str]] = []
    seen: set[frozenset[str]] = set()

    def walk(path: list[str]) -> None:
        for nxt in sorted(graph.get(path[-1], ())):
            if nxt == path[0]:
                key = frozenset(path)
                if key not in seen:
                    seen.add(key)
                    found.append([*path, nxt])
            elif nxt not in path and nxt > path[0]:
                walk([*path, nxt])

    for start in sorted(graph):
        walk([start])
    return found


def test_the_package_has_no_import_cycles() -> None:
    found = cycles(import_graph())
    assert found == [], "import cycles: " + "; ".join(" -> ".join(c) for c in found)


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]
    assert _imports("x", ast.parse("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .kernel import K\n")) == set()
