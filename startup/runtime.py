"""Result capture and the per-cell output cap, inside the kernel. Stdlib only.

The server asks for the last cell's result through ``user_expressions``
(``_kernelexec_report()``), so nothing extra travels on IOPub or lands in the notebook.

Two result rules. ``execute_code``'s: a variable named ``result`` the cell bound, else the last
expression. ``run_python``'s (the old safe executor's, asked for in the request's metadata,
``kernelexec_result: "statement"``): the value of the cell's last statement, computed by the cell
itself: an AST transform (``LastStatement``) makes the last statement hand its value to
``_kernelexec_note`` as it runs.
"""

from __future__ import annotations

import ast
import collections
import copy
import json
import os
import resource
import sys
import threading
import time
import types
from typing import Any

_MISSING = object()
NOTE = "_kernelexec_note"  # builtins (kernel_init): what the transformed last statement calls
IF = "_kernelexec_if"


def _call(name: str, *args: ast.expr) -> ast.expr:
    return ast.Call(func=ast.Name(id=name, ctx=ast.Load()), args=list(args), keywords=[])


def _level(level: int) -> ast.expr:
    return ast.Constant(value=level)


def _as_load(target: ast.expr) -> ast.expr:
    """A store target (``x``, ``a.b``, ``d[k]``) as an expression reading it again."""
    expr = copy.deepcopy(target)
    for node in ast.walk(expr):
        if hasattr(node, "ctx"):
            node.ctx = ast.Load()
    return expr


def _placed(stmt: ast.stmt, call: ast.expr) -> ast.stmt:
    """``if True: <call>`` at ``stmt``'s place: a statement IPython does not display (a trailing bare
    expression would become the cell's Out)."""
    placed = ast.If(test=ast.Constant(value=True), body=[ast.Expr(value=call)], orelse=[])
    for node in ast.walk(placed):
        ast.copy_location(node, stmt)
    return placed


def _noted(stmt: ast.stmt, level: int = 0) -> list[ast.stmt]:
    """``stmt`` rewritten to note the value the old executor gave it, at ``level``: an expression's
    value, an assignment's right-hand side, an augmented assignment's new value, a ``def``'s or
    ``class``'s object; for ``if`` and ``for``, the last non-None value a statement inside gave.
    ``while``, ``with``, ``try``, ``import``, ``pass``, ``del`` give None.

    As in the old executor, an ``if`` hands its value on only when its branch runs to the end: the
    values of a branch left by ``break`` or ``continue`` are dropped (each ``if`` notes at the next
    level, opened before it and closed at the end of each branch); a ``for`` keeps what its own body
    gave before a ``break``."""
    if isinstance(stmt, (ast.Expr, ast.Assign)) or isinstance(stmt, ast.AnnAssign) and stmt.value is not None:
        stmt.value = ast.copy_location(_call(NOTE, stmt.value, _level(level)), stmt.value)  # type: ignore[arg-type]
    elif isinstance(stmt, ast.AugAssign):
        return [stmt, _placed(stmt, _call(NOTE, _as_load(stmt.target), _level(level)))]
    elif isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [stmt, _placed(stmt, _call(NOTE, ast.Name(id=stmt.name, ctx=ast.Load()), _level(level)))]
    elif isinstance(stmt, ast.If):
        inner = level + 1
        for branch in ("body", "orelse"):
            statements = getattr(stmt, branch)
            if statements:
                done = _placed(statements[-1], _call(IF, _level(inner), ast.Constant(value=True)))
                setattr(stmt, branch, [n for s in statements for n in _noted(s, inner)] + [done])
        return [_placed(stmt, _call(IF, _level(inner), ast.Constant(value=False))), stmt]
    elif isinstance(stmt, (ast.For, ast.AsyncFor)):
        stmt.body = [n for s in stmt.body for n in _noted(s, level)]
        stmt.orelse = [n for s in stmt.orelse for n in _noted(s, level)]
    return [stmt]



def _numpy_scalar(value: Any) -> Any:
    """A numpy scalar as the Python number or bool it holds (``df.b.sum()`` is an ``np.int64``, which JSON does
    not know, though ``np.float64`` is a float): ``json.dumps``'s ``default``, without importing numpy. Anything else
    is not JSON (TypeError): the answer gives its repr."""
    if any(c.__name__ == "generic" and c.__module__ == "numpy" for c in type(value).__mro__):
        return value.item()  # a datetime64's or a complex's item is not JSON either: default is asked again, refuses
    raise TypeError(f"{type(value).__qualname__} is not JSON serializable")


def _as_old_server(value: Any) -> Any:
    """``json.dumps``'s ``default`` for run_python's results: what the old safe executor's server answered for a
    value JSON does not know (its SDK's JSON with ``fallback=str``): a set, frozenset or deque as the array of its
    items (in iteration order), a date, datetime or time in ISO 8601, a numpy scalar as its number
    (``_numpy_scalar``), anything else as its ``str()`` (a class's own ``__str__``; for most objects the same text as
    their repr), each in place inside lists and dicts. Only the built-in types themselves are taken apart (a subclass's
    own ``__iter__`` or ``isoformat`` could run forever or raise); whatever a value's own code raises, ``SystemExit``
    included, is a TypeError here, so the caller falls back to the repr."""
    try:
        if type(value) in (set, frozenset, collections.deque):
            return list(value)
        if type(value).__module__ == "datetime" and type(value).__name__ in ("date", "datetime", "time"):
            return value.isoformat()  # the SDK's ISO 8601: 2024-01-02T03:04:05, where str() puts a space
        try:
            return _numpy_scalar(value)
        except TypeError:
            pass
        text = str(value)
    except (Exception, SystemExit) as exc:  # a value's own code: never the kernel's end
        raise TypeError(f"{type(value).__qualname__} could not be reported") from exc
    if not isinstance(text, str):
        raise TypeError(f"str() of {type(value).__qualname__} gave no text")
    return text


class LastStatement:
    """An IPython AST transformer (``shell.ast_transformers``): in a cell that asked for the
    statement rule, the last top-level statement notes its value (``_noted``), and a cell that rebinds
    one of the old executor's tools is refused whole (``rebinding``). Other cells, and everything before
    the last statement, run untouched. Never raises (IPython would drop it)."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime

    def visit(self, node: Any) -> Any:
        if self.runtime.rule != "statement" or not isinstance(node, ast.Module) or not node.body:
            return node
        protected = self.runtime.protected
        found = protected.rebinding(node) if protected is not None else None
        if found is not None:
            return protected.refused(node, *found)
        try:
            node.body[-1:] = _noted(copy.deepcopy(node.body[-1]))
        except Exception:  # noqa: BLE001 - the cell runs as written; its result is then None
            pass
        if protected is not None:
            try:
                node = protected.unstarred(node)
            except Exception:  # noqa: BLE001 - the cell runs as written (a star import over a tool then fails it)
                pass
        return node


def _binds_result(cell: str) -> bool:
    """True when the cell's top level stores to the name ``result`` (=, +=, for, with, :=, import as)."""
    try:
        tree = ast.parse(cell)
    except SyntaxError:
        return False
    scopes = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)
    todo: list[ast.AST] = [tree]
    while todo:
        node = todo.pop()
        if isinstance(node, ast.Name) and node.id == "result" and isinstance(node.ctx, ast.Store):
            return True
        if isinstance(node, ast.alias) and (node.asname or node.name) == "result":
            return True
        if isinstance(node, ast.Global) and "result" in node.names:
            return True
        if isinstance(node, scopes):
            # a nested scope binds its own locals, unless it declares `global result` (found above)
            todo.extend(n for n in ast.walk(node) if isinstance(n, ast.Global))
            continue
        todo.extend(ast.iter_child_nodes(node))
    return False


HERE = os.path.dirname(os.path.abspath(__file__)) + os.sep  # the startup directory: kernelexec's own code


def _without_own_frames(tb: types.TracebackType | None) -> types.TracebackType | None:
    """``tb`` (a new chain; the old one is left as it was) without the frames of kernelexec's startup
    code (the guard's import and file checks, the runtime), so an error points at the user's line."""
    kept = []
    while tb is not None:
        if not tb.tb_frame.f_code.co_filename.startswith(HERE):
            kept.append(tb)
        tb = tb.tb_next
    chain = None
    for entry in reversed(kept):
        chain = types.TracebackType(chain, entry.tb_frame, entry.tb_lasti, entry.tb_lineno)
    return chain


def hide_own_frames(formatter: Any) -> None:
    """Make IPython's traceback formatter (``shell.InteractiveTB``) leave out kernelexec's frames, in the
    exception shown and in those chained to it. IPython's ``__tracebackhide__`` would still show the
    innermost frame, which is the guard's own for a refused import."""
    real = formatter.structured_traceback

    def structured_traceback(etype: Any, evalue: Any, etb: Any = None, *args: Any, **kwargs: Any) -> Any:
        try:
            etb = _without_own_frames(etb)
            seen = {id(evalue)}
            chained = [evalue.__cause__, evalue.__context__] if isinstance(evalue, BaseException) else []
            while chained and len(seen) < 100:
                exc = chained.pop()
                if isinstance(exc, BaseException) and id(exc) not in seen:
                    seen.add(id(exc))
                    exc.__traceback__ = _without_own_frames(exc.__traceback__)
                    chained += [exc.__cause__, exc.__context__]
        except Exception:  # noqa: BLE001 - never lose a traceback over this
            pass
        return real(etype, evalue, etb, *args, **kwargs)

    formatter.structured_traceback = structured_traceback


def _cpu_seconds() -> float:
    """CPU seconds (user + system) of this process's threads and of the children it has waited for."""
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + children.ru_utime + children.ru_stime


class _Report:
    """What ``user_expressions`` returns: its JSON mime bundle is the whole answer. Its ``text/plain`` (IPython
    formats every user expression as text too) is a short name, not the payload again: the server reads only the
    JSON, and a second copy would be encoded, sent and decoded on every cell (up to the result cap twice)."""

    def __init__(self, payload: dict[str, Any]) -> None:
        self._payload = payload

    def _repr_json_(self) -> dict[str, Any]:
        return self._payload

    def __repr__(self) -> str:
        return "<kernelexec report: see application/json>"

    def bundle(self) -> dict[str, Any]:
        return {"text/plain": repr(self), "application/json": self._payload}


def format_reports_directly(formatter: Any) -> None:
    """IPython's display formatter answers a report as its JSON bundle at once. Asked as a user expression after
    every cell, a report went through all eleven of IPython's formatters (each a type lookup along the MRO, its
    deferred printers, the pretty printer for text/plain): ~0.3 ms of the kernel's time per cell, for a bundle
    that is its JSON. Any other object is formatted as before."""
    real = formatter.format

    def format(obj: Any, include: Any = None, exclude: Any = None) -> Any:
        if type(obj) is _Report:
            return obj.bundle(), {}
        return real(obj, include, exclude)

    formatter.format = format


class Runtime:
    """Per-kernel state: the last cell's result and the stream budget."""

    def __init__(self, shell: Any, policy: dict[str, Any], bypass: Any) -> None:
        self.shell = shell
        self.protected: Any = None  # startup/protected.py (``keep_tools``): the old executor's tools, kept by run_python's cells
        self.bypass = bypass
        self.spill_dir: str = policy["spill_dir"]
        self.result_cap: int = int(policy.get("result_cap", 8_000_000))
        self.stream_cap: int = int(policy.get("stream_cap", 1_000_000))
        self.disk_cap: int = int(policy.get("disk_cap", 64_000_000))
        self.last: dict[str, Any] = {"kind": "none"}
        self.rule = "variable"  # this cell's result rule: "variable" (execute_code) or "statement" (run_python)
        self.transformer = LastStatement(self)
        self._levels: dict[int, Any] = {}  # level -> the last non-None value noted there (0: the cell)
        self._before: Any = _MISSING
        self._kept: Any = None  # a run_python cell's protected names, as they were at its start (protected.Kept)
        self._lock = threading.Lock()
        self._streams: dict[str, dict[str, Any]] = {}
        self._cell = 0
        self._cpu_before: float | None = None  # this process's and its waited-for children's CPU seconds at the cell's start
        self.cost: dict[str, Any] = {}  # the last cell's: cpu_s (that cell alone), peak_rss (the kernel's peak so far)

    # --- result ------------------------------------------------------------------------
    def pre_run_cell(self, info: Any) -> None:
        self._cell += 1
        self.cost = {}
        self._cpu_before = _cpu_seconds()
        self._before = self.shell.user_ns.get("result", _MISSING)
        self.rule = self._asked_rule()
        self._kept = self.protected.Kept(self.shell) if self.rule == "statement" and self.protected is not None else None
        self._levels = {}
        with self._lock:
            self._streams = {}

    def keep_tools(self, protected: Any) -> None:
        """From now on, run_python's cells keep the old executor's tools (startup/protected.py, loaded by the boot)."""
        self.protected = protected

    def _asked_rule(self) -> str:
        """The rule the execute request asked for in its metadata (``kernelexec_result``)."""
        try:
            parent = self.shell.kernel.get_parent("shell")
            asked = parent["metadata"].get("kernelexec_result")
        except Exception:  # noqa: BLE001 - no kernel (tests), no metadata: the default rule
            return "variable"
        return "statement" if asked == "statement" else "variable"

    def note(self, value: Any, level: int = 0) -> Any:
        """Called by the transformed last statement (``LastStatement``) with each value it gives."""
        if value is not None:
            self._levels[level] = value
        return value

    def note_if(self, level: int, done: bool) -> None:
        """An ``if`` of the last statement: opening its level, or (its branch ran to the end) handing
        its value, if any, to the level around it."""
        if not done:
            self._levels[level] = None
        elif self._levels.get(level) is not None:
            self._levels[level - 1] = self._levels[level]

    def post_run_cell(self, outcome: Any) -> None:
        if self._kept is not None:
            self._kept.end(outcome)
            self._kept = None
        ns = self.shell.user_ns
        cell = getattr(outcome.info, "raw_cell", "") or ""
        value: Any = _MISSING
        if self.rule == "statement":
            value, kind = self._levels.get(0), "statement"
            self._levels = {}
            self.rule = "variable"
        elif "result" in ns and (ns["result"] is not self._before or _binds_result(cell)):
            value, kind = ns["result"], "variable"
        elif outcome.result is not None:
            value, kind = outcome.result, "expression"
        self.last = {"kind": "none"} if value is _MISSING else self._encode(value, kind)
        self._finish_streams()
        self._measure()
        # IPython tees every stdout/stderr write into history_manager.outputs and never prunes it
        # (history disabled or not): a long session would pin everything it ever printed
        clear = getattr(getattr(getattr(self.shell, "history_manager", None), "outputs", None), "clear", None)
        if callable(clear):
            clear()

    def _measure(self) -> None:
        """What the cell cost: CPU seconds between its pre- and post-run hooks (every thread of the kernel and the
        children it waited for), and the kernel's peak resident memory so far (ru_maxrss: /proc's VmHWM)."""
        try:
            cost: dict[str, Any] = {}
            if self._cpu_before is not None:
                cost["cpu_s"] = round(max(_cpu_seconds() - self._cpu_before, 0.0), 6)
            peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
            cost["peak_rss"] = int(peak if sys.platform == "darwin" else peak * 1024)  # Linux counts KiB, macOS bytes
            self.cost = cost
        except Exception:  # noqa: BLE001 - a measure never breaks the cell's answer
            self.cost = {}
        self._cpu_before = None

    def _encode(self, value: Any, kind: str) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": kind, "type": type(value).__qualname__}
        try:
            text = json.dumps(value, allow_nan=False, default=_as_old_server if kind == "statement" else _numpy_scalar)
            out["format"] = "json"
        except (Exception, SystemExit):  # no JSON (a value's own code may raise anything, SystemExit too): its repr
            try:
                text = repr(value)
            except (Exception, SystemExit) as exc:  # a broken __repr__ must not break the answer, nor end the kernel
                text = f"<unrepresentable {type(value).__qualname__}: {exc!r}>"
            out["format"] = "repr"
        if len(text) > self.result_cap:
            out["file"] = self._spill(f"result-{self._cell}.{'json' if out['format'] == 'json' else 'txt'}", text)
            out["total_chars"] = len(text)
            text = text[: self.result_cap]
            out["format"] = "repr"  # a cut JSON text is no longer JSON
        out["text"] = text
        return out

    def report(self) -> _Report:
        return _Report({**self.last, "streams": self._stream_report(), "cost": self.cost})

    def _spill(self, name: str, text: str) -> str:
        path = os.path.join(self.spill_dir, name)
        with self.bypass():
            os.makedirs(self.spill_dir, exist_ok=True)
            with open(path, "w", encoding="utf-8", errors="replace") as fh:
                fh.write(text)
        return path

    def variables(self) -> _Report:
        """The user's variables for ``list_variables``: name, type, bounded repr, shape/length."""
        import reprlib
        import types

        short = reprlib.Repr()
        short.maxstring = short.maxother = 120
        hidden = self.shell.user_ns_hidden
        out = []
        for name, value in list(self.shell.user_ns.items()):
            if name.startswith("_") or name in hidden or isinstance(value, types.ModuleType):
                continue
            kind = type(value)
            entry: dict[str, Any] = {"name": name, "type": f"{kind.__module__}.{kind.__qualname__}".removeprefix("builtins.")}
            try:
                entry["repr"] = short.repr(value)[:200]
            except Exception as exc:
                entry["repr"] = f"<repr failed: {exc!r}>"[:200]
            shape = getattr(value, "shape", None)
            if isinstance(shape, tuple) and all(isinstance(n, int) for n in shape):
                entry["shape"] = list(shape)
            if not isinstance(value, type):
                try:
                    entry["length"] = len(value)
                except Exception:
                    pass
            out.append(entry)
        return _Report(out)  # type: ignore[arg-type]

    # --- stream cap ------------------------------------------------------------------------
    def cap_stream(self, stream: Any) -> None:
        """Wrap ``stream.write`` so one cell forwards at most ``stream_cap`` characters over ZMQ.

        Beyond the cap the text goes to a file (up to ``disk_cap``), and the cell ends with one
        note naming the file. The fd watcher thread calls the same ``write``, so raw fd writes count too.
        """
        real_write = stream.write
        name = stream.name

        def write(text: str) -> int | None:
            with self._lock:
                state = self._streams.setdefault(name, {"sent": 0, "total": 0, "head": [], "fh": None, "file": None})
                n = len(text)
                state["total"] += n
                room = self.stream_cap - state["sent"]
                if room >= n and state["fh"] is None:
                    state["sent"] += n
                    state["head"].append(text)
                    forward = text
                else:
                    forward = text[: max(room, 0)]
                    state["sent"] += len(forward)
                    self._to_file(name, state, text)
            if forward:
                return real_write(forward)
            return n

        stream.write = write

    def _to_file(self, name: str, state: dict[str, Any], text: str) -> None:
        """Keep what the cap cut in a file; a full disk or the file-size limit ends the copy, never the cell."""
        try:
            if state["fh"] is None and not state.get("disk_error"):
                path = os.path.join(self.spill_dir, f"{name}-{self._cell}.txt")
                state["file"] = path
                state["written"] = 0
                with self.bypass():
                    os.makedirs(self.spill_dir, exist_ok=True)
                    state["fh"] = open(path, "w", encoding="utf-8", errors="replace")  # noqa: SIM115
                head, state["head"] = state["head"], []
                for chunk in head:
                    self._write_capped(state, chunk)
            self._write_capped(state, text)
        except OSError as exc:
            state["disk_error"] = str(exc)
            state["written"] = state.get("written", 0)
            state["fh"] = None  # stop copying for the rest of this cell

    def _write_capped(self, state: dict[str, Any], text: str) -> None:
        room = self.disk_cap - state["written"]
        if room > 0 and state["fh"]:
            with self.bypass():
                state["fh"].write(text[:room])
                state["fh"].flush()
            state["written"] += min(room, len(text))

    def _finish_streams(self) -> None:
        with self._lock:
            streams = dict(self._streams)
        for name, state in streams.items():
            fh = state.get("fh")
            if not state.get("file"):
                continue
            if fh:
                try:
                    fh.close()
                except OSError:
                    pass
            state["fh"] = False
            note = (
                f"\n[kernelexec: {name} cut after {state['sent']:,} of {state['total']:,} characters; "
                f"{state['written']:,} kept in {state['file']}"
                + (f" (copy stopped: {state['disk_error']})" if state.get("disk_error") else "")
                + "]\n"
            )
            stream = getattr(sys, name, None)
            if stream is not None:
                stream.flush()
                # bypass the cap for our own note
                type(stream).write(stream, note)
                stream.flush()

    def _stream_report(self) -> dict[str, Any]:
        with self._lock:
            return {
                name: {"total": s["total"], "sent": s["sent"], "file": s["file"], "kept": s.get("written", s["total"])}
                for name, s in self._streams.items()
                if s["file"]
            }
