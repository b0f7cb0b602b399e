"""The session store (kernelexec/store/): one suite, run against both backends — SQLite (the built-in default)
and a real PostgreSQL 15 started here with initdb/pg_ctl as an unprivileged user (no stand-in for either).

What it shows: records round-trip; a record of one owner does not exist for another; a lease is taken only
when free or expired (compare-and-set, raced from two connections), every acquisition gets a larger fencing
token, and a writer whose lease was taken can neither renew nor write; a question is answered once; the
journal keeps its order; everything survives close and reopen; a store URL's password is never shown; and
SQLite survives SIGKILL at random points (50 kills) with every committed record there.
"""

from __future__ import annotations

import os
import random
import secrets
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
import traceback
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import pytest

from kernelexec.store import (
    AlreadyAnswered,
    AskRecord,
    Fence,
    GrantRecord,
    Lease,
    QuestionRecord,
    Reservation,
    RunRecord,
    SessionRecord,
    StaleLease,
    Store,
    StoreError,
    TaskRecord,
    open_store,
    redacted,
)
from kernelexec.store.sqlite import DB_NAME, SQLiteStore

from .pg import PG_USER, Postgres, free_port, postgres

__all__ = ["postgres"]  # the session's PostgreSQL, a fixture

@dataclass
class Where:
    """One store's location: how to open it again (reopen tests) and a second connection (race tests)."""

    kind: str
    url: str | None
    state_dir: Path
    secret: str = ""

    async def open(self) -> Store:
        return await open_store(self.url, self.state_dir)


@pytest.fixture(params=["sqlite", "postgres"])
def where(request: pytest.FixtureRequest, tmp_path: Path) -> Where:
    if request.param == "sqlite":
        return Where("sqlite", None, tmp_path)
    pg: Postgres = request.getfixturevalue("postgres")
    return Where("postgres", pg.url(pg.create_db()), tmp_path, pg.password)


@pytest.fixture
async def store(where: Where) -> AsyncIterator[Store]:
    opened = await where.open()
    try:
        yield opened
    finally:
        await opened.close()


pytestmark = pytest.mark.anyio


def _session(handle: str = "s1", owner: str | None = "alice", **kw: Any) -> SessionRecord:
    return SessionRecord(handle=handle, owner=owner, working_dir=kw.pop("working_dir", "/work/x"),
                         environment=kw.pop("environment", "/usr/bin/python3 (3.11)"), profile=kw.pop("profile", "standard"), **kw)


ANSWER = {"content": [{"type": "text", "text": "π ≈ 3.14 — and a NUL: \x00, a quote \" and \\ backslash"}],
          "structuredContent": {"ending": "finished", "n": [1, 2.5, None, True], "nested": {"z": 1, "a": 2}}, "isError": False}


# --- records ----------------------------------------------------------------------------------------------
async def test_sessions_round_trip_update_list_and_delete(store: Store) -> None:
    await store.put_session(_session("s1", local_slot="k"))
    await store.put_session(_session("s2", owner="bob", gateway_kernel_id="8f1c-kernel"))
    await store.put_session(_session("s3", owner=None))
    got = await store.get_session("s1", owner="alice")
    assert got is not None and (got.handle, got.owner, got.local_slot, got.gateway_kernel_id) == ("s1", "alice", "k", None)
    assert (got.working_dir, got.environment, got.profile) == ("/work/x", "/usr/bin/python3 (3.11)", "standard")
    assert got.created > 0 and got.updated >= got.created
    await anyio.sleep(0.01)
    await store.put_session(_session("s1", working_dir="/work/y", local_slot="s"))
    again = await store.get_session("s1", owner="alice")
    assert again is not None and again.working_dir == "/work/y" and again.local_slot == "s"
    assert again.created == got.created and again.updated > got.updated  # created kept, updated moved
    assert [s.handle for s in await store.list_sessions(owner="alice")] == ["s1", "s3"]
    assert [s.handle for s in await store.list_sessions(owner="bob")] == ["s2", "s3"]
    assert [s.handle for s in await store.list_sessions(owner=None)] == ["s3"]
    with pytest.raises(StoreError):  # a kernel is in one place: a local slot or a gateway, not both
        await store.put_session(_session("s4", local_slot="k", gateway_kernel_id="g"))
    await store.delete_session("s1")
    assert await store.get_session("s1", owner="alice") is None
    assert await store.get_session("s2", owner="bob") is not None


async def test_runs_round_trip_and_their_answer_as_json(store: Store) -> None:
    await store.put_run(RunRecord("run-1", "s1", "alice", "running"))
    got = await store.get_run("run-1", owner="alice")
    assert got is not None and got.state == "running" and got.answer is None and got.session == "s1"
    await store.put_run(RunRecord("run-1", "s1", "alice", "awaiting_input"))
    await store.put_run(RunRecord("run-1", "s1", "alice", "finished", ANSWER))
    done = await store.get_run("run-1", owner="alice")
    assert done is not None and done.state == "finished" and done.answer == ANSWER and done.created == got.created
    assert list(done.answer["structuredContent"]["nested"]) == ["z", "a"]  # kept as written
    await store.put_run(RunRecord("run-2", "s1", "alice", "failed", {"content": [], "isError": True}))
    await store.put_run(RunRecord("run-3", "s1", "alice", "awaiting_input"))
    await store.put_run(RunRecord("run-4", "s2", "alice", "running"))
    assert [r.id for r in await store.runs_of("s1", owner="alice")] == ["run-1", "run-2", "run-3"]
    with pytest.raises(StoreError):
        await store.put_run(RunRecord("run-5", "s1", "alice", "bogus"))  # type: ignore[arg-type]
    with pytest.raises(StoreError):
        await store.put_run(RunRecord("run-6", "s1", "alice", "finished", {"x": float("nan")}))
    assert await store.lose_unfinished(session="s1") == 1  # run-3 only; run-4 is another session's
    assert (await store.get_run("run-3", owner="alice")).state == "lost"  # type: ignore[union-attr]
    assert (await store.get_run("run-4", owner="alice")).state == "running"  # type: ignore[union-attr]
    assert await store.lose_unfinished() == 1
    assert {r.state for r in await store.runs_of("s1", owner="alice")} == {"finished", "failed", "lost"}


async def test_kept_runs_are_a_budget_per_owner_and_a_forgotten_run_goes(store: Store) -> None:
    """prune_runs keeps each owner's last ``keep`` ended runs (never a running one, never another owner's);
    delete_run forgets one run (its own call took its answer)."""
    for i in range(6):
        await store.put_run(RunRecord(f"a-{i}", "s1", "alice", "finished", ANSWER))
        await anyio.sleep(0.002)  # distinct update times
    await store.put_run(RunRecord("a-live", "s1", "alice", "running"))
    await store.put_run(RunRecord("b-0", "s2", "bob", "finished", ANSWER))
    await store.put_run(RunRecord("n-0", "s3", None, "lost"))
    assert await store.prune_runs(owner="alice", keep=2) == 4
    assert [r.id for r in await store.runs_of("s1", owner="alice")] == ["a-4", "a-5", "a-live"]
    assert await store.get_run("b-0", owner="bob") is not None  # another owner's runs are not alice's budget
    assert await store.prune_runs(owner=None, keep=0) == 1 and await store.get_run("n-0", owner=None) is None
    await store.delete_run("a-5")
    assert await store.get_run("a-5", owner="alice") is None
    assert await store.prune_runs(owner="alice", keep=0) == 1  # a-4; the running one stays
    assert [r.id for r in await store.runs_of("s1", owner="alice")] == ["a-live"]


async def test_tasks_round_trip(store: Store) -> None:
    task = TaskRecord("t-1", "alice", "run-1", ttl_s=3600.0, status="working", created=1000.0, updated=1000.0)
    await store.put_task(task)
    assert await store.get_task("t-1", owner="alice") == task
    assert task.expires == 4600.0
    await store.put_task(TaskRecord("t-1", "alice", "run-1", ttl_s=3600.0, status="completed", created=1000.0, updated=1005.0))
    got = await store.get_task("t-1", owner="alice")
    assert got is not None and (got.status, got.created, got.updated) == ("completed", 1000.0, 1005.0)
    await store.put_task(TaskRecord("t-2", None, None, ttl_s=60.0, status="working"))
    job = await store.get_task("t-2", owner="anyone")
    assert job is not None and job.run_id is None and job.created > 0


async def test_a_record_of_one_owner_is_unknown_to_another(store: Store) -> None:
    await store.put_session(_session("sa", owner="alice"))
    await store.put_run(RunRecord("run-a", "sa", "alice", "finished", ANSWER))
    await store.put_task(TaskRecord("t-a", "alice", "run-a", 60.0, "completed"))
    await store.put_question(QuestionRecord("q-a", "run-a", "Name? ", answerer="alice"))
    for other in ("bob", None, "Alice", "alice "):
        assert await store.get_session("sa", owner=other) is None
        assert await store.get_run("run-a", owner=other) is None
        assert await store.get_task("t-a", owner=other) is None
        assert await store.get_question("q-a", owner=other) is None
        assert await store.runs_of("sa", owner=other) == []
        with pytest.raises(StoreError) as refused:
            await store.answer_question("q-a", by=other)
        assert not isinstance(refused.value, AlreadyAnswered) and "unknown question" in str(refused.value)
    assert await store.get_run("run-a", owner="alice") is not None
    assert await store.get_task("t-a", owner="alice") is not None
    # bob's refused attempts did not use up alice's question
    assert (await store.answer_question("q-a", by="alice")).answered
    # an owner-less record (stdio, no auth) is anyone's
    await store.put_run(RunRecord("run-n", "sn", None, "running"))
    assert await store.get_run("run-n", owner="bob") is not None and await store.get_run("run-n", owner=None) is not None


# --- leases and fencing -----------------------------------------------------------------------------------
async def test_lease_compare_and_set_and_fencing(store: Store) -> None:
    await store.put_session(_session("s1"))
    a = await store.acquire_lease("s1", "server-a", ttl_s=0.4)
    assert a is not None and a.token == 1 and a.holder == "server-a"
    assert await store.acquire_lease("s1", "server-b", ttl_s=5) is None  # held
    mine = await store.acquire_lease("s1", "server-a", ttl_s=0.4)  # its own holder's acquire: the same token, extended
    assert mine is not None and mine.token == a.token and mine.expires >= a.expires and mine.taken_from is None
    a = mine
    assert await store.current_lease("s1") == a
    renewed = await store.renew_lease(a, ttl_s=0.4)
    assert renewed is not None and renewed.token == a.token and renewed.expires >= a.expires
    assert await store.append_journal("s1", {"cell": 1}, fence=Fence.of(a)) == 1  # A writes while it holds the lease
    await anyio.sleep(0.6)  # A's lease expires (A is stuck and does not know)
    assert await store.current_lease("s1") is None
    b = await store.acquire_lease("s1", "server-b", ttl_s=30)
    assert b is not None and b.token > a.token
    assert b.taken_from == "server-a"  # a takeover: the holder whose lease ran out is named (its runs are lost)
    b = Lease(b.session, b.holder, b.token, b.expires)
    assert await store.renew_lease(a, ttl_s=30) is None  # A's renew with its old token fails
    assert await store.release_lease(a) is False  # and so does its release
    with pytest.raises(StaleLease):  # A's writes with the stale token are refused
        await store.append_journal("s1", {"cell": "from A, too late"}, fence=Fence.of(a))
    with pytest.raises(StaleLease):
        await store.put_session(_session("s1", working_dir="/from/a"), fence=Fence.of(a))
    with pytest.raises(StaleLease):
        await store.delete_session("s1", fence=Fence.of(a))
    with pytest.raises(StaleLease):
        await store.put_run(RunRecord("run-a", "s1", "alice", "finished", ANSWER), fence=Fence.of(a))
    with pytest.raises(StaleLease):
        await store.put_question(QuestionRecord("q-a", "run-a", "x? "), fence=Fence.of(a))
    assert await store.get_run("run-a", owner="alice") is None and await store.get_question("q-a", owner=None) is None
    with pytest.raises(StaleLease):  # a fence is for its own session only
        await store.append_journal("s2", {"cell": 1}, fence=Fence.of(b))
    await store.put_run(RunRecord("run-b", "s1", "alice", "running", holder="replica:gateway:b"), fence=Fence.of(b))
    await store.put_run(RunRecord("run-b", "s1", "alice", "running"), fence=Fence.of(b))  # later writes keep the holder
    held = await store.get_run("run-b", owner="alice")
    assert held is not None and held.holder == "replica:gateway:b"
    resume = {"kernel": "k-1", "channel": "c-1", "msg_id": "m-1", "code": "x = 1\x00", "timeout": 30.0}
    await store.put_run(RunRecord("run-b", "s1", "alice", "running", resume=resume), fence=Fence.of(b))
    await store.put_run(RunRecord("run-b", "s1", "alice", "running", holder="replica:gateway:c"), fence=Fence.of(b))
    held = await store.get_run("run-b", owner="alice")  # where another replica collects it from: kept by later writes
    assert held is not None and held.resume == resume and held.holder == "replica:gateway:c"
    # the replica that left it (paused past its lease, woken) ends its copy: not written over the adopter's record
    await store.put_run(RunRecord("run-b", "s1", "alice", "failed", ANSWER, holder="replica:gateway:b"))
    held = await store.get_run("run-b", owner="alice")
    assert held is not None and held.state == "running" and held.holder == "replica:gateway:c"
    await store.put_run(RunRecord("run-b", "s1", "alice", "finished", ANSWER, holder="replica:gateway:c"))  # the adopter's
    held = await store.get_run("run-b", owner="alice")
    assert held is not None and held.state == "finished" and held.holder == "replica:gateway:c"
    await store.delete_run("run-b", holder="replica:gateway:b")  # nor forgets it (its own call took its end)
    assert await store.get_run("run-b", owner="alice") is not None
    await store.put_run(RunRecord("run-b", "s1", "alice", "running", holder="replica:gateway:c"), fence=Fence.of(b))
    with pytest.raises(StaleLease):  # a run is recorded lost only under its session's current lease
        await store.lose_run("run-b", fence=Fence.of(a))
    await store.put_run(RunRecord("run-b2", "s1", "alice", "awaiting_input"), fence=Fence.of(b))
    assert await store.lose_run("run-b2", fence=Fence.of(b)) is True
    assert await store.lose_run("run-b2", fence=Fence.of(b)) is False  # once
    lost = await store.get_run("run-b2", owner="alice")
    assert lost is not None and lost.state == "lost"
    await store.delete_run("run-b2")
    assert await store.append_journal("s1", {"cell": 2}, fence=Fence.of(b)) == 2
    await store.put_session(_session("s1", working_dir="/from/b"), fence=Fence.of(b))
    assert [e.record for e in await store.journal("s1")] == [{"cell": 1}, {"cell": 2}]
    session = await store.get_session("s1", owner="alice")
    assert session is not None and session.working_dir == "/from/b"
    assert await store.current_lease("s1") == b
    assert await store.release_lease(b) is True
    assert await store.current_lease("s1") is None
    with pytest.raises(StaleLease):  # a released lease fences nothing
        await store.append_journal("s1", {"cell": "after release"}, fence=Fence.of(b))
    c = await store.acquire_lease("s1", "server-a", ttl_s=30)
    assert c is not None and c.token > b.token and c.taken_from is None  # monotonic across a release; not a takeover
    with pytest.raises(StaleLease):  # a fence for a session that never had a lease
        await store.append_journal("s9", {"cell": 1}, fence=Fence("s9", 1))


async def test_live_leases_by_prefix(store: Store) -> None:
    """A fleet's replicas register as leases ``replica:<id>``: listed while held and unexpired, by prefix only."""
    one = await store.acquire_lease("replica:one", "one", ttl_s=30)
    two = await store.acquire_lease("replica:two", "two", ttl_s=0.3)
    await store.acquire_lease("replicas-not", "x", ttl_s=30)
    await store.acquire_lease("s1", "one", ttl_s=30)
    assert one is not None and two is not None
    assert [lease.holder for lease in await store.live_leases("replica:")] == ["one", "two"]
    await anyio.sleep(0.5)
    assert [lease.holder for lease in await store.live_leases("replica:")] == ["one"]
    assert await store.release_lease(one)
    assert await store.live_leases("replica:") == []
    assert await store.live_leases("replica_") == []  # the prefix is text, not a pattern


async def test_racing_acquirers_on_two_connections_one_wins(where: Where) -> None:
    first, second = await where.open(), await where.open()
    try:
        for round_ in range(8):
            session = f"race-{round_}"
            won: list[Any] = []
            setup = await first.acquire_lease(session, "setup", ttl_s=30)  # the race is for a lease row that exists, free
            assert setup is not None and await first.release_lease(setup)

            async def grab(s: Store, name: str, session: str = session, won: list[Any] = won) -> None:
                lease = await s.acquire_lease(session, name, ttl_s=30)
                if lease is not None:
                    won.append(lease)

            async with anyio.create_task_group() as tg:
                for i in range(3):
                    tg.start_soon(grab, first, f"a{i}")
                    tg.start_soon(grab, second, f"b{i}")
            assert len(won) == 1, won
            assert won[0].token == 2
    finally:
        await first.close()
        await second.close()


# --- questions --------------------------------------------------------------------------------------------
async def test_a_question_is_answered_once(store: Store) -> None:
    await store.put_question(QuestionRecord("q-1", "run-1", "Password: ", password=True, answerer="alice"))
    await store.put_question(QuestionRecord("q-2", "run-1", "Run tool fetch(url=…)?", approval=True, answerer="alice"))
    q = await store.get_question("q-1", owner="alice")
    assert q is not None and q.password and not q.approval and not q.answered and q.prompt == "Password: "
    approval = await store.get_question("q-2", owner="alice")
    assert approval is not None and approval.approval and not approval.password
    answered = await store.answer_question("q-1", by="alice")
    assert answered.answered and answered.id == "q-1"
    with pytest.raises(AlreadyAnswered):
        await store.answer_question("q-1", by="alice")
    stored = await store.get_question("q-1", owner="alice")
    assert stored is not None and stored.answered
    assert not (await store.get_question("q-2", owner="alice")).answered  # type: ignore[union-attr]
    with pytest.raises(StoreError):
        await store.answer_question("q-nope", by="alice")
    with pytest.raises(StoreError):  # an id is a question's for good
        await store.put_question(QuestionRecord("q-1", "run-2", "again? "))


async def test_asks_are_taken_once_by_one_of_two_connections_racing(where: Where) -> None:
    """A fleet's relay: each ask for a run is taken by exactly one reader, in order, and only for the runs asked for."""
    first, second = await where.open(), await where.open()
    try:
        for n in range(5):
            await first.ask(AskRecord("run-1", "answer", "alice", f"q-{n}", f"sealed-{n}", "send_input"))
        await second.ask(AskRecord("run-2", "cancel", "bob", channel="tasks/cancel"))
        taken: list[AskRecord] = []

        async def take(s: Store) -> None:
            taken.extend(await s.take_asks(["run-1"]))

        async with anyio.create_task_group() as tg:
            for s in (first, second, first, second):
                tg.start_soon(take, s)
        assert sorted(a.question_id or "" for a in taken) == [f"q-{n}" for n in range(5)]  # each once
        assert await first.take_asks(["run-1"]) == [] and await first.take_asks([]) == []
        (cancel,) = await second.take_asks(["run-2", "run-3"])
        assert (cancel.run_id, cancel.kind, cancel.owner, cancel.text) == ("run-2", "cancel", "bob", None)
    finally:
        await first.close()
        await second.close()


async def test_a_grant_is_used_once_by_one_of_two_connections_racing(where: Where) -> None:
    """A fleet's capability URL: only its key's digest is kept, and one use wins across connections (replicas)."""
    first, second = await where.open(), await where.open()
    try:
        for n in range(4):
            await first.put_grant(GrantRecord(f"digest-{n}", "upload", "alice", "s-1", 9e9, {"filename": "a.csv", "max_bytes": 9}))
            used: list[GrantRecord | None] = []

            async def use(s: Store, digest: str = f"digest-{n}", used: list[GrantRecord | None] = used) -> None:
                used.append(await s.use_grant(digest))

            async with anyio.create_task_group() as tg:
                for s in (first, second, first, second):
                    tg.start_soon(use, s)
            won = [g for g in used if g is not None]
            assert len(won) == 1 and won[0].caps == {"filename": "a.csv", "max_bytes": 9} and won[0].owner == "alice"
            assert (await second.get_grant(f"digest-{n}")).used  # type: ignore[union-attr]
        assert await first.use_grant("digest-unknown") is None and await first.get_grant("digest-unknown") is None
    finally:
        await first.close()
        await second.close()


async def test_prune_takes_what_nobody_can_use_and_keeps_every_live_row(store: Store) -> None:
    """The relay's rows and expired records go in bounded batches; a row a run, a page or a replica may still use stays."""
    now = time.time()
    old, recent = now - 7200, now - 10
    await store.put_run(RunRecord("run-ended", "s1", "alice", "finished", ANSWER))
    await store.put_run(RunRecord("run-live", "s1", "alice", "awaiting_input"))
    for n in range(5):  # an ended run's (and a forgotten run's) asks and questions: nobody takes or answers them
        await store.ask(AskRecord("run-ended", "answer", "alice", f"q-e{n}", "sealed", "send_input", created=old))
        await store.ask(AskRecord("run-gone", "cancel", "alice", channel="tasks/cancel", created=old))
        await store.put_question(QuestionRecord(f"q-e{n}", "run-ended", "name?", answered=True, created=old))
    await store.ask(AskRecord("run-live", "answer", "alice", "q-live", "sealed", "send_input", created=old))  # to be taken
    await store.put_question(QuestionRecord("q-live", "run-live", "name?", created=old))  # the live run waits on it
    await store.ask(AskRecord("run-ended", "cancel", "alice", channel="tasks/cancel", created=recent))  # not past the grace
    await store.put_grant(GrantRecord("g-old", "upload", "alice", "s1", old, {}, used=True))
    await store.put_grant(GrantRecord("g-unused-old", "secret", "alice", "s1", old, {}))
    await store.put_grant(GrantRecord("g-used-live", "upload", "alice", "s1", now + 600, {}, used=True))  # answers 410
    await store.put_task(TaskRecord("t-old", "alice", "run-ended", 60.0, "completed", created=old, updated=old))
    await store.put_task(TaskRecord("t-live", "alice", "run-ended", 3 * 3600.0, "completed", created=old, updated=old))
    await store.put_run(RunRecord("run-of-t-old", "s1", "alice", "finished", ANSWER))
    assert await store.reserve(Reservation("r-old", "urls:alice", 1, now - 1), limit=9)
    assert await store.reserve(Reservation("r-live", "urls:alice", 1, now + 600), limit=9)
    dead = await store.acquire_lease("replica:gateway:dead", "dead", 0.01)
    assert dead is not None and await store.release_lease(dead)
    live = await store.acquire_lease("replica:gateway:live", "live", 60)
    session = await store.acquire_lease("s1", "live", 60)

    first = await store.prune(ended_before=now - 60, expired_before=now + 1, limit=3)  # bounded: 3 of each at most
    assert first == {"asks": 3, "questions": 3, "grants": 2, "tasks": 1, "reservations": 1, "replicas": 1}, first
    second = await store.prune(ended_before=now - 60, expired_before=now + 1, limit=3)
    assert second == {"asks": 3, "questions": 2, "grants": 0, "tasks": 0, "reservations": 0, "replicas": 0}, second
    rest = await store.prune(ended_before=now - 60, expired_before=now + 1, limit=100)
    assert rest == {"asks": 4, "questions": 0, "grants": 0, "tasks": 0, "reservations": 0, "replicas": 0}, rest  # 10 in all
    assert sum((await store.prune(ended_before=now - 60, expired_before=now + 1, limit=100)).values()) == 0
    taken = await store.take_asks(["run-live", "run-ended", "run-gone"])
    assert [(a.run_id, a.created) for a in taken] == [("run-live", old), ("run-ended", recent)]  # the live run's, the recent
    assert await store.get_question("q-live", owner="alice") is not None
    assert [await store.get_question(f"q-e{n}", owner="alice") for n in range(5)] == [None] * 5
    assert await store.get_grant("g-old") is None and await store.get_grant("g-unused-old") is None
    assert (await store.get_grant("g-used-live")) is not None
    assert await store.get_task("t-old", owner="alice") is None and await store.get_task("t-live", owner="alice") is not None
    assert await store.get_run("run-ended", owner="alice") is not None  # runs are kept by count (prune_runs), never here
    assert await store.reserved("urls:alice") == 1
    assert live is not None and await store.renew_lease(live, 60) is not None  # a live replica's lease stays
    assert session is not None and await store.current_lease("s1") is not None  # a session's lease is never pruned


async def test_a_budget_is_never_passed_by_two_connections_racing(where: Where) -> None:
    """A fleet-wide budget: reservations from two connections (replicas) at once never sum past its limit; a released
    or expired one frees its share."""
    first, second = await where.open(), await where.open()
    try:
        won: list[str] = []

        async def reserve(s: Store, n: int) -> None:
            if await s.reserve(Reservation(f"r-{n}", "spool", 30, time.time() + 60), limit=100):
                won.append(f"r-{n}")

        async with anyio.create_task_group() as tg:
            for n in range(12):
                tg.start_soon(reserve, (first, second)[n % 2], n)
        assert len(won) == 3 and await first.reserved("spool") == 90 == await second.reserved("spool")
        assert not await second.reserve(Reservation("r-more", "spool", 11, time.time() + 60), limit=100)
        assert await second.reserve(Reservation("r-fits", "spool", 10, time.time() + 60), limit=100)
        await first.release(won[0])
        assert await second.reserved("spool") == 70
        assert await first.reserve(Reservation("r-short", "spool", 30, time.time() + 0.3), limit=100)
        assert not await first.reserve(Reservation("r-no", "spool", 1, time.time() + 60), limit=100)
        await anyio.sleep(0.5)  # r-short expired: its share is free again
        assert await second.reserved("spool") == 70
        assert await first.reserve(Reservation("r-yes", "spool", 30, time.time() + 60), limit=100)
    finally:
        await first.close()
        await second.close()


async def test_a_reservation_of_a_replica_whose_lease_ran_out_no_longer_counts(store: Store) -> None:
    """SIGKILLed mid-upload: its replica lease runs out, and with it what it had reserved (not only at its expiry)."""
    lease = await store.acquire_lease("replica:gateway:a", "a", 0.5)
    assert lease is not None
    assert await store.reserve(Reservation("r-a", "spool", 80, time.time() + 3600, holder="replica:gateway:a"), limit=100)
    assert not await store.reserve(Reservation("r-b", "spool", 80, time.time() + 3600, holder=None), limit=100)
    await anyio.sleep(0.7)  # replica a stopped renewing
    assert await store.reserved("spool") == 0
    assert await store.reserve(Reservation("r-b", "spool", 80, time.time() + 3600, holder=None), limit=100)


async def test_idle_sessions_are_those_whose_lease_was_let_go_long_enough_ago(store: Store) -> None:
    """A fleet's reaping reads when the fleet last drove each session from its lease: a released lease keeps that time."""
    for handle in ("s-idle", "s-held", "s-local", "s-closed"):
        kernel = None if handle == "s-local" else f"k-{handle}"
        await store.put_session(SessionRecord(handle, "alice", "/w", "py", "default", gateway_kernel_id=kernel,
                                              closed=1.0 if handle == "s-closed" else None))
        lease = await store.acquire_lease(handle, "replica-a", 30)
        assert lease is not None
        if handle != "s-held":
            assert await store.release_lease(lease)
    await anyio.sleep(0.3)
    assert [r.handle for r in await store.idle_sessions(0.1)] == ["s-idle"]  # held, local-kernel and closed ones: never
    assert await store.idle_sessions(60) == []  # let go a moment ago: not idle for a minute


async def test_racing_answers_on_two_connections_one_wins(where: Where) -> None:
    first, second = await where.open(), await where.open()
    try:
        for n in range(6):
            await first.put_question(QuestionRecord(f"q-{n}", "run-1", "Name? ", answerer="alice"))
            outcomes: list[str] = []

            async def answer(s: Store, qid: str = f"q-{n}", outcomes: list[str] = outcomes) -> None:
                try:
                    await s.answer_question(qid, by="alice")
                    outcomes.append("answered")
                except AlreadyAnswered:
                    outcomes.append("refused")

            async with anyio.create_task_group() as tg:
                for s in (first, second, first, second):
                    tg.start_soon(answer, s)
            assert sorted(outcomes) == ["answered", "refused", "refused", "refused"]
    finally:
        await first.close()
        await second.close()


# --- the journal ------------------------------------------------------------------------------------------
async def test_the_journal_keeps_order_per_session(store: Store) -> None:
    for i in range(25):
        assert await store.append_journal("s1", {"cell": i, "source": f"x = {i}", "outputs": [{"text": "é\x00" * (i % 3)}]}) == i + 1
        if i % 5 == 0:
            await store.append_journal("s2", {"other": i})
    entries = await store.journal("s1")
    assert [e.seq for e in entries] == list(range(1, 26))
    assert [e.record["cell"] for e in entries] == list(range(25))
    assert entries[5].record["outputs"] == [{"text": "é\x00é\x00"}]
    assert [e.record["cell"] for e in await store.journal("s1", after=20)] == [20, 21, 22, 23, 24]
    assert [e.record for e in await store.journal("s2")] == [{"other": i} for i in range(0, 25, 5)]
    assert await store.journal("nobody") == []


async def test_what_a_start_compares_journal_counts_session_handles_and_closed(store: Store) -> None:
    for i in range(3):
        await store.append_journal("s1", {"cell": i})
    await store.append_journal("s2", {"cell": 0})
    assert await store.journal_counts() == {"s1": 3, "s2": 1}
    await store.put_session(SessionRecord("h-alice", "alice", "/w", "", "standard"))
    await store.put_session(SessionRecord("h-anyone", None, "/w", "", "standard"))
    assert await store.session_handles() == {"h-alice", "h-anyone"}  # every owner's: a start's own look
    await store.put_session(SessionRecord("h-alice", "alice", "/w", "", "standard", closed=123.0))
    closed = await store.get_session("h-alice", owner="alice")
    assert closed is not None and closed.closed == 123.0
    # a later write never reopens it, nor changes its owner
    await store.put_session(SessionRecord("h-alice", None, "/x", "", "standard"))
    again = await store.get_session("h-alice", owner="alice")
    assert again is not None and again.closed == 123.0 and again.working_dir == "/x"
    assert await store.get_session("h-alice", owner=None) is None


async def test_concurrent_appends_from_two_connections_are_numbered_once(where: Where) -> None:
    first, second = await where.open(), await where.open()
    try:
        async def write(s: Store, name: str) -> None:
            for i in range(15):
                await s.append_journal("s1", {"by": name, "i": i})

        async with anyio.create_task_group() as tg:
            tg.start_soon(write, first, "a")
            tg.start_soon(write, second, "b")
        entries = await first.journal("s1")
        assert [e.seq for e in entries] == list(range(1, 31))
        for name in ("a", "b"):  # each writer's records in its own order
            assert [e.record["i"] for e in entries if e.record["by"] == name] == list(range(15))
    finally:
        await first.close()
        await second.close()


# --- reopen and schema ------------------------------------------------------------------------------------
async def test_reopen_after_close_keeps_everything(where: Where) -> None:
    s = await where.open()
    await s.put_session(_session("s1", gateway_kernel_id="gw-1"))
    await s.put_run(RunRecord("run-1", "s1", "alice", "finished", ANSWER))
    await s.put_run(RunRecord("run-2", "s1", "alice", "running"))
    await s.put_task(TaskRecord("t-1", "alice", "run-1", 60.0, "completed", 5.0, 6.0))
    await s.put_question(QuestionRecord("q-1", "run-2", "Name? ", answerer="alice"))
    await s.answer_question("q-1", by="alice")
    await s.put_question(QuestionRecord("q-2", "run-2", "Age? ", answerer="alice"))
    lease = await s.acquire_lease("s1", "server-a", ttl_s=60)
    assert lease is not None
    for i in range(3):
        await s.append_journal("s1", {"cell": i}, fence=Fence.of(lease))
    await s.close()
    with pytest.raises(StoreError):  # closed is closed
        await s.get_run("run-1", owner="alice")

    s = await where.open()  # the schema is there: opened again, not created again
    try:
        session = await s.get_session("s1", owner="alice")
        assert session is not None and session.gateway_kernel_id == "gw-1"
        run = await s.get_run("run-1", owner="alice")
        assert run is not None and run.state == "finished" and run.answer == ANSWER
        assert (await s.get_run("run-2", owner="alice")).state == "running"  # type: ignore[union-attr]
        assert await s.get_task("t-1", owner="alice") == TaskRecord("t-1", "alice", "run-1", 60.0, "completed", 5.0, 6.0)
        with pytest.raises(AlreadyAnswered):
            await s.answer_question("q-1", by="alice")
        assert (await s.answer_question("q-2", by="alice")).answered
        assert await s.current_lease("s1") == lease
        assert await s.append_journal("s1", {"cell": 3}, fence=Fence.of(lease)) == 4
        assert [e.record["cell"] for e in await s.journal("s1")] == [0, 1, 2, 3]
        assert await s.acquire_lease("s1", "server-b", ttl_s=1) is None
    finally:
        await s.close()


async def test_a_store_from_a_newer_kernelexec_is_refused(where: Where) -> None:
    s = await where.open()
    await s.close()
    if where.kind == "sqlite":
        with sqlite3.connect(where.state_dir / DB_NAME) as db:
            db.execute("INSERT INTO schema_version (version) VALUES (99)")
    else:
        import psycopg

        assert where.url is not None
        with psycopg.connect(where.url, autocommit=True) as conn:
            conn.execute("INSERT INTO schema_version (version) VALUES (99)")
    with pytest.raises(StoreError, match="schema version 99"):
        await where.open()


async def test_the_sqlite_store_is_private_and_in_wal_mode(tmp_path: Path) -> None:
    s = await open_store(None, tmp_path)
    try:
        assert isinstance(s, SQLiteStore) and s.path == tmp_path / "kernelexec.db"
        await s.put_run(RunRecord("run-1", "s1", None, "running"))
        for name in ("kernelexec.db", "kernelexec.db-wal"):
            assert (tmp_path / name).stat().st_mode & 0o077 == 0, name
        with sqlite3.connect(tmp_path / DB_NAME) as db:
            assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
            assert db.execute("SELECT version FROM schema_version ORDER BY version").fetchall() == [(1,), (2,), (3,), (4,), (5,), (6,)]
    finally:
        await s.close()
    assert isinstance(await open_store(f"sqlite:///{tmp_path}/other.db", tmp_path), SQLiteStore)


# --- the password is never shown --------------------------------------------------------------------------
@pytest.mark.parametrize(("url", "shown"), [
    ("postgresql://kx:hunter2@db.example:5432/kernelexec", "postgresql://kx:***@db.example:5432/kernelexec"),
    ("postgres://kx:p%40ss%3Aw0rd@10.0.0.1/k?sslmode=require", "postgres://kx:***@10.0.0.1/k?sslmode=require"),
    ("postgresql://kx@host/db?password=hunter2&sslmode=require", "postgresql://kx@host/db?password=***&sslmode=require"),
    ("postgresql://kx:hunter2@[::1]:5432/db", "postgresql://kx:***@[::1]:5432/db"),
    ("postgresql://kx:hunter2@host:notaport/db", "postgresql://kx:***@host:notaport/db"),
    ("postgresql://host/db", "postgresql://host/db"),
])
async def test_redacted_hides_a_urls_password(url: str, shown: str) -> None:
    assert redacted(url) == shown
    assert "hunter2" not in redacted(url) and "p%40ss" not in redacted(url)


def _shown(exc: BaseException) -> str:
    return str(exc) + repr(exc) + "".join(traceback.format_exception(exc))


async def test_a_postgres_password_never_appears(postgres: Postgres, caplog: pytest.LogCaptureFixture) -> None:
    from urllib.parse import unquote

    secret = unquote(postgres.password)
    forms = {secret, postgres.password}
    url = postgres.url(postgres.create_db())
    s = await open_store(url, Path("/nonexistent"))
    try:
        assert "***" in s.url and not any(f in s.url or f in repr(s) or f in str(s) for f in forms)
        await s.put_run(RunRecord("run-1", "s1", None, "running"))
        with pytest.raises(StoreError) as failed:  # a driver error during a call
            await s.put_question(QuestionRecord("q", "r", "x"))
            await s.put_question(QuestionRecord("q", "r", "x"))
        assert not any(f in _shown(failed.value) for f in forms)
    finally:
        await s.close()
    wrong = "Wr0ng-" + secrets.token_hex(4)
    bad_urls = [postgres.url(password=wrong),  # refused by the server
                f"postgresql://{PG_USER}:{wrong}@127.0.0.1:notaport/postgres",  # malformed
                f"postgresql://{PG_USER}:{wrong}@127.0.0.1:{free_port()}/postgres",  # nobody listening
                f"postgresql://{PG_USER}@127.0.0.1:{postgres.port}/postgres?password={wrong}",
                f"mysql://{PG_USER}:{wrong}@127.0.0.1/db"]  # not a store URL
    for bad in bad_urls:
        with pytest.raises(StoreError) as refused:
            await open_store(bad, Path("/nonexistent"))
        shown = _shown(refused.value)
        assert wrong not in shown, shown
        assert "***" in shown or "password=" not in shown
    assert not any(f in caplog.text for f in [*forms, wrong])


# --- SQLite under SIGKILL ---------------------------------------------------------------------------------
WRITER = textwrap.dedent("""
    import sys, anyio
    from pathlib import Path
    from kernelexec.store import Fence, RunRecord, open_store

    async def main(state_dir, tag):
        store = await open_store(None, Path(state_dir))
        lease = await store.acquire_lease(tag, tag, ttl_s=3600)
        i = 0
        while True:
            await store.put_run(RunRecord(f"{tag}-{i}", tag, "alice", "running"))
            await store.append_journal(tag, {"i": i, "pad": "x" * (i % 7) * 500}, fence=Fence.of(lease))
            await store.put_run(RunRecord(f"{tag}-{i}", tag, "alice", "finished", {"i": i}))
            print(i, flush=True)  # only after its three writes were committed
            i += 1

    anyio.run(main, sys.argv[1], sys.argv[2])
""")


@pytest.mark.slow
def test_sqlite_keeps_every_committed_record_through_50_sigkills(tmp_path: Path) -> None:
    rng = random.Random(int(os.environ.get("KERNELEXEC_TEST_SEED", "31")))
    confirmed: dict[str, int] = {}
    for kill in range(50):
        tag = f"w{kill}"
        # unbuffered: readline() below takes the first line alone. A buffered reader took every line the writer had
        # printed by then into its buffer, which communicate() (reading the pipe itself) never saw: under load the
        # writer's confirmed count came out short (82 records, 1 confirmed) and the judge failed a good store
        proc = subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path), tag], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, bufsize=0)
        first = b""
        if kill % 5:  # most kills land mid-write: after its first confirmed record, whatever the machine's load
            assert proc.stdout is not None
            first = proc.stdout.readline()
        time.sleep(rng.uniform(0.0, 0.3) if first else rng.uniform(0.05, 0.6))  # the others while it opens the store
        proc.send_signal(signal.SIGKILL)
        out, err = proc.communicate(timeout=30)
        assert proc.returncode == -signal.SIGKILL, err.decode(errors="replace")
        lines = (first + out).decode().split()
        confirmed[tag] = int(lines[-1]) + 1 if lines else 0

        with sqlite3.connect(tmp_path / DB_NAME) as db:  # the file opens and is whole
            assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"

    async def check() -> None:
        store = await open_store(None, tmp_path)
        try:
            for tag, count in confirmed.items():
                journal = await store.journal(tag)
                assert [e.record["i"] for e in journal[:count]] == list(range(count)), tag
                assert len(journal) <= count + 1  # at most the one committed after the last line printed
                for i in range(count):
                    run = await store.get_run(f"{tag}-{i}", owner="alice")
                    assert run is not None and run.state == "finished" and run.answer == {"i": i}, (tag, i)
        finally:
            await store.close()

    anyio.run(check)
    assert sum(confirmed.values()) > 200 and sum(1 for c in confirmed.values() if c) >= 30, confirmed


async def test_postgres_reconnects_after_its_connection_is_lost(postgres: Postgres) -> None:
    import psycopg

    url = postgres.url(postgres.create_db())
    s = await open_store(url, Path("/nonexistent"))
    try:
        await s.put_run(RunRecord("run-1", "s1", None, "running"))
        with psycopg.connect(url, autocommit=True) as admin:  # the server drops the store's connection
            admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'kernelexec' "
                          "AND datname = current_database()")
        with pytest.raises(StoreError) as lost:  # the call in flight fails, said plainly (never retried: was it done?)
            await s.put_run(RunRecord("run-2", "s1", None, "running"))
        assert postgres.password not in _shown(lost.value)
        await s.put_run(RunRecord("run-3", "s1", None, "running"))  # the next call has a new connection
        assert (await s.get_run("run-1", owner=None)) is not None and (await s.get_run("run-3", owner=None)) is not None
    finally:
        await s.close()
