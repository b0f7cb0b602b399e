"""The session argument as an ``x-mcp-header``: a 2026-07-28 client mirrors it into ``Mcp-Param-Session`` (what a
load balancer may hash on), a header that disagrees with the body is refused, and clients that do not send it (the
2025-11-25 protocol) keep working as before. A real ``kernelexec serve --transport http`` and the SDK's client."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from .conftest import http_server as serve_http

pytestmark = pytest.mark.anyio

HEADER = "mcp-param-session"


@pytest.fixture(scope="module")
def server(short_tmp: Path) -> Iterator[str]:
    with serve_http(short_tmp / "hdr") as url:
        yield url


def client(url: str, seen: list[dict[str, str]], mode: Any = "auto",
           rewrite: Callable[[httpx2.Request], None] | None = None) -> Client:
    """The SDK's client over streamable HTTP, recording each tools/call's headers (and rewriting them first, if asked:
    an attacker's client that routes by one session and names another in the body)."""

    async def hook(request: httpx2.Request) -> None:
        if request.headers.get("mcp-method") == "tools/call" or b'"tools/call"' in request.content:
            if rewrite is not None:
                rewrite(request)
            seen.append({k.lower(): v for k, v in request.headers.items()})

    http = httpx2.AsyncClient(timeout=120, event_hooks={"request": [hook]})
    return Client(streamable_http_client(url, http_client=http), mode=mode)


async def test_a_modern_client_sends_the_session_as_a_header(server: str) -> None:
    seen: list[dict[str, str]] = []
    async with client(server, seen) as c:
        tools = {t.name: t for t in (await c.list_tools()).tools}
        assert tools["execute_code"].input_schema["properties"]["session"] == {
            "type": "string", "x-mcp-header": "Session", "title": "Session",
            "description": "Session handle from an earlier answer; omit for this connection's default"}
        assert "session" not in tools["execute_code"].input_schema.get("required", [])
        first = (await c.call_tool("execute_code", {"code": "x = 20"})).structured_content
        assert first is not None and HEADER not in seen[-1], seen[-1]  # no session named: no header
        handle = first["session"]
        second = (await c.call_tool("execute_code", {"code": "x + 22", "session": handle})).structured_content
        assert second is not None and second["result"] == 42 and second["session"] == handle, second
        assert seen[-1][HEADER] == handle and seen[-1]["mcp-protocol-version"] == "2026-07-28", seen[-1]
        listed = await c.call_tool("list_variables", {"session": handle})
        assert not listed.is_error and seen[-1][HEADER] == handle
        closed = await c.call_tool("close_session", {"session": handle})
        assert not closed.is_error and seen[-1][HEADER] == handle


async def test_a_2025_client_sends_no_header_and_keeps_working(server: str) -> None:
    seen: list[dict[str, str]] = []
    async with client(server, seen, mode="legacy") as c:
        first = (await c.call_tool("execute_code", {"code": "y = 1"})).structured_content
        assert first is not None
        again = (await c.call_tool("execute_code", {"code": "y + 1"})).structured_content  # its Mcp-Session-Id's default
        assert again is not None and again["result"] == 2, again
        named = (await c.call_tool("execute_code", {"code": "y + 2", "session": first["session"]})).structured_content
        assert named is not None and named["result"] == 3, named
    assert seen and all(HEADER not in headers for headers in seen), seen
    assert all("mcp-session-id" in headers for headers in seen)  # what its load balancer sticks on


async def test_a_header_that_disagrees_with_the_body_is_refused(server: str) -> None:
    """Routed by one session's header, naming another in the body: refused before anything runs; so is a header
    without the argument."""
    seen: list[dict[str, str]] = []
    async with client(server, []) as honest:
        victim = (await honest.call_tool("execute_code", {"code": "secret = 'v'"})).structured_content
        mine = (await honest.call_tool("execute_code", {"code": "ran = []"})).structured_content
    assert victim is not None and mine is not None

    def swap(request: httpx2.Request) -> None:
        request.headers["Mcp-Param-Session"] = victim["session"]

    async with client(server, seen, rewrite=swap) as attacker:
        with pytest.raises(Exception, match="Mcp-Param-Session header does not match"):
            await attacker.call_tool("execute_code", {"code": "ran.append(1)", "session": mine["session"]})

    def invent(request: httpx2.Request) -> None:
        request.headers["Mcp-Param-Session"] = victim["session"]

    async with client(server, seen, rewrite=invent) as attacker:
        with pytest.raises(Exception, match="body's 'session' argument is absent"):
            await attacker.call_tool("execute_code", {"code": "1"})
    async with client(server, []) as honest:
        check = (await honest.call_tool("execute_code", {"code": "ran", "session": mine["session"]})).structured_content
    assert check is not None and check["result"] == [], check  # the refused calls never ran


async def test_a_modern_client_that_does_not_mirror_the_argument_keeps_working(server: str) -> None:
    """The header helps a balancer; it is never needed. A 2026-07-28 client that leaves it out (a hand-written
    JSON-RPC client, one that never listed the tools) is served as before (the SDK alone would refuse it)."""
    seen: list[dict[str, str]] = []

    def drop(request: httpx2.Request) -> None:
        if "Mcp-Param-Session" in request.headers:
            del request.headers["Mcp-Param-Session"]

    async with client(server, seen, rewrite=drop) as careless:
        first = (await careless.call_tool("execute_code", {"code": "z = 5"})).structured_content
        assert first is not None
        again = await careless.call_tool("execute_code", {"code": "z * 2", "session": first["session"]})
        assert not again.is_error and again.structured_content is not None and again.structured_content["result"] == 10, again
    assert seen and all(HEADER not in headers for headers in seen) and seen[-1]["mcp-protocol-version"] == "2026-07-28"
