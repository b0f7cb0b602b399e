"""Once across a fleet (issue 33): reaping idle sessions is the work of one replica, the leader (the ``fleet:upkeep``
lease), by the store's record of when the fleet last drove each session. Three real replicas with ``--idle-timeout``
on one real PostgreSQL and one real Jupyter Server gateway.

What it shows: a session driven by all three in turn, whose last driver is then SIGKILLed, has its gateway kernel
shut down once (one replica says so, none other), after it was idle for the timeout across the fleet; the next call
is served. The store's dead rows (the relay's of ended runs, expired grants) are pruned by one replica alone.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest

from kernelexec.session.upkeep import EXPIRED_KEPT_S, PRUNE_EVERY
from kernelexec.store import AskRecord, GrantRecord, QuestionRecord, RunRecord, open_store

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


def prune_passes(replica_url: str) -> float:
    """How many times this replica pruned the store (its /metrics: the store's calls by operation)."""
    page = httpx2.get(replica_url.removesuffix("/mcp") + "/metrics", timeout=30).text
    found = [line for line in page.splitlines() if line.startswith('kernelexec_store_seconds_count{operation="prune"}')]
    return float(found[0].rsplit(" ", 1)[1]) if found else 0.0


async def test_the_stores_dead_rows_are_pruned_once_by_the_fleet(fleet: Fleet) -> None:
    """The relay's rows of ended runs and expired grants go, pruned by the leader alone (not once per replica)."""
    store = await open_store(fleet.store, fleet.base)
    try:
        old = time.time() - 2 * EXPIRED_KEPT_S
        await store.put_run(RunRecord("run-ended", "s-x", None, "finished", {"content": []}))
        await store.ask(AskRecord("run-ended", "cancel", None, channel="tasks/cancel", created=old))
        await store.put_question(QuestionRecord("q-ended", "run-ended", "name?", answered=True, created=old))
        await store.put_grant(GrantRecord("g-old", "upload", None, "s-x", old, {}, used=True))
        await store.put_grant(GrantRecord("g-live", "upload", None, "s-x", time.time() + 600, {}))
        with anyio.fail_after(3 * PRUNE_EVERY):
            while await store.get_grant("g-old") is not None or await store.get_question("q-ended", owner=None) is not None:
                await anyio.sleep(0.5)
        assert await store.get_grant("g-live") is not None and await store.get_run("run-ended", owner=None) is not None
    finally:
        await store.close()
    alive = [r for r in fleet.replicas if r.proc.poll() is None]
    passes = {r.name: prune_passes(r.url) for r in alive}
    assert len(alive) >= 2 and sum(1 for n in passes.values() if n) == 1, passes  # the leader alone
