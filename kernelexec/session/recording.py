"""Every call of a session, recorded as a real notebook, current when its answer goes out.

The Recorder is the one writer of a session's record. Each cell goes, in this order, before the answer leaves
(off the event loop):
- the session store's journal (``Recorder.sink``: one transaction, kept by a kill of the server when it returns;
  SQLite fsyncs it right after, off the call's path): the record the
  server trusts. A write the store refuses is tried again briefly (``STORE_TRIES``), then the call fails plainly
  (``NotRecorded``) with nothing written anywhere: the file never holds a cell the store lacks, which a fleet's
  next takeover (``write_journal`` from the store) would erase. Without a store (``kernelexec replay``) the file
  below is fsynced instead and is the durable record.
- ``journal.jsonl``, one JSON line per cell: the same record as a file beside the notebook (what
  ``kernelexec replay SESSION_DIR`` and a restore read). Written after the store, not fsynced when the store
  has the cell: a SIGKILL of the server keeps the page cache, and after a host crash ``reconcile`` writes it
  again from the store.
- ``notebook.ipynb``, kept current by appending in place: its JSON ends with the cells array, one
  cell per line (JSON strings escape newlines, so a raw newline only ever separates cells), so a
  cell costs one write at the end of the file, never a rewrite of what came before; the file is
  valid nbformat after every answered cell. A server SIGKILLed mid-append can leave a torn last
  line: ``rebuild_stale`` (server start, ``kernelexec replay``) sees that the notebook does not end
  as it should, or holds fewer cells than the journal, and writes it again from the journal,
  atomically (temp file + ``os.replace``), as it does for one a crash left behind its journal.

Besides code cells the journal holds markdown *marker* cells for what happened to the kernel between
calls (``restart_session``, a restore, a revival after a server restart), so a reader sees them and
replay can redo them. ``session.json`` beside the journal says who owns the session and whether it
was closed (a closed session is never revived). Reading any of it back, checked, is ``record_meta.py``'s.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kernelexec import tracing
from kernelexec.kernel.execution import Execution
from kernelexec.kernel.wire import clean
from kernelexec.layout import SessionDirs
from kernelexec.longtext import cut
from kernelexec.session.record_meta import Event, read_session_meta
from kernelexec.store import StaleLease, StoreError

logger = logging.getLogger(__name__)


def _iso(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


STORE_TRIES = (0.0, 0.2, 0.5, 1.0)  # seconds before each try of a store write: a blip passes, an outage fails the call


class NotRecorded(StoreError):
    """The session store did not take a cell, after the tries: the call fails, and nothing of it is recorded."""


JOURNAL_STREAM_CHARS = 100_000  # per stream output; the whole text is in the answer's stdout_file/stderr_file


def _bounded(output: dict[str, Any]) -> dict[str, Any]:
    """A stream output cut head+tail for the record: floods stay on disk once (their spill file), not in every notebook write."""
    text = output.get("text")
    if output.get("output_type") == "stream" and isinstance(text, str) and len(text) > JOURNAL_STREAM_CHARS:
        output["text"] = cut(text, JOURNAL_STREAM_CHARS, where=f"in the record; the answer's {output.get('name')}_file has them")[0]
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
                # what the answer told beside the outputs (outputs and bytes past the per-cell caps dropped, a flood
                # cut, malformed messages): the record says it too, or the notebook would look complete
                **({"notes": list(ex.notes)} if ex.notes else {}),
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


def mark_closed(session_dir: Path) -> None:
    """Record in ``session.json`` that the session was closed, so no later server revives it."""
    meta = read_session_meta(session_dir) or {}
    meta["closed"] = _iso(time.time())
    target = SessionDirs(session_dir).meta
    tmp = target.with_name(f".{target.name}.tmp")
    tmp.write_text(json.dumps(meta))
    os.replace(tmp, target)


JournalSink = Callable[[dict[str, Any]], int]  # one record into the store's journal, kept by a kill when it returns; its seq


def rebuild_stale(sessions_dir: Path) -> list[Path]:
    """Rewrite every notebook its journal is ahead of (a server killed before or while writing it).

    Called when a server starts and by ``kernelexec replay``; returns the notebooks written. Each
    session directory is on its own: one that cannot be read or written is logged and skipped.
    """
    written: list[Path] = []
    try:
        dirs = [d for d in sessions_dir.iterdir() if d.is_dir() and not d.is_symlink()]
    except OSError:
        return written
    for d in dirs:
        try:
            layout = SessionDirs(d)
            recorder = Recorder(layout.journal, layout.notebook, notebook_meta(d))
            if recorder.journal.exists() and recorder.stale(quick=True):
                written.append(recorder.write_notebook())
        except Exception as exc:  # noqa: BLE001 - one broken directory must never stop a start
            logger.warning("skipping session directory %s: its notebook could not be rebuilt (%s)", d.name, exc)
    return written


def notebook_meta(session_dir: Path) -> dict[str, Any]:
    """The notebook-level ``kernelexec`` metadata of a session directory, from its ``session.json``."""
    meta = read_session_meta(session_dir) or {}
    kept: dict[str, Any] = {k: meta[k] for k in ("session", "profile", "created") if k in meta and isinstance(meta[k], (str, int, float))}
    environment = meta.get("environment")
    if isinstance(environment, dict):
        kept["environment"] = {k: v for k, v in environment.items() if isinstance(v, str)}
    return kept or {"session": session_dir.name}


_TAIL = b"\n]}\n"  # how a notebook file ends: the cells array, then the top-level object, closed


def _line(record: dict[str, Any]) -> bytes:
    """One JSON line, valid UTF-8 whatever the strings hold (they are cleaned at the kernel's door,
    but the record must never be the thing that breaks)."""
    return _cleaned(record)[1]


def _cleaned(record: dict[str, Any]) -> tuple[dict[str, Any], bytes]:
    """The record as it can be stored (no lone surrogate, NaN or infinity) and its JSON line."""
    try:
        return record, json.dumps(record, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode("utf-8")
    except (UnicodeEncodeError, ValueError):  # a lone surrogate, NaN or infinity: never in the record
        record = clean(record)
        return record, json.dumps(record, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode("utf-8")


class Recorder:
    """Appends cells to a session's journal and to its notebook file (see the module docstring)."""

    def __init__(self, journal: Path, notebook: Path, session_meta: dict[str, Any], sink: JournalSink | None = None) -> None:
        self.journal = journal
        self.notebook = notebook
        self.session_meta = session_meta
        # the session store's journal (set by the session manager while a store is open); None: files only
        self.sink = sink
        self._count: int | None = None  # cells in the notebook file, once known

    def _header(self) -> bytes:
        """Everything before the first cell: the notebook's metadata on one line, then ``"cells": [``."""
        metadata = {
            "kernelspec": {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"},
            "language_info": self._language_info(),
            "kernelexec": self.session_meta,
        }
        head = json.dumps({"metadata": metadata, "nbformat": 4, "nbformat_minor": 5}, ensure_ascii=False)
        return head[:-1].encode("utf-8") + b', "cells": ['

    def _language_info(self) -> dict[str, Any]:
        """The kernel's Python, as ipykernel itself would report it (``version``), when the session knows it."""
        environment = self.session_meta.get("environment")
        version = environment.get("version") if isinstance(environment, dict) else None
        info: dict[str, Any] = {"name": "python"}
        if isinstance(version, str):
            info.update(version=version, mimetype="text/x-python", file_extension=".py")
        return info

    def _cell_line(self, record: dict[str, Any], number: int) -> bytes:
        return _line({**record, "id": f"cell-{number}"})

    def start(self) -> None:
        """Make the notebook file exist and match the journal (a new session: an empty notebook).
        O(journal) once per recorder; each append after it is O(1)."""
        count = self.notebook_count()
        if count is None or count != self.journal_count():
            self.write_notebook()
        else:
            self._count = count

    def append(self, ex: Execution, meta: dict[str, Any]) -> None:
        """Record one call in the journal (fsynced) and the notebook, before its answer goes out."""
        with tracing.span("kernelexec.record", **{"kernelexec.cell.execution_count": ex.execution_count}):
            self._record(cell_record(ex, meta))

    def mark(self, event: Event, text: str, **info: Any) -> None:
        """Record a kernel event between calls (see ``marker_record``)."""
        self._record(marker_record(event, text, info))

    def _record(self, record: dict[str, Any]) -> None:
        record, line = _cleaned(record)
        stored = False
        if self.sink is not None:
            self._store(record)
            stored = True
        with open(self.journal, "ab") as fh:
            fh.write(line + b"\n")
            fh.flush()
            if not stored:
                os.fsync(fh.fileno())
        try:
            self._append_cell(record)
        except (OSError, ValueError) as exc:  # the journal has it; the next start rebuilds the notebook
            logger.warning("appending to %s failed (%s); rewriting it from the journal", self.notebook, exc)
            self.write_notebook()

    def _store(self, record: dict[str, Any]) -> None:
        """The record into the store, tried ``len(STORE_TRIES)`` times (this is a worker thread: sleeping is fine);
        never a silent fall back to the file alone."""
        assert self.sink is not None
        failure: BaseException | None = None
        for pause in STORE_TRIES:
            time.sleep(pause)
            try:
                self.sink(record)
                return
            except StaleLease:  # a fleet's replica that lost the session's lease: it records nothing, anywhere
                raise
            except Exception as exc:  # noqa: BLE001 - any failure of the store's: tried again, then the call fails
                failure = exc
                logger.warning("the session store did not take a cell of %s: %s", self.journal.parent.name, exc)
        raise NotRecorded(f"session {self.journal.parent.name}: the session store did not take this call's record "
                          f"({type(failure).__name__}: {str(failure)[:200]}); the code may have run, but nothing of it "
                          "is recorded: call again once the store is back") from None

    def _append_cell(self, record: dict[str, Any]) -> None:
        if self._count is None:
            self.start()  # the journal already holds this cell, so the notebook now does too
            return
        number = self._count + 1
        body = (b"\n" if number == 1 else b",\n") + self._cell_line(record, number) + _TAIL
        fd = os.open(self.notebook, os.O_RDWR)
        try:
            end = os.fstat(fd).st_size
            if end < len(_TAIL) or os.pread(fd, len(_TAIL), end - len(_TAIL)) != _TAIL:
                raise ValueError("the notebook file does not end as kernelexec writes it")
            # One write: the file is valid before and after it. No fsync: the journal is the durable
            # record (fsynced above); the page cache already survives a kill of the server.
            os.pwrite(fd, body, end - len(_TAIL))
        finally:
            os.close(fd)
        self._count = number

    def adopt(self, records: list[dict[str, Any]], **meta: Any) -> None:
        """A fork's record: the source's cells so far copied into this (new, empty) journal, fsynced, and
        the notebook written again with ``meta`` (``forked_from``) in its metadata."""
        self.session_meta = {**self.session_meta, **meta}
        with open(self.journal, "ab") as fh:
            for record in records:
                fh.write(_line(record) + b"\n")
            fh.flush()
            os.fsync(fh.fileno())
        self.write_notebook()

    def journal_count(self) -> int:
        """Complete journal lines (a torn last line, from a crash mid-write, does not count)."""
        return len(self.cells())

    def cells(self) -> list[dict[str, Any]]:
        """All recorded cells; a torn or unreadable line is skipped."""
        if not self.journal.exists():
            return []
        cells = []
        with open(self.journal, encoding="utf-8", errors="replace") as fh:
            for line in fh:
                try:
                    cell = json.loads(line)
                except json.JSONDecodeError:
                    continue
                if isinstance(cell, dict):
                    cells.append(cell)
        return cells

    def notebook_count(self) -> int | None:
        """Cells in the notebook file, counted by its line breaks; None when it does not end as ours do."""
        try:
            with open(self.notebook, "rb") as fh:
                fh.seek(0, os.SEEK_END)
                size = fh.tell()
                if size < len(_TAIL):
                    return None
                fh.seek(size - len(_TAIL))
                if fh.read() != _TAIL:
                    return None
                fh.seek(0)
                breaks = sum(chunk.count(b"\n") for chunk in iter(lambda: fh.read(1 << 20), b""))
        except OSError:
            return None
        return breaks - _TAIL.count(b"\n")

    def stale(self, *, quick: bool = False) -> bool:
        """True when the notebook file is missing, torn, or behind its journal. ``quick`` (server start,
        over every session directory): O(1) per directory — the file's end, and its time against the
        journal's (each cell is written to the journal first, then to the notebook); otherwise the
        cells are counted."""
        if quick:
            try:
                journal, notebook = self.journal.stat(), self.notebook.stat()
            except OSError:
                return True
            if notebook.st_mtime_ns < journal.st_mtime_ns or not self._ends_well():
                return True
            return False
        count = self.notebook_count()
        return count is None or count != self.journal_count()

    def _ends_well(self) -> bool:
        try:
            with open(self.notebook, "rb") as fh:
                fh.seek(0, os.SEEK_END)
                if fh.tell() < len(_TAIL):
                    return False
                fh.seek(-len(_TAIL), os.SEEK_END)
                return fh.read() == _TAIL
        except OSError:
            return False

    def journal_lines(self) -> int:
        """Line breaks in the journal file: its cells, unless a crash tore one (a quick look, no parsing)."""
        try:
            with open(self.journal, "rb") as fh:
                return sum(chunk.count(b"\n") for chunk in iter(lambda: fh.read(1 << 20), b""))
        except FileNotFoundError:
            return 0

    def write_journal(self, records: list[dict[str, Any]]) -> None:
        """Write the journal file again from the store's journal, atomically (temp file, fsync, ``os.replace``),
        then the notebook from it."""
        fd, tmp = tempfile.mkstemp(dir=self.journal.parent, prefix=".journal-", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as fh:
                for record in records:
                    fh.write(_line(record) + b"\n")
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, self.journal)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        self.write_notebook()

    def write_notebook(self) -> Path:
        """Write the whole notebook from the journal, atomically (temp file + ``os.replace``)."""
        cells = self.cells()
        fd, tmp = tempfile.mkstemp(dir=self.notebook.parent, prefix=".notebook-", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(self._header())
                for number, cell in enumerate(cells, 1):
                    fh.write((b"\n" if number == 1 else b",\n") + self._cell_line(cell, number))
                fh.write(_TAIL)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, self.notebook)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        self._count = len(cells)
        return self.notebook

    def current(self) -> Path:
        """The notebook file, written again first if it is missing or behind (resource reads, close)."""
        if self.stale():
            self.write_notebook()
        return self.notebook
