"""Code mode's upstream connections are per token (issue 30, invariant 5).

Two bearer tokens over streamable HTTP call a stateful upstream (tests/codemode_upstream.py's remember/recall):
each sees only its own state, checked in the upstream's own log (one process per connection). A broker's
budgets close the oldest idle connection, and a token's idle connection is released (its process ends); the
one set of a server without tokens is kept.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from kernelexec.codemode.broker import Broker, Limits
from kernelexec.codemode.config import Upstream

from .support import http_server

pytestmark = pytest.mark.anyio

UPSTREAM = Path(__file__).resolve().parent / "codemode_upstream.py"
ALICE = "alice-token-0123456789abcdef"
BOB = "bob-token-0123456789abcdef00"


@pytest.fixture(scope="module")
def config_dir() -> Iterator[Path]:
    """Outside every work root and session directory: no kernel can write it."""
    with tempfile.TemporaryDirectory(prefix="kxtok") as folder:
        yield Path(folder)


def client(url: str, token: str) -> Client:
    return Client(streamable_http_client(url, http_client=httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"},
                                                                             timeout=60)))


async def run(c: Client, code: str) -> Any:
    answer = await c.call_tool("execute_code", {"code": code})
    s: Any = answer.structured_content
    assert s is not None and s["success"], answer.content
    return s["result"]


async def test_two_tokens_see_separate_state_in_a_stateful_upstream(short_tmp: Path, config_dir: Path) -> None:
    log = config_dir / "state.log"
    config = config_dir / "tools.json"
    config.write_text(json.dumps({"mcpServers": {"local": {
        "command": sys.executable, "args": [str(UPSTREAM), "stdio", "local"], "env": {"STATE_LOG": str(log)}}}}))
    tokens = config_dir / "tokens"
    tokens.write_text(f"{ALICE}\n{BOB}\n")
    with http_server(short_tmp / "pertoken", "--auth-token-file", str(tokens), "--tools-config", str(config),
                     "--pool-size", "0", "--restart-spares", "0") as url:
        async with client(url, ALICE) as alice, client(url, BOB) as bob:
            assert await run(alice, "import mcp_tools\nmcp_tools.local.remember(value='alice-private-note')") == 1
            bobs = await run(bob, "import mcp_tools\nmcp_tools.local.recall()")
            assert bobs == [], f"bob's cell sees what alice's left in the upstream: {bobs}"
            assert await run(bob, "import mcp_tools\nmcp_tools.local.remember(value='bob-note')") == 1
            assert await run(alice, "import mcp_tools\nmcp_tools.local.recall()") == ["alice-private-note"]
    lines = [line.split(" ", 1) for line in log.read_text().splitlines()]
    pids = {pid for pid, _ in lines}
    assert len(pids) == 2, lines  # one upstream process (connection) per token
    by_pid: dict[str, list[str]] = {}
    for pid, said in lines:
        by_pid.setdefault(pid, []).append(said)
    assert sorted(by_pid.values()) == sorted([["remember alice-private-note", "recall alice-private-note"],
                                              ["recall ", "remember bob-note"]]), by_pid


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


async def _gone(pid: int, timeout: float = 15) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if not _alive(pid):
            return True
        await anyio.sleep(0.1)
    return False


async def test_budgets_close_the_oldest_idle_connection_and_idle_ones_are_released() -> None:
    upstreams = [Upstream(name=n, kind="stdio", source="test", command=sys.executable, args=(str(UPSTREAM), "stdio", n))
                 for n in ("a", "b")]
    broker = Broker(upstreams, limits=Limits(connections_per_token=1, connections_per_server=2, idle_close=1.5))

    async def pid(principal: str | None, server: str) -> int:
        item = await broker.call(server, "pid", {}, None, principal)
        return int(item["value"])

    async with broker.running():
        alice_a = await pid("alice", "a")
        assert await pid("alice", "a") == alice_a  # one connection per (token, server), kept while used
        alice_b = await pid("alice", "b")  # alice's budget is one connection: her idle one to a is closed
        assert await _gone(alice_a), "the oldest idle connection was not closed for the token's budget"
        bob_b = await pid("bob", "b")
        assert bob_b != alice_b and _alive(alice_b)
        carol_b = await pid("carol", "b")  # server b's budget is two: its oldest idle (alice's) is closed
        assert await _gone(alice_b), "the oldest idle connection was not closed for the server's budget"
        mine = await pid(None, "a")  # no token (stdio): the one set, never released as idle
        assert await _gone(bob_b) and await _gone(carol_b), "a token's idle connections were not released"
        assert _alive(mine)
        assert await pid(None, "a") == mine
