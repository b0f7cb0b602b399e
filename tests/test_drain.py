"""server/drain.py's rules without a server: when a drain may end, and that calls waiting on runs are cut short
(answered, not failed) when it does. The real thing, a replica SIGTERMed with a cell running, is in
tests/test_fleet.py and tests/test_fleet_lb.py."""

from __future__ import annotations

import time

import anyio
import pytest

from kernelexec.server.drain import Drain

pytestmark = pytest.mark.anyio


def test_a_drain_waits_for_the_balancers_notice_only_where_a_balancer_checks() -> None:
    drain = Drain(notice=3, timeout=30)
    assert not drain.over(0)  # not begun
    drain.begin()
    assert drain.over(0)  # nobody asked /healthz: nothing to wait for
    drain.checked = True
    assert not drain.over(0)  # a balancer routes here: it must see the 503 first
    drain.began = time.monotonic() - 3.1
    assert drain.over(0)


def test_a_drain_waits_for_unfinished_runs_up_to_its_timeout() -> None:
    drain = Drain(notice=0, timeout=30)
    drain.begin()
    assert not drain.over(2)
    drain.began = time.monotonic() - 30.1
    assert drain.over(2)  # the deadline: what still runs is recorded lost by the session manager


async def test_calls_waiting_on_runs_are_answered_when_the_drain_ends() -> None:
    drain = Drain()
    reached: list[str] = []

    async def wait_on_a_run() -> None:
        with drain.waiting():
            await anyio.sleep(60)
        reached.append("answered")  # cut short, not failed: the call goes on to answer what it has

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(wait_on_a_run)
            await anyio.sleep(0.05)
            drain.end()
    assert reached == ["answered"]
    with anyio.fail_after(1), drain.waiting():  # a wait begun after the end does not wait at all
        await anyio.sleep(60)
