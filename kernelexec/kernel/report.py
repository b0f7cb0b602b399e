"""A cell's execute_reply read into its ``Execution``: the count, the error, and the runtime's report (its
``_kernelexec_report()`` user expression: the result, what the stream cap cut, what the cell cost), checked.

The kernel is untrusted: the result and what its stream cap cut are kept only in the shape the runtime
(startup/runtime.py) gives them, and a file they name only when the backend says the path is its spill
directory's. Pure logic, apart from the driver, so it is tested without a kernel.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any, Literal

from kernelexec.kernel.collector import strip_ansi
from kernelexec.kernel.execution import CellError, CellResult, Execution


def streams_cut(report: Any, spill_ok: Callable[[Any], bool]) -> dict[str, Any]:
    """The kernel's report of what its stream cap cut, kept only in the shape the runtime gives it
    (a file it names must pass ``spill_ok``)."""
    if not isinstance(report, dict):
        return {}
    kept: dict[str, Any] = {}
    for name in ("stdout", "stderr"):
        item = report.get(name)
        if isinstance(item, dict):
            path = item.get("file")
            ok = spill_ok(path)
            kept[name] = {**{k: v for k, v in item.items() if k != "file"}, **({"file": path} if ok else {})}
    return kept


def read_result(payload: dict[str, Any], spill_ok: Callable[[Any], bool]) -> CellResult | None:
    """The runtime's result report, if it has the runtime's shape (kind, format, text, file)."""
    text = payload.get("text")
    if payload.get("kind") == "none" or not isinstance(text, str):
        return None
    fmt: Literal["json", "text"] = "json" if payload.get("format") == "json" else "text"
    value: Any = None
    if fmt == "json":
        try:
            value = json.loads(text)  # decoded once, here; the answer uses the value
        except ValueError:
            fmt = "text"
    path = payload.get("file")
    return CellResult(text, fmt, path if path is not None and spill_ok(path) else None, value)


MAX_CPU_S = 1e9  # a measure past these is no measure (the kernel is untrusted): dropped
MAX_MEMORY = 1 << 50


def _measure(value: Any, limit: float) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or not 0 <= value <= limit:
        return None
    return value


def read_cost(report: Any, ex: Execution) -> None:
    """The runtime's measure of the cell (``cost``: ``cpu_s``, ``peak_rss``), kept only when each is a plausible number."""
    if not isinstance(report, dict):
        return
    cpu = _measure(report.get("cpu_s"), MAX_CPU_S)
    peak = _measure(report.get("peak_rss"), MAX_MEMORY)
    ex.cpu_seconds = None if cpu is None else round(float(cpu), 6)
    ex.peak_memory = None if peak is None else int(peak)


def take_reply(content: dict[str, Any], ex: Execution, spill_ok: Callable[[Any], bool]) -> None:
    """An execute_reply's content into ``ex``: the execution count, the error (when no IOPub error came first)
    and the runtime's report (``CellRun._finish``, kernel/cell.py)."""
    count = content.get("execution_count")
    if isinstance(count, int) and not isinstance(count, bool):
        ex.execution_count = count
    if content.get("status") == "error" and ex.error is None:
        traceback = content.get("traceback", [])
        ex.error = CellError(
            str(content.get("ename", "Error")), str(content.get("evalue", "")),
            [strip_ansi(t) for t in traceback if isinstance(t, str)] if isinstance(traceback, list) else [])
    expressions = content.get("user_expressions")
    report = expressions.get("report") if isinstance(expressions, dict) else None
    data = report.get("data") if isinstance(report, dict) and report.get("status") == "ok" else None
    payload = data.get("application/json") if isinstance(data, dict) else None
    if isinstance(payload, dict):
        ex.streams_cut = streams_cut(payload.pop("streams", None), spill_ok)
        read_cost(payload.pop("cost", None), ex)
        ex.result = read_result(payload, spill_ok)
