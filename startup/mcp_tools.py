"""``mcp_tools``: the user's other MCP servers as Python functions, called through kernelexec's server.

Loaded by ``kernel_init.py`` under every profile (stdlib only, never imports kernelexec) and registered as
the module ``mcp_tools``. The server pushes the catalog of callable tools (``_kernelexec_tools_catalog``)
before a cell runs, so ``mcp_tools.<server>.<tool>`` exist with a signature and docstring made from each
tool's input schema (``help()``, tab completion). A call is a request on the kernel's own Jupyter stdin
channel: an ``input_request`` whose metadata carries ``kernelexec_tool_call`` (the broker's mark, which a
cell's ``input()`` cannot set) and the calls; the server's ``input_reply`` carries the JSON answer. No
socket, address or secret is given to the kernel: the server makes the call, under its own rules.
"""

from __future__ import annotations

import asyncio
import base64
import builtins
import inspect
import json
import keyword
import sys
import threading
import types
from typing import Any

MARK = "kernelexec_tool_call"  # kernelexec/kernel/stdin.py TOOL_CALL_MARK
PROMPT = "[kernelexec mcp_tools call: answered by kernelexec's MCP server, not by a person]"

_JSON_TYPES: dict[str, Any] = {"string": str, "integer": int, "number": float, "boolean": bool, "array": builtins.list,
                               "object": dict, "null": None}


class ToolError(Exception):
    """A brokered tool call failed: the tool raised, timed out, its arguments failed its schema, or its server failed."""


class ToolRefused(ToolError):
    """kernelexec refused the call: a setting (--tools-allow, --tools-approve, a cap) or the user said no."""


_lock = threading.Lock()  # one stdin request at a time (the stdin socket is not thread-safe)
_catalog: dict[str, Any] = {"tools": [], "unavailable": {}, "refused": {}}
_servers: dict[str, _Server] = {}


def _kernel() -> Any:
    shell = sys.modules["IPython"].get_ipython()
    kernel = getattr(shell, "kernel", None)
    if kernel is None:
        raise ToolError("mcp_tools works only in a kernel run by kernelexec's MCP server")
    return kernel


def _route(kernel: Any) -> tuple[Any, Any]:
    """The current cell's (ident, parent): where the stdin request goes. Read in the cell's own context."""
    if not getattr(kernel, "_allow_stdin", False):
        raise ToolError("mcp_tools calls travel over the stdin channel, which this request does not allow: call tools "
                        "from a cell kernelexec's execute_code runs (not from Jupyter Lab or a console)")
    parent = kernel.get_parent("shell")
    getter = getattr(kernel, "_get_shell_context_var", None)
    if getter is not None and hasattr(kernel, "_shell_parent_ident"):
        ident = getter(kernel._shell_parent_ident)
    else:
        ident = kernel._parent_ident["shell"]
    return ident, parent


def _request(payload: dict[str, Any], route: tuple[Any, Any]) -> dict[str, Any]:
    """Send one marked input_request and wait for its reply (blocking; interruptible like input())."""
    import zmq

    kernel = _kernel()
    ident, parent = route
    with _lock:  # no flush of stdout first (input() does one): it waits on the IOPub thread, and a call prints nothing
        socket = kernel.stdin_socket
        while True:  # stale replies
            try:
                socket.recv_multipart(zmq.NOBLOCK)
            except zmq.ZMQError:
                break
        kernel.session.send(socket, "input_request", {"prompt": PROMPT, "password": False}, parent, ident=ident,
                            metadata={MARK: payload})
        while True:
            try:
                rlist, _, xlist = zmq.select([socket], [], [socket], 0.01)
                if rlist or xlist:
                    _, reply = kernel.session.recv(socket)
                    if reply is not None:
                        break
            except KeyboardInterrupt:
                raise KeyboardInterrupt("Interrupted by user") from None
    value = reply.get("content", {}).get("value") if isinstance(reply, dict) else None
    try:
        answer = json.loads(value) if isinstance(value, str) else None
    except ValueError:
        answer = None
    if not isinstance(answer, dict):
        raise ToolError("the tool call was not answered by kernelexec's server (mcp_tools needs a cell run by execute_code)")
    return answer


def _outcome(item: Any) -> Any:
    """A reply item as the caller's value, or the exception it stands for."""
    if not isinstance(item, dict):
        raise ToolError("malformed reply from kernelexec's server")
    if not item.get("ok"):
        raise (ToolRefused if item.get("refused") else ToolError)(str(item.get("message", "the call failed")))
    value = item.get("value")
    images = []
    for image in item.get("images") or []:
        try:
            from IPython.display import Image

            images.append(Image(data=base64.b64decode(image["data"]), format=str(image["mime_type"]).split("/")[-1]))
        except Exception:  # noqa: BLE001 - an image that does not decode is left out
            continue
    if not images:
        return value
    if value in ("", None):
        return images[0] if len(images) == 1 else images
    return [value, *images]


def _call(server: str, tool: str, arguments: dict[str, Any]) -> Any:
    reply = _request({"op": "call", "calls": [{"server": server, "tool": tool, "arguments": arguments}]}, _route(_kernel()))
    if "error" in reply:
        raise ToolError(str(reply["error"]))
    return _outcome((reply.get("results") or [None])[0])


class _Batch:
    """Awaitable calls started in the same turn of the event loop go to the server as one request (made at once there)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, route: tuple[Any, Any]) -> None:
        self.loop, self.route = loop, route
        self.calls: builtins.list[tuple[dict[str, Any], asyncio.Future[Any]]] = []  # (list is mcp_tools.list here)

    def flush(self) -> None:
        global _pending
        if _pending is self:
            _pending = None
        calls = self.calls
        payload = {"op": "call", "calls": [c for c, _ in calls]}

        def done(future: asyncio.Future[Any]) -> None:
            exc = future.exception()
            results = None if exc is not None else future.result().get("results")
            for i, (_, waiter) in enumerate(calls):
                if waiter.done():
                    continue
                if exc is not None:
                    waiter.set_exception(exc)
                elif not isinstance(results, builtins.list) or i >= len(results):
                    waiter.set_exception(ToolError(str(future.result().get("error", "malformed reply"))))
                else:
                    waiter.set_result(results[i])

        self.loop.run_in_executor(None, _request, payload, self.route).add_done_callback(done)


_pending: _Batch | None = None


async def _acall(server: str, tool: str, arguments: dict[str, Any]) -> Any:
    global _pending
    loop = asyncio.get_running_loop()
    batch = _pending
    if batch is None or batch.loop is not loop or len(batch.calls) >= 64:
        batch = _pending = _Batch(loop, _route(_kernel()))
        loop.call_soon(batch.flush)
    waiter: asyncio.Future[Any] = loop.create_future()
    batch.calls.append(({"server": server, "tool": tool, "arguments": arguments}, waiter))
    return _outcome(await waiter)


def _annotation(schema: Any) -> Any:
    """A JSON schema's type as a Python annotation (a type where there is one, else its name)."""
    if not isinstance(schema, dict):
        return Any
    kind = schema.get("type")
    if isinstance(kind, str):
        return _JSON_TYPES.get(kind, Any)
    options = schema.get("anyOf") or schema.get("oneOf")
    if isinstance(options, builtins.list):
        return " | ".join(dict.fromkeys(_name(_annotation(o)) for o in options))
    return Any


def _name(annotation: Any) -> str:
    return "None" if annotation is None else getattr(annotation, "__name__", str(annotation))


def _tool(entry: dict[str, Any]) -> Any:
    """One upstream tool as a function of keyword arguments, its signature and docstring from the tool's schema
    (``help()`` and completion see them); ``.acall`` is the awaitable form."""
    server, name = str(entry["server_name"]), str(entry["name"])
    found = entry.get("input_schema")
    schema: dict[str, Any] = found if isinstance(found, dict) else {}
    found = schema.get("properties")
    props: dict[str, Any] = found if isinstance(found, dict) else {}
    required = set(schema.get("required") or [])
    params, lines = [], []
    for key, prop in props.items():
        prop = prop if isinstance(prop, dict) else {}
        described = str(prop.get("description", "")).strip()
        plain = str(key).isidentifier() and not keyword.iskeyword(str(key))
        lines.append(f"    {key} ({_name(_annotation(prop))}{', required' if key in required else ''})"
                     f"{': ' + described if described else ''}{'' if plain else ' [pass it as **{' + repr(key) + ': ...}]'}")
        if plain:
            default = inspect.Parameter.empty if key in required else prop.get("default")
            params.append(inspect.Parameter(key, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=_annotation(prop)))
    params.sort(key=lambda p: p.default is not inspect.Parameter.empty)
    if len(lines) > len(params):  # a name Python cannot take as a keyword: the signature takes **arguments too
        params.append(inspect.Parameter("arguments", inspect.Parameter.VAR_KEYWORD))
    signature = inspect.Signature(params)

    def tool(**arguments: Any) -> Any:
        return _call(server, name, arguments)

    async def acall(**arguments: Any) -> Any:
        return await _acall(server, name, arguments)

    description = str(entry.get("description") or "").strip()
    where = f"{entry['server']}.{entry['tool']}"
    for fn in (tool, acall):
        vars(fn)["__signature__"] = signature  # what inspect.signature (help, completion) reads
        fn.__name__ = fn.__qualname__ = str(entry["tool"]) if fn is tool else "acall"
        fn.__module__ = "mcp_tools"
        fn.__doc__ = (f"{description or 'MCP tool ' + name}\n\nMCP tool {name!r} of server {server!r}, called through "
                      "kernelexec's server.\n\nArguments (keyword only):\n" + ("\n".join(lines) or "    (none)") +
                      "\n\nReturns the tool's structured content, else its text (images as IPython display objects). "
                      "Raises mcp_tools.ToolError (the tool failed) or mcp_tools.ToolRefused (a setting or the user "
                      f"refused). Awaitable form: await mcp_tools.{where}.acall(...)")
    tool.acall = acall  # type: ignore[attr-defined]
    return tool


class _Server(types.SimpleNamespace):
    """One configured MCP server: its allowed tools as attributes."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        server = self.__dict__.get("_attr", "?")
        reason = _catalog.get("refused", {}).get(f"{server}.{name}")
        if reason:
            raise ToolRefused(reason)
        tools = sorted(k for k in self.__dict__ if not k.startswith("_"))
        raise AttributeError(f"mcp_tools.{server} has no tool {name!r}; callable: {', '.join(tools) or 'none'}")

    def __repr__(self) -> str:
        return f"<mcp server {self.__dict__.get('_attr')}: {', '.join(sorted(k for k in self.__dict__ if not k.startswith('_')))}>"


def _install_catalog(text: str) -> int:
    """Called by the server (``_kernelexec_tools_catalog``) with the callable tools; returns their count."""
    global _catalog
    data = json.loads(text)
    _catalog = data
    module = sys.modules[__name__]
    for name in builtins.list(_servers):
        if hasattr(module, name):
            delattr(module, name)
    _servers.clear()
    for name in data.get("unavailable", {}):
        _servers.setdefault(name, _Server(_attr=name))
    for entry in data.get("tools", []):
        server = _servers.setdefault(str(entry["server"]), _Server(_attr=str(entry["server"])))
        try:
            setattr(server, str(entry["tool"]), _tool(entry))
        except Exception as exc:  # noqa: BLE001 - one odd schema must not take the other tools away
            data.setdefault("unavailable", {})[f"{entry['server']}.{entry['tool']}"] = f"its schema could not be read: {exc!r}"[:300]
    for name, server in _servers.items():
        if name.isidentifier() and not hasattr(module, name):
            setattr(module, name, server)
    return len(data.get("tools", []))


class _Listing(builtins.list[str]):
    def __repr__(self) -> str:
        return "\n".join(self) if self else "(no MCP tools are configured: kernelexec serve --tools-config FILE)"


def list() -> Any:  # noqa: A001 - mcp_tools.list(), as the skill says
    """What a cell can call: one line per tool, ``server.tool(arguments): description``."""
    found = []
    for entry in _catalog.get("tools", []):
        tool = getattr(_servers.get(entry["server"]), entry["tool"], None)
        summary = (str(entry.get("description") or "").strip().splitlines() or [""])[0][:100]
        found.append(f"{entry['server']}.{entry['tool']}{tool.__signature__ if tool else '()'}{': ' + summary if summary else ''}")
    for name, why in _catalog.get("unavailable", {}).items():
        found.append(f"{name}: unavailable ({str(why)[:200]})")
    return _Listing(found)


async def gather(*calls: Any) -> Any:
    """``await mcp_tools.gather(a.acall(...), b.acall(...))``: asyncio.gather, for profiles that refuse asyncio."""
    return await asyncio.gather(*calls)
