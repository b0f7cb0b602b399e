"""What a call pays in the session store (issue 35, per-call overhead): a cell answered in full by its own call
writes its journal line and nothing else (no run record: nobody holds its run id), and that commit is not
fsynced on the call's path but by the store's WAL thread right after; a run whose id is told (background, or a
yield) is in the store before the answer that tells it. A real in-memory server, real kernels, real SQLite."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import anyio
import pytest

from kernelexec.store.sqlite import SQLiteStore

from .conftest import make_settings, serving
from .support import until

pytestmark = pytest.mark.anyio


def run_rows(state_dir: Path) -> list[tuple[str, str]]:
    with sqlite3.connect(state_dir / "kernelexec.db") as db:
        return db.execute("SELECT id, state FROM runs").fetchall()


async def test_a_cell_answered_in_full_leaves_only_its_journal_line(short_tmp: Path) -> None:
    settings = make_settings(short_tmp, pool_size=0, restart_spares=0, yield_after=30)
    async with serving(settings) as h:
        store = h.sessions.store
        assert isinstance(store, SQLiteStore)
        written: list[str] = []  # every run record the server writes (the store's own method, observed)
        put_run = store.put_run

        async def observed(record: Any, **kwargs: Any) -> None:
            written.append(record.state)
            await put_run(record, **kwargs)

        store.put_run = observed  # type: ignore[method-assign]
        for _ in range(3):
            assert (await h.run("x = 1"))["success"]
        await anyio.sleep(0.5)  # a record written after the answer would be here by now
        assert written == [] and run_rows(settings.state_dir) == []
        handle = next(iter(h.sessions.sessions))
        assert [e.record["source"] for e in await store.journal(handle)][-3:] == ["x = 1"] * 3
        await until(lambda: store.wal_sync.synced >= 1, "the WAL fsynced after the journal's commits")

        # a run whose id is told: recorded before the answer that tells it, then its end
        started = await h.run("import time\ntime.sleep(1)\nresult = 7", background=True)
        assert run_rows(settings.state_dir) == [(started["run_id"], "running")]
        finished = await h.call("get_run", run_id=started["run_id"], wait_s=30)
        assert finished.structured_content["result"] == 7
        await until(lambda: run_rows(settings.state_dir) == [(started["run_id"], "finished")], "its end recorded")


async def test_the_journal_commit_is_in_the_file_at_once_and_on_disk_by_close(short_tmp: Path) -> None:
    """The commit that skipped its fsync is visible to another connection when it returns (in the OS: a kill of
    the server keeps it); closing the store waits for the WAL's fsync."""
    store = await SQLiteStore.open(short_tmp / "j" / "kernelexec.db")
    try:
        seq = store.append_journal_sync("s1", {"cell_type": "code", "source": "x = 1"})
        with sqlite3.connect(short_tmp / "j" / "kernelexec.db") as other:
            assert other.execute("SELECT seq FROM journal WHERE session = 's1'").fetchall() == [(seq,)]
    finally:
        await store.close()
    assert store.wal_sync.synced >= 1
