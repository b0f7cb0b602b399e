"""The journal in the session store (issue 31): every recorded cell goes into the store's journal first, in order,
then journal.jsonl and notebook.ipynb follow; a restarted server writes the files again from the store when they
are behind it; sessions are revived from the store's record, never from a session.json. A real ``kernelexec
serve`` over HTTP, real kernels, SQLite or a real PostgreSQL (tests/pg.py)."""

from __future__ import annotations

import json
import signal
import tempfile
from pathlib import Path
from typing import Any

import nbformat
import pytest

from kernelexec.server.auth import principal_id
from kernelexec.store import open_store

from .pg import Postgres, postgres
from .test_restart import serving, text
from .test_tasks import ALICE, BOB, Raw
from .zygote import ForkedServer

__all__ = ["postgres"]

pytestmark = pytest.mark.anyio


@pytest.fixture(params=["sqlite", "postgres"])
def store_env(request: pytest.FixtureRequest) -> dict[str, str]:
    if request.param == "sqlite":
        return {}
    pg: Postgres = request.getfixturevalue("postgres")
    return {"KERNELEXEC_STORE": pg.url(pg.create_db())}


async def stored_journal(state: Path, store_env: dict[str, str], handle: str) -> list[dict[str, Any]]:
    store = await open_store(store_env.get("KERNELEXEC_STORE"), state)
    try:
        entries = await store.journal(handle)
    finally:
        await store.close()
    assert [e.seq for e in entries] == list(range(1, len(entries) + 1))
    return [e.record for e in entries]


def file_journal(session_dir: Path) -> list[dict[str, Any]]:
    if not (session_dir / "journal.jsonl").exists():
        return []
    return [json.loads(line) for line in (session_dir / "journal.jsonl").read_text().splitlines()]


def notebook_cells(session_dir: Path) -> list[dict[str, Any]]:
    nb = nbformat.read(session_dir / "notebook.ipynb", as_version=4)
    nbformat.validate(nb)
    return [dict(c) for c in nb.cells]


def sources(cells: list[dict[str, Any]]) -> list[str]:
    return [c["source"] for c in cells]


async def answered(client: Raw, result: dict[str, Any]) -> dict[str, Any]:
    if result.get("resultType") == "task":  # a revival may take longer than --yield-after
        result = (await client.until(result["taskId"], "completed", within=90))["result"]
    return result


@pytest.mark.slow
@pytest.mark.own_store  # on SQLite and on PostgreSQL by its own parameter: its twin in tests/on_postgres/ would repeat both
async def test_every_cell_is_in_the_store_journal_and_the_files_follow_it(short_tmp: Path, store_env: dict[str, str]) -> None:
    base = Path(tempfile.mkdtemp(prefix="j", dir=short_tmp))
    state, tokens, log = base / "state", base / "tokens", base / "server.log"
    tokens.write_text(f"{ALICE}\n{BOB}\n")
    with serving(state, tokens, log, **store_env) as (url, proc):
        alice = Raw(url, ALICE)
        handle = (await alice.call("new_session"))["structuredContent"]["session"]
        for code in ("x = 1", "print('two')", "1 / 0"):
            await answered(alice, await alice.call("execute_code", code=code, session=handle))
        await alice.call("restart_session", session=handle)
        await answered(alice, await alice.call("execute_code", code="y = 4", session=handle))
        session_dir = state / "sessions" / handle
        stored = await stored_journal(state, store_env, handle)
        want = ["x = 1", "print('two')", "1 / 0", "*kernelexec: kernel restarted by restart_session; variables cleared*", "y = 4"]
        assert sources(stored) == want, stored
        assert stored[1]["outputs"][0]["text"] == "two\n" and stored[2]["outputs"][0]["ename"] == "ZeroDivisionError"
        assert file_journal(session_dir) == stored  # the same records, the same order
        assert [{k: v for k, v in c.items() if k != "id"} for c in notebook_cells(session_dir)] == \
            [{**c, "metadata": c["metadata"]} for c in stored]
        proc.send_signal(signal.SIGKILL)
        proc.wait(15)

    # the files fall behind the store (a host crash loses the unsynced tail of journal.jsonl; a kill tears the
    # notebook): the next start writes both again from the store
    lines = (session_dir / "journal.jsonl").read_text().splitlines(keepends=True)
    (session_dir / "journal.jsonl").write_text("".join(lines[:2]) + lines[2][:15])
    (session_dir / "notebook.ipynb").write_bytes((session_dir / "notebook.ipynb").read_bytes()[:-40])
    with serving(state, tokens, log, **store_env) as (url, proc):
        alice = Raw(url, ALICE)
        assert sources(file_journal(session_dir)) == want
        assert sources(notebook_cells(session_dir)) == want
        # revived from the store's record; the restore reruns what followed the restart
        after = await answered(alice, await alice.call("execute_code", code="result = y * 10", session=handle))
        assert after.get("isError") is not True and after["structuredContent"]["result"] == 40, after
    stored = await stored_journal(state, store_env, handle)
    assert sources(stored)[:5] == want and sources(stored)[-1] == "result = y * 10"
    assert file_journal(session_dir) == stored and sources(notebook_cells(session_dir)) == sources(stored)


@pytest.mark.slow
async def test_revival_trusts_the_store_not_session_json(short_tmp: Path) -> None:
    """session.json is the server's own file (not kernel-writable, layout.py), but the server no longer takes an
    owner or a working directory from it: a session.json rewritten to hand the session to another token, or
    one left for a handle the store never had, revives nothing. The store is the run's (tests/on_postgres/)."""
    from .support import store_env

    base = Path(tempfile.mkdtemp(prefix="t", dir=short_tmp))
    state, tokens, log = base / "state", base / "tokens", base / "server.log"
    tokens.write_text(f"{ALICE}\n{BOB}\n")
    on_store = store_env()  # one database for both servers
    with serving(state, tokens, log, **on_store) as (url, proc):
        alice = Raw(url, ALICE)
        handle = (await alice.call("new_session"))["structuredContent"]["session"]
        await answered(alice, await alice.call("execute_code", code="secret = 'alice'", session=handle))
        closed = (await alice.call("new_session"))["structuredContent"]["session"]
        await alice.call("close_session", session=closed)
        proc.send_signal(signal.SIGKILL)
        proc.wait(15)
    store = await open_store(on_store.get("KERNELEXEC_STORE"), state)
    try:
        record = await store.get_session(handle, owner=None)
        assert record is None  # alice's: nobody else's
        record = await store.get_session(handle, owner="x")
        assert record is None
        assert {handle, closed} <= await store.session_handles()
        owners = {r.handle: r for r in await store.list_sessions(owner=None)}  # owned by alice: not listed for None
        assert handle not in owners and closed not in owners
    finally:
        await store.close()
    meta_file = state / "sessions" / handle / "session.json"
    meta = json.loads(meta_file.read_text())
    owner = meta["owner"]
    assert owner is not None
    # hand it to bob, and reopen the closed one, in the files only
    bob_owner = principal_id(BOB)
    assert owner == principal_id(ALICE)
    meta_file.write_text(json.dumps({**meta, "owner": bob_owner}))
    closed_file = state / "sessions" / closed / "session.json"
    closed_meta = json.loads(closed_file.read_text())
    assert closed_meta.pop("closed", None)
    closed_file.write_text(json.dumps(closed_meta))
    with serving(state, tokens, log, **on_store) as (url, proc):
        alice, bob = Raw(url, ALICE), Raw(url, BOB)
        refused = await bob.call("execute_code", code="result = secret", session=handle)
        assert refused["isError"] is True and "unknown" in text(refused), refused
        still = await answered(alice, await alice.call("execute_code", code="result = secret", session=handle))
        assert still.get("isError") is not True and still["structuredContent"]["result"] == "alice", still
        gone = await alice.call("execute_code", code="result = 1", session=closed)
        assert gone["isError"] is True and "unknown" in text(gone), gone


# --- crash-safe: SIGKILL at random points, in a loop ------------------------------------------------------
KILLS = 50


answered_ = answered  # (the name ``answered`` is the test's list below)


def _subsequence(wanted: list[str], found: list[str]) -> bool:
    it = iter(found)
    return all(any(w == f for f in it) for w in wanted)


async def _cells_until_killed(url: str, handle: str, prefix: str, answered: list[str]) -> None:
    client = Raw(url, ALICE)
    for j in range(10_000):
        code = f"{prefix}_{j} = {j}"
        try:
            result = await answered_(client, await client.call("execute_code", code=code, session=handle))
        except Exception:  # noqa: BLE001 - the server is gone: this answer never came
            return
        if result.get("isError") is not True and result.get("structuredContent", {}).get("success") is True:
            answered.append(code)


def _check_files(session_dir: Path, answered: list[str]) -> None:
    assert _subsequence(answered, sources(file_journal(session_dir)))
    assert _subsequence(answered, sources(notebook_cells(session_dir)))  # valid nbformat (notebook_cells validates)


# Every round's server is forked from this process's zygote (tests/zygote.py), a process that did kernelexec's imports
# once: a fresh process running the real ``kernelexec serve`` (cli.main, as ``python -m kernelexec`` does), killed with
# SIGKILL like any. Only the imports are not paid again: started afresh, 50 servers cost ~65 s of CPU in them.
class Forked:
    """One round's server, serving HTTP on a port of its own once ``go`` returns; its output appended to ``log``."""

    def __init__(self, state: Path, tokens: Path, log: Path, store: dict[str, str]) -> None:
        from .support import clean_env, free_port

        self.port = free_port()
        with log.open("ab") as out:
            self.process = ForkedServer(["serve", "--transport", "http", "--port", str(self.port), "--state-dir", str(state),
                                         "--auth-token-file", str(tokens), "--yield-after", "1", "--restart-spares", "0",
                                         "--pool-size", "0"], env=clean_env(**store), stdout=out)

    def go(self) -> str:
        from .support import wait_for_port

        wait_for_port(self.port, self.process, timeout=120)
        return f"http://127.0.0.1:{self.port}/mcp"

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(15)  # TimeoutExpired: it outlived SIGKILL by 15 s


@pytest.mark.slow
@pytest.mark.timeout(900)
async def test_sigkill_at_random_points_loses_no_answered_cell(short_tmp: Path) -> None:
    """At least 50 SIGKILLs of a real server: during a cell, an answer, a journal or notebook write, a revival (every
    fifth kill lands while the revived kernel is being refilled). After each kill the store opens (SQLite's
    integrity check) and holds every cell whose answer the client received, in order; after each restart the
    journal file and the notebook hold them too, and the notebook is valid nbformat. The store is the run's
    (in tests/on_postgres/, or with ``--store postgres``: a database of the real PostgreSQL, so servers writing to it
    are killed)."""
    import random
    import sqlite3

    import anyio

    from .support import store_env

    rng = random.Random(31)
    base = Path(tempfile.mkdtemp(prefix="k", dir=short_tmp))
    state, tokens, log = base / "state", base / "tokens", base / "server.log"
    tokens.write_text(f"{ALICE}\n")
    answered: list[str] = []
    handle = ""
    kills = 0
    store = store_env()  # one database for every server of this test
    while kills < KILLS:
        server = Forked(state, tokens, log, store)
        try:
            url = server.go()
            alice = Raw(url, ALICE)
            if not handle:
                handle = (await alice.call("new_session"))["structuredContent"]["session"]
            session_dir = state / "sessions" / handle
            _check_files(session_dir, answered)  # the start reconciled the files with the store
            async with anyio.create_task_group() as tg:
                if kills % 5 == 4:  # killed while the session is revived (a kernel started, the journal rerun)
                    tg.start_soon(_cells_until_killed, url, handle, f"r{kills}", answered)
                else:  # killed among cells and answers, once the revived kernel answered one
                    warm = await answered_(alice, await alice.call("execute_code", code=f"w{kills} = 0", session=handle))
                    assert warm.get("isError") is not True, warm
                    answered.append(f"w{kills} = 0")
                    tg.start_soon(_cells_until_killed, url, handle, f"c{kills}", answered)
                await anyio.sleep(rng.uniform(0, 0.3))
                server.kill()
                kills += 1
        finally:
            server.kill()
        opened = await open_store(store.get("KERNELEXEC_STORE"), state)  # it opens; it has every answered cell
        try:
            stored = sources([e.record for e in await opened.journal(handle)])
        finally:
            await opened.close()
        if not store:
            with sqlite3.connect(state / "kernelexec.db") as db:
                assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        assert _subsequence(answered, stored), (kills, [a for a in answered if a not in stored])
    last = Forked(state, tokens, log, store)
    try:
        last.go()
        _check_files(state / "sessions" / handle, answered)
    finally:
        last.kill()
    assert len(answered) > KILLS, answered  # the kills landed among answered cells, not only before them
