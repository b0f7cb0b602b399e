"""Rebuilding a session's state from its record: ``restart_session(replay=True)`` and reviving a
session after a server restart run the session's successful cells since its last plain restart
again, through the live ``Kernel.execute``. Below sessions (which call it) and notebook replay
(which redoes recorded restores with ``rerun``); it knows sessions only as a type.
"""

from __future__ import annotations

import ast
import json
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from pydantic import BaseModel, Field

from kernelexec.codemode.recorded_calls import RecordedCalls, catalog_from_records
from kernelexec.environment.packages import pip_lines
from kernelexec.errors import InvalidRequest
from kernelexec.lean_schema import LeanModel
from kernelexec.session.record_meta import read_cell_meta
from kernelexec.syntax import parse

if TYPE_CHECKING:
    from kernelexec.kernel.driver import Kernel
    from kernelexec.kernel.execution import Execution


class ReplayedCell(LeanModel):
    """One recorded cell run again to rebuild a session's state (restore, revival)."""

    cell: int = Field(description="Position of the cell in the session's notebook (1-based)")
    first_line: str = Field(description="First line of its code")
    ok: bool = Field(description="It ran without raising this time too")
    error: str | None = Field(None, description="What went wrong this time, when it did")
    for_names: list[str] = Field(default_factory=list, description="Restore: the variables it was run again for")


class RestoreReport(BaseModel):
    """How a replaced kernel got its variables back: loaded from the checkpoint (inside the kernel),
    recomputed by running only the recorded cells they depend on, or lost."""

    restored: list[str] = Field(default_factory=list, description="Variables loaded from the checkpoint")
    reran: list[ReplayedCell] = Field(default_factory=list, description="Recorded cells run again for what the checkpoint lacked")
    lost: list[str] = Field(default_factory=list, description="Variables neither loaded nor recomputed")
    why: dict[str, str] = Field(default_factory=dict, description="Why a variable was not loaded from the checkpoint")
    detail: str = Field("", description="The same in one line")


class WorkingDir(Protocol):
    """Where a session's kernel stands (``Session``): ``rerun`` moves it as the recorded cells did."""

    cwd: Path
    default_cwd: Path


_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda, ast.ListComp, ast.SetComp, ast.DictComp,
           ast.GeneratorExp)


def cell_names(source: str) -> dict[str, list[str]] | None:
    """The names a cell's top level may bind (``wrote``) and every name it reads (``read``), from its
    code's syntax (parsed, never run); None when it does not parse as Python (magics), or its tree is too deep to
    build (``1+1+…`` 100,000 times: RecursionError, MemoryError): the cell's record is written either way."""
    try:
        tree = parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    written, read = _names(tree)
    wrote = written - _deleted_for_good(tree)  # what it reads of its own making stays its own (read & written)
    return {"wrote": sorted(wrote), "read": sorted(read - written) + sorted(read & written)}


def _names(tree: ast.AST) -> tuple[set[str], set[str]]:
    """The names ``tree``'s top level may bind, and every name it reads."""
    wrote: set[str] = set()
    read: set[str] = set()
    todo: list[tuple[ast.AST, bool]] = [(tree, True)]
    while todo:
        node, top = todo.pop()
        if isinstance(node, ast.Name):
            if isinstance(node.ctx, ast.Load):
                read.add(node.id)
            elif top and isinstance(node.ctx, ast.Store):
                wrote.add(node.id)
        elif isinstance(node, ast.alias) and top:
            wrote.add((node.asname or node.name).partition(".")[0])
        elif isinstance(node, ast.Global):
            wrote.update(node.names)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and top:
            wrote.add(node.name)
        inner = top and not isinstance(node, _SCOPES)
        todo.extend((child, inner) for child in ast.iter_child_nodes(node))
    return wrote, read


def _deleted_for_good(tree: ast.Module) -> set[str]:
    """Names a top-level ``del`` removes with no top-level statement after it binding them again: gone once the
    cell ends (``del parts`` after building a frame from them), so a restore never runs the cell again for them."""
    gone: set[str] = set()
    bound_later: set[str] = set()
    for statement in reversed(tree.body):
        if isinstance(statement, ast.Delete):
            gone |= {t.id for t in statement.targets if isinstance(t, ast.Name)} - bound_later
        else:
            bound_later |= _names(statement)[0]
    return gone


def first_line(source: str, limit: int = 80) -> str:
    line = next((ln for ln in source.splitlines() if ln.strip()), "")
    return line if len(line) <= limit else line[: limit - 1] + "…"


def restorable(cells: Iterable[dict[str, Any]]) -> list[tuple[int, dict[str, Any]]]:
    """(1-based position, cell) of each successful code cell since the last plain restart.

    A plain ``restart_session`` is the user asking for a clean kernel, so state before it stays gone.
    A forced restart (timeout, kernel death), a restore or a revival does not reset the list: that
    state was lost, not dropped.
    """
    chosen: list[tuple[int, dict[str, Any]]] = []
    for number, cell in enumerate(cells, 1):
        meta = read_cell_meta(cell)
        if meta.event == "restart":
            chosen = []
        elif cell.get("cell_type") == "code" and meta.success:
            chosen.append((number, cell))
    return chosen


def cell_timeout(recorded: float | None, default: float, limit: float) -> float:
    """A recorded cell's timeout (``CellMeta.timeout``: a positive finite number or None), at most
    ``limit`` (--max-timeout); None gets ``default``. A notebook never lifts the user's limits."""
    return default if recorded is None else min(recorded, limit)


def _failure(ex: Execution) -> str | None:
    if ex.error is not None:
        return ex.error.one_line()
    if ex.ending != "completed":
        return ex.restart_reason or ex.ending
    return None


async def rerun(
    kernel: Kernel,
    cells: list[dict[str, Any]],
    *,
    default_timeout: float,
    max_timeout: float,
    grace: float,
    session: WorkingDir | None = None,
) -> list[ReplayedCell]:
    """Run ``restorable(cells)`` again in ``kernel``, each with its recorded timeout and (for a
    session) in its recorded working directory. Outputs are dropped; what ran is returned. Code mode: a cell's
    brokered tool calls are answered with its recorded results (no server is called again)."""
    return await _run_cells(kernel, restorable(cells), default_timeout=default_timeout, max_timeout=max_timeout,
                            grace=grace, session=session)


async def _run_cells(kernel: Kernel, chosen: list[tuple[int, dict[str, Any]]], *, default_timeout: float,
                     max_timeout: float, grace: float, session: WorkingDir | None,
                     reasons: dict[int, list[str]] | None = None) -> list[ReplayedCell]:
    done: list[ReplayedCell] = []
    records = [call for _, cell in chosen for call in read_cell_meta(cell).tool_calls]
    if records:
        catalog = catalog_from_records(records)
        await kernel.evaluate(f"_kernelexec_tools_catalog({catalog!r})")
        kernel.tools_catalog = catalog
    for number, cell in chosen:
        meta = read_cell_meta(cell)
        source = "".join(cell.get("source", ""))
        if session is not None and meta.cwd:
            cwd = Path(meta.cwd)
            if cwd != session.cwd and cwd.is_dir():
                await kernel.evaluate(f"_kernelexec_chdir({str(cwd)!r})")
                session.cwd = cwd
        try:  # pip lines: the session's overlay already has what they installed (replay installs again)
            _, runnable = pip_lines(source)
        except InvalidRequest:
            runnable = source
        served = RecordedCalls(list(meta.tool_calls)) if meta.tool_calls else None
        ex = await kernel.execute(runnable, timeout=cell_timeout(meta.timeout, default_timeout, max_timeout), grace=grace,
                                  tools=served.handle if served is not None else None)
        if session is not None and ex.ending in ("restarted", "kernel_died"):
            session.cwd = session.default_cwd
        done.append(ReplayedCell(cell=number, first_line=first_line(source), ok=ex.success, error=_failure(ex),
                                 for_names=(reasons or {}).get(number, [])))
    return done


def describe_replayed(replayed: list[ReplayedCell]) -> str:
    """One sentence for answers and notebook markers: which cells ran again, which failed."""
    if not replayed:
        return "no cells to replay"
    numbers = ", ".join(str(r.cell) for r in replayed)
    text = f"replayed {len(replayed)} cell{'s' if len(replayed) != 1 else ''} ({numbers})"
    failed = [r for r in replayed if not r.ok]
    if failed:
        text += "; failed this time: " + "; ".join(f"cell {r.cell}: {r.error}" for r in failed)
    return text


def recompute_plan(chosen: list[tuple[int, dict[str, Any]]], missing: Iterable[str],
                   present: set[str]) -> tuple[dict[int, list[str]], list[str]]:
    """Which of the ``chosen`` recorded cells to run again so the ``missing`` names exist again: for each,
    the last cell that bound it, then (before that cell) the last binders of what it reads and the kernel
    lacks, and so on. Returns {cell position: the names it runs for} and the names no cell binds (lost).
    A cell recorded without names (before this record kept them) is taken to bind and read anything."""
    metas = [(number, read_cell_meta(cell)) for number, cell in chosen]
    runs: dict[int, list[str]] = {}
    lost: list[str] = []
    todo: list[tuple[str, int | None, bool]] = [(name, None, True) for name in sorted(set(missing))]
    seen: set[tuple[str, int | None]] = set()
    while todo:
        name, before, asked = todo.pop(0)
        if (name, before) in seen:
            continue
        seen.add((name, before))
        writer = next(((n, m) for n, m in reversed(metas)
                       if (before is None or n < before) and (m.wrote is None or name in m.wrote)), None)
        if writer is None:
            if asked:
                lost.append(name)
            continue
        number, meta = writer
        runs.setdefault(number, [])
        if asked and name not in runs[number]:
            runs[number].append(name)
        for needed in meta.read if meta.wrote is not None else ():
            if needed not in present:
                todo.append((needed, number, False))  # a builtin or a name no cell binds: not lost, not asked
    return dict(sorted(runs.items())), sorted(set(lost))


def _report(answer: Any) -> tuple[list[str], dict[str, str]]:
    """The kernel's answer to ``_kernelexec_checkpoint_restore`` (untrusted): the names it loaded and,
    by name, why the others were not (identifiers only, texts cut short)."""
    if not isinstance(answer, dict):
        return [], {"*": f"the kernel did not restore its checkpoint: {str(answer)[:200]}"}
    restored = [n for n in answer.get("restored", []) if isinstance(n, str) and n.isidentifier()] \
        if isinstance(answer.get("restored"), list) else []
    why: dict[str, str] = {}
    for key in ("unsaved", "failed"):
        found = answer.get(key)
        if isinstance(found, dict):
            why.update({k: str(v)[:200] for k, v in found.items() if isinstance(k, str) and (k.isidentifier() or k == "*")})
    return restored[:10_000], dict(list(why.items())[:10_000])


async def checkpoint_restore(
    kernel: Kernel,
    cells: list[dict[str, Any]],
    *,
    default_timeout: float,
    max_timeout: float,
    grace: float,
    session: WorkingDir | None = None,
) -> RestoreReport:
    """Refill a new kernel: its checkpoint loaded inside it (``_kernelexec_checkpoint_restore``: the host
    never reads the checkpoint), then only the recorded cells (since the last plain restart) that bind what
    the checkpoint lacked, in their order, with checkpointing paused so they cannot overwrite it; names those
    cells rebound that the checkpoint had are loaded again after them."""
    timeout = max(60.0, default_timeout)
    restored, why = _report(await kernel.evaluate("_kernelexec_checkpoint_restore()", timeout=timeout))
    chosen = restorable(cells)
    present = set(restored)
    missing = {n for n in why if n != "*"} - present
    recorded = {n for _, cell in chosen for n in (read_cell_meta(cell).wrote or ())}
    missing |= recorded - present - {n for n in recorded if n.startswith("_")}
    if missing:
        names = await kernel.evaluate("_kernelexec_variables()")
        if isinstance(names, list):
            present |= {v["name"] for v in names if isinstance(v, dict) and isinstance(v.get("name"), str)}
        missing -= present
    runs, lost = recompute_plan(chosen, missing, present)
    if not restored and any(read_cell_meta(cell).wrote is None for _, cell in chosen):
        # no checkpoint, and a record from before cells kept the names they bind (a previous release's state
        # dir, or cells that did not parse): nothing tells what is missing, so every cell since the last plain
        # restart runs again, as revival always did
        runs, lost = {number: [] for number, _ in chosen}, []
    reran: list[ReplayedCell] = []
    if runs:
        await kernel.evaluate("_kernelexec_checkpoint_pause()")
        reran = await _run_cells(kernel, [(n, c) for n, c in chosen if n in runs], default_timeout=default_timeout,
                                 max_timeout=max_timeout, grace=grace, session=session, reasons=runs)
        clobbered = sorted({n for number, cell in chosen if number in runs
                            for n in (read_cell_meta(cell).wrote or restored)} & set(restored))
        if clobbered:
            await kernel.evaluate(f"_kernelexec_checkpoint_restore({json.dumps(clobbered)})", timeout=timeout)
        await kernel.evaluate("_kernelexec_checkpoint_resume()")
        lost += [n for r in reran if not r.ok for n in r.for_names]
    lost = sorted(set(lost))
    report = RestoreReport(restored=sorted(restored), reran=reran, lost=lost,
                           why={k: v for k, v in why.items() if k not in restored})
    report.detail = describe_restore(report)
    return report


def describe_restore(report: RestoreReport) -> str:
    """``restored df, model from the checkpoint; re-ran cell 3 for conn; lost: gen``."""
    parts = []
    if report.restored:
        parts.append(f"restored {', '.join(report.restored[:20])}{' …' if len(report.restored) > 20 else ''} from the checkpoint")
    for r in report.reran:
        line = f"re-ran cell {r.cell}" + (f" for {', '.join(r.for_names)}" if r.for_names else "")
        parts.append(line + ("" if r.ok else f" (failed: {r.error})"))
    if report.lost:
        parts.append("lost: " + ", ".join(f"{n} ({report.why[n]})" if n in report.why else n for n in report.lost))
    if "*" in report.why:
        parts.append(report.why["*"])
    return "; ".join(parts) if parts else "nothing to restore"
