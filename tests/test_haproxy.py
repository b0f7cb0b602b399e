"""deploy/haproxy.cfg, run as it ships by Debian's haproxy in front of real ``kernelexec serve --transport http``
processes (with a bearer token) on 127.0.0.1: health checks on /healthz, 2025-11-25 clients sticky on their
Mcp-Session-Id, and the token still required through the balancer. (2026-07-28 calls hashed on Mcp-Param-Session,
every one served, are tests/test_fleet_lb.py's: that needs the replicas to share a store and a gateway.)

Each replica here has its own state (the shared store and gateway that let any replica serve any session are the
fleet's); the balancer is what is tested: which replica each request reaches (its X-Kernelexec-Replica header).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from .balancer import Balancer, have_haproxy, running_haproxy
from .conftest import http_server

pytestmark = pytest.mark.anyio

TOKEN = "lb-token-0123456789abcdef0123"


@contextmanager
def balancer(base: Path, replica_urls: list[str]) -> Iterator[Balancer]:
    if not have_haproxy():
        if os.environ.get("CI"):
            pytest.fail("haproxy is not installed (.ci/run installs Debian's haproxy)")
        pytest.skip("haproxy is not installed (apt-get install haproxy)")
    with running_haproxy(base, replica_urls) as lb:
        yield lb


@pytest.fixture(scope="module")
def replicas(short_tmp: Path) -> Iterator[list[str]]:
    tokens = short_tmp / "lb-tokens"
    tokens.write_text(TOKEN + "\n")
    with ExitStack() as stack:
        yield [stack.enter_context(http_server(short_tmp / f"replica{i}", "--auth-token-file", str(tokens), timeout=120))
               for i in (1, 2)]


@pytest.fixture(scope="module")
def two(replicas: list[str], short_tmp: Path) -> Iterator[Balancer]:
    with balancer(short_tmp, replicas) as lb:
        yield lb


@pytest.fixture(scope="module")
def one(replicas: list[str], short_tmp: Path) -> Iterator[Balancer]:
    with balancer(short_tmp, replicas[:1]) as lb:
        yield lb


class Seen:
    """Which replica answered each tools/call, and what the request carried. A ``get_run`` is not counted: it follows
    a call that yielded (a slow kernel start on a loaded machine), names no session and lands anywhere."""

    def __init__(self) -> None:
        self.calls: list[tuple[str | None, str | None]] = []  # (Mcp-Param-Session sent, X-Kernelexec-Replica)

    async def response(self, response: httpx2.Response) -> None:
        request = response.request
        if request.method == "POST" and b'"tools/call"' in request.content and b'"get_run"' not in request.content:
            self.calls.append((request.headers.get("mcp-param-session"), response.headers.get("x-kernelexec-replica")))


def client(url: str, seen: Seen, mode: Any = "auto", token: str | None = TOKEN) -> Client:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    http = httpx2.AsyncClient(headers=headers, timeout=120, event_hooks={"response": [seen.response]})
    return Client(streamable_http_client(url, http_client=http), mode=mode)


def test_health_checks_need_no_token_and_say_nothing(two: Balancer) -> None:
    for url in (two.url, *two.replicas.values()):
        answer = httpx2.get(url.replace("/mcp", "/healthz"), timeout=30)
        assert answer.status_code == 200 and answer.text == "ok\n", (url, answer.status_code, answer.text)
    assert httpx2.get(two.url.replace("/mcp", "/metrics"), timeout=30).status_code == 401  # the rest keeps its token
    deadline = time.monotonic() + 20  # two failed checks 2 s apart
    while "replicas/r3 is DOWN" not in (checks := two.log.read_text(errors="replace")) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert "replicas/r3 is DOWN" in checks, checks[-2000:]  # the replica that is not running: found down by its check
    assert "replicas/r1 is DOWN" not in checks and "replicas/r2 is DOWN" not in checks, checks[-2000:]


async def test_a_request_without_the_token_is_refused_through_the_balancer(two: Balancer) -> None:
    refused = httpx2.post(two.url, json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
                          headers={"Accept": "application/json, text/event-stream"}, timeout=30)
    assert refused.status_code == 401, refused.status_code
    wrong = httpx2.post(two.url, json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
                        headers={"Accept": "application/json, text/event-stream", "Authorization": "Bearer nope-" + TOKEN},
                        timeout=30)
    assert wrong.status_code == 401, wrong.status_code
    with pytest.raises(Exception):  # noqa: B017 - the SDK's error for a 401 at connect
        async with client(two.url, Seen(), token=None) as c:
            await c.call_tool("execute_code", {"code": "1"})


async def test_2025_clients_stick_to_the_replica_that_holds_their_session(two: Balancer) -> None:
    """Legacy clients keep their default session without naming it: every request must reach the one process that
    issued their Mcp-Session-Id. Four clients spread over both replicas, each always on its own."""
    used = set()
    for i in range(4):
        seen = Seen()
        async with client(two.url, seen, mode="legacy") as c:
            await c.call_tool("execute_code", {"code": f"mine = {i}"})
            for _ in range(3):
                again = (await c.call_tool("execute_code", {"code": "mine * 10"})).structured_content
                assert again is not None and again["result"] == i * 10, again
        replicas = {replica for _, replica in seen.calls}
        assert len(replicas) == 1 and None not in replicas and not any(sent for sent, _ in seen.calls), seen.calls
        used |= replicas
    assert used == {"r1", "r2"}, used  # round robin placed the clients; r3 (not running) got none


async def test_one_replica_serves_both_protocols_through_the_balancer(one: Balancer) -> None:
    for mode in ("legacy", "auto"):
        seen = Seen()
        async with client(one.url, seen, mode=mode) as c:
            first = (await c.call_tool("execute_code", {"code": "kept = 41"})).structured_content
            assert first is not None
            second = (await c.call_tool("execute_code", {"code": "kept + 1", "session": first["session"]})).structured_content
            assert second is not None and second["result"] == 42, second
        assert {replica for _, replica in seen.calls} == {"r1"}, seen.calls
        assert seen.calls[-1][0] == (first["session"] if mode == "auto" else None), (mode, seen.calls)
