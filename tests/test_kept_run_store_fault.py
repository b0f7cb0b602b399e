"""A run id goes out only once the session store holds the run (review finding 7): when the store refuses the
run's first record (tried again briefly), the answer fails instead of telling an id that any other replica, or
this one after a restart, would answer ``unknown run`` for. The fault is real: another connection holds the
SQLite store's write lock while the run's id would be told."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path
from typing import Any

import pytest

from kernelexec.store.sqlite import SQLiteStore

from .conftest import make_settings, serving

pytestmark = pytest.mark.anyio


async def test_a_run_id_the_store_did_not_take_is_never_told(short_tmp: Path) -> None:
    async with serving(make_settings(short_tmp, yield_after=1, pool_size=0, restart_spares=0)) as h:
        store = h.sessions.store
        if not isinstance(store, SQLiteStore):
            pytest.skip("the fault is SQLite's write lock")
        handle = await h.new_session()
        assert store._conn is not None
        store._conn.execute("PRAGMA busy_timeout=50")  # a held lock fails a write at once (the fault), not after 30 s
        other = sqlite3.connect(store.path, isolation_level=None, check_same_thread=False)
        other.execute("BEGIN IMMEDIATE")
        timer = threading.Timer(3.5, lambda: other.execute("ROLLBACK"))
        timer.start()
        try:
            answer = await h.client.call_tool("execute_code", {"session": handle, "code": "import time\ntime.sleep(6)\n1"})
        finally:
            timer.join()
            other.close()
        s: Any = answer.structured_content
        if not answer.is_error and s and s.get("run_id"):
            told = await store.get_run(s["run_id"], owner=None)
            assert told is not None, f"run id {s['run_id']} was told, but the store does not hold it"
        assert answer.is_error and "could not be recorded" in answer.content[0].text, answer.content
