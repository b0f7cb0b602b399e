"""Nothing promised is lost with the process (issue 31): a real ``kernelexec serve`` over HTTP is killed with
SIGKILL and started again on the same state directory and store (SQLite by default, or a real PostgreSQL
through KERNELEXEC_STORE); the runs and tasks it had answer as before — a finished one with its answer, one
that was running (or waiting in input()) when the server died with an honest "lost" — and another token still
sees none of them. The store's password appears in no output of the server or of ``kernelexec config``."""

from __future__ import annotations

import signal
import sqlite3
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pytest

from .pg import Postgres, postgres
from .support import clean_env, free_port, kernelexec_cmd, wait_for_port
from .test_tasks import ALICE, BOB, Raw, assert_task
from .zygote import ForkedServer

__all__ = ["postgres"]  # the session's PostgreSQL, a fixture

pytestmark = pytest.mark.anyio


@contextmanager
def serving(state_dir: Path, tokens: Path, log: Path, **env: str) -> Iterator[tuple[str, ForkedServer]]:
    """A server on a port of its own (forked from the zygote, tests/zygote.py), its output appended to ``log``."""
    port = free_port()
    with log.open("ab") as out:
        proc = ForkedServer(["serve", "--transport", "http", "--port", str(port), "--state-dir", str(state_dir), "--auth-token-file",
                             str(tokens), "--yield-after", "1", "--restart-spares", "0", "--pool-size", "0"],
                            env=clean_env(**env), stdout=out)
    try:
        wait_for_port(port, proc)
        yield f"http://127.0.0.1:{port}/mcp", proc
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(15)


def text(result: dict[str, Any]) -> str:
    return "".join(c.get("text", "") for c in result["content"])


@pytest.fixture(params=["sqlite", "postgres"])
def store_env(request: pytest.FixtureRequest) -> dict[str, str]:
    if request.param == "sqlite":
        return {}
    pg: Postgres = request.getfixturevalue("postgres")
    return {"KERNELEXEC_STORE": pg.url(pg.create_db())}


@pytest.mark.slow
async def test_runs_and_tasks_survive_a_sigkilled_server(short_tmp: Path, store_env: dict[str, str]) -> None:
    base = Path(tempfile.mkdtemp(prefix="r", dir=short_tmp))  # short: the kernels' unix socket paths
    state, tokens, log = base / "state", base / "tokens", base / "server.log"
    tokens.write_text(f"{ALICE}\n{BOB}\n")
    with serving(state, tokens, log, **store_env) as (url, proc):
        alice, bob = Raw(url, ALICE), Raw(url, BOB)
        handle = (await alice.call("new_session"))["structuredContent"]["session"]
        # a background run, finished before the kill (its answer collected once; a restart must keep it)
        started = await alice.call("execute_code", code="result = 6 * 7", session=handle, background=True)
        finished_id = started["structuredContent"]["run_id"]
        finished = await alice.call("get_run", run_id=finished_id, wait_s=60)
        assert finished["isError"] is False and finished["structuredContent"]["result"] == 42, finished
        # a yielded run (a task over it), finished before the kill and never collected
        created = await alice.call("execute_code", code="import time\ntime.sleep(1.5)\nresult = 'task done'", session=handle)
        assert_task(created, "task", "working")
        done_task = await alice.until(created["taskId"], "completed")
        # a run still going, and a task over one, when the server dies
        going = (await alice.call("execute_code", code="import time\ntime.sleep(600)", session=handle,
                                  background=True))["structuredContent"]["run_id"]
        other = (await alice.call("new_session"))["structuredContent"]["session"]
        waiting = (await alice.call("execute_code", code="name = input('Name? ')", session=other,
                                    background=True))["structuredContent"]["run_id"]
        asked = await Raw(url, ALICE, elicitation=False).call("get_run", run_id=waiting, wait_s=30)
        assert asked["structuredContent"]["ending"] == "awaiting_input", asked
        third = (await alice.call("new_session"))["structuredContent"]["session"]
        lost_task = await alice.call("execute_code", code="import time\ntime.sleep(600)", session=third)
        assert_task(lost_task, "task", "working")
        proc.send_signal(signal.SIGKILL)
        proc.wait(15)

    with serving(state, tokens, log, **store_env) as (url, proc):
        alice, bob = Raw(url, ALICE), Raw(url, BOB)
        again = await alice.call("get_run", run_id=finished_id, wait_s=0)
        assert again["isError"] is False and again["structuredContent"] == finished["structuredContent"], again
        assert again["content"] == finished["content"]
        task = await alice.result("tasks/get", {"taskId": created["taskId"]})
        assert_task(task, "complete", "completed")
        assert task["result"] == done_task["result"] and task["result"]["structuredContent"]["result"] == "task done"
        assert task["createdAt"] == created["createdAt"]

        for run_id in (going, waiting):
            lost = await alice.call("get_run", run_id=run_id, wait_s=0)
            assert lost["isError"] is True and "was lost" in text(lost) and "unknown" not in text(lost), lost
        refused = await Raw(url, ALICE, elicitation=False).call("send_input", run_id=waiting, text="Ada",
                                                                question_id=asked["structuredContent"]["question_id"])
        assert refused["isError"] is True and "was lost" in text(refused) and "cannot be answered" in text(refused), refused
        gone = await alice.result("tasks/get", {"taskId": lost_task["taskId"]})
        assert_task(gone, "complete", "completed")
        assert gone["result"]["isError"] is True and "was lost" in gone["result"]["content"][0]["text"], gone
        assert (await alice.result("tasks/cancel", {"taskId": lost_task["taskId"]}))["resultType"] == "complete"

        # another token: none of them exist
        for run_id in (finished_id, going, waiting):
            unknown = await bob.call("get_run", run_id=run_id, wait_s=0)
            assert unknown["isError"] is True and "unknown run" in text(unknown), unknown
        for task_id in (created["taskId"], lost_task["taskId"]):
            assert (await bob.send("tasks/get", {"taskId": task_id}))["error"]["code"] == -32602
        assert "unknown run" in text(await alice.call("get_run", run_id="run-never-was", wait_s=0))

        # the session itself goes on (revived) in the new server
        after = await alice.call("execute_code", code="result = 1 + 1", session=handle)
        if after.get("resultType") == "task":  # reviving the session's kernel may take longer than --yield-after
            after = (await alice.until(after["taskId"], "completed", within=90))["result"]
        assert after.get("isError") is not True and after["structuredContent"]["result"] == 2, after
        if not store_env:  # the host rule: the store is out of the kernel's reach (its file, its directory)
            db = state / "kernelexec.db"
            probe = await alice.call("execute_code", session=handle, code=(
                "import os\nseen = []\n"
                f"for p in ({str(db)!r}, {str(db) + '-wal'!r}):\n"
                "    try:\n        open(p, 'rb').read(16); seen.append(p)\n    except Exception as e:\n        seen.append(type(e).__name__)\n"
                "result = seen"))
            assert probe.get("isError") is not True and str(db) not in probe["structuredContent"]["result"], probe

    shown = log.read_text(errors="replace")
    assert "kernelexec: MCP over streamable HTTP" in shown  # the log is the servers' output
    assert (state / "kernelexec.db").exists() is not bool(store_env)  # the store the server used: SQLite, or PostgreSQL
    if store_env:
        secret = store_env["KERNELEXEC_STORE"].split("//", 1)[1].split("@", 1)[0].split(":", 1)[1]
        assert secret not in shown and unquote(secret) not in shown
        config = subprocess.run(kernelexec_cmd("config", "--store", store_env["KERNELEXEC_STORE"]), env=clean_env(),
                                capture_output=True, text=True, timeout=60)
        assert config.returncode == 0 and '"store": "**********"' in config.stdout, config
        assert secret not in config.stdout + config.stderr and unquote(secret) not in config.stdout + config.stderr
        wrong = store_env["KERNELEXEC_STORE"].replace(secret, "Wr0ngPassw0rd")  # the server refuses it: serve exits
        refused = subprocess.run(kernelexec_cmd("serve", "--state-dir", str(base / "other"), "--store", wrong), env=clean_env(),
                                 stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)
        assert refused.returncode == 1 and "kernelexec: cannot open the store" in refused.stderr, refused.stderr
        assert "Wr0ngPassw0rd" not in refused.stdout + refused.stderr and "Traceback" not in refused.stderr


@pytest.mark.slow
async def test_a_run_going_when_the_server_is_stopped_answers_lost_after_the_restart(short_tmp: Path) -> None:
    """SIGTERM: the server drains (server/drain.py); the run still going at --drain-timeout is recorded lost by the
    stopping server itself, and the next server says so."""
    base = Path(tempfile.mkdtemp(prefix="r", dir=short_tmp))
    state, tokens, log = base / "state", base / "tokens", base / "server.log"
    tokens.write_text(f"{ALICE}\n{BOB}\n")
    with serving(state, tokens, log, KERNELEXEC_DRAIN_TIMEOUT="2") as (url, proc):
        alice = Raw(url, ALICE)
        handle = (await alice.call("new_session"))["structuredContent"]["session"]
        going = (await alice.call("execute_code", code="import time\nprint('begun', flush=True)\ntime.sleep(600)", session=handle,
                                  background=True))["structuredContent"]["run_id"]
        seen = await Raw(url, ALICE, elicitation=False).call("get_run", run_id=going, wait_s=1)
        assert seen["structuredContent"]["ending"] == "running", seen
        proc.terminate()
        assert proc.wait(30) == 0  # drained and stopped cleanly (uvicorn no longer raises the signal again)
    with sqlite3.connect(state / "kernelexec.db") as db:  # recorded by the stopping server, not left "running"
        assert db.execute("SELECT state FROM runs WHERE id = ?", (going,)).fetchall() == [("lost",)]
    with serving(state, tokens, log) as (url, proc):
        lost = await Raw(url, ALICE).call("get_run", run_id=going, wait_s=0)
        assert lost["isError"] is True and "was lost" in text(lost), lost
