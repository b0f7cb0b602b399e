"""A run another replica left on a session's kernel (drained and handed over, or SIGKILLed) is adopted by the next
holder of the session (``Fleet.adopt_orphans``: the store then names that replica as the run's) and collected once its
kernel is attached (``Session.collect_orphans``). A driving period that ends before the kernel was attached (the
call cancelled while attaching, the session limits refusing a kernel) must not leave the run named as this live
replica's, still running: no other replica adopts a live replica's run, and get_run would say "running" for ever.
Real parts: a SQLite store, the fleet's leases, sessions."""

from __future__ import annotations

from pathlib import Path

import pytest

from kernelexec.errors import SessionError
from kernelexec.session.fleet import Fleet
from kernelexec.session.session import Session
from kernelexec.store import RunRecord, SessionRecord
from kernelexec.store.sqlite import SQLiteStore

from .support import make_settings

pytestmark = pytest.mark.anyio


def refuse(session: Session) -> None:
    raise SessionError("this token already holds 1 live sessions (--max-sessions-per-token)")


async def test_a_run_adopted_but_not_collected_is_not_left_running_under_a_live_replica(short_tmp: Path) -> None:
    store = await SQLiteStore.open(short_tmp / "fleet.db")
    try:
        handle, dead = "s-orphan", "replica:gateway:drained-a"
        await store.put_session(SessionRecord(handle, None, str(short_tmp), "python", "default", gateway_kernel_id="k-1"))
        gone = await store.acquire_lease(handle, "drained-a", 60)  # the replica that ran the cell drove the session...
        assert gone is not None
        await store.put_run(RunRecord("run-orphan", handle, None, "running", holder=dead, resume={
            "kernel": "k-1", "channel": "ch-a", "msg_id": "m-1", "code": "x = 1", "timeout": 60, "handed_over": 1.0}))
        await store.release_lease(gone)  # ... and handed it over (a drain's deadline): its lease let go

        b = Fleet(store, remote=True)
        assert await store.acquire_lease(b.key, b.id, 60) is not None  # replica B lives
        session = Session(handle, make_settings(short_tmp))
        session.driver = b
        session.admit = refuse  # B cannot start (attach) the session's kernel now
        with pytest.raises(SessionError):
            async with session.driving() as driven:
                assert driven and [r.id for r in session.reclaiming] == ["run-orphan"]  # adopted by B
                await session.ensure_kernel()

        record = await store.get_run("run-orphan", owner=None)
        assert record is not None
        assert not (record.state == "running" and record.holder == b.key), (
            "the run is left as live replica B's, still running, though B collects nothing: no other replica adopts it")
        assert session.reclaiming == []
    finally:
        await store.close()
