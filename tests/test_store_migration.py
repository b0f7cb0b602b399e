"""Migration (issue 31): a state directory written by the last release without a store is imported into the store
on the first start of this one, nothing lost, and revival, ``restart_session(replay=true)`` and ``kernelexec replay
SESSION_DIR`` keep working on it.

tests/fixtures/state-de0c71b/ was written by the real server of commit de0c71b (the last release), not by this
code: ``git worktree add --detach /tmp/kx-old de0c71b``, then ``PYTHONPATH=/tmp/kx-old python -m kernelexec.cli serve
--transport http --auth-token-file <ALICE, BOB> --pool-size 0 --restart-spares 0`` driven over HTTP by
tests/test_tasks.Raw: alice's session ran ``x = 20``, a print, ``y = x + 1; y``, ``1 / 0``, restart_session,
``x = 40``, ``import numpy``, ``z = x + 2``; bob's ran ``mine = 'bob'``; a third of alice's ran ``gone = 1`` and was
closed. The server was stopped (SIGTERM) and each session's session.json, journal.jsonl and notebook.ipynb kept
(there was no kernelexec.db). HANDLES names the three."""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
from pathlib import Path

import nbformat
import pytest

from kernelexec.server.auth import principal_id
from kernelexec.store import open_store

from .support import clean_env, kernelexec_cmd
from .test_restart import serving, text
from .test_store_journal import answered, file_journal, sources
from .test_tasks import ALICE, BOB, Raw

pytestmark = pytest.mark.anyio

FIXTURE = Path(__file__).parent / "fixtures" / "state-de0c71b"


@pytest.mark.slow
async def test_a_state_dir_of_the_last_release_is_imported_and_keeps_working(short_tmp: Path) -> None:
    handles = dict(line.split() for line in (FIXTURE / "HANDLES").read_text().splitlines())
    alice_h, bob_h, closed_h = handles["alice"], handles["bob"], handles["closed"]
    base = Path(tempfile.mkdtemp(prefix="m", dir=short_tmp))
    state, tokens, log = base / "state", base / "tokens", base / "server.log"
    shutil.copytree(FIXTURE / "sessions", state / "sessions")
    tokens.write_text(f"{ALICE}\n{BOB}\n")
    before = {h: file_journal(state / "sessions" / h) for h in handles.values()}
    assert not (state / "kernelexec.db").exists() and len(before[alice_h]) == 8

    with serving(state, tokens, log) as (url, proc):
        alice, bob = Raw(url, ALICE), Raw(url, BOB)
        # imported: every cell, in order, as it was; each session's record with its owner; the closed one closed
        store = await open_store(None, state)
        try:
            for h, cells in before.items():
                assert [e.record for e in await store.journal(h)] == cells, h
            a = await store.get_session(alice_h, owner=principal_id(ALICE))
            b = await store.get_session(bob_h, owner=principal_id(BOB))
            c = await store.get_session(closed_h, owner=principal_id(ALICE))
            assert a is not None and a.closed is None and a.profile == "standard" and a.working_dir.endswith("/work")
            assert json.loads(a.environment)["version"], a
            assert b is not None and b.closed is None and c is not None and c.closed is not None
            assert await store.get_session(alice_h, owner=principal_id(BOB)) is None
        finally:
            await store.close()
        # the notebook materialised from the journal, in this release's form (the old one was written by nbformat)
        nb = nbformat.read(state / "sessions" / alice_h / "notebook.ipynb", as_version=4)
        nbformat.validate(nb)
        assert [c.source for c in nb.cells] == sources(before[alice_h])
        assert [c.get("outputs") for c in nb.cells] == [c.get("outputs") for c in before[alice_h]]

        # revival: the cells since the last restart rerun in a new kernel
        z = await answered(alice, await alice.call("execute_code", code="result = (x, z)", session=alice_h))
        assert z.get("isError") is not True and z["structuredContent"]["result"] == [40, 42], json.dumps(z)[:3000]
        mine = await answered(bob, await bob.call("execute_code", code="result = mine", session=bob_h))
        assert mine.get("isError") is not True and mine["structuredContent"]["result"] == "bob", mine
        assert "unknown" in text(await bob.call("execute_code", code="result = 1", session=alice_h))
        assert "unknown" in text(await alice.call("execute_code", code="result = 1", session=closed_h))
        # restart_session(replay=true): the same cells again
        replayed = await alice.call("restart_session", session=alice_h, replay=True)
        assert replayed.get("isError") is not True, replayed
        again = await answered(alice, await alice.call("execute_code", code="result = z + 1", session=alice_h))
        assert again["structuredContent"]["result"] == 43, again

    after = file_journal(state / "sessions" / alice_h)
    assert after[:8] == before[alice_h]  # the release's cells first, unchanged; this server's after them
    assert sources(after)[-1] == "result = z + 1" and any("revived" in s for s in sources(after))
    nb = nbformat.read(state / "sessions" / alice_h / "notebook.ipynb", as_version=4)
    nbformat.validate(nb)
    assert [c.source for c in nb.cells] == sources(after)
    # a second start imports nothing twice
    with serving(state, tokens, log) as (url, proc):
        store = await open_store(None, state)
        try:
            assert [e.record for e in await store.journal(alice_h)] == after
        finally:
            await store.close()

    # kernelexec replay SESSION_DIR, on the release's own directory (a copy, as it was) and on the one this server wrote
    for session_dir in (FIXTURE / "sessions" / alice_h, state / "sessions" / alice_h):
        work = Path(tempfile.mkdtemp(prefix="rp", dir=short_tmp))
        copy = work / alice_h
        copy.mkdir()
        for name in ("session.json", "journal.jsonl", "notebook.ipynb"):
            shutil.copy(session_dir / name, copy / name)
        proc = subprocess.run(kernelexec_cmd("replay", str(copy), "--state-dir", str(work / "s"), "--pool-size", "0"),
                              env=clean_env(), capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
