"""The tools' structured results: pydantic models whose JSON schemas are the tools' output schemas
(execute_code's ``ExecuteResult``, run_python's ``{result, logs}``, sessions, variables, installs).

Every one is a ``LeanModel`` (lean_schema.py): the SDK's client validates every answer against its schema,
and every tools/list carries it.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from kernelexec.lean_schema import LeanModel
from kernelexec.session.restore import ReplayedCell, RestoreReport


class Rerun(LeanModel):
    cell: int = Field(description="Notebook cell (1-based)")
    for_names: list[str] = Field(default_factory=list, description="What it was run again for")


class Restored(LeanModel):
    """How a replaced kernel got its variables back (session/restore.RestoreReport, as answers say it)."""

    restored: list[str] = Field(default_factory=list, description="Loaded from the checkpoint")
    reran: list[Rerun] = Field(default_factory=list, description="Cells run again for the rest")
    lost: list[str] = Field(default_factory=list, description="Neither loaded nor recomputed")
    why: dict[str, str] = Field(default_factory=dict, description="Why a variable was not loaded from the checkpoint")
    detail: str = Field("", description="The same in one line")

    @classmethod
    def of(cls, report: RestoreReport | None) -> Restored | None:
        if report is None:
            return None
        return cls(restored=report.restored, reran=[Rerun(cell=c.cell, for_names=c.for_names) for c in report.reran], lost=report.lost, why=report.why,
                   detail=report.detail)


RunEnding = Literal["completed", "interrupted", "restarted", "kernel_died", "running", "awaiting_input"]


class OutputRef(LeanModel):
    """A rich output kept as a file: what it is, how big, and where to get all of it."""

    mime_type: str = Field(description="MIME type, e.g. image/png, image/svg+xml, text/html")
    size: int = Field(description="Size in bytes")
    path: str = Field(description="File holding the full item")
    uri: str = Field(description="MCP resource URI for the same file")


#: Any JSON value, as ``anyOf`` rather than a ``type`` array: some clients (Gemini-style function
#: declarations) accept only one type per schema, and the MCP Inspector's --strict flags the array.
ANY_JSON: dict[str, Any] = {"anyOf": [{"type": t} for t in ("string", "number", "boolean", "object", "array", "null")]}


class EnvironmentInfo(LeanModel):
    """The Python a kernel runs in, and why that one (environments.py)."""

    python: str = Field(description="The interpreter the kernel was started with")
    version: str = Field(description="Its Python version, e.g. 3.12.1")
    source: str = Field(description="Where the choice came from: flag (--python), project .venv, VIRTUAL_ENV, conda, or own (kernelexec's)")
    prefix: str | None = Field(None, description="The environment's prefix (sys.prefix); read-only to the kernel")
    ipykernel: str | None = Field(None, description="Whose ipykernel: the environment's own, or kernelexec's overlay (the environment is never modified)")


class ExecuteResult(LeanModel):
    """The structured answer of execute_code (the old plugin's fields, extended)."""

    success: bool = Field(description="True when the code ran to the end without raising")
    result: Any = Field(
        None,
        description="Value of `result` if the code bound it, else of the last expression: JSON when possible, else its repr",
        json_schema_extra=ANY_JSON,
    )
    stdout: str = Field("", description="Standard output (cut head+tail when long; see stdout_file)")
    stderr: str = Field("", description="Standard error (cut head+tail when long; see stderr_file)")
    result_file: str | None = Field(None, description="File with the whole result when it was too long to return")
    error: str | None = Field(None, description='One line, e.g. "ZeroDivisionError: division by zero"')
    error_type: str | None = Field(None, description="Exception class name")
    traceback: list[str] = Field(default_factory=list, description="Traceback lines, no colour codes")
    session: str = Field(description="Session handle this ran in; pass it back to keep state")
    execution_count: int | None = Field(None, description="The cell number in this session's kernel")
    outputs: list[OutputRef] = Field(default_factory=list, description="Rich outputs (images, HTML, ...) kept as files")
    duration_ms: float = Field(0.0, description="Wall time of the call in milliseconds")
    cpu_seconds: float | None = Field(None, description="CPU seconds this cell alone used in the kernel (all its threads and "
                                      "the child processes it waited for); None when the kernel did not report it")
    peak_memory_mb: float | None = Field(None, description="The kernel's peak resident memory so far, in MiB (its VmHWM); "
                                         "None when the kernel did not report it")
    stdout_file: str | None = Field(None, description="Full stdout when it was cut")
    stderr_file: str | None = Field(None, description="Full stderr when it was cut")
    timed_out: bool = Field(False, description="The call hit its timeout")
    ending: RunEnding = Field("completed", description="completed, interrupted (SIGINT stopped it), restarted (the kernel was "
                              "restarted; state lost), kernel_died, running (a background run still going), or awaiting_input "
                              "(the code waits in input(): answer with send_input; a getpass() is never answered this way)")
    run_id: str | None = Field(None, description="Background run id (execute_code with background=true); poll it with get_run")
    restart_reason: str | None = Field(None, description="Why the kernel was restarted, when it was")
    input_prompt: str | None = Field(None, description="awaiting_input: the prompt of the code's input() (the code's words)")
    input_password: bool | None = Field(None, description="awaiting_input: always false: a getpass() (a secret) is typed "
                                          "by the user on its own page, never sent with send_input")
    question_id: str | None = Field(None, description="awaiting_input: the question's single-use id; send_input names it to answer")
    notebook: str | None = Field(None, description="Path of this session's notebook record")
    profile: str = Field(description="Policy profile in force")
    layers: list[str] = Field(default_factory=list, description="Isolation layers around this kernel "
                              "(env, rlimits, landlock, seccomp, bubblewrap, netns, cgroup, guard)")
    environment: EnvironmentInfo | None = Field(None, description="The Python environment this ran in (None: a remote backend's own)")
    restored: Restored | None = Field(None, description="The session's kernel had been replaced (a death, a timeout's "
                                           "restart, a revival): which variables came back from the checkpoint, which "
                                           "cells ran again for the rest, what was lost")
    notes: list[str] = Field(default_factory=list, description="What the server did to this cell's output "
                             "(caps it applied, malformed kernel messages it dropped)")


class RunPythonResult(LeanModel):
    """The old safe executor's answer."""

    result: Any = Field(
        None, description="Value of `result` or of the last expression",
        json_schema_extra=ANY_JSON,
    )
    logs: str = Field("", description="Everything printed (stdout then stderr)")


class Variable(LeanModel):
    name: str
    type: str
    repr: str = Field(description="Bounded repr")
    shape: list[int] | None = None
    length: int | None = None


class VariablesResult(LeanModel):
    session: str
    variables: list[Variable]


class SessionInfo(LeanModel):
    session: str
    status: str = Field(description="What happened: created, restarted, closed")
    profile: str
    working_dir: str
    notebook: str | None = None
    detail: str | None = None
    replayed: list[ReplayedCell] = Field(default_factory=list, description="Cells run again to rebuild state (restart_session with replay)")
    restored: Restored | None = Field(None, description="restart_session with restore: variables loaded from the "
                                           "checkpoint, cells run again for the rest, what was lost")
    forked_from: str | None = Field(None, description="fork_session: the session this one was forked from")


class InstalledPackage(LeanModel):
    name: str
    version: str
    size: int = Field(description="Bytes it takes in the session's overlay")


class InstallResult(LeanModel):
    """The answer of install_packages."""

    session: str
    installed: list[InstalledPackage] = Field(description="What was installed (dependencies included)")
    duration_ms: float = Field(description="How long the install took")
    index: str = Field(description="Where the wheels came from")
    summary: str


class UploadGrant(LeanModel):
    """upload_url's answer, in the draft SEP-2631 files/authorizeUpload shape (server/uploads.py)."""

    uploadUrl: str = Field(description="PUT the file's bytes here, once; the URL is the capability")  # noqa: N815
    method: Literal["PUT"] = "PUT"
    headers: dict[str, str] = Field(default_factory=dict, description="Headers to send with the PUT")
    expiresAt: str = Field(description="When the URL stops working (ISO 8601, UTC)")  # noqa: N815
    maxBytes: int = Field(description="The largest body accepted; more is refused with 413")  # noqa: N815
    session: str
    filename: str

