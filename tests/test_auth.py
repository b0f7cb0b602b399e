"""Bearer-token authentication over streamable HTTP: refused without/with a wrong token, handles
bound to the token that created them, per-token limits, no unauthenticated listening beyond loopback."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from .conftest import clean_env, free_port, http_server, kernelexec_cmd

pytestmark = pytest.mark.anyio

ALICE = "alice-token-0123456789abcdef"
BOB = "bob-token-0123456789abcdef00"


@pytest.fixture(scope="module")
def server(short_tmp: Path) -> Iterator[str]:
    tokens = short_tmp / "tokens"
    tokens.write_text(f"# one per line\n{ALICE}\n{BOB}\n")
    # a warm pool as shipped: a token's sessions mostly come from it, and the owner is bound when one is taken
    with http_server(short_tmp / "auth", "--auth-token-file", str(tokens), "--max-sessions-per-token", "2",
                     "--pool-size", "1") as url:
        yield url


def client(url: str, token: str | None) -> Client:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return Client(streamable_http_client(url, http_client=httpx2.AsyncClient(headers=headers, timeout=60)))


def test_requests_without_or_with_a_wrong_token_get_401(server: str) -> None:
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
    headers = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
    assert httpx2.post(server, json=body, headers=headers).status_code == 401
    wrong = {**headers, "Authorization": "Bearer not-the-right-token-at-all"}
    assert httpx2.post(server, json=body, headers=wrong).status_code == 401


async def test_a_handle_from_another_token_is_unknown(server: str) -> None:
    async with client(server, ALICE) as alice, client(server, BOB) as bob:
        mine = await alice.call_tool("new_session", {})
        handle = mine.structured_content["session"]
        await alice.call_tool("execute_code", {"code": "secret = 'alice'", "session": handle})
        stolen = await bob.call_tool("execute_code", {"code": "secret", "session": handle})
        assert stolen.is_error and "unknown session" in stolen.content[0].text
        closed = await bob.call_tool("close_session", {"session": handle})
        assert closed.is_error
        still = await alice.call_tool("execute_code", {"code": "secret", "session": handle})
        assert still.structured_content["result"] == "alice"
        await alice.call_tool("close_session", {"session": handle})


async def test_only_the_runs_owner_may_answer_its_input_over_stateless_http(server: str) -> None:
    """A stateless 2026-07-28 HTTP client without elicitation: input() answers awaiting_input; another token's
    send_input (and get_run) finds no such run; the owner's send_input answers it."""
    async with client(server, ALICE) as alice, client(server, BOB) as bob:
        handle = (await alice.call_tool("new_session", {})).structured_content["session"]
        asked = (await alice.call_tool("execute_code", {"code": "input('pin? ')", "session": handle})).structured_content
        assert asked["ending"] == "awaiting_input" and asked["input_prompt"] == "pin? ", asked
        stolen = await bob.call_tool("send_input", {"run_id": asked["run_id"], "question_id": asked["question_id"], "text": "bob's"})
        assert stolen.is_error and "unknown run" in stolen.content[0].text
        assert (await bob.call_tool("get_run", {"run_id": asked["run_id"], "wait_s": 0})).is_error
        done = (await alice.call_tool("send_input", {"run_id": asked["run_id"], "question_id": asked["question_id"],
                                                     "text": "1234"})).structured_content
        assert done["result"] == "1234", done
        await alice.call_tool("close_session", {"session": handle})


async def test_input_is_elicited_through_input_required_over_stateless_http(server: str) -> None:
    """A stateless HTTP client that declares elicitation: the call returns an input_required result, the SDK
    client asks its callback and retries with inputResponses + the sealed requestState; the cell runs once."""
    from mcp_types import ElicitResult

    asked: list[str] = []

    async def human(context: object, params: object) -> ElicitResult:
        asked.append(params.message)  # type: ignore[attr-defined]
        return ElicitResult(action="accept", content={"answer": "Ada"})

    headers = {"Authorization": f"Bearer {ALICE}"}
    async with Client(streamable_http_client(server, http_client=httpx2.AsyncClient(headers=headers, timeout=60)),
                      elicitation_callback=human) as alice:
        handle = (await alice.call_tool("new_session", {})).structured_content["session"]
        code = "runs = globals().get('runs', 0) + 1\nname = input('Your name? ')\n(runs, name)"
        done = (await alice.call_tool("execute_code", {"code": code, "session": handle})).structured_content
        assert done["result"] == [1, "Ada"], done
        await alice.call_tool("close_session", {"session": handle})
    assert len(asked) == 1 and f"session {handle}" in asked[0] and "Your name?" in asked[0]


async def test_sessions_per_token_are_limited(server: str) -> None:
    async with client(server, BOB) as bob:
        handles = [(await bob.call_tool("new_session", {})).structured_content["session"] for _ in range(2)]
        refused = await bob.call_tool("new_session", {})
        assert refused.is_error and "max-sessions-per-token" in refused.content[0].text
        for h in handles:
            await bob.call_tool("close_session", {"session": h})
        again = await bob.call_tool("new_session", {})
        assert not again.is_error


def test_no_unauthenticated_listening_beyond_loopback(short_tmp: Path) -> None:
    proc = subprocess.run(
        kernelexec_cmd("serve", "--transport", "http", "--host", "0.0.0.0", "--port", str(free_port()),
                       "--state-dir", str(short_tmp / "open")),
        env=clean_env(), capture_output=True, text=True, timeout=60,
    )
    assert proc.returncode != 0 and "refusing to listen on 0.0.0.0 without authentication" in proc.stderr


def test_short_tokens_are_refused(short_tmp: Path) -> None:
    proc = subprocess.run(
        kernelexec_cmd("serve", "--transport", "http", "--port", str(free_port()), "--state-dir", str(short_tmp / "s")),
        env=clean_env(KERNELEXEC_AUTH_TOKEN="short"), capture_output=True, text=True, timeout=60,
    )
    assert proc.returncode != 0 and "at least 16 characters" in proc.stderr


async def test_concurrent_calls_cannot_overshoot_the_session_limits(short_tmp: Path) -> None:
    """The race: 8 stateless calls at once from one token (each would mint a session) and then 8
    concurrent new_session calls from another. Places are counted from the moment they are
    reserved, not once a kernel has started, so neither limit is passed and one token cannot lock
    everyone else out."""
    import anyio

    tokens = short_tmp / "race-tokens"
    tokens.write_text(f"{ALICE}\n{BOB}\n")
    with http_server(short_tmp / "race", "--auth-token-file", str(tokens), "--max-sessions-per-token", "2",
                     "--max-sessions", "3", "--pool-size", "0", "--restart-spares", "0") as url:
        async with client(url, ALICE) as alice, client(url, BOB) as bob:
            results: list = []

            async def stateless() -> None:
                results.append(await alice.call_tool("execute_code", {"code": "import time; time.sleep(0.5); 1"}))

            async with anyio.create_task_group() as tg:
                for _ in range(8):
                    tg.start_soon(stateless)
            ran = [r for r in results if not r.is_error]
            refused = [r for r in results if r.is_error]
            assert len(ran) == 2, [r.content[0].text for r in refused]
            assert all("max-sessions-per-token" in r.content[0].text for r in refused)
            assert len({r.structured_content["session"] for r in ran}) == 2

            minted: list = []

            async def new() -> None:
                minted.append(await bob.call_tool("new_session", {}))

            async with anyio.create_task_group() as tg:
                for _ in range(8):
                    tg.start_soon(new)
            assert sum(not r.is_error for r in minted) == 1  # 3 in all: alice's 2 and one of bob's
            assert all("limit" in r.content[0].text for r in minted if r.is_error)


async def test_a_session_of_another_token_cannot_be_forked(server: str) -> None:
    """Forks never cross owners (issue 32): another token's fork_session finds no such session, the owner's works."""
    async with client(server, ALICE) as alice, client(server, BOB) as bob:
        mine = await alice.call_tool("new_session", {})
        handle = mine.structured_content["session"]
        await alice.call_tool("execute_code", {"code": "secret = 'alice'", "session": handle})
        stolen = await bob.call_tool("fork_session", {"session": handle})
        assert stolen.is_error and "unknown session" in stolen.content[0].text
        forked = await alice.call_tool("fork_session", {"session": handle})
        assert not forked.is_error, forked.content
        fork = forked.structured_content["session"]
        assert (await alice.call_tool("execute_code", {"code": "secret", "session": fork})).structured_content["result"] == "alice"
        assert (await bob.call_tool("execute_code", {"code": "secret", "session": fork})).is_error
        for h in (handle, fork):
            await alice.call_tool("close_session", {"session": h})
