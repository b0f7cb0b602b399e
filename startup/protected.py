"""The old safe executor's tools, which a ``run_python`` cell may not rebind. Stdlib only.

smolagents' LocalPythonExecutor, the old tool, held its tools (``print``, ``len``, ``range``… its
``BASE_PYTHON_TOOLS``) out of the code's reach and refused a cell that assigned to one ("Cannot assign to name
'print': doing this would erase the existing tool!"). Here they are CPython's builtins, which a cell could shadow
and so break every later ``print`` of the session. ``rebinding`` finds such a cell before it runs (the runtime's
AST transformer then makes it ``refused``: one raise at the offending line, nothing of it run); ``Kept`` undoes
at the cell's end what goes around the syntax. Both only for run_python's cells (``Runtime.rule``):
``execute_code`` runs Python as Python.
"""

from __future__ import annotations

import ast
import builtins
import math
from typing import Any

_MISSING = object()

# The names the old safe executor (smolagents' LocalPythonExecutor) held as its own tools (its BASE_PYTHON_TOOLS):
# a run_python cell there could not rebind them, and cannot here (tests/test_safe_executor.py compares the list).
PROTECTED = frozenset({
    "print", "isinstance", "range", "float", "int", "bool", "str", "set", "list", "dict", "tuple", "round", "ceil", "floor",
    "log", "exp", "sin", "cos", "tan", "asin", "acos", "atan", "atan2", "degrees", "radians", "pow", "sqrt", "len", "sum",
    "max", "min", "abs", "enumerate", "zip", "reversed", "sorted", "all", "any", "map", "filter", "ord", "chr", "next",
    "iter", "divmod", "callable", "getattr", "hasattr", "setattr", "issubclass", "type", "complex",
})
REFUSE = "_kernelexec_refuse"  # builtins (kernel_init): the error class a refused cell raises
STAR = "_kernelexec_star"  # builtins (kernel_init): around a star import, ``star_keeper``'s


class InterpreterError(ValueError):
    """The old executor's error, with its words, for a cell that would rebind one of its tools."""


def _bound_names(node: ast.AST) -> list[str]:
    """The names ``node`` binds in its scope: every store target (=, +=, annotated, for, with-as, :=, comprehension),
    a def's or class's name, an import's (``as``) name, ``global``/``nonlocal``, ``except … as``, a match capture."""
    if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
        return [node.id]
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [node.name]
    if isinstance(node, ast.Import):
        return [a.asname or a.name.split(".")[0] for a in node.names]
    if isinstance(node, ast.ImportFrom):
        return [a.asname or a.name for a in node.names]
    if isinstance(node, (ast.Global, ast.Nonlocal)):
        return list(node.names)
    if isinstance(node, ast.ExceptHandler) and node.name:
        return [node.name]
    name = getattr(node, "name", None) if type(node).__name__ in ("MatchAs", "MatchStar") else None
    rest = getattr(node, "rest", None) if type(node).__name__ == "MatchMapping" else None
    return [n for n in (name, rest) if isinstance(n, str)]


def rebinding(tree: ast.AST) -> tuple[ast.AST, str] | None:
    """The first place ``tree`` rebinds or deletes a protected name, anywhere in the cell (nested scopes too, as the
    old executor refused it wherever it ran), with the old executor's message; None when it does not."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Del) and node.id in PROTECTED:
            return node, f"Cannot delete name '{node.id}': name is not defined"
        for name in _bound_names(node):
            # the old executor let imports bind any name; here one that binds a builtin's name would erase it,
            # while ``from math import sqrt`` (no builtin of that name here) erases nothing
            if isinstance(node, (ast.Import, ast.ImportFrom)) and name not in ORIGINAL:
                continue
            if name in PROTECTED:
                return node, f"Cannot assign to name '{name}': doing this would erase the existing tool!"
    return None


def refused(tree: ast.Module, node: ast.AST, message: str) -> ast.Module:
    """The cell replaced by one ``raise`` of the old executor's error at the offending line: nothing of it runs."""
    call = ast.Call(func=ast.Name(id=REFUSE, ctx=ast.Load()), args=[ast.Constant(value=message)], keywords=[])
    raised = ast.Raise(exc=call, cause=None)
    line = getattr(node, "lineno", 1)
    for part in ast.walk(raised):
        part.lineno, part.end_lineno, part.col_offset, part.end_col_offset = line, line, 0, 0  # type: ignore[attr-defined]
    return ast.Module(body=[raised], type_ignores=tree.type_ignores)


def unstarred(tree: ast.Module) -> ast.Module:
    """Each ``from m import *`` of the cell (at its top level, or in the blocks there: nowhere else is it legal)
    wrapped in ``_kernelexec_star(False)`` / ``_kernelexec_star(True)`` (``star_keeper``): the import runs as written,
    then the names it bound over a protected builtin get that builtin back. A star import names nothing to refuse,
    and the old executor took it (``from math import *`` then ``floor(1.5)``); whatever else it binds stays."""

    def around(node: ast.stmt, after: bool) -> ast.stmt:
        call = ast.Call(func=ast.Name(id=STAR, ctx=ast.Load()), args=[ast.Constant(value=after)], keywords=[])
        placed = ast.If(test=ast.Constant(value=True), body=[ast.Expr(value=call)], orelse=[])  # displays nothing
        for part in ast.walk(placed):
            ast.copy_location(part, node)
        return placed

    def block(statements: list[ast.stmt]) -> list[ast.stmt]:
        out: list[ast.stmt] = []
        for node in statements:
            if isinstance(node, ast.ImportFrom) and any(a.name == "*" for a in node.names):
                out += [around(node, False), node, around(node, True)]
                continue
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                for field in ("body", "orelse", "finalbody"):
                    inner = getattr(node, field, None)
                    if isinstance(inner, list) and inner:
                        setattr(node, field, block(inner))
                for handler in getattr(node, "handlers", None) or []:
                    handler.body = block(handler.body)
                for case in getattr(node, "cases", None) or []:
                    case.body = block(case.body)
            out.append(node)
        return out

    tree.body = block(tree.body)
    return tree


def star_keeper(shell: Any) -> Any:
    """``_kernelexec_star``: ``(False)`` notes the protected builtins' names in the user namespace, ``(True)`` puts
    back those the star import between changed. A run_python cell's only; execute_code's cells are never rewritten."""
    noted: dict[str, Any] = {}

    def star(after: bool) -> None:
        ns = shell.user_ns
        if not after:
            noted.clear()
            noted.update({name: ns.get(name, _MISSING) for name in ORIGINAL})
            return
        Kept._put_back(ns, noted)

    return star


# the builtins themselves, as the kernel booted with them (this file loads before any cell runs)
ORIGINAL = {name: vars(builtins)[name] for name in PROTECTED if name in vars(builtins)}
# the old executor's tools that are no builtin: math's functions, which its code called without an import
# (``sqrt(16)``). A run_python cell's start gives them to the builtins (``Kept``), so a session that never runs one
# keeps Python's builtins as they are; an import of one (``from math import sqrt``, numpy's) stays allowed.
MATH_TOOLS = {name: getattr(math, name) for name in sorted(PROTECTED - set(ORIGINAL)) if hasattr(math, name)}
TOOLS = {**ORIGINAL, **MATH_TOOLS}


class Kept:
    """The protected builtins kept whole around a run_python cell (made in ``Runtime.pre_run_cell``, ended in
    ``post_run_cell``). A rebinding the AST check cannot see (``globals()['print'] = …``, ``exec``,
    ``builtins.print = …``) is undone at the cell's end, and the cell fails with the old executor's error. The
    builtins module is held to the kernel's boot (a thread's change between cells is undone when the next
    run_python cell starts); the user namespace to the cell's start (``execute_code`` may shadow a builtin). math's
    tools (``MATH_TOOLS``: ``sqrt``) are given to the builtins at the first run_python cell's start and held there
    too; in the user namespace only the AST check refuses rebinding them, as the old executor did (an import of one,
    numpy's ``sqrt`` say, binds it)."""

    def __init__(self, shell: Any) -> None:
        self.shell = shell
        self._put_back(vars(builtins), TOOLS)
        ns = shell.user_ns
        self.before = {name: ns.get(name, _MISSING) for name in ORIGINAL}

    @staticmethod
    def _put_back(space: dict[str, Any], was: dict[str, Any]) -> list[str]:
        """Each name of ``was`` given its value there again (or removed, where it had none); the names changed."""
        changed = []
        for name, old in was.items():
            if space.get(name, _MISSING) is not old:
                changed.append(name)
                if old is _MISSING:
                    space.pop(name, None)
                else:
                    space[name] = old
        return changed

    def end(self, outcome: Any) -> None:
        erased = self._put_back(self.shell.user_ns, self.before) + self._put_back(vars(builtins), TOOLS)
        if erased and outcome is not None and outcome.success:
            try:
                raise InterpreterError(f"Cannot assign to name '{erased[0]}': doing this would erase the existing tool!")
            except InterpreterError as exc:
                self.shell.showtraceback()
                outcome.error_in_exec = exc
