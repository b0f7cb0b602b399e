"""A fleet behind deploy/haproxy.cfg (issue 33): Debian's haproxy in front of three real ``kernelexec serve`` replicas
sharing a real PostgreSQL, a real Jupyter Server gateway, one key file and one shared directory (tests/fleet_parts.py),
with real MCP SDK clients talking only to the balancer.

What it shows: one session's calls spread across the replicas with its variables kept, for 2025-11-25 clients (sticky
on their Mcp-Session-Id, a new connection may land anywhere) and 2026-07-28 clients with and without
Mcp-Param-Session; the replica a session's calls are hashed to SIGKILLed and the next call served within 5 s with
the record whole; 20 clients x 50 calls over the fleet, each checking its own counter; every replica restarted in
turn under load with no answer lost. Which replica answered is the balancer's X-Kernelexec-Replica header.
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
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from .balancer import Balancer
from .fleet_parts import Fleet, Replica, fleet, gateway, journal_sources
from .pg import postgres
from .test_haproxy import Seen, balancer

__all__ = ["fleet", "gateway", "postgres"]  # fixtures

pytestmark = [pytest.mark.anyio, pytest.mark.slow]


@pytest.fixture(scope="module")
def lb(fleet: Fleet, short_tmp: Path) -> Iterator[Balancer]:
    with balancer(short_tmp, [replica.url for replica in fleet.replicas[:3]]) as found:
        yield found


def client(lb: Balancer, seen: Seen, *, mode: Any = "auto", header: bool = True) -> Client:
    """An SDK client of the balancer; ``header=False`` is a 2026-07-28 client that does not send Mcp-Param-Session
    (the body still names the session): the balancer then spreads its calls round robin."""
    hooks: dict[str, list[Any]] = {"response": [seen.response]}
    if not header:
        async def strip(request: httpx2.Request) -> None:
            request.headers.pop("mcp-param-session", None)
        hooks["request"] = [strip]
    http = httpx2.AsyncClient(timeout=120, event_hooks=hooks)
    return Client(streamable_http_client(lb.url, http_client=http), mode=mode)


async def run(c: Client, code: str, **arguments: Any) -> dict[str, Any]:
    """execute_code through the balancer; a yielded answer followed with get_run, which names no session and so
    lands on any replica (it is collected from the store there)."""
    result = await c.call_tool("execute_code", {"code": code, **arguments})
    while result.structured_content is not None and result.structured_content.get("ending") == "running":
        result = await c.call_tool("get_run", {"run_id": result.structured_content["run_id"], "wait_s": 30})
    assert not result.is_error and result.structured_content is not None, result.content
    return result.structured_content


def replica_named(fleet: Fleet, lb: Balancer, name: str) -> Replica:
    url = lb.replicas[name]
    return next(r for r in fleet.replicas if r.url == url and r.proc.poll() is None)


@pytest.mark.parametrize("mode,header", [("legacy", False), ("auto", False), ("auto", True)],
                         ids=["2025-11-25", "2026-07-28-no-header", "2026-07-28-header"])
async def test_one_sessions_calls_spread_across_replicas_through_the_balancer(fleet: Fleet, lb: Balancer, mode: str,
                                                                              header: bool) -> None:
    seen = Seen()
    async with client(lb, seen, mode=mode, header=header) as c:
        handle = (await run(c, "count = 0"))["session"]
    made = len(seen.calls)  # the call that made the session
    for _ in range(3):  # a 2025-11-25 client sticks to one replica per connection: three connections, one session
        async with client(lb, seen, mode=mode, header=header) as c:
            await c.list_tools()  # the SDK learns which argument is x-mcp-header from the tool list
            for _ in range(4):
                before = len(seen.calls)
                answer = await run(c, "count += 1\ncount", session=handle)
                assert answer["session"] == handle and len(seen.calls) == before + 1
    assert answer["result"] == 12, answer  # every increment kept, whichever replica ran it
    served_by = [replica for _, replica in seen.calls]
    assert None not in served_by, seen.calls
    sent = [header_sent for header_sent, _ in seen.calls[made:]]
    if header:
        assert all(value == handle for value in sent), seen.calls
        assert len(set(served_by[made:])) == 1, seen.calls  # hashed: locality while its replica is up
    else:
        assert not any(sent), seen.calls
        assert set(served_by) == {"r1", "r2", "r3"}, seen.calls  # spread over the whole fleet
    assert await journal_sources(fleet, handle) == ["count = 0"] + ["count += 1\ncount"] * 12  # one record


async def test_2026_calls_are_hashed_on_the_session_header_and_every_one_served(lb: Balancer) -> None:
    """A call naming a session carries Mcp-Param-Session and always reaches the replica that header hashes to; calls
    naming no session go round robin. Every call is served with its session's variables, whichever replica made it."""
    seen = Seen()
    made: dict[str, str] = {}
    async with client(lb, seen) as c:
        await c.list_tools()
        for _ in range(6):
            created = (await c.call_tool("new_session", {})).structured_content
            assert created is not None
            made[created["session"]] = seen.calls[-1][1] or ""
        assert set(made.values()) == {"r1", "r2", "r3"}, made  # no header: round robin
        before = len(seen.calls)
        for handle in made:
            for n in range(3):
                answer = await run(c, f"n = {n}\nn + 1", session=handle)
                assert answer["result"] == n + 1 and answer["session"] == handle, answer
    named = seen.calls[before:]
    assert len(named) == 18 and all(sent for sent, _ in named), named  # every call naming a session sent the header
    for handle in made:
        assert len({replica for sent, replica in named if sent == handle}) == 1, named  # one replica per session
    assert any(made[handle] != replica for handle, (_, replica) in zip(
        [h for h in made for _ in range(3)], named, strict=True)), (made, named)  # some served by another than their maker


async def test_the_replica_a_session_is_hashed_to_sigkilled_and_the_next_call_served_within_5_s(fleet: Fleet,
                                                                                              lb: Balancer) -> None:
    seen = Seen()
    async with client(lb, seen) as c:
        await c.list_tools()
        handle = (await run(c, "v = 1"))["session"]
        for _ in range(3):
            await run(c, "v += 1\nv", session=handle)
        holder = seen.calls[-1][1]
        assert holder is not None
        victim = replica_named(fleet, lb, holder)
        victim.proc.send_signal(signal.SIGKILL)
        victim.proc.wait(10)
        killed = time.monotonic()
        after = await run(c, "v += 1\nv", session=handle)
        took = time.monotonic() - killed
        assert after["result"] == 5 and seen.calls[-1][1] != holder, (after, seen.calls[-1])
        assert took < 5.0, f"the next call through the balancer took {took:.1f} s after the SIGKILL"
        fleet.replicas.remove(victim)
        fleet.start(victim.name, port=int(victim.url.rsplit(":", 1)[1].split("/", 1)[0]))  # back in its slot
        assert (await run(c, "v", session=handle))["result"] == 5
    assert await journal_sources(fleet, handle) == ["v = 1"] + ["v += 1\nv"] * 4 + ["v"]  # nothing lost


async def drive(lb: Balancer, seen: Seen, calls: int, header: bool, wrong: list[str], *, until: anyio.Event | None = None) -> int:
    """One client: its own session and counter, ``calls`` increments (or until ``until`` is set), each answer checked."""
    async with client(lb, seen, header=header) as c:
        await c.list_tools()
        handle = (await run(c, "mine = 0"))["session"]
        n = 0
        while n < calls or (until is not None and not until.is_set()):
            n += 1
            answer = await run(c, "mine += 1\nmine", session=handle)
            if answer["result"] != n or answer["session"] != handle:
                wrong.append(f"{handle}: call {n} answered {answer.get('result')!r}")
    return n


async def test_20_clients_x_50_calls_over_the_fleet_with_no_wrong_answer(lb: Balancer) -> None:
    seen, wrong = Seen(), list[str]()
    started = time.monotonic()
    async with anyio.create_task_group() as tg:
        for i in range(20):
            tg.start_soon(drive, lb, seen, 50, i % 2 == 0, wrong)
    took = time.monotonic() - started
    assert not wrong, wrong[:5]
    calls = [replica for _, replica in seen.calls]
    assert len(calls) >= 20 * 51 and None not in calls  # more: get_run calls following answers that yielded
    spread = {name: calls.count(name) for name in ("r1", "r2", "r3")}
    assert all(spread.values()), spread  # every replica served some
    print(f"20 x 50 calls in {took:.1f} s ({len(calls) / took:.1f} calls/s), per replica {spread}")


async def test_a_rolling_restart_of_every_replica_under_load_loses_no_answer(fleet: Fleet, lb: Balancer) -> None:
    """Each replica in turn stopped as a deploy stops it (SIGTERM: it drains, server/drain.py) and started again,
    while six clients call without a pause, every answer checked. Before the drain, a replica's SIGTERM ended the
    process before its cleanup: a yielded cell's run stayed ``running`` in the store and its client's get_run
    followed it until the deadline."""
    seen, wrong, done = Seen(), list[str](), anyio.Event()
    counts: list[int] = []

    async def client_loop(header: bool) -> None:
        counts.append(await drive(lb, seen, 5, header, wrong, until=done))

    started = time.monotonic()
    with anyio.fail_after(180):  # 30 s on a quiet machine; each replica's start (imports) is most of it under load
        await rolling_restart(fleet, lb, client_loop, done)
    took = time.monotonic() - started
    assert not wrong, wrong[:5]
    assert len(counts) == 6 and sum(counts) > 30, counts
    assert None not in [replica for _, replica in seen.calls]
    print(f"rolling restart of 3 replicas under 6 clients: {took:.1f} s, {sum(counts)} calls answered, none lost")


async def rolling_restart(fleet: Fleet, lb: Balancer, client_loop: Any, done: anyio.Event) -> None:
    """Six clients calling while each replica in turn is stopped as a deploy stops it and started on its port."""
    async with anyio.create_task_group() as tg:
        for i in range(6):
            tg.start_soon(client_loop, i % 2 == 0)
        for name in ("r1", "r2", "r3"):
            await anyio.sleep(1)
            replica = replica_named(fleet, lb, name)
            began = time.monotonic()
            await anyio.to_thread.run_sync(fleet.restart, replica)
            print(f"{name}: stopped (drained) and started again in {time.monotonic() - began:.1f} s")
            await anyio.sleep(2.5)  # the balancer's next health check sees it up (inter 2 s, rise 1)
        await anyio.sleep(1)
        done.set()


async def test_inputs_asked_and_answered_through_the_balancer_land_on_any_replica(fleet: Fleet, lb: Balancer) -> None:
    """input() asked through the balancer, answered by send_input through it: round robin sends the answer to
    whichever replica, and the relay takes it to the one running the cell (tests/test_fleet_relay.py for the rest)."""
    seen = Seen()
    pairs = []
    async with client(lb, seen, header=False) as c:  # no elicitation: the question comes back as awaiting_input
        for n in range(4):
            asked = await c.call_tool("execute_code", {"code": f"answer = input('n{n}? ')\nanswer * 2"})
            while asked.structured_content is not None and asked.structured_content["ending"] == "running":
                asked = await c.call_tool("get_run", {"run_id": asked.structured_content["run_id"], "wait_s": 30})
            waiting = asked.structured_content
            assert waiting is not None and waiting["ending"] == "awaiting_input", asked.content
            ran_on = seen.calls[-1][1]
            done = await c.call_tool("send_input", {"run_id": waiting["run_id"], "question_id": waiting["question_id"],
                                                    "text": str(n), "wait_s": 30})
            assert not done.is_error and done.structured_content is not None, done.content
            assert done.structured_content["result"] == str(n) * 2, done.structured_content
            pairs.append((ran_on, seen.calls[-1][1]))
    assert any(asked_on != answered_on for asked_on, answered_on in pairs), pairs  # answered on another replica
