"""What a cell produced, as plain data: the kernel's side of a call.

``Execution`` is built once from the kernel's messages (driver.py, collector.py), appended once to the
session notebook (session/recording.py) and rendered once for MCP (server/render.py). The tools'
structured results are the MCP layer's (server/results.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

Ending = Literal["completed", "interrupted", "restarted", "kernel_died"]
# which value is a cell's result (startup/runtime.py): execute_code's rule or the old safe executor's (run_python)
ResultRule = Literal["variable", "statement"]


@dataclass(frozen=True)
class CellError:
    """The exception a cell raised (or kernelexec's stand-in for one), traceback without colour codes."""

    ename: str
    evalue: str
    traceback: list[str] = field(default_factory=list)

    def one_line(self) -> str:
        """"ZeroDivisionError: division by zero": the type and the first line of the message."""
        first = next(iter(self.evalue.strip().splitlines()), "")
        return f"{self.ename}: {first}" if first else self.ename

    def output(self) -> dict[str, Any]:
        """As an nbformat error output."""
        return {"output_type": "error", "ename": self.ename, "evalue": self.evalue, "traceback": list(self.traceback)}


@dataclass(frozen=True)
class CellResult:
    """The value of ``result`` or of the cell's last expression, as the kernel runtime reported it."""

    text: str  # JSON text when ``format`` is "json", else the repr (possibly cut by the kernel's cap)
    format: Literal["json", "text"] = "text"
    file: str | None = None  # the kernel's spill file with the whole text, when it cut it
    value: Any = None  # the decoded JSON when ``format`` is "json"


@dataclass
class Execution:
    """One cell's outcome, straight from the kernel. No MCP or file concerns here."""

    code: str
    stdout: str = ""
    stderr: str = ""
    outputs: list[dict[str, Any]] = field(default_factory=list)  # nbformat v4 output dicts, in order
    result: CellResult | None = None
    streams_cut: dict[str, Any] = field(default_factory=dict)  # what the kernel's stream cap cut
    stream_files: dict[str, str] = field(default_factory=dict)  # the server's spill file of a stream it capped
    notes: list[str] = field(default_factory=list)  # what the server did to the kernel's messages (caps, drops)
    inputs: list[dict[str, Any]] = field(default_factory=list)  # input()/getpass() asked and answered (a password as ***)
    tool_calls: list[dict[str, Any]] = field(default_factory=list)  # code mode: brokered MCP tool calls (broker.CellCalls)
    error: CellError | None = None
    execution_count: int | None = None
    duration_ms: float = 0.0
    ending: Ending = "completed"
    timed_out: bool = False
    cancelled: bool = False
    restart_reason: str | None = None
    started: float | None = None  # time.monotonic() when the kernel was asked to run it (a run's queue wait ends here)
    cpu_seconds: float | None = None  # the CPU seconds of this cell alone, as the kernel's runtime measured them
    peak_memory: int | None = None  # the kernel's peak resident memory so far, in bytes (its VmHWM)

    @property
    def success(self) -> bool:
        return self.error is None and self.ending == "completed"
