"""The kernel's stdin channel while a cell runs: its input()/getpass() questions and code mode's tool calls.

``Kernel.execute`` hands both kinds of ``input_request`` here: a question goes to ``Ask`` (the human, through
the MCP client), a request marked with ``TOOL_CALL_MARK`` to ``ToolCalls`` (the broker). Apart from the driver
because it is its own small protocol, and the mark is shared with replay and startup/mcp_tools.py.
"""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import anyio
import anyio.lowlevel
import anyio.to_thread

from kernelexec.kernel import zmtp
from kernelexec.kernel.execution import Execution

# The reply that makes the cell's getpass() raise EOFError with the text after it (startup/kernel_init.py
# wraps the kernel's getpass for it): a secret this client cannot be asked for, said plainly in the cell
REFUSED_MARK = "\x04kernelexec-refused:"


@dataclass(frozen=True)
class Refusal:
    """An answer that is no answer, with the reason the cell's getpass() raises (EOFError, its message)."""

    message: str


# A question a cell asks through input()/getpass(): (prompt, password) -> the answer, or None (declined:
# the cell gets EOFError, as at the end of a terminal's input), or a Refusal (getpass: EOFError with its message)
Ask = Callable[[str, bool], Awaitable["str | Refusal | None"]]
TOOL_CALL_MARK = "kernelexec_tool_call"  # the input_request metadata key of a brokered call (startup/mcp_tools.py MARK)
# Code mode: a cell's brokered tool calls (a marked input_request's payload) -> the reply (broker.CellCalls.handle)
ToolCalls = Callable[[Any], Awaitable[dict[str, Any]]]


STALL_S = 2.0  # a reply the kernel leaves unaccepted this long (its channel full: it stopped reading) means it is hung
BATCH = 64  # stdin messages served before the IOPub loop (liveness, output) has its turn again
INPUTS_KEPT = 20  # questions recorded per cell (``ex.inputs``, replayed in order); the rest are counted in one note
PROMPT_KEPT = 200  # characters of a prompt in the record
OVERLAPS = 3  # questions asked before the answer to the previous one was sent: the kernel does not read its answers


class KernelStalled(Exception):
    """The kernel stopped reading a channel: a message to it could not be handed over within ``STALL_S``."""


async def send_to_kernel(channel: Any, msg: dict[str, Any], *, within: float = STALL_S) -> None:
    """The one way the server sends a message to a kernel while a cell runs: never blocks the event loop, never
    queues without bound. A kernel's own socket (``zmtp``) is written to once it has room: a kernel that leaves
    ``zmtp.WRITE_HIGH`` bytes unread (or a connection down with ``zmtp.PENDING_MAX`` messages waiting) is waited on
    asynchronously for ``within`` seconds, then it raises ``KernelStalled``. Any other channel (a gateway's WebSocket,
    a blocking write) sends in a worker thread, abandoned after ``within`` seconds, with the same ``KernelStalled``.
    (jupyter_client's ``channel.send`` on a zmq.asyncio socket queued every send it could not make at once as a
    pending future, without limit, to a kernel that never reads.)"""
    socket = getattr(channel, "socket", None)
    if isinstance(socket, zmtp.Connection):
        if not await socket.wait_writable(within):
            raise KernelStalled(f"the kernel left its {channel_name(channel)} channel full for {within:g} s")
        channel.session.send(socket, msg)  # buffers after the signed parts
        return
    sent = False

    def send() -> None:
        nonlocal sent
        channel.send(msg)
        sent = True

    with anyio.move_on_after(within):
        await anyio.to_thread.run_sync(send, abandon_on_cancel=True)
    if not sent:
        raise KernelStalled(f"a send on the kernel's {channel_name(channel)} channel did not finish within {within:g} s")


def channel_name(channel: Any) -> str:
    return str(getattr(channel, "channel_name", "stdin"))


class Stdin:
    """One cell's stdin channel: its input()/getpass() requests served through ``ask``, its brokered tool calls
    through ``tools``. A tool call is told apart by its metadata's ``TOOL_CALL_MARK`` (set by
    startup/mcp_tools.py; input() cannot set metadata), never by its prompt: a cell's input() is always asked
    as a question, and a tool call is never shown to the human as one.

    Bounded whatever the kernel sends: the cell's deadline is checked before every message, the event loop
    gets a turn after every one, a batch at most is served before IOPub's turn, every reply goes through
    ``send_to_kernel`` (a kernel that stops reading is hung), and what the questions add to the cell's record
    is capped: the first declined question is named in a note, the rest counted in one more line, and
    ``INPUTS_KEPT`` questions at most are recorded."""

    def __init__(self, kc: Any, msg_id: str, ask: Ask | None, ex: Execution, tools: ToolCalls | None = None) -> None:
        self.kc, self.msg_id, self.ask, self.ex, self.tools = kc, msg_id, ask, ex, tools
        self.declined = 0
        self.refused = False
        self.unrecorded = 0
        self._more_note: int | None = None  # the index in ex.notes of the counted line, once there is one
        self._unrecorded_note: int | None = None
        # The kernel asked again before our answer to its last question was even sent, OVERLAPS times: it does not
        # read its replies (input() waits for each), and it must not be kept after the cell with them unread
        # (CellRun.follow). Fewer are forgiven: a cell that catches the interrupt and asks again before the interrupt's
        # decline goes out, or two threads asking at once (ipykernel's input() drops a stale reply itself).
        self.overlaps = 0
        self._queued_at_reply = False  # a message already waited when the last reply went out

    @property
    def overlapped(self) -> bool:
        """The kernel does not read its answers (``overlaps``): not kept after the cell (``CellRun.follow``)."""
        return self.overlaps >= OVERLAPS

    async def serve(self, deadline: float) -> str:
        """Serve what waits on the stdin channel: ``ok`` (drained), ``more`` (a batch served and more waiting: the
        caller gives IOPub its turn without waiting on it), ``timeout`` (the cell's deadline passed), or ``hung``
        (the kernel did not take a reply: ``KernelStalled``, noted)."""
        for _ in range(BATCH):
            if time.monotonic() >= deadline:
                return "timeout"
            if not await waiting(self.kc.stdin_channel):
                return "ok"
            try:
                msg = await self.kc.get_stdin_msg(timeout=0)
            except Exception:  # noqa: BLE001 - a message that would not decode: nothing to answer
                self._queued_at_reply = False  # (it was the message that waited)
                await anyio.lowlevel.checkpoint()
                continue
            queued, self._queued_at_reply = self._queued_at_reply, False
            try:
                await self._one(msg, queued)
            except KernelStalled as exc:
                self.ex.notes.append(f"{exc}: it stopped reading the server's replies to its questions, so it was "
                                     "treated as hung")
                return "hung"
            await anyio.lowlevel.checkpoint()  # every message gives the loop a turn, however fast they come
        return "more"

    async def _one(self, msg: Any, queued: bool = False) -> None:
        """Answer one of the cell's questions or tool calls; ``queued``: it was already waiting when our last reply
        went out (the stdin channel is read in order, so it was asked before that reply existed)."""
        parent = msg.get("parent_header") if isinstance(msg, dict) else None
        content = msg.get("content") if isinstance(msg, dict) else None
        if (not isinstance(parent, dict) or parent.get("msg_id") != self.msg_id or msg.get("msg_type") != "input_request"
                or not isinstance(content, dict)):
            return
        self.overlaps += queued
        if queued and self.overlaps == OVERLAPS:
            self.ex.notes.append("the kernel asked again before the answer to its last question was sent: it stopped "
                                 "reading the server's replies, so it is restarted after this cell (variables lost)")
        metadata = msg.get("metadata")
        if isinstance(metadata, dict) and TOOL_CALL_MARK in metadata:
            reply = (await self.tools(metadata[TOOL_CALL_MARK]) if self.tools is not None
                     else {"error": "code mode is off: no MCP tools are configured (kernelexec serve --tools-config)"})
            await self._reply(json.dumps(reply))
            return
        prompt, password = str(content.get("prompt", ""))[:2000], content.get("password") is True
        answer = await self.ask(prompt, password) if self.ask is not None else None
        if isinstance(answer, Refusal):  # getpass() raises EOFError(message) (kernel_init's wrapper)
            await self._reply(REFUSED_MARK + answer.message)
            self._record(prompt, password, None, refusal=answer.message)
            return
        await self._reply("\x04" if answer is None else answer)  # ipykernel raises EOFError for \x04
        self._record(prompt, password, answer)

    async def _reply(self, value: str) -> None:
        self._queued_at_reply = await waiting(self.kc.stdin_channel)
        await send_to_kernel(self.kc.stdin_channel, self.kc.session.msg("input_reply", {"value": value}))

    def _record(self, prompt: str, password: bool, answer: str | None, refusal: str | None = None) -> None:
        ex = self.ex
        if len(ex.inputs) < INPUTS_KEPT:
            ex.inputs.append({"prompt": prompt[:PROMPT_KEPT], "password": password, "answered": answer is not None,
                              "answer": None if answer is None else ("***" if password else answer)})
        else:
            self.unrecorded += 1
            line = (f"{self.unrecorded} more input()/getpass() question{'s' if self.unrecorded > 1 else ''} past the "
                    f"first {INPUTS_KEPT} {'are' if self.unrecorded > 1 else 'is'} not in the record (a replay gives "
                    "them EOFError)")
            self._unrecorded_note = _put_note(ex, self._unrecorded_note, line)
        if answer is not None:
            return
        if refusal is not None:  # the first refusal says why, once (they count among the declined after it)
            if not self.refused:
                ex.notes.append(f"getpass() asked {prompt[:80]!r} and was refused: {refusal}")
                self.refused = True
                return
        self.declined += 1
        if self.declined == 1:
            ex.notes.append(f"{'getpass()' if password else 'input()'} asked {prompt[:80]!r} and got no answer (declined, "
                            "unanswered before the cell's timeout, or this client cannot ask its user): the cell got EOFError")
        else:
            more = self.declined - 1
            self._more_note = _put_note(ex, self._more_note, f"and {more} more input()/getpass() question"
                                        f"{'s' if more > 1 else ''} got no answer: EOFError each time")


def _put_note(ex: Execution, index: int | None, line: str) -> int:
    """One counted note, kept up to date in place: its index in ``ex.notes``."""
    if index is None:
        ex.notes.append(line)
        return len(ex.notes) - 1
    ex.notes[index] = line
    return index


def drop_stdin(kc: Any) -> bool:
    """Close ``kc``'s stdin socket at once, before a restart in place; the next use connects a new one to the new
    process. Replies the server queued to the old process (a cell that asked and never read them, cut by its
    timeout before its channel filled) would otherwise be delivered to the new one when the socket reconnects to the
    same address, and its next input() takes whatever reply comes first (ipykernel checks neither its parent nor its
    time): a stale ``\x04`` made it raise EOFError. True when one was closed (a kernel's own socket; a gateway's
    channels are its own)."""
    channel = getattr(kc, "_stdin_channel", None)
    if channel is None or not isinstance(getattr(channel, "socket", None), zmtp.Connection):
        return False
    channel.socket.close(linger=0)
    kc._stdin_channel = None  # jupyter_client connects a new one when next asked for it
    return True


async def stdin_first(kc: Any, timeout: float) -> bool:
    """Wait up to ``timeout`` for IOPub or stdin, whichever comes first; True when stdin has a message.
    (A brokered tool call's round trip must not wait for an IOPub poll to end.)"""
    sockets = [getattr(channel, "socket", None) for channel in (kc.iopub_channel, kc.stdin_channel)]
    iopub, stdin = sockets
    if not (isinstance(iopub, zmtp.Connection) and isinstance(stdin, zmtp.Connection)):  # another client kind: poll
        await anyio.sleep(min(timeout, 0.01))
        return bool(await kc.stdin_channel.msg_ready())
    await zmtp.wait_any([iopub, stdin], timeout)
    return stdin.ready()


async def waiting(channel: Any) -> bool:
    """A message waits on ``channel``: asked of a kernel's own socket directly (``CellRun.collect`` asks once per
    IOPub message); a channel of another kind (a gateway's queue) is asked through its ``msg_ready``."""
    socket = getattr(channel, "socket", None)
    if isinstance(socket, zmtp.Connection):
        return socket.ready()
    return bool(await channel.msg_ready())
