"""Rebuilding a session's state from its record: ``restart_session(replay=True)`` and reviving a
session after a server restart run the session's successful cells since its last plain restart
again, through the live ``Kernel.execute``. Below sessions (which call it) and notebook replay
(which redoes recorded restores with ``rerun``); it knows sessions only as a type.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from pydantic import BaseModel, Field

from kernelexec.codemode.recorded_calls import RecordedCalls, catalog_from_records
from kernelexec.environment.packages import pip_lines
from kernelexec.errors import InvalidRequest
from kernelexec.session.record_meta import read_cell_meta

if TYPE_CHECKING:
    from kernelexec.kernel.driver import Kernel
    from kernelexec.kernel.execution import Execution


class ReplayedCell(BaseModel):
    """One recorded cell run again to rebuild a session's state (restore, revival)."""

    cell: int = Field(description="Position of the cell in the session's notebook (1-based)")
    first_line: str = Field(description="First line of its code")
    ok: bool = Field(description="It ran without raising this time too")
    error: str | None = Field(None, description="What went wrong this time, when it did")


class WorkingDir(Protocol):
    """Where a session's kernel stands (``Session``): ``rerun`` moves it as the recorded cells did."""

    cwd: Path
    default_cwd: Path


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
    done: list[ReplayedCell] = []
    chosen = restorable(cells)
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
        done.append(ReplayedCell(cell=number, first_line=first_line(source), ok=ex.success, error=_failure(ex)))
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
