"""The session store: everything a session owns outside its kernel (interface.py), in SQLite (sqlite.py, the
built-in default: ``<state dir>/kernelexec.db``) or PostgreSQL (postgres.py, ``--store postgresql://…``)."""

from __future__ import annotations

from pathlib import Path

from kernelexec.store.interface import (
    AlreadyAnswered,
    AskRecord,
    Fence,
    GrantRecord,
    JournalEntry,
    Lease,
    QuestionRecord,
    Reservation,
    RunRecord,
    RunState,
    SessionRecord,
    StaleLease,
    Store,
    StoreError,
    TaskRecord,
    redacted,
)

__all__ = ["AlreadyAnswered", "AskRecord", "Fence", "GrantRecord", "JournalEntry", "Lease", "QuestionRecord", "Reservation",
           "RunRecord", "RunState", "SessionRecord", "StaleLease", "Store", "StoreError", "TaskRecord", "open_store", "redacted"]


async def open_store(url: str | None, state_dir: Path) -> Store:
    """The store ``url`` names (``postgresql://…`` / ``postgres://…``, ``sqlite:///path``), or by default
    ``<state_dir>/kernelexec.db``; its schema created or migrated. Errors never show the URL's password."""
    if url is None or url == "":
        from kernelexec.store.sqlite import DB_NAME, SQLiteStore

        return await SQLiteStore.open(Path(state_dir) / DB_NAME)
    scheme = url.split(":", 1)[0].lower()
    if scheme in ("postgresql", "postgres"):
        from kernelexec.store.postgres import PostgresStore

        return await PostgresStore.open(url)
    if scheme == "sqlite" and url.startswith("sqlite:///"):
        from kernelexec.store.sqlite import SQLiteStore

        return await SQLiteStore.open(Path(url[len("sqlite://"):]))
    raise StoreError(f"not a store URL: {redacted(url)!r} (postgresql://user:password@host/db, or sqlite:///path)")
