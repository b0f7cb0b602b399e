"""``Mcp-Param-Session``: checked when a client sends it, never required.

The tools' ``session`` argument is annotated ``x-mcp-header: Session`` (``app.SessionArg``), so a 2026-07-28 client
mirrors it into that header and a load balancer may route on it. The SDK validates the header against the body
before dispatch, and also refuses a call that names a session in the body *without* the header. Routing here helps
but is never needed (any replica serves any session), so a client that does not mirror the argument (a hand-written
JSON-RPC client, one that never listed the tools) keeps working as before: for a request without the header the
SDK is given no schema to check; a request that sends it is checked in full (a header disagreeing with the body, a
header without the argument, a repeated header: 400).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from contextvars import ContextVar
from typing import Any

from mcp.server.mcpserver import MCPServer
from mcp.shared.inbound import MCP_PARAM_HEADER_PREFIX

from kernelexec.server.app import SESSION_HEADER

HEADER = (MCP_PARAM_HEADER_PREFIX + SESSION_HEADER).lower().encode()  # ASGI header names are lowercase bytes

_sent: ContextVar[bool | None] = ContextVar("kernelexec_session_header_sent", default=None)


class SessionHeaderSeen:
    """ASGI wrapper of the HTTP app: notes, for the request being handled, whether it carries the header."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope.get("type") != "http":
            await self.app(scope, receive, send)
            return
        token = _sent.set(any(name.lower() == HEADER for name, _ in scope.get("headers") or ()))
        try:
            await self.app(scope, receive, send)
        finally:
            _sent.reset(token)


def install(mcp: MCPServer) -> None:
    """The SDK's header check sees a tool's schema only when the request carries the header (or outside HTTP)."""
    lowlevel = mcp._lowlevel_server
    full: Callable[[str], Mapping[str, Any] | None] | None = lowlevel.get_tool_input_schema

    def schema(name: str) -> Mapping[str, Any] | None:
        if _sent.get() is False or full is None:
            return None  # no Mcp-Param-* header: nothing the body could disagree with
        return full(name)

    lowlevel.get_tool_input_schema = schema
