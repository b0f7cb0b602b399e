"""Code mode's broker: a cell's ``mcp_tools.<server>.<tool>(...)`` calls, made by the server, outside the sandbox.

The kernel gets no socket, network or secret for this. A call travels over the kernel's own Jupyter stdin
channel (startup/mcp_tools.py): an ``input_request`` whose *metadata* carries ``TOOL_CALL_MARK`` — a field a
cell's ``input()`` cannot set — with the calls; ``kernel/stdin.Stdin`` hands it to ``CellCalls.handle``
and answers with an ``input_reply`` whose value is the JSON reply. A plain ``input()`` is never taken for a
call (whatever its prompt says), and a call is never shown to the human as a cell's question.

The broker connects to each upstream server (tools_config.py) with the SDK's ``mcp.Client``, lazily, once per
(auth principal, server): a token's cells never see state another token's calls left in a stateful upstream
(its MCP session, its process). Stdio and unauthenticated HTTP (no principal) keep one set. Connections have a
budget (``Limits.connections_per_token``, ``connections_per_server``; the oldest idle one is closed to make room)
and a token's are closed after ``Limits.idle_close`` seconds unused. Each is held by its own task (its lifetime in
a context manager); a connection that failed is dropped and made again on the next call. Every reply of an
upstream — a result, an ``isError`` result, an error, a failed connect — passes ``Connection.request``, which
scrubs the server's secrets (``Upstream.scrub``) from all of it before anything else reads it. Every call is checked here, whoever
sent it (a cell can forge any message on its own channels, so nothing the kernel says is trusted):
``--tools-allow``, the tool exists, its arguments against its input schema (schema.py; before they leave), then
``--tools-approve`` (the human's yes through MCP elicitation, worded here, for that one call: a ``Verdict``
for another ``ApprovalCall`` makes no call; refused when nobody can be asked), a per-call timeout, a cap on
calls per cell and on the size of a result. Each call is logged and returned as a record (server, tool,
arguments, outcome, duration) for the journal and notebook; replay and restore serve those records back (recorded_calls.py).
"""

from __future__ import annotations

import json
import logging
import math
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import anyio

from kernelexec import tracing
from kernelexec.codemode.config import Upstream, matches, python_name, server_attr
from kernelexec.codemode.schema import schema_problem
from kernelexec.display import display
from kernelexec.terminal import safe

logger = logging.getLogger(__name__)

MAX_BATCH = 64  # calls in one request (an asyncio.gather)
MAX_ARGUMENT_CHARS = 1_000_000
CONNECT_TIMEOUT = 30.0  # seconds to start and connect to an upstream server
RETRY_AFTER = 30.0  # seconds a server that failed to connect is left alone by listings (a call tries at once)



@dataclass(frozen=True)
class ApprovalCall:
    """The one call an approval question is about: the server, the tool and its arguments exactly as the question
    shows them (``approval_arguments``: canonical JSON). The human's answer is for this call and no other."""

    server: str
    tool: str
    arguments: str


@dataclass(frozen=True)
class Verdict:
    """The human's answer to an approval question, naming the call it was asked about (``Broker.call`` makes the
    call only when that is the call it is about to make)."""

    call: ApprovalCall
    approved: bool


# A human's yes for one call: the question (worded by the server) and the call it shows -> the verdict for that
# call, or None when nobody can be asked
Approve = Callable[[str, ApprovalCall], Awaitable[Verdict | None]]


@dataclass
class Limits:
    call_timeout: float = 60.0
    calls_per_cell: int = 100
    result_chars: int = 200_000
    connections_per_token: int = 8  # open upstream connections of one principal (the oldest idle closed first)
    connections_per_server: int = 16  # open connections to one upstream server, all principals together
    idle_close: float = 600.0  # seconds: a token's connection unused this long is closed (stdio's set is kept)


@dataclass
class ToolEntry:
    """One upstream tool as the kernel sees it."""

    server: str  # configured server name
    name: str  # the tool's own name
    description: str
    input_schema: dict[str, Any]
    output_schema: dict[str, Any] | None

    @property
    def qualified(self) -> str:
        return f"{server_attr(self.server)}.{python_name(self.name)}"

    def for_kernel(self) -> dict[str, Any]:
        return {"server": server_attr(self.server), "tool": python_name(self.name), "name": self.name,
                "server_name": self.server, "description": self.description[:4000], "input_schema": self.input_schema}


class UpstreamError(Exception):
    """An upstream's failure, its message already scrubbed; ``broken``: the transport failed (connect again)."""

    def __init__(self, message: str, *, broken: bool) -> None:
        super().__init__(message)
        self.broken = broken


class Connection:
    """One upstream server's client for one principal, held open by its own task until ``drop``."""

    def __init__(self, upstream: Upstream, principal: str | None = None) -> None:
        self.upstream = upstream
        self.principal = principal
        self.active = 0  # requests (and connects) under way: never closed as idle meanwhile
        self.last_used = time.monotonic()
        self.client: Any = None
        self.tools: dict[str, ToolEntry] | None = None
        self.error: str | None = None
        self._lock = anyio.Lock()
        self._closing: anyio.Event | None = None
        self.connects = 0
        self.failed_at = -RETRY_AFTER  # monotonic time of the last failed connect

    def _target(self) -> Any:
        up = self.upstream
        if up.kind == "http":
            import httpx2
            from mcp.client.streamable_http import streamable_http_client

            return streamable_http_client(up.url, http_client=httpx2.AsyncClient(headers=up.headers, timeout=30.0))
        from mcp.client.stdio import StdioServerParameters, stdio_client

        # its stderr goes to the server's own (fd 2), whatever sys.stderr has become
        errlog = sys.__stderr__ if sys.__stderr__ is not None else sys.stderr
        return stdio_client(StdioServerParameters(command=up.command, args=list(up.args), env=up.env or None, cwd=up.cwd),
                            errlog=errlog)

    async def get(self, tg: Any) -> Any:
        """The connected client, connecting first if there is none (one connect at a time)."""
        async with self._lock:
            if self.client is not None:
                return self.client
            ready = anyio.Event()
            closing = self._closing = anyio.Event()
            scope = anyio.CancelScope()
            tg.start_soon(self._hold, ready, closing, scope)
            with anyio.move_on_after(CONNECT_TIMEOUT):
                await ready.wait()
            if not ready.is_set():
                scope.cancel()
                self.error = f"could not connect to MCP server {self.upstream.name!r} within {CONNECT_TIMEOUT:g} s"
            if self.client is None:
                self.failed_at = time.monotonic()
                raise ConnectionError(self.error or "could not connect")
            return self.client

    async def _hold(self, ready: anyio.Event, closing: anyio.Event, scope: anyio.CancelScope) -> None:
        """The connection's task: the client's context entered and left here (its lifetime in one task)."""
        from mcp import Client

        with scope:
            try:
                async with Client(self._target()) as client:
                    self.connects += 1
                    self.client, self.error = client, None
                    ready.set()
                    await closing.wait()
            except Exception as exc:  # noqa: BLE001 - said on the next call
                if self.client is None:
                    self.error = self.upstream.scrub(f"could not connect to MCP server {self.upstream.name!r}: {type(exc).__name__}: {exc}")[:500]
                    logger.warning(safe(self.error))
                else:
                    logger.info(safe(f"MCP server {self.upstream.name!r}: connection ended ({type(exc).__name__})"))
            finally:
                if self._closing is closing:
                    self.client = None
                ready.set()

    def drop(self) -> None:
        """Close the connection (after a failure): the next call connects again."""
        self.client = None
        if self._closing is not None:
            self._closing.set()

    async def request(self, tg: Any, method: str, *args: Any, timeout: float = math.inf) -> Any:
        """The one door for an upstream's replies: ``client.<method>(*args)`` (connecting first), its result with
        every secret of the server scrubbed from all its text and structured values (an ``isError`` result too),
        a failure as an ``UpstreamError`` whose message is scrubbed (the connection dropped when it broke).
        ``timeout`` bounds the request alone (TimeoutError): starting and connecting a server has its own bound,
        ``CONNECT_TIMEOUT``, so a server slow to start on a busy machine is not taken for a tool that hangs."""
        self.active += 1
        tool = args[0] if method == "call_tool" and args and isinstance(args[0], str) else None
        try:
            # the SDK's client span ("MCP send tools/call …") is this span's child; it injects the traceparent
            # into the upstream request's _meta (SEP-414)
            with tracing.span(f"kernelexec.broker {method}", **{"kernelexec.upstream": self.upstream.name,
                                                                 "gen_ai.tool.name": tool}) as span:
                client = await self.get(tg)
                with anyio.fail_after(timeout):
                    try:
                        result = await getattr(client, method)(*args)
                    except Exception as exc:
                        from mcp.shared.exceptions import MCPError

                        broken = not isinstance(exc, MCPError) or "closed" in str(exc).lower()
                        if broken:
                            self.drop()  # the server crashed or the transport broke: connect again on the next call
                        said = f"{type(exc).__name__}: {exc}" if broken else str(exc)
                        tracing.error(span, type(exc).__name__ if broken else str(getattr(getattr(exc, "error", None), "code", "mcp_error")))
                        raise UpstreamError(self.upstream.scrub(said), broken=broken) from None
                if getattr(result, "is_error", False):
                    tracing.error(span, "tool_error")
        finally:
            self.active -= 1
            self.last_used = time.monotonic()
        return self.scrubbed(result)

    def scrubbed(self, result: Any) -> Any:
        """A reply (a pydantic model of the SDK, or plain data) without the server's secrets, anywhere in it."""
        dump = getattr(result, "model_dump", None)
        if dump is None:
            return self.upstream.scrub(result)
        data = dump(by_alias=True, mode="python")
        clean = self.upstream.scrub(data)
        return result if clean == data else type(result).model_validate(clean)

    def idle_for(self, now: float) -> float:
        return -1.0 if self.active else now - self.last_used

    async def list_tools(self, tg: Any, timeout: float = math.inf) -> dict[str, ToolEntry]:
        if self.tools is None:
            listed = await self.request(tg, "list_tools", timeout=timeout)
            self.tools = {t.name: ToolEntry(self.upstream.name, t.name, t.description or "", dict(t.input_schema or {}),
                                            dict(t.output_schema) if t.output_schema else None) for t in listed.tools}
        return self.tools


class CallFailed(Exception):
    def __init__(self, message: str, *, refused: bool = False) -> None:
        super().__init__(message)
        self.refused = refused


class Broker:
    """All upstream connections of one server process, by (principal, server), and the rules every brokered call passes."""

    def __init__(self, upstreams: list[Upstream], *, allow: list[str] | None = None, approve: list[str] | None = None,
                 limits: Limits | None = None) -> None:
        self.upstreams = {up.attr: up for up in upstreams}
        self.connections: dict[tuple[str | None, str], Connection] = {}
        self.allow = ["*"] if allow is None else list(allow)  # an empty list allows nothing
        self.approve = list(approve or [])
        self.limits = limits or Limits()
        self._tg: Any = None
        self.calls = 0

    @asynccontextmanager
    async def running(self) -> AsyncIterator[Broker]:
        async with anyio.create_task_group() as tg:
            self._tg = tg
            sweeping = anyio.CancelScope()
            tg.start_soon(self._release_idle, sweeping)
            try:
                yield self
            finally:
                sweeping.cancel()
                for connection in self.connections.values():
                    connection.drop()
                self.connections.clear()
                self._tg = None

    async def _release_idle(self, scope: anyio.CancelScope) -> None:
        """A token's connections unused for ``idle_close`` seconds are closed (stdio's one set is kept)."""
        with scope:
            while True:
                await anyio.sleep(max(0.05, min(self.limits.idle_close / 4, 30.0)))
                self.release_idle()

    def release_idle(self) -> list[tuple[str | None, str]]:
        now = time.monotonic()
        gone = [key for key, c in self.connections.items()
                if key[0] is not None and c.idle_for(now) >= self.limits.idle_close]
        for key in gone:
            self._close(key)
        return gone

    def _close(self, key: tuple[str | None, str]) -> None:
        connection = self.connections.pop(key)
        connection.drop()
        logger.info(safe(f"MCP server {connection.upstream.name!r}: connection of {key[0] or 'the server'} closed"))

    def _make_room(self, keys: list[tuple[str | None, str]], budget: int, what: str) -> None:
        """At most ``budget`` - 1 of ``keys`` left open, the oldest idle ones closed; CallFailed when all are busy."""
        now = time.monotonic()
        idle = sorted((k for k in keys if self.connections[k].idle_for(now) >= 0),
                      key=lambda k: self.connections[k].last_used)
        excess = len(keys) - budget + 1
        if excess > len(idle):
            raise CallFailed(f"too many upstream connections open for {what} (budget {budget}), all busy: try again later",
                             refused=True)
        for key in idle[:max(excess, 0)]:
            self._close(key)

    def connection(self, principal: str | None, attr: str) -> Connection:
        """The connection of ``principal`` to the server ``attr`` (made on first use, within the budgets)."""
        key = (principal, attr)
        found = self.connections.get(key)
        if found is not None:
            return found
        self._make_room([k for k in self.connections if k[0] == principal], self.limits.connections_per_token,
                        f"token {principal}" if principal else "this server")
        self._make_room([k for k in self.connections if k[1] == attr], self.limits.connections_per_server,
                        f"MCP server {self.upstreams[attr].name!r}")
        made = self.connections[key] = Connection(self.upstreams[attr], principal)
        return made

    def _task_group(self) -> Any:
        if self._tg is None:
            raise CallFailed("the tool broker is not running")
        return self._tg

    def allowed(self, server: str, tool: str) -> bool:
        return matches(self.allow, server, tool) is not None

    async def catalog(self, principal: str | None = None) -> tuple[list[ToolEntry], dict[str, str]]:
        """Every allowed tool of every upstream (``principal``'s connection to each, made at its first use), and
        the servers that could not be listed with why."""
        entries: list[ToolEntry] = []
        failed: dict[str, str] = {}
        tg = self._task_group()

        async def one(attr: str) -> None:
            try:
                connection = self.connection(principal, attr)
            except CallFailed as exc:
                failed[attr] = str(exc)
                return
            if connection.tools is None and time.monotonic() - connection.failed_at < RETRY_AFTER:
                failed[attr] = connection.error or "could not connect"  # not tried again for every cell
                return
            try:
                tools = await connection.list_tools(tg, self.limits.call_timeout)
            except Exception as exc:  # noqa: BLE001 - listed as unavailable
                connection.drop()
                failed[attr] = connection.error or connection.upstream.scrub(f"{type(exc).__name__}: {exc}")[:300]
                return
            entries.extend(t for t in tools.values() if self.allowed(t.server, t.name))

        async with anyio.create_task_group() as listing:
            for attr in self.upstreams:
                listing.start_soon(one, attr)
        entries.sort(key=lambda e: e.qualified)
        return entries, failed

    async def kernel_catalog(self, principal: str | None = None) -> str:
        """The catalog as the kernel's ``_kernelexec_tools_catalog`` takes it (JSON)."""
        entries, failed = await self.catalog(principal)
        refused = {}
        for (owner, _), connection in list(self.connections.items()):
            if owner != principal:
                continue
            for tool in (connection.tools or {}).values():
                if not self.allowed(tool.server, tool.name):
                    refused[tool.qualified] = f"{tool.server}.{tool.name} is not allowed by --tools-allow"
        return json.dumps({"tools": [e.for_kernel() for e in entries], "unavailable": failed, "refused": refused})

    def cell(self, approve: Approve | None, timeout: float = math.inf, principal: str | None = None) -> CellCalls:
        """The calls of one cell: counted against the per-cell cap, recorded, none after the cell's ``timeout``;
        made over ``principal``'s connections (the session's owner; None: the one set of stdio)."""
        return CellCalls(self, approve, deadline=time.monotonic() + timeout, principal=principal)

    def describe(self, entries: list[ToolEntry], limit: int = 60) -> list[str]:
        """One line per callable tool, for execute_code's description."""
        lines = []
        for e in entries[:limit]:
            found = e.input_schema.get("properties")
            props: dict[str, Any] = found if isinstance(found, dict) else {}
            summary = (e.description.strip().splitlines() or [""])[0][:80]
            lines.append(f"mcp_tools.{e.qualified}({', '.join(list(props)[:6])}){': ' + summary if summary else ''}")
        if len(entries) > limit:
            lines.append(f"… {len(entries) - limit} more: mcp_tools.list()")
        return lines

    # --- one call ----------------------------------------------------------------------------
    async def call(self, server: str, tool: str, arguments: dict[str, Any], approve: Approve | None,
                   principal: str | None = None) -> dict[str, Any]:
        """One checked call over ``principal``'s connection; its reply item for the kernel (``ok``, ``value``/``images``
        or ``message``)."""
        attr = server if server in self.upstreams else next(
            (a for a, up in self.upstreams.items() if up.name == server), None)
        if attr is None:
            raise CallFailed(f"no MCP server {server!r} is configured (--tools-config); configured: "
                             f"{', '.join(self.upstreams) or 'none'}")
        connection = self.connection(principal, attr)
        name = connection.upstream.name
        if connection.tools is None:
            try:
                # a server whose tools/list hangs does not hold the cell
                await connection.list_tools(self._task_group(), self.limits.call_timeout)
            except TimeoutError:
                raise CallFailed(f"MCP server {name!r} did not list its tools within {self.limits.call_timeout:g} s") from None
            except UpstreamError as exc:
                raise CallFailed(f"MCP server {name!r} could not list its tools: {str(exc)[:300]}") from None
        tools = connection.tools or {}
        entry = tools.get(tool) or next((t for t in tools.values() if python_name(t.name) == tool), None)
        if entry is None:
            raise CallFailed(f"MCP server {name!r} has no tool {tool!r}")
        if not self.allowed(name, entry.name):
            raise CallFailed(f"{name}.{entry.name} is refused: it matches no --tools-allow pattern "
                             f"({', '.join(self.allow)})", refused=True)
        problem = schema_problem(entry.input_schema, arguments)
        if problem is not None:
            raise CallFailed(f"arguments for {name}.{entry.name} do not match its input schema (not sent): {problem}")
        pattern = matches(self.approve, name, entry.name)
        if pattern is not None:
            question = approval_message(name, entry.name, arguments, pattern)
            if question is None:
                raise CallFailed(f"{name}.{entry.name} needs approval (--tools-approve {pattern!r}) and its arguments are "
                                 f"over {APPROVAL_SHOWN} characters of JSON: too large to show the user whole", refused=True)
            call = ApprovalCall(name, entry.name, approval_arguments(arguments))
            verdict = None if approve is None else await approve(question, call)
            if verdict is None:
                raise CallFailed(f"{name}.{entry.name} needs the user's approval (--tools-approve {pattern!r}) and this "
                                 "client cannot ask its user now (MCP elicitation while the call waits)", refused=True)
            # the answer must be for this very call (server, tool, arguments as shown), and the arguments unchanged since
            if verdict.call != call or approval_arguments(arguments) != call.arguments:
                raise CallFailed(f"{name}.{entry.name} was not made: the approval given was for another call "
                                 "(an answer approves only the call its question showed)", refused=True)
            if not verdict.approved:
                raise CallFailed(f"{name}.{entry.name} was declined by the user (--tools-approve {pattern!r})", refused=True)
        # looked up again: while the human was asked, the connection may have been closed (idle, or for a budget)
        connection = self.connection(principal, attr)
        try:
            result = await connection.request(self._task_group(), "call_tool", entry.name, arguments,
                                              timeout=self.limits.call_timeout)
        except TimeoutError:
            raise CallFailed(f"{name}.{entry.name} timed out after {self.limits.call_timeout:g} s "
                             "(--tools-call-timeout)") from None
        except UpstreamError as exc:
            if exc.broken:
                raise CallFailed(f"MCP server {name!r} failed during the call ({str(exc)[:300]}); "
                                 "it is started again on the next call") from None
            raise CallFailed(f"{name}.{entry.name}: {str(exc)[:2000]}") from None
        return self.convert(entry, result)

    def convert(self, entry: ToolEntry, result: Any) -> dict[str, Any]:
        """A CallToolResult as the kernel's reply item: structured content (unwrapped when the SDK wrapped a
        plain value), else the text, with images apart."""
        texts = [c.text for c in result.content if getattr(c, "type", None) == "text"]
        if result.is_error:
            raise CallFailed(f"{entry.server}.{entry.name} raised: {chr(10).join(texts)[:4000] or 'an error'}")
        images = [{"mime_type": c.mime_type, "data": c.data} for c in result.content if getattr(c, "type", None) == "image"]
        structured = result.structured_content
        if structured is not None:
            value, kind = structured, "structured"
            props = (entry.output_schema or {}).get("properties")
            if isinstance(structured, dict) and set(structured) == {"result"} and (not isinstance(props, dict) or set(props) == {"result"}):
                value = structured["result"]
        else:
            value, kind = "\n".join(texts), "text"
        item = {"ok": True, "kind": kind, "value": value, "images": images}
        size = len(json.dumps(item))
        if size > self.limits.result_chars:
            raise CallFailed(f"{entry.server}.{entry.name} returned {size:,} characters; the cap is "
                             f"{self.limits.result_chars:,} (--tools-max-result-chars)")
        return item


APPROVAL_SHOWN = 800  # characters of arguments an approval question shows; larger calls are refused, never cut


def approval_arguments(arguments: dict[str, Any]) -> str:
    """A call's arguments as an approval question shows them: canonical JSON, every character escaped."""
    return json.dumps(arguments, ensure_ascii=True, sort_keys=True)


def approval_message(server: str, tool: str, arguments: dict[str, Any], pattern: str) -> str | None:
    """The question for the human: the server's words, with the arguments as data, every character escaped
    (no right-to-left overrides or line separators from the cell). None when the arguments do not fit whole:
    a cut would let the cell choose what the human does not see."""
    shown = approval_arguments(arguments)
    if len(shown) > APPROVAL_SHOWN:
        return None
    return display(f"kernelexec: code running in a session wants to call the MCP tool {server}.{tool} "
                   f"(--tools-approve {pattern!r} asks you each time). Arguments:\n{shown}\n\nApprove this one call?", None)


@dataclass
class CellCalls:
    """The brokered calls of one cell (``Broker.cell``): the reply to each request, and the records."""

    broker: Broker
    approve: Approve | None
    records: list[dict[str, Any]] = field(default_factory=list)
    count: int = 0
    deadline: float = math.inf  # the cell's timeout: no call is made after it
    principal: str | None = None  # whose connections (the session's owner)

    async def handle(self, payload: Any) -> dict[str, Any]:
        """A request from the kernel (untrusted): its calls made concurrently; the reply."""
        op = payload.get("op") if isinstance(payload, dict) else None
        calls = payload.get("calls") if isinstance(payload, dict) else None
        if op != "call" or not isinstance(calls, list) or not 0 < len(calls) <= MAX_BATCH:
            return {"error": f"malformed tool request (at most {MAX_BATCH} calls at once)"}
        if len(calls) == 1:  # the usual case: no task to start
            return {"results": [await self.one(calls[0])]}
        results: list[dict[str, Any]] = [{} for _ in calls]

        async def one(i: int, call: Any) -> None:
            results[i] = await self.one(call)

        async with anyio.create_task_group() as tg:
            for i, call in enumerate(calls):
                tg.start_soon(one, i, call)
        return {"results": results}

    async def one(self, call: Any) -> dict[str, Any]:
        started = time.monotonic()
        self.count += 1  # every request counts, well-formed or not: the cap bounds work and records alike
        server = str(call.get("server", ""))[:200] if isinstance(call, dict) else ""
        tool = str(call.get("tool", ""))[:200] if isinstance(call, dict) else ""
        arguments = call.get("arguments") if isinstance(call, dict) else None
        size = len(json.dumps(arguments)) if isinstance(arguments, dict) else -1
        kept = arguments if 0 <= size <= MAX_ARGUMENT_CHARS else {"omitted": f"not an object of at most {MAX_ARGUMENT_CHARS:,} characters"}
        record: dict[str, Any] = {"server": server, "tool": tool, "arguments": kept}
        limit = self.broker.limits.calls_per_cell
        try:
            if self.count > limit:
                raise CallFailed(f"this cell made more than {limit} tool calls (--tools-max-calls-per-cell)", refused=True)
            if not isinstance(arguments, dict) or size > MAX_ARGUMENT_CHARS:
                raise CallFailed(f"arguments must be an object of at most {MAX_ARGUMENT_CHARS:,} characters of JSON")
            remaining = self.deadline - time.monotonic()
            if remaining <= 0:
                raise CallFailed("the cell's timeout has passed: no more tool calls", refused=True)
            with anyio.fail_after(remaining):
                item = await self.broker.call(server, tool, arguments, self.approve, self.principal)
            record["result"] = {k: item[k] for k in ("kind", "value", "images")}
        except TimeoutError:
            item = {"ok": False, "refused": True, "message": "the cell's timeout passed during the call"}
            record["error"], record["refused"] = item["message"], True
        except CallFailed as exc:
            item = {"ok": False, "refused": exc.refused, "message": str(exc)}
            record["error"], record["refused"] = str(exc), exc.refused
        except Exception as exc:  # noqa: BLE001 - the call fails, the cell goes on
            logger.exception("brokered call %s.%s", server, tool)
            item = {"ok": False, "refused": False, "message": f"the broker failed: {type(exc).__name__}: {exc}"[:1000]}
            record["error"], record["refused"] = item["message"], False
        record["duration_ms"] = round((time.monotonic() - started) * 1000, 3)
        self.broker.calls += 1
        if self.count <= limit:
            self.records.append(record)
        elif self.count == limit + 1:  # past the cap: one line says so, the record stays bounded
            self.records.append({"server": "", "tool": "", "arguments": {}, "refused": True,
                                 "error": f"further calls past --tools-max-calls-per-cell ({limit}) refused and not recorded",
                                 "duration_ms": 0.0})
        if logger.isEnabledFor(logging.INFO):
            logger.info(safe(f"tool call {server}.{tool} {json.dumps(kept)[:300]} -> "
                             f"{'ok' if item.get('ok') else 'refused' if item.get('refused') else 'error'} "
                             f"in {record['duration_ms']:.1f} ms{'' if item.get('ok') else ': ' + str(item.get('message'))[:200]}"))
        return item


def from_settings(settings: Any) -> Broker | None:
    """The broker ``--tools-config`` asks for, or None (code mode off). Raises ToolsConfigError."""
    if not settings.tools_config:
        return None
    from kernelexec.codemode import config as tools_config
    from kernelexec.sandbox.probe import kernel_reach

    upstreams = tools_config.load(settings.tools_config, reach=kernel_reach(settings), working_dir=settings.working_dir)
    return Broker(upstreams, allow=settings.tools_allow, approve=settings.tools_approve,
                  limits=Limits(settings.tools_call_timeout, settings.tools_max_calls_per_cell, settings.tools_max_result_chars))
