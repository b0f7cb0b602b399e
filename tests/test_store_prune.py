"""The store's dead rows pruned by a running server's upkeep (``Upkeep.prune``; the rows ``Store.prune`` deletes
are shown in tests/test_store.py on both stores): one real server on its default store deletes the relay's rows of
ended runs, expired grants and tasks past their ttl, and keeps what a live run, a page or a get_run still uses.
The fleet's once-per-fleet pruning (by its leader only) is in tests/test_fleet_once.py."""

from __future__ import annotations

import time
from pathlib import Path

import anyio
import pytest

from kernelexec.session import upkeep
from kernelexec.store import AskRecord, GrantRecord, QuestionRecord, RunRecord, TaskRecord

from .support import make_settings, serving

pytestmark = pytest.mark.anyio


async def test_a_single_servers_upkeep_prunes_dead_rows_and_keeps_live_ones(short_tmp: Path) -> None:
    async with serving(make_settings(short_tmp)) as h:
        store = h.sessions.store
        assert store is not None
        old = time.time() - 2 * upkeep.EXPIRED_KEPT_S
        await store.put_run(RunRecord("run-ended", "s1", None, "finished", {"content": []}))
        await store.put_run(RunRecord("run-live", "s1", None, "awaiting_input"))
        for n in range(3):
            await store.ask(AskRecord("run-ended", "answer", None, f"q-{n}", "sealed", "send_input", created=old))
            await store.put_question(QuestionRecord(f"q-{n}", "run-ended", "name?", answered=True, created=old))
        await store.ask(AskRecord("run-live", "cancel", None, channel="tasks/cancel", created=old))
        await store.put_question(QuestionRecord("q-live", "run-live", "name?", created=old))
        await store.put_grant(GrantRecord("g-old", "upload", None, "s1", old, {}, used=True))
        await store.put_grant(GrantRecord("g-new", "upload", None, "s1", time.time() + 60, {}))
        await store.put_task(TaskRecord("t-old", None, "run-ended", 60.0, "completed", created=old, updated=old))
        h.sessions.upkeep._prune_at = 0.0  # its next round prunes (every PRUNE_EVERY otherwise)
        with anyio.fail_after(10):
            while await store.get_grant("g-old") is not None:
                await anyio.sleep(0.2)
        assert [await store.get_question(f"q-{n}", owner=None) for n in range(3)] == [None] * 3
        assert await store.get_task("t-old", owner=None) is None
        assert await store.get_question("q-live", owner=None) is not None and await store.get_grant("g-new") is not None
        assert await store.get_run("run-ended", owner=None) is not None  # a run's answer stays (kept by count)
        (live,) = await store.take_asks(["run-live", "run-ended"])  # the live run's ask is still there to take
        assert live.run_id == "run-live"
