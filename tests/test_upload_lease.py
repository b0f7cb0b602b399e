"""An upload uses the session's kernel only under the session's fleet lease (review finding 2): ``Session.turn``
goes through ``driving()``. Another replica holding the lease in the store makes the upload wait (bounded) and
then refuse, with no kernel started or attached and nothing recorded. Real parts: a SQLite store, the fleet's
leases, a session."""

from __future__ import annotations

from pathlib import Path

import pytest

from kernelexec.errors import SessionBusy
from kernelexec.session.fleet import Fleet
from kernelexec.session.session import Session
from kernelexec.store.sqlite import SQLiteStore

from .conftest import make_settings

pytestmark = pytest.mark.anyio


async def test_an_upload_to_a_session_another_replica_drives_waits_then_is_refused_touching_nothing(short_tmp: Path) -> None:
    settings = make_settings(short_tmp)
    store = await SQLiteStore.open(short_tmp / "fleet.db")
    fleet = Fleet(store, remote=True)
    session = Session("s-leased", settings)
    session.driver = fleet  # as SessionManager._track sets it in a fleet
    held = await store.acquire_lease("s-leased", "another-replica", 60)
    assert held is not None
    with pytest.raises(SessionBusy) as busy:
        async with session.turn(1.0) as kernel:
            await kernel.shutdown()
            pytest.fail("the upload's steps ran in the kernel without the session's lease")
    assert "another replica" in str(busy.value)
    assert session.kernel is None and fleet.held == {} and not session.recorder.cells()
    assert not session.lock.locked()
    lease = await store.acquire_lease("s-leased", "third-replica", 60)
    assert lease is None  # the other replica's lease stands: nothing was taken over
