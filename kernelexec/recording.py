"""Every call of a session, recorded as a real notebook.

The durable record is an append-only journal (one JSON line per cell, flushed and fsynced before
the answer goes out), so a call costs the same in a 500-cell session as in the first. The
``.ipynb`` is materialised from the journal atomically (temp file + ``os.replace``) shortly after
each cell, on demand (resource reads, replay, close), and on start-up after a crash
(``rebuild_stale``). A crash of the kernel, the server or the machine loses at most the cell in
flight. The session manager materialises dirty notebooks in the background.

Besides code cells the journal holds markdown *marker* cells for what happened to the kernel between
calls (``restart_session``, a restore, a revival after a server restart), so a reader sees them and
replay can redo them. ``session.json`` beside the journal says who owns the session and whether it
was closed (a closed session is never revived).
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from .models import Execution

SESSION_FILE = "session.json"
Event = Literal["restart", "restore", "revive"]


def _iso(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


JOURNAL_STREAM_CHARS = 100_000  # per stream output; the whole text is in the answer's stdout_file/stderr_file


def _bounded(output: dict[str, Any]) -> dict[str, Any]:
    """A stream output cut head+tail for the record: floods stay on disk once (their spill file), not in every notebook write."""
    text = output.get("text")
    if output.get("output_type") == "stream" and isinstance(text, str) and len(text) > JOURNAL_STREAM_CHARS:
        head, tail = text[: JOURNAL_STREAM_CHARS // 2], text[-JOURNAL_STREAM_CHARS // 2 :]
        cut = len(text) - len(head) - len(tail)
        output["text"] = f"{head}\n[... {cut:,} characters cut in the record; the answer's {output.get('name')}_file has them ...]\n{tail}"
    return output


def cell_record(ex: Execution, meta: dict[str, Any]) -> dict[str, Any]:
    """The journal line for one call: an nbformat v4 code cell as plain JSON.

    ``meta`` comes from the session: ``session``, ``profile``, ``cwd``, the call's ``timeout`` and
    the ``layers`` in force. The timings are the call's own (``duration_ms``) and its wall-clock end.
    """
    finished = time.time()
    outputs = [_bounded(dict(o)) for o in ex.outputs]
    if ex.ending != "completed" and not any(o.get("output_type") == "error" for o in outputs):
        reason = ex.restart_reason or ("timed out" if ex.timed_out else ex.ending)
        outputs.append({"output_type": "error", "ename": "KernelexecError", "evalue": reason, "traceback": [reason]})
    tags = [] if ex.success else ["raises-exception"]
    return {
        "cell_type": "code",
        "execution_count": ex.execution_count,
        "source": ex.code,
        "outputs": outputs,
        "metadata": {
            "tags": tags,
            "kernelexec": {
                **meta,
                "started": _iso(finished - ex.duration_ms / 1000),
                "finished": _iso(finished),
                "duration_ms": ex.duration_ms,
                "ending": ex.ending,
                "timed_out": ex.timed_out,
                "kernel_restarted": ex.ending in ("restarted", "kernel_died"),
                "restart_reason": ex.restart_reason,
                "success": ex.success,
            },
        },
    }


def marker_record(event: Event, text: str, info: dict[str, Any]) -> dict[str, Any]:
    """The journal line for a kernel event between calls: a markdown cell a reader sees and replay redoes."""
    return {
        "cell_type": "markdown",
        "source": f"*kernelexec: {text}*",
        "metadata": {"kernelexec": {"event": event, "at": _iso(time.time()), **info}},
    }


def cell_event(cell: dict[str, Any]) -> str | None:
    """The marker event of a journal/notebook cell (``restart``, ``restore``, ``revive``), else None."""
    if cell.get("cell_type") != "markdown":
        return None
    return (cell.get("metadata") or {}).get("kernelexec", {}).get("event")


def read_session_meta(session_dir: Path) -> dict[str, Any] | None:
    """A session directory's ``session.json``, or None when it has none (or it is unreadable)."""
    try:
        meta = json.loads((session_dir / SESSION_FILE).read_text())
    except (OSError, ValueError):
        return None
    return meta if isinstance(meta, dict) else None


def mark_closed(session_dir: Path) -> None:
    """Record in ``session.json`` that the session was closed, so no later server revives it."""
    meta = read_session_meta(session_dir) or {}
    meta["closed"] = _iso(time.time())
    tmp = session_dir / f".{SESSION_FILE}.tmp"
    tmp.write_text(json.dumps(meta))
    os.replace(tmp, session_dir / SESSION_FILE)


def rebuild_stale(sessions_dir: Path) -> list[Path]:
    """Materialise every notebook older than its journal (a server killed before writing it).

    Called when a server starts and by ``kernelexec replay``; returns the notebooks written.
    """
    written = []
    try:
        dirs = [d for d in sessions_dir.iterdir() if d.is_dir()]
    except OSError:
        return written
    for d in dirs:
        recorder = Recorder(d / "journal.jsonl", d / "notebook.ipynb", _notebook_meta(d))
        if recorder.dirty:
            written.append(recorder.write_notebook())
    return written


def _notebook_meta(session_dir: Path) -> dict[str, Any]:
    meta = read_session_meta(session_dir) or {}
    return {k: meta[k] for k in ("session", "profile", "created") if k in meta} or {"session": session_dir.name}


class Recorder:
    """Appends cells to a session's journal and keeps its notebook file up to date."""

    def __init__(self, journal: Path, notebook: Path, session_meta: dict[str, Any]) -> None:
        self.journal = journal
        self.notebook = notebook
        self.session_meta = session_meta
        self._dirty = journal.exists() and (
            not notebook.exists() or notebook.stat().st_mtime < journal.stat().st_mtime
        )

    def append(self, ex: Execution, meta: dict[str, Any]) -> None:
        """Journal one call (fsynced before this returns, so before the answer goes out)."""
        self._write_line(cell_record(ex, meta))

    def mark(self, event: Event, text: str, **info: Any) -> None:
        """Journal a kernel event between calls (see ``marker_record``)."""
        self._write_line(marker_record(event, text, info))

    def _write_line(self, record: dict[str, Any]) -> None:
        line = json.dumps(record, separators=(",", ":"))
        with open(self.journal, "a", encoding="utf-8") as fh:
            fh.write(line + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        self._dirty = True

    def cells(self) -> list[dict[str, Any]]:
        """All recorded cells; a torn last line (a crash mid-write) is skipped."""
        if not self.journal.exists():
            return []
        cells = []
        with open(self.journal, encoding="utf-8") as fh:
            for line in fh:
                try:
                    cells.append(json.loads(line))
                except json.JSONDecodeError:
                    continue
        return cells

    def write_notebook(self) -> Path:
        """Materialise the notebook from the journal, atomically."""
        import nbformat  # lazily: costs ~0.3 s at import

        nb = nbformat.v4.new_notebook()
        nb.metadata.update(
            {
                "kernelspec": {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"},
                "language_info": {"name": "python"},
                "kernelexec": self.session_meta,
            }
        )
        for cell in self.cells():
            nb.cells.append(nbformat.from_dict({**cell, "id": f"cell-{len(nb.cells) + 1}"}))
        data = nbformat.writes(nb)
        fd, tmp = tempfile.mkstemp(dir=self.notebook.parent, prefix=".notebook-", suffix=".tmp")
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, self.notebook)
        self._dirty = False
        return self.notebook

    @property
    def dirty(self) -> bool:
        return self._dirty

    def flush(self) -> Path | None:
        """Write the notebook if cells were appended since the last write."""
        if self._dirty:
            return self.write_notebook()
        return self.notebook if self.notebook.exists() else None
