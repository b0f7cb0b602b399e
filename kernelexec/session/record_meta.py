"""Reading kernelexec's metadata back from a journal, a notebook or a session directory, checked.

A notebook is data: what replay, restore and revival read of it goes through these typed readers
(``read_cell_meta``, ``read_notebook_meta``, ``read_session_meta``), apart from the writing in
``recording.py``, so what may be trusted of a record is decided in one small place.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from kernelexec.layout import SessionDirs

Event = Literal["restart", "restore", "revive", "install"]


# --- reading kernelexec metadata back ---------------------------------------------------------------
# A notebook is data: its ``metadata.kernelexec`` may come from another tool, a hand edit or an attacker,
# and be any JSON at all. Everything that reads it back (replay, restore, revival) goes through the two
# readers below, which keep what has the shape kernelexec writes and name, by type only, what they ignore.

EVENTS: tuple[Event, ...] = ("restart", "restore", "revive", "install")
ENDINGS = ("completed", "interrupted", "restarted", "kernel_died")
_KINDS = {str: "a string", bool: "a boolean", int: "a number", float: "a number", list: "a list", dict: "an object"}


def _kind(value: Any) -> str:
    return "null" if value is None else _KINDS.get(type(value), type(value).__name__)


def _positive(value: Any) -> float | None:
    """A positive finite number (not a boolean), as a float; else None."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return None
    try:
        number = float(value)
    except OverflowError:  # an integer too large for a float
        return None
    return number if math.isfinite(number) and number > 0 else None


@dataclass(frozen=True)
class CellMeta:
    """What kernelexec reads back of one cell's ``metadata.kernelexec``; defaults where it is absent or
    not of kernelexec's shape (``ignored`` says what was left out, by type, never echoing the value)."""

    recorded: bool = False  # the cell carries kernelexec metadata at all (it ran in a session)
    event: Event | None = None  # a marker cell's event (markdown cells only)
    specs: tuple[str, ...] = ()  # an install marker's specs as recorded (validated when installed)
    cwd: str | None = None  # the working directory the cell ran in (absolute)
    success: bool = False
    timeout: float | None = None  # the call's timeout: a positive finite number
    ending: str = "completed"  # one of ENDINGS
    inputs: tuple[RecordedInput, ...] = ()  # the cell's input()/getpass() answers, in order
    tool_calls: tuple[RecordedToolCall, ...] = ()  # code mode: the cell's brokered tool calls, in order
    wrote: tuple[str, ...] | None = None  # names the cell may bind (None: not recorded; restore reruns for them)
    read: tuple[str, ...] = ()  # names the cell reads
    ignored: tuple[str, ...] = ()


@dataclass(frozen=True)
class RecordedInput:
    """One recorded answer to a cell's input()/getpass(): None when it was not answered (EOFError);
    a password's is ``***``, which cannot be replayed."""

    answer: str | None
    password: bool = False


@dataclass(frozen=True)
class RecordedToolCall:
    """One recorded brokered tool call (code mode): what replay serves instead of calling the server."""

    server: str
    tool: str
    arguments: dict[str, Any]
    result: dict[str, Any] | None  # {kind, value, images} when it succeeded
    error: str | None = None
    refused: bool = False
    duration_ms: float | None = None


def _read_tool_calls(value: Any) -> tuple[RecordedToolCall, ...] | None:
    if not isinstance(value, list):
        return None
    found = []
    for entry in value:
        if not isinstance(entry, dict) or not isinstance(entry.get("server"), str) or not isinstance(entry.get("tool"), str):
            return None
        arguments, result, error = entry.get("arguments"), entry.get("result"), entry.get("error")
        if not isinstance(arguments, dict) or (result is not None and not isinstance(result, dict)) \
                or (error is not None and not isinstance(error, str)) or (result is None) == (error is None):
            return None
        found.append(RecordedToolCall(entry["server"], entry["tool"], arguments, result, error, entry.get("refused") is True,
                                      _positive(entry.get("duration_ms"))))
    return tuple(found)


def _read_inputs(value: Any) -> tuple[RecordedInput, ...] | None:
    if not isinstance(value, list):
        return None
    found = []
    for entry in value:
        if not isinstance(entry, dict) or not isinstance(entry.get("password", False), bool):
            return None
        answer = entry.get("answer")
        if answer is not None and not isinstance(answer, str):
            return None
        found.append(RecordedInput(answer if entry.get("answered", answer is not None) is not False else None,
                                   entry.get("password", False)))
    return tuple(found)


def read_cell_meta(cell: Any) -> CellMeta:
    """The kernelexec metadata of a journal or notebook cell, checked (see ``CellMeta``)."""
    metadata = cell.get("metadata") if isinstance(cell, dict) else None
    found = metadata.get("kernelexec") if isinstance(metadata, dict) else None
    if found is None:
        return CellMeta()
    if not isinstance(found, dict):
        return CellMeta(ignored=(f"metadata.kernelexec is {_kind(found)}, not an object",))
    ignored: list[str] = []
    fields: dict[str, Any] = {"recorded": bool(found)}
    markdown = cell.get("cell_type") == "markdown"
    if "event" in found:
        event = found["event"]
        if not markdown:
            ignored.append("event on a cell that is not markdown")
        elif event in EVENTS:
            fields["event"] = event
        else:
            ignored.append(f"event is {_kind(event)}, not one of {', '.join(EVENTS)}")
    if "specs" in found and fields.get("event") == "install":
        specs = found["specs"]
        if isinstance(specs, list) and all(isinstance(s, str) for s in specs):
            fields["specs"] = tuple(specs)
        else:
            ignored.append(f"specs is {_kind(specs)}, not a list of strings")
    if "cwd" in found and found["cwd"] is not None:
        cwd = found["cwd"]
        if isinstance(cwd, str) and cwd.startswith("/") and "\0" not in cwd:
            fields["cwd"] = cwd
        else:
            ignored.append(f"cwd is {_kind(cwd)}, not an absolute path")
    if "success" in found:
        if isinstance(found["success"], bool):
            fields["success"] = found["success"]
        else:
            ignored.append(f"success is {_kind(found['success'])}, not a boolean")
    if "timeout" in found and found["timeout"] is not None:
        timeout = _positive(found["timeout"])
        if timeout is not None:
            fields["timeout"] = timeout
        else:
            ignored.append(f"timeout is {_kind(found['timeout'])}, not a positive number")
    if "ending" in found:
        if found["ending"] in ENDINGS:
            fields["ending"] = found["ending"]
        else:
            ignored.append(f"ending is {_kind(found['ending'])}, not one of {', '.join(ENDINGS)}")
    if "inputs" in found:
        inputs = _read_inputs(found["inputs"])
        if inputs is not None:
            fields["inputs"] = inputs
        else:
            ignored.append(f"inputs is {_kind(found['inputs'])}, not a list of recorded answers")
    if "tool_calls" in found:
        calls = _read_tool_calls(found["tool_calls"])
        if calls is not None:
            fields["tool_calls"] = calls
        else:
            ignored.append(f"tool_calls is {_kind(found['tool_calls'])}, not a list of recorded tool calls")
    if "names" in found:
        names = found["names"]
        wrote, read = (names.get("wrote"), names.get("read")) if isinstance(names, dict) else (None, None)
        if all(isinstance(v, list) and all(isinstance(n, str) and n.isidentifier() for n in v) for v in (wrote, read)):
            fields["wrote"], fields["read"] = tuple(wrote), tuple(read)  # type: ignore[arg-type]
        else:
            ignored.append(f"names is {_kind(names)}, not {{wrote, read}} lists of names")
    return CellMeta(**fields, ignored=tuple(ignored))


@dataclass(frozen=True)
class NotebookMeta:
    """What kernelexec reads back of a notebook's ``metadata.kernelexec`` (see ``CellMeta``)."""

    session: str | None = None  # the recorded session's handle
    profile: str | None = None  # the profile it was recorded under (said, never used)
    environment: tuple[str | None, str | None] | None = None  # (python, version) it was recorded in
    ignored: tuple[str, ...] = ()


def read_notebook_meta(metadata: Any) -> NotebookMeta:
    """A notebook's kernelexec metadata, checked (``metadata`` is the notebook's ``metadata`` object)."""
    found = metadata.get("kernelexec") if isinstance(metadata, dict) else None
    if found is None:
        return NotebookMeta()
    if not isinstance(found, dict):
        return NotebookMeta(ignored=(f"metadata.kernelexec is {_kind(found)}, not an object",))
    ignored: list[str] = []
    fields: dict[str, Any] = {}
    for key in ("session", "profile"):
        if key in found and found[key] is not None:
            if isinstance(found[key], str):
                fields[key] = found[key]
            else:
                ignored.append(f"{key} is {_kind(found[key])}, not a string")
    if "environment" in found and found["environment"] is not None:
        environment = found["environment"]
        if isinstance(environment, dict):
            python, version = environment.get("python"), environment.get("version")
            bad = [k for k, v in (("python", python), ("version", version)) if v is not None and not isinstance(v, str)]
            ignored += [f"environment.{k} is {_kind(environment[k])}, not a string" for k in bad]
            fields["environment"] = (python if isinstance(python, str) else None, version if isinstance(version, str) else None)
        else:
            ignored.append(f"environment is {_kind(environment)}, not an object")
    return NotebookMeta(**fields, ignored=tuple(ignored))


def cell_event(cell: dict[str, Any]) -> Event | None:
    """The marker event of a journal/notebook cell (``restart``, ``restore``, ``revive``, ``install``), else None."""
    return read_cell_meta(cell).event


def read_session_meta(session_dir: Path) -> dict[str, Any] | None:
    """A session directory's ``session.json``, or None when it has none (or it is unreadable)."""
    try:
        meta = json.loads(SessionDirs(session_dir).meta.read_text())
    except (OSError, ValueError):
        return None
    return meta if isinstance(meta, dict) else None
