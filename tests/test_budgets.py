"""Budgets, attacked from outside: a real ``kernelexec serve --transport http`` process, real SDK clients speaking
2026-07-28 (stateless: no Mcp-Session-Id), real kernels. Everything a caller can create has a limit with a clear
error, and a failed call gives back what was reserved for it (docs/budgets.md, Budgets)."""

from __future__ import annotations

from pathlib import Path

import anyio
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from .conftest import http_server
from .support import served

pytestmark = pytest.mark.anyio

ALICE = "alice-token-0123456789abcdef"
BOB = "bob-token-0123456789abcdef00"
QUIET = ("--pool-size", "0", "--restart-spares", "0")


def client(url: str, token: str) -> Client:
    return Client(streamable_http_client(url, http_client=httpx2.AsyncClient(
        headers={"Authorization": f"Bearer {token}"}, timeout=120)))


@pytest.fixture
def tokens(short_tmp: Path) -> Path:
    path = short_tmp / "tokens"
    path.write_text(f"{ALICE}\n{BOB}\n")
    return path


def server_rss_kib(pid: int) -> int:
    """The resident memory of the server process ``pid`` (not its kernels)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError(f"no VmRSS for {pid}")


async def test_a_flood_of_background_runs_stops_at_the_run_budgets(short_tmp: Path, tokens: Path) -> None:
    """Background runs of 1 MB code, queued behind a sleeping cell: the session takes 16
    (--max-queued-runs-per-session, its default), then every other is refused naming the flag; the token's
    runs over several sessions stop at 32 (--max-queued-runs-per-token); the server's memory does not grow
    with the refused ones. Before the budgets all 100 were accepted (about +1 MB of server memory each)."""
    state = short_tmp / "flood"
    with served(state, "--auth-token-file", str(tokens), *QUIET) as server:
        async with client(server.url, ALICE) as alice:
            handle = (await alice.call_tool("new_session", {})).structured_content["session"]
            blocker = await alice.call_tool("execute_code", {"code": "import time; time.sleep(120)", "session": handle,
                                                             "background": True})
            assert not blocker.is_error, blocker.content
            big = "x = 1\n" + "#" * (1_000_000 - 16) + "\n"
            before = server_rss_kib(server.process.pid)
            accepted, refused = 1, []
            for _ in range(100):
                result = await alice.call_tool("execute_code", {"code": big, "session": handle, "background": True})
                if result.is_error:
                    refused.append(result.content[0].text)
                else:
                    accepted += 1
            grown_mib = (server_rss_kib(server.process.pid) - before) / 1024
            assert accepted == 16, (accepted, refused[:1])
            assert len(refused) == 85 and all("--max-queued-runs-per-session" in r for r in refused), refused[:1]
            assert grown_mib < 60, f"the server grew by {grown_mib:.0f} MiB for 100 attempted 1 MB runs"

            # the token's budget, over more sessions: 16 already queued here, 16 more in a second session, then no more
            others = [(await alice.call_tool("new_session", {})).structured_content["session"] for _ in range(2)]
            answers = [await alice.call_tool("execute_code", {"code": "import time; time.sleep(120)", "session": h,
                                                              "background": True}) for h in others for _ in range(10)]
            assert sum(not a.is_error for a in answers) == 16, [a.content[0].text for a in answers if a.is_error][:1]
            assert all("--max-queued-runs-per-token" in a.content[0].text for a in answers if a.is_error)

            async with client(server.url, BOB) as bob:  # another token is not held up by alice's budget
                done = await bob.call_tool("execute_code", {"code": "6 * 7"})
                assert not done.is_error and done.structured_content["result"] == 42, done.content
            # (the sessions' queues end with the server: closing one waits for its queued cells)



async def test_stateless_calls_that_fail_give_their_session_back(short_tmp: Path, tokens: Path) -> None:
    """Over stateless HTTP each call without a handle gets a fresh session. 20 calls whose working_dir is bad
    (absolute and missing, relative and missing), or whose cell is refused before it runs (a bare pip line),
    must not keep those sessions: afterwards the other token, and alice herself, still get one. Before,
    the first two failed calls held both places of --max-sessions 2 for good, and every later call was refused."""
    with http_server(short_tmp / "stateless", "--auth-token-file", str(tokens), "--max-sessions", "2",
                     "--max-sessions-per-token", "2", *QUIET) as url:
        async with client(url, ALICE) as alice:
            bad = [{"working_dir": "/no/such/dir"}, {"working_dir": "no-such-subdir"}, {"background": True,
                                                                                        "working_dir": "/no/such/dir"}]
            for i in range(18):
                result = await alice.call_tool("execute_code", {"code": "1", **bad[i % 3]})
                assert result.is_error and "working_dir" in result.content[0].text, result.content
            for _ in range(2):
                result = await alice.call_tool("execute_code", {"code": "%pip install\n1"})
                assert result.is_error and "pip install" in result.content[0].text, result.content
            async with client(url, BOB) as bob:
                done = await bob.call_tool("execute_code", {"code": "6 * 7"})
                assert not done.is_error and done.structured_content["result"] == 42, done.content
            mine = await alice.call_tool("execute_code", {"code": "'still served'"})
            assert not mine.is_error and mine.structured_content["result"] == "still served", mine.content


async def test_stateless_calls_that_run_no_code_hold_no_session(short_tmp: Path, tokens: Path) -> None:
    """The tools that run no code, over stateless HTTP without a handle: interrupt, list_variables and
    restart_session name no session and are refused without making one; install_packages that fails (a bad
    spec) gives its fresh session back. 30 such calls, then the other token and alice still get a session of
    --max-sessions 2 (before, each of them made a session that held its place for good)."""
    with http_server(short_tmp / "nocode", "--auth-token-file", str(tokens), "--max-sessions", "2",
                     "--max-sessions-per-token", "2", *QUIET) as url:
        async with client(url, ALICE) as alice:
            for _ in range(8):
                for tool in ("interrupt", "list_variables", "restart_session"):
                    result = await alice.call_tool(tool, {})
                    assert result.is_error and "session handle" in result.content[0].text, (tool, result.content)
            for i in range(6):
                result = await alice.call_tool("install_packages", {"packages": [f"not a valid spec {i} !!"]})
                assert result.is_error, result.content
            async with client(url, BOB) as bob:
                done = await bob.call_tool("execute_code", {"code": "6 * 7"})
                assert not done.is_error and done.structured_content["result"] == 42, done.content
            mine = await alice.call_tool("execute_code", {"code": "'still served'"})
            assert not mine.is_error and mine.structured_content["result"] == "still served", mine.content


@pytest.mark.slow
async def test_one_tokens_quick_runs_do_not_evict_anothers_unread_result(short_tmp: Path, tokens: Path) -> None:
    """Finished runs are kept for get_run per token: bob's finished, unread background run survives alice's 250
    quick ones. Before, the 200 kept runs were one pool for all tokens and bob's run was gone ("unknown run")."""
    with http_server(short_tmp / "evict", "--auth-token-file", str(tokens), *QUIET) as url:
        async with client(url, ALICE) as alice, client(url, BOB) as bob:
            bobs = (await bob.call_tool("new_session", {})).structured_content["session"]
            started = await bob.call_tool("execute_code", {"code": "'bob-result'", "session": bobs, "background": True})
            run_id = started.structured_content["run_id"]
            handle = (await alice.call_tool("new_session", {})).structured_content["session"]
            quick: list[str] = []
            while len(quick) < 250:  # in batches under the session's run budget, each batch waited for
                batch = [(await alice.call_tool("execute_code", {"code": "1", "session": handle, "background": True}))
                         for _ in range(min(10, 250 - len(quick)))]
                assert not any(b.is_error for b in batch), batch[0].content
                ids = [b.structured_content["run_id"] for b in batch]
                for rid in ids:
                    got = await alice.call_tool("get_run", {"run_id": rid, "wait_s": 60})
                    assert not got.is_error and got.structured_content["ending"] != "running", got.content
                quick += ids
            first = await alice.call_tool("get_run", {"run_id": quick[0], "wait_s": 0})
            assert first.is_error and "unknown run" in first.content[0].text  # alice's own pool is still bounded
            answer = await bob.call_tool("get_run", {"run_id": run_id, "wait_s": 30})
            assert not answer.is_error, answer.content
            assert answer.structured_content["result"] == "bob-result", answer.structured_content
            with anyio.fail_after(30):
                await alice.call_tool("close_session", {"session": handle})
                await bob.call_tool("close_session", {"session": bobs})
