"""Every AST the server builds is built one at a time (kernelexec/syntax.py): CPython 3.11 corrupts its AST
recursion counter when two threads build ASTs at once (gh-106905), which failed a red-team call in CI."""

from __future__ import annotations

import gc
import re
import sys
import threading
from pathlib import Path

from kernelexec import syntax
from kernelexec.session.restore import cell_names

PACKAGE = Path(__file__).resolve().parent.parent / "kernelexec"
SOURCE = "\n".join(f"def f{i}(a, b=[1, 2, {{'k': (3, 4)}}]):\n    return [x * {i} for x in a if x]" for i in range(200))


class _Finalized:
    """Garbage whose finalizer runs Python code: a collection inside one thread's AST build lets another thread in."""

    def __del__(self) -> None:
        sum(range(20))


def _parse_in_threads(parse: object, seconds: float) -> list[str]:
    errors: list[str] = []
    stop = threading.Event()

    def parser() -> None:
        try:
            while not stop.is_set():
                parse(SOURCE)  # type: ignore[operator]
        except SystemError as exc:
            errors.append(str(exc))
            stop.set()

    def litter() -> None:
        while not stop.is_set():
            a, b = _Finalized(), _Finalized()
            a.other, b.other = b, a  # type: ignore[attr-defined]

    interval, thresholds = sys.getswitchinterval(), gc.get_threshold()
    sys.setswitchinterval(1e-6)
    gc.set_threshold(50, 1, 1)
    threads = [threading.Thread(target=parser) for _ in range(3)] + [threading.Thread(target=litter)]
    try:
        for t in threads:
            t.start()
        stop.wait(seconds)
        stop.set()
        for t in threads:
            t.join(30)
    finally:
        sys.setswitchinterval(interval)
        gc.set_threshold(*thresholds)
    return errors


def test_cells_parsed_in_many_threads_at_once_never_fail() -> None:
    """Three threads parse a 200-function cell as each cell's record does (``cell_names``, in a worker thread),
    with the collector running finalizers in between. Without the lock this failed within a second on CPython 3.11.7
    (``SystemError: AST constructor recursion depth mismatch (before=15, after=9)``)."""
    assert _parse_in_threads(cell_names, 1.0) == []


def test_a_literal_answer_is_read_and_anything_else_refused() -> None:
    assert syntax.literal("'{\"rows\": []}'") == '{"rows": []}'
    for bad in ("__import__('os')", "f(1)", "[x for x in y]", "-" * 9000 + "1", "+".join(["1"] * 4000)):
        try:
            syntax.literal(bad)
        except ValueError:
            continue
        raise AssertionError(f"{bad!r} was evaluated")


def test_the_server_builds_no_ast_but_through_kernelexec_syntax() -> None:
    found = []
    for path in PACKAGE.rglob("*.py"):
        if path.name == "syntax.py":
            continue
        text = path.read_text(encoding="utf-8")
        if re.search(r"\bast\.(parse|literal_eval)\(|PyCF_ONLY_AST|\bcompile\([^)]*ast\.", text):
            found.append(str(path.relative_to(PACKAGE)))
    assert found == [], found
