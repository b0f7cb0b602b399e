"""Once across a fleet (issue 33): reaping idle sessions is the work of one replica, the leader (the ``fleet:upkeep``
lease), by the store's record of when the fleet last drove each session. Three real replicas with ``--idle-timeout``
on one real PostgreSQL and one real Jupyter Server gateway.

What it shows: a session driven by all three in turn, whose last driver is then SIGKILLed, has its gateway kernel
shut down once (one replica says so, none other), after it was idle for the timeout across the fleet; the next call
is served.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from .fleet_parts import Fleet, call, gateway, new_fleet
from .pg import Postgres, postgres

__all__ = ["gateway", "postgres"]  # fixtures

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

IDLE_S = 8.0


@pytest.fixture(scope="module")
def fleet(short_tmp: Path, postgres: Postgres, gateway: Any) -> Iterator[Fleet]:
    found = new_fleet(short_tmp, postgres, gateway, "once")
    try:
        for name in ("a", "b", "c"):
            found.start(name, "--idle-timeout", str(IDLE_S), "--yield-after", "5")
        yield found
    finally:
        found.stop_all()


def reaps(fleet: Fleet, handle: str) -> list[str]:
    return [r.name for r in fleet.replicas for line in r.output().splitlines() if f"stopping idle session {handle}" in line]


async def test_an_idle_session_is_reaped_once_by_the_fleet_even_when_its_last_driver_died(fleet: Fleet) -> None:
    a, b, c = fleet.replicas
    before = set(fleet.gateway.kernel_ids())
    handle = (await call(a.url, "x = 1"))["session"]
    (kernel,) = set(fleet.gateway.kernel_ids()) - before
    assert (await call(b.url, "x += 1\nx", session=handle))["result"] == 2
    assert (await call(c.url, "x += 1\nx", session=handle))["result"] == 3  # C drove it last
    c.proc.send_signal(signal.SIGKILL)
    c.proc.wait(10)
    killed = time.monotonic()
    with anyio.fail_after(IDLE_S + 30):
        while kernel in fleet.gateway.kernel_ids():
            await anyio.sleep(0.5)
    assert time.monotonic() - killed >= IDLE_S - 1  # not before it was idle for the timeout
    await anyio.sleep(3)  # every replica's upkeep ran several times since
    assert len(reaps(fleet, handle)) == 1, reaps(fleet, handle)  # once across the fleet
    after = await call(b.url, "1 + 1", session=handle)  # the session goes on, in a kernel of its own
    assert after["result"] == 2
    assert len(reaps(fleet, handle)) == 1
