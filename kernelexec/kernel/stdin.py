"""The kernel's stdin channel while a cell runs: its input()/getpass() questions and code mode's tool calls.

``Kernel.execute`` hands both kinds of ``input_request`` here: a question goes to ``Ask`` (the human, through
the MCP client), a request marked with ``TOOL_CALL_MARK`` to ``ToolCalls`` (the broker). Apart from the driver
because it is its own small protocol, and the mark is shared with replay and startup/mcp_tools.py.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import zmq

from kernelexec.kernel.execution import Execution

# A question a cell asks through input()/getpass(): (prompt, password) -> the answer, or None (declined:
# the cell gets EOFError, as at the end of a terminal's input)
Ask = Callable[[str, bool], Awaitable[str | None]]
TOOL_CALL_MARK = "kernelexec_tool_call"  # the input_request metadata key of a brokered call (startup/mcp_tools.py MARK)
# Code mode: a cell's brokered tool calls (a marked input_request's payload) -> the reply (broker.CellCalls.handle)
ToolCalls = Callable[[Any], Awaitable[dict[str, Any]]]


async def answer_stdin(kc: Any, msg_id: str, ask: Ask | None, ex: Execution, tools: ToolCalls | None = None) -> None:
    """Serve the cell's input()/getpass() requests (the stdin channel) through ``ask``, and its brokered tool
    calls through ``tools``. A tool call is told apart by its metadata's ``TOOL_CALL_MARK`` (set by
    startup/mcp_tools.py; input() cannot set metadata), never by its prompt: a cell's input() is always asked
    as a question, and a tool call is never shown to the human as one."""
    while await waiting(kc.stdin_channel):
        try:
            msg = await kc.get_stdin_msg(timeout=0)
        except Exception:  # noqa: BLE001 - a message that would not decode: nothing to answer
            continue
        parent = msg.get("parent_header") if isinstance(msg, dict) else None
        content = msg.get("content") if isinstance(msg, dict) else None
        if (not isinstance(parent, dict) or parent.get("msg_id") != msg_id or msg.get("msg_type") != "input_request"
                or not isinstance(content, dict)):
            continue
        metadata = msg.get("metadata")
        if isinstance(metadata, dict) and TOOL_CALL_MARK in metadata:
            reply = (await tools(metadata[TOOL_CALL_MARK]) if tools is not None
                     else {"error": "code mode is off: no MCP tools are configured (kernelexec serve --tools-config)"})
            kc.input(json.dumps(reply))
            continue
        prompt, password = str(content.get("prompt", ""))[:2000], content.get("password") is True
        answer = await ask(prompt, password) if ask is not None else None
        kc.input("\x04" if answer is None else answer)  # ipykernel raises EOFError for \x04
        ex.inputs.append({"prompt": prompt, "password": password, "answered": answer is not None,
                          "answer": None if answer is None else ("***" if password else answer)})
        if answer is None:
            ex.notes.append(f"{'getpass()' if password else 'input()'} asked {prompt[:80]!r} and got no answer (declined, "
                            "unanswered before the cell's timeout, or this client cannot ask its user): the cell got EOFError")


async def stdin_first(kc: Any, timeout: float) -> bool:
    """Wait up to ``timeout`` for IOPub or stdin, whichever comes first; True when stdin has a message.
    (A brokered tool call's round trip must not wait for an IOPub poll to end.)"""
    import zmq.asyncio

    sockets = [getattr(channel, "socket", None) for channel in (kc.iopub_channel, kc.stdin_channel)]
    if any(not isinstance(sock, zmq.asyncio.Socket) for sock in sockets):  # another client kind: poll as before
        await anyio.sleep(min(timeout, 0.01))
        return bool(await kc.stdin_channel.msg_ready())
    poller = zmq.asyncio.Poller()
    for sock in sockets:
        poller.register(sock, zmq.POLLIN)
    ready = dict(await poller.poll(timeout * 1000))
    return sockets[1] in ready


async def waiting(channel: Any) -> bool:
    """A message waits on ``channel``: zmq's EVENTS read directly (``Kernel._collect`` asks once per IOPub message,
    and the channel's ``msg_ready``, an async poll through a future, costs six times as much); a channel
    that is not a zmq socket (a gateway's queue) is asked through its ``msg_ready``."""
    socket = getattr(channel, "socket", None)
    if socket is not None:
        return bool(socket.get(zmq.EVENTS) & zmq.POLLIN)
    return bool(await channel.msg_ready())
