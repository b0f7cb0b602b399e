"""One cell's request on a running kernel, from send to reply: ``CellRun``.

Its reason to change is what happens to one request: its IOPub read against one monotonic deadline (the
stdin channel served meanwhile), a timeout escalated (SIGINT, a short grace, then a restart), a kernel that
stopped reading its channels restarted, a death reported, the shell reply taken. The kernel's own life
(start, restart, shutdown) and the backend seam stay in ``driver.py``, which makes one ``CellRun`` per
``Kernel.execute``; this module sees the kernel only through ``RunningKernel``, what a request needs of it.
"""

from __future__ import annotations

import logging
import queue
import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import anyio
import anyio.lowlevel

from kernelexec.errors import KernelDied
from kernelexec.kernel import zmtp
from kernelexec.kernel.channels import receive, zmtp_connections
from kernelexec.kernel.collector import Collector
from kernelexec.kernel.execution import Execution
from kernelexec.kernel.report import take_reply
from kernelexec.kernel.stdin import KernelStalled, Stdin, send_to_kernel, stdin_first

logger = logging.getLogger(__name__)

POLL = 0.2  # seconds between liveness checks while waiting on output
OVER_BOUNDS = (f"kernel message past the server's bounds (a frame over {zmtp.MAX_FRAME_BYTES >> 20} MiB, a message over "
               f"{zmtp.MAX_MESSAGE_BYTES >> 20} MiB or {zmtp.MAX_FRAMES} frames), skipped unread")
OnOutput = Callable[[str, str], Awaitable[None]]  # (stream name, text) for progress reporting


class RunningKernel(Protocol):
    """What a request needs of its kernel (``driver.Kernel`` is one)."""

    kc: Any

    @property
    def liveness_every(self) -> float: ...  # seconds between liveness checks while a request runs

    async def is_alive(self) -> bool: ...
    async def interrupt(self) -> None: ...
    async def restart(self) -> None: ...
    def exit_status(self) -> str: ...
    async def reply_to(self, msg_id: str, timeout: float) -> dict[str, Any]: ...
    def spill_path_ok(self, path: Any) -> bool: ...


class CellRun:
    """One execute_request's life on ``kernel``: what it produced goes into ``ex`` (through ``collector``)."""

    def __init__(self, kernel: RunningKernel, ex: Execution, msg_id: str, collector: Collector, grace: float,
                 on_output: OnOutput | None, stdin: Stdin | None) -> None:
        self.kernel = kernel
        self.ex = ex
        self.msg_id = msg_id
        self.collector = collector
        self.grace = grace
        self.on_output = on_output
        self.stdin = stdin
        self.sockets = zmtp_connections(kernel.kc)  # as the request starts: a restart meanwhile makes new ones

    async def run(self, request: Any, started: float, timeout: float) -> None:
        """The request sent, its IOPub read until idle (``timeout`` seconds from ``started``, a monotonic time); a
        timeout or a hang escalated, a death reported."""
        try:
            await send_to_kernel(self.kernel.kc.shell_channel, request)
        except KernelStalled as exc:
            self.ex.notes.append(f"{exc}: the request could not be sent, so the kernel was treated as hung")
            await self.follow(started, timeout, state="hung")
            return
        await self.follow(started, timeout)

    async def follow(self, started: float, timeout: float, state: str | None = None) -> None:
        """The request, once sent (by this process, or by a fleet's replica that stopped: ``Kernel.collect``), read
        until idle against its deadline; a timeout or a hang escalated, a death reported, the reply taken."""
        deadline = started + timeout
        if state is None:
            try:
                state = await self.collect(deadline, self.on_output, self.stdin)
            except KernelStalled as exc:
                self.ex.notes.append(f"{exc}: the request could not be sent, so the kernel was treated as hung")
                state = "hung"
        if state == "timeout":
            self.ex.timed_out = True
            state = await self.escalate(f"timed out after {timeout:.3g} s")
        elif state == "hung":  # it stopped reading its channels: a hung kernel, whatever its deadline says
            state = await self._hung()
        if state == "dead":
            await self._after_death(silent=not self.collector.began)
        elif state == "idle":
            await self._finish(deadline=time.monotonic() + max(self.grace, 5.0))
        # messages the sockets skipped past their bounds, since the last answer that said so (on the kernel's own
        # threads they may come between two cells): nothing a kernel sends is left out silently
        skipped = sum(conn.take_dropped() for conn in {*self.sockets, *zmtp_connections(self.kernel.kc)})
        if skipped:
            self.collector.drop(OVER_BOUNDS, skipped)
        if state in ("idle", "interrupted") and self.stdin is not None and self.stdin.overlapped:
            await self._restart_unread("the kernel stopped reading the server's replies to its questions (it asked "
                                       "again before the answer to the last was sent): the cell ended")

    async def collect(self, deadline: float, on_output: OnOutput | None, stdin: Stdin | None = None) -> str:
        """Read IOPub until the request's idle status: returns ``idle``, ``timeout``, ``dead`` or ``hung`` (the
        kernel stopped reading a reply, see ``stdin.send_to_kernel``); meanwhile ``stdin`` serves the cell's
        questions and tool calls. The deadline is checked before every message, on either channel."""
        kernel, collector = self.kernel, self.collector
        next_check = time.monotonic() + kernel.liveness_every
        while True:
            served = "ok"
            if stdin is not None:
                served = await stdin.serve(deadline)
                if served not in ("ok", "more"):
                    return served
            now = time.monotonic()
            if now >= next_check:
                if not await kernel.is_alive():
                    return "dead"
                next_check = now + kernel.liveness_every
            remaining = deadline - now
            if remaining <= 0:
                return "timeout"
            # a quiet IOPub is not waited on while stdin has more: at 64 messages a POLL, a kernel asking without
            # reading the replies took 6 s to fill its channel and be found hung, longer than a cell's timeout
            wait = 0 if served == "more" else min(remaining, POLL)
            code_mode = stdin is not None and stdin.tools is not None
            if code_mode and await stdin_first(kernel.kc, wait):
                continue  # code mode: a tool call waits; served at the top, not after the next IOPub poll
            try:
                msg = await receive(kernel.kc, "iopub", 0 if code_mode else wait)
            except queue.Empty:
                continue
            except Exception as exc:  # a message that would not decode (see wire.loads): dropped, counted
                collector.handle({"msg_type": "?", "content": None, "error": repr(exc)})
                continue
            await anyio.lowlevel.checkpoint()  # a flood of ready messages must not starve other sessions
            parent = msg.get("parent_header") if isinstance(msg, dict) else None
            if not isinstance(parent, dict) or parent.get("msg_id") != self.msg_id:
                continue
            text = collector.handle(msg)
            if on_output is not None and text:
                await on_output(msg["content"]["name"], text)
            if collector.idle:
                return "idle"

    async def escalate(self, why: str) -> str:
        """SIGINT, wait ``grace`` for idle; if the cell still runs (C loop, SIGINT ignored), restart."""
        ex, grace = self.ex, self.grace
        if not await self.kernel.is_alive():
            await self._after_death()
            return "dead-handled"
        await self.kernel.interrupt()
        state = await self.collect(time.monotonic() + grace, None)
        if state == "idle":
            ex.ending = "interrupted"
            await self._finish(deadline=time.monotonic() + grace)
            return "interrupted"
        if state == "dead":
            await self._after_death()
            return "dead-handled"
        ex.ending = "restarted"
        ex.restart_reason = f"{why}; the interrupt did not stop it within {grace:g} s, so the kernel was restarted (variables lost)"
        await self.kernel.restart()
        return "restarted"

    async def _hung(self) -> str:
        """A kernel that stopped reading its channels: interrupted (the cell's end is collected), then restarted.
        Not kept: the replies it left unread (thousands, in its socket and ours) would answer its next input()s,
        and its own stdin socket keeps our connection's place until it reads them. The restart gives the new
        process a new stdin socket (``Kernel.restart``), so none of them reaches it."""
        why = "the kernel stopped reading its channels"
        state = await self.escalate(why)
        if state == "interrupted":
            state = await self._restart_unread(f"{why} (a hung kernel): the interrupt ended the cell")
        return state

    async def _restart_unread(self, why: str) -> str:
        """Not kept: a kernel left with replies it never read (``_hung``; ``Stdin.overlapped``)."""
        self.ex.ending = "restarted"
        self.ex.restart_reason = f"{why}, and the kernel was restarted so that nothing it left unread answers a later call (variables lost)"
        await self.kernel.restart()
        return "restarted"

    async def _after_death(self, *, silent: bool = False) -> None:
        status = self.kernel.exit_status()
        self.ex.ending = "kernel_died"
        if silent:  # it may have died just before the request reached it, or run it and died at once
            self.ex.restart_reason = (f"the kernel died ({status}) before it reported running this code, which may have "
                                      "run in part or not at all (it is not run again); it was restarted and its variables are lost")
        else:
            self.ex.restart_reason = (
                f"the kernel died ({status}) while running this code; it was restarted and its variables are lost"
            )
        await self.kernel.restart()

    async def _finish(self, deadline: float) -> None:
        """Take the shell reply: execution count, the result report and (if no IOPub error came) the error."""
        try:
            reply = await self.kernel.reply_to(self.msg_id, deadline - time.monotonic())
        except (TimeoutError, KernelDied):
            logger.warning("no execute_reply for %s", self.msg_id)
            return
        content = reply.get("content") if isinstance(reply, dict) else None
        if not isinstance(content, dict):
            self.ex.notes.append("the server dropped a malformed execute_reply (content is not an object)")
            return
        take_reply(content, self.ex, self.kernel.spill_path_ok)


async def follow_sent(run: CellRun, timeout: float) -> Execution:
    """A request another process sent, whose messages this connection took over (a fleet's replica that stopped
    mid-cell: ``Kernel.collect``), read as the sender would have: ``timeout`` from now; an input() gets EOFError."""
    ex = run.ex
    started = ex.started = time.monotonic()
    try:
        await run.follow(started, timeout)
    finally:
        run.collector.finish()
        ex.duration_ms = round((time.monotonic() - started) * 1000, 3)
    return ex
