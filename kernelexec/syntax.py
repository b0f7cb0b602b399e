"""Python source parsed in the server: every AST a kernelexec process builds, one at a time.

CPython 3.11 (3.11.7 here) keeps one AST-construction recursion counter per interpreter, so two threads building
ASTs at once can corrupt it, and ``ast.parse`` raises ``SystemError: AST constructor recursion depth mismatch``
(CPython gh-106905). The server parses in more than one thread: each cell's record (``Session.record``, in a
worker thread) reads the names its code binds, for every session at once, while the event loop reads a kernel's
literal answers. A CI run's red team hit it: two sessions' cells ended together, one tool call failed and its cell
went unrecorded. Every parse goes through ``parse`` or ``literal`` below, under one lock, which a parse holds
briefly (``x = 1``: 5 µs; a 200-function cell: 7 ms)."""

from __future__ import annotations

import ast
import threading
from typing import Any

_ONE_AT_A_TIME = threading.Lock()


def parse(source: str) -> ast.Module:
    """``ast.parse``, never beside another thread's."""
    with _ONE_AT_A_TIME:
        return ast.parse(source)


def literal(text: str) -> Any:
    """``ast.literal_eval`` of text (a kernel's repr: untrusted), its parse under the same lock. Anything but a
    literal is a ValueError or SyntaxError, one too deep to read too (``-`` 9,000 times: MemoryError in the parser),
    so that a caller's one ``except`` covers what a hostile kernel can send."""
    try:
        with _ONE_AT_A_TIME:
            tree = ast.parse(text.lstrip(" \t"), mode="eval")
        return ast.literal_eval(tree)
    except (RecursionError, MemoryError) as exc:
        raise ValueError(f"too deep to read ({type(exc).__name__})") from None
