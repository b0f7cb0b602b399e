"""A server start makes its state directory and its session store agree (``reconcile``), before any session is
used:

- **Migration**: a session directory of a release without a store (``session.json``, ``journal.jsonl``,
  ``notebook.ipynb``; no ``kernelexec.db``) is imported: its cells into the store's journal, in order, and its
  ``session.json`` as the session's record (owner, working dir, environment, profile, created; a closed one as
  closed). A session the store knows is never taken from its file again.
- **Catching up**: cells the files hold beyond the store's journal (a store write that failed, so the Recorder
  fell back to the file, fsynced) are appended to the store; a journal file behind the store (a host crash
  lost its unsynced tail, or a kill tore its last line) is written again from the store, and the notebook
  from it, atomically.
- A notebook behind its journal file (a kill between the two) is written again, as ``rebuild_stale`` does.

After it, the store is the record the server trusts: ``SessionManager.lookup`` revives a session from its
store record, never from ``session.json``. One directory that cannot be read is logged and skipped.
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import anyio

from kernelexec.layout import SessionDirs, valid_handle
from kernelexec.session.record_meta import read_session_meta
from kernelexec.session.recording import Recorder, notebook_meta
from kernelexec.store import SessionRecord, Store

logger = logging.getLogger(__name__)


@dataclass
class Reconciled:
    imported_cells: int = 0
    imported_sessions: list[str] = field(default_factory=list)
    journals_rewritten: list[str] = field(default_factory=list)
    notebooks_rewritten: list[str] = field(default_factory=list)


def _session_dirs(sessions_dir: Path) -> list[Path]:
    try:
        return sorted(d for d in sessions_dir.iterdir() if d.is_dir() and not d.is_symlink() and valid_handle(d.name))
    except OSError:
        return []


def session_record(handle: str, meta: dict[str, object]) -> SessionRecord:
    """A ``session.json`` (read checked by record_meta) as the store's record of the session."""
    owner = meta.get("owner")
    working_dir = meta.get("working_dir")
    environment = meta.get("environment")
    profile = meta.get("profile")
    created = meta.get("created")
    return SessionRecord(
        handle,
        owner if isinstance(owner, str) else None,
        working_dir if isinstance(working_dir, str) else "",
        json.dumps(environment, sort_keys=True) if isinstance(environment, dict) else "",
        profile if isinstance(profile, str) else "",
        local_slot="k",
        created=float(created) if isinstance(created, (int, float)) else time.time(),
        closed=time.time() if meta.get("closed") else None,
    )


async def reconcile(store: Store, sessions_dir: Path) -> Reconciled:
    done = Reconciled()
    dirs = await anyio.to_thread.run_sync(_session_dirs, sessions_dir)
    if not dirs:
        return done
    counts = await store.journal_counts()
    known = await store.session_handles()
    for d in dirs:
        held = _hold(d)
        if held is None:  # a live server drives this session (its .lock): its files are its to write
            continue
        try:
            await _one(store, d, counts.get(d.name, 0), d.name in known, done)
        except Exception as exc:  # noqa: BLE001 - one broken directory must never stop a start
            logger.warning("session directory %s: not reconciled with the store (%s)", d.name, exc)
        finally:
            os.close(held)
    if done.imported_cells or done.imported_sessions:
        logger.info("imported into the store: %d session(s), %d cell(s)", len(done.imported_sessions), done.imported_cells)
    return done


def _hold(d: Path) -> int | None:
    """The session directory's lock (as ``session._claim`` takes it) while it is reconciled; None when another
    process holds it."""
    import fcntl

    try:
        fd = os.open(d / ".lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    return fd


async def _one(store: Store, d: Path, stored: int, known: bool, done: Reconciled) -> None:
    handle = d.name
    layout = SessionDirs(d)
    meta = read_session_meta(d)
    recorder = Recorder(layout.journal, layout.notebook, notebook_meta(d))
    lines = await anyio.to_thread.run_sync(recorder.journal_lines)
    if lines != stored:  # the quick look disagrees: read the cells
        cells = await anyio.to_thread.run_sync(recorder.cells)
        if len(cells) > stored:
            for cell in cells[stored:]:
                await store.append_journal(handle, cell)
            done.imported_cells += len(cells) - stored
        if stored > len(cells) or len(cells) != lines:  # the file is behind the store, or torn: the store's again
            entries = await store.journal(handle)
            await anyio.to_thread.run_sync(recorder.write_journal, [e.record for e in entries])
            done.journals_rewritten.append(handle)
    if handle not in done.journals_rewritten and layout.journal.exists() and await anyio.to_thread.run_sync(
            lambda: recorder.stale(quick=True)):
        await anyio.to_thread.run_sync(recorder.write_notebook)
        done.notebooks_rewritten.append(handle)
    if not known and meta is not None:  # a closed one as closed: its record keeps it closed whatever the file says
        await store.put_session(session_record(handle, meta))
        done.imported_sessions.append(handle)
