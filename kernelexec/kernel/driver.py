"""One IPython kernel, driven through jupyter_client's async API, and the seam its backends fill in.

``Kernel`` is the driver: lifecycle (start, restart, shutdown), the request protocol and
diagnostics. Where the kernel runs is a backend's business (``kernelexec/backends/``: ``local.LocalKernel``,
our provisioner inside the sandbox; ``kernelspecs.ProvisionedKernel``, a kernelspec's provisioner;
``gateway.GatewayKernel``). The seam, in the manner of jupyter_client's ``KernelProvisionerBase``:

- **must** override: ``create_manager``, ``start_kwargs`` (abstract).
- **may** override (a safe default here): ``install_startup``, ``exit_code``, ``exit_status``, ``log_tail``,
  ``spill_path_ok``; ``restart`` and ``shutdown`` when the backend owns more than the manager (call
  ``super()``); the class attributes ``supports_packages``, ``liveness_every`` and ``checkpoint_on_this_host``; and ``spares`` (set in
  ``__init__`` when the backend keeps a warm spare: a ``SpareKeeper``).
- **never** override: the request protocol (``execute``, ``evaluate``, ``reply_to``, ``interrupt``,
  ``is_alive``, ``adopt``, ``warm``): every backend's messages go through the same checks.

``Kernel.execute`` sends one request, reads IOPub (filtered by ``parent_header.msg_id``) and the
shell reply against one monotonic deadline, and races that against ``is_alive()`` so a dead kernel
is noticed in well under a second. On timeout it escalates: SIGINT, a short grace, then a restart.
The stdin channel (questions, code mode's calls) is ``stdin.py``'s; reading the reply, ``report.py``'s.
Callers hold the session lock: at most one request is ever in flight per kernel.
"""

from __future__ import annotations

import logging
import queue
import signal
import time
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import IO, Any, ClassVar, Protocol

import anyio
import anyio.lowlevel
import zmq
from jupyter_client.manager import AsyncKernelManager

from kernelexec import tracing
from kernelexec.errors import KernelDied, KernelStartError
from kernelexec.kernel.collector import Caps, Collector
from kernelexec.kernel.execution import Execution, ResultRule
from kernelexec.kernel.launch import LaunchSpec
from kernelexec.kernel.report import take_reply
from kernelexec.kernel.stdin import Ask, KernelStalled, Stdin, ToolCalls, send_to_kernel, stdin_first
from kernelexec.kernel.wire import harden
from kernelexec.layout import SLOTS

logger = logging.getLogger(__name__)

_POLL = 0.2  # seconds between liveness checks while waiting on output
OnOutput = Callable[[str, str], Awaitable[None]]  # (stream name, text) for progress reporting


class SpareKeeper(Protocol):
    """What the driver and the session manager ask of a kernel's warm spare (``backends.spares.Spares``,
    which only local kernels have): set by a backend in ``__init__``."""

    ready: Kernel | None
    takeovers: int
    retry_at: float

    async def prepare(self) -> bool: ...
    async def take_over(self) -> bool: ...
    async def drop(self) -> None: ...
    async def shutdown(self) -> None: ...
    def failed(self) -> None: ...


class Kernel(ABC):
    """A running kernel for one session. Not safe for concurrent ``execute`` calls: the session serialises them."""

    supports_packages: ClassVar[bool] = False  # the server can install into its session's overlay (packages.py)
    liveness_every: ClassVar[float] = _POLL  # seconds between liveness checks while a request runs
    # its checkpoint is its session's directory on this host: a fork copies the files, else relays them (checkpoint_copy)
    checkpoint_on_this_host: ClassVar[bool] = False

    def __init__(self, spec: LaunchSpec, *, startup_timeout: float = 60.0, slot: str = SLOTS[0]) -> None:
        self.spec = spec
        self.startup_timeout = startup_timeout
        self.slot = slot
        self.km: AsyncKernelManager | None = None
        self.kc: Any = None
        self._log: IO[bytes] | None = None
        self.restarts = 0
        self.tools_catalog: str | None = None  # code mode: the catalog this kernel process has (codemode/broker.py)
        # a warm spare for the next restart, for backends whose kernels can have one (backends/spares.py)
        self.spares: SpareKeeper | None = None

    # --- lifecycle -----------------------------------------------------------------------
    async def start(self) -> None:
        """Start the kernel and wait until it answers and its policy is installed."""
        dirs = self.spec.dirs
        self._log = open(dirs.log, "ab")  # noqa: SIM115 - lives as long as the kernel
        km = self.create_manager()
        harden(km.session)  # every message this kernel sends is decoded and cleaned by wire.loads
        self.km = km
        try:
            with anyio.fail_after(self.startup_timeout):
                await km.start_kernel(**self.start_kwargs())
                self.kc = km.client()
                self.kc.start_channels()
                await self._wait_ready()
        except BaseException as exc:
            tail = self.log_tail()
            with anyio.CancelScope(shield=True):
                await self.shutdown()
            if isinstance(exc, KernelStartError):
                raise
            if isinstance(exc, Exception):
                raise KernelStartError(f"kernel failed to start: {exc!r}", tail) from exc
            raise

    # --- the backend seam ---------------------------------------------------------------------
    @abstractmethod
    def create_manager(self) -> AsyncKernelManager:
        """A kernel manager for this kernel's slot, not started. Called by ``start`` for every cold start."""

    @abstractmethod
    def start_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``km.start_kernel``. Called by ``start``, after ``create_manager``."""

    async def install_startup(self) -> None:  # noqa: B027 - a hook with a safe default, not abstract
        """Put kernelexec's startup code into the kernel, once it answers and before its policy is
        checked. Called by ``start``. Default: nothing (the launch ran it, as locally)."""

    def exit_code(self) -> int | None:
        """The kernel process's exit code once it ended, else None. Called when reporting a death."""
        return None

    def log_tail(self, limit: int = 2000) -> str:
        """The end of the session's ``kernel.log``, for start failures. Called by ``start``."""
        try:
            return self.spec.dirs.log.read_bytes()[-limit:].decode(errors="replace")
        except OSError:
            return ""

    def _manager(self) -> AsyncKernelManager:
        """The kernel manager, for code that runs only while the kernel is started (as the session lock ensures)."""
        km = self.km
        assert km is not None, "the kernel is not started"
        return km

    def spill_path_ok(self, path: Any) -> bool:
        """Whether a spill file the kernel reports (a capped stream or result) is where its runtime
        writes them; anything else a hostile kernel names is dropped from the answer. Called by ``_finish``.
        Default: the session's own ``spill/``."""
        return isinstance(path, str) and Path(path).parent == self.spec.dirs.spill

    @property
    def connection_file(self) -> Path:
        """Where this kernel's connection info is (published for ``kernelexec lab``)."""
        return self.spec.dirs.connection_file_for(self.slot)

    async def warm(self) -> None:
        """Import ``--warm-imports`` ahead (startup/kernel_init.py): pooled kernels and spares."""
        try:
            await self.evaluate("_kernelexec_warm()", timeout=self.startup_timeout)
        except Exception:  # noqa: BLE001 - a kernel that cannot warm up is still a kernel
            logger.warning("warm imports failed", exc_info=True)

    async def _wait_ready(self) -> None:
        """Wait for the kernel to answer, then check that the startup code installed the policy."""
        while True:
            try:
                await self.kc.wait_for_ready(timeout=self.startup_timeout)
                break
            except RuntimeError as exc:
                if not await self._manager().is_alive():
                    raise KernelStartError("kernel exited during startup", self.log_tail()) from exc
                raise
        self.tools_catalog = None  # a new process: code mode's catalog is pushed again
        await self.install_startup()
        report = await self.evaluate("_kernelexec_policy()", timeout=self.startup_timeout)
        if not (isinstance(report, dict) and report.get("active")):
            raise KernelStartError(f"kernel started without its policy: {report!r}", self.log_tail())

    async def shutdown(self) -> None:
        """Stop the kernel (and its spare) and release their sockets and files. Safe to call more than once."""
        if self.spares is not None:
            await self.spares.shutdown()
        if self.kc is not None:
            self.kc.stop_channels()
            self.kc = None
        if self.km is not None:
            try:
                if self.km.has_kernel:
                    await self.km.shutdown_kernel(now=True)
            except Exception:
                logger.exception("kernel shutdown failed")
            finally:
                await self.km._async_cleanup_resources()  # the sync name warns under a running loop
                self.km = None
        if self._log is not None:
            self._log.close()
            self._log = None

    async def restart(self) -> None:
        """Kill the kernel (and its process group) and start a fresh one; the startup code runs again.
        A warm spare, if one is ready or being started, takes over instead of a cold start."""
        assert self.km is not None
        self.restarts += 1
        if self.spares is not None and await self.spares.take_over():
            return
        try:
            await self.km.restart_kernel(now=True)
            await self._wait_ready()
        except Exception:
            # a restart that fails leaves us with a broken manager: start over from scratch
            logger.exception("restart failed; starting a new kernel")
            await self.shutdown()
            await self.start()
        await self._drain()

    @property
    def spare(self) -> Kernel | None:
        """The warm spare ready for the next restart, if any."""
        return self.spares.ready if self.spares is not None else None

    @property
    def spare_takeovers(self) -> int:
        return self.spares.takeovers if self.spares is not None else 0

    async def restart_after_death(self) -> str:
        """Restart a kernel found dead between calls (killed from outside, the OOM killer) and say so, in the
        one wording every caller uses (the session between calls, ``execute`` before a request)."""
        status = self.exit_status()
        await self.restart()
        return f"before this call: the kernel had died ({status}) and was restarted; variables from earlier calls are lost"

    def adopt(self, other: Kernel) -> None:
        """Take ``other``'s running kernel (manager, client, log and slot) as this one's; ``other`` is left empty.
        Used by ``Spares.take_over``: the session's Kernel object stays, its process changes."""
        self.km, self.kc, self._log, self.slot = other.km, other.kc, other._log, other.slot
        self.tools_catalog = other.tools_catalog
        other.km = other.kc = other._log = None

    async def interrupt(self) -> None:
        if self.km is not None:
            await self.km.interrupt_kernel()

    async def is_alive(self) -> bool:
        return self.km is not None and await self.km.is_alive()

    def exit_status(self) -> str:
        """How the kernel process ended, for answers: "exit code 3" or "signal SIGKILL (exit code 137)"."""
        code = self.exit_code()
        if code is None:
            return "exit code unknown"
        number = -code if code < 0 else code - 128 if code > 128 else 0
        if number:
            try:
                return f"signal {signal.Signals(number).name} (exit code {code})"
            except ValueError:
                pass
        return f"exit code {code}"

    def note(self, text: str) -> None:
        """A timestamped line in the session's ``kernel.log`` (what a remote backend did; the kernel's
        own stderr goes there too for local kernels)."""
        if self._log is not None and not self._log.closed:
            stamp = time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime())
            self._log.write(f"{stamp} {text}\n".encode())
            self._log.flush()

    async def _drain(self) -> None:
        """Drop stale IOPub/shell messages left over from an interrupted or killed request."""
        for channel in (self.kc.iopub_channel, self.kc.shell_channel):
            while await channel.msg_ready():
                await channel.get_msg(timeout=0)

    # --- running code ----------------------------------------------------------------------
    async def execute(
        self,
        code: str,
        *,
        timeout: float,
        grace: float,
        on_output: OnOutput | None = None,
        result_rule: ResultRule = "variable",
        ask: Ask | None = None,
        tools: ToolCalls | None = None,
    ) -> Execution:
        """Run ``code`` as one cell. Never raises for the user's errors; those are in ``Execution.error``.
        ``result_rule``: which value is the result (startup/runtime.py): ``variable`` (execute_code's:
        a variable named ``result`` the cell bound, else the last expression) or ``statement`` (the old
        safe executor's, run_python's: the value of the last statement)."""
        ex = Execution(code=code)
        started = ex.started = time.monotonic()
        if not await self.is_alive():
            # It died before this request (killed between calls, noticed only now): the code has not
            # run, so run it in a fresh kernel rather than report a death it did not cause. Once sent,
            # a request is never sent again: a kernel that dies without a word may have run part of it.
            ex.restart_reason = await self.restart_after_death()
        ask = ask if self.answers_stdin else None
        tools = tools if self.serves_tool_calls else None
        request = self._request(code, result_rule, allow_stdin=ask is not None or tools is not None)
        msg_id = str(request["header"]["msg_id"])
        collector = Collector(ex, self.caps(), self.spec.dirs.outputs, tag=f"stream-{msg_id[:12]}")
        stdin = Stdin(self.kc, msg_id, ask, ex, tools) if ask is not None or tools is not None else None
        span = tracing.span("kernelexec.kernel.execute", **{"kernelexec.kernel.msg_id": msg_id})
        try:
            with span as s:
                await self._send_and_collect(ex, request, msg_id, collector, started, timeout, grace, on_output, stdin)
                if s is not None and ex.error is not None:
                    tracing.error(s, "cell_error")
        except anyio.get_cancelled_exc_class():
            # The client gave up (MCP cancellation): stop the cell so the next call finds a quiet kernel.
            ex.cancelled = True
            with anyio.CancelScope(shield=True):
                await self._escalate(msg_id, collector, grace, ex, "the call was cancelled")
            raise
        finally:
            collector.finish()
            ex.duration_ms = round((time.monotonic() - started) * 1000, 3)
        return ex

    async def _send_and_collect(self, ex: Execution, request: Any, msg_id: str, collector: Collector, started: float,
                                timeout: float, grace: float, on_output: OnOutput | None, stdin: Stdin | None) -> None:
        """One request sent, its IOPub read until idle; a timeout or a hang escalated, a death reported."""
        try:
            await send_to_kernel(self.kc.shell_channel, request)
            state = await self._collect(msg_id, collector, started + timeout, on_output, stdin)
        except KernelStalled as exc:
            ex.notes.append(f"{exc}: the request could not be sent, so the kernel was treated as hung")
            state = "hung"
        if state == "timeout":
            ex.timed_out = True
            state = await self._escalate(msg_id, collector, grace, ex, f"timed out after {timeout:.3g} s")
        elif state == "hung":  # it stopped reading its channels: a hung kernel, whatever its deadline says
            state = await self._hung(msg_id, collector, grace, ex)
        if state == "dead":
            await self._after_death(ex, silent=not collector.began)
        elif state == "idle":
            await self._finish(msg_id, ex, deadline=time.monotonic() + max(grace, 5.0))

    async def _hung(self, msg_id: str, collector: Collector, grace: float, ex: Execution) -> str:
        """A kernel that stopped reading its channels: interrupted (the cell's end is collected), then restarted.
        Not kept: the replies it left unread (thousands, in its socket and ours) would answer its next input()s,
        and its own stdin socket keeps our connection's place until it reads them. Our stdin socket is replaced
        before the restart, so none of them reaches the new process."""
        self._fresh_stdin()
        why = "the kernel stopped reading its channels"
        state = await self._escalate(msg_id, collector, grace, ex, why)
        if state == "interrupted":
            ex.ending = "restarted"
            ex.restart_reason = (f"{why} (a hung kernel): the interrupt ended the cell, and the kernel was restarted "
                                 "so that nothing it left unread answers a later call (variables lost)")
            await self.restart()
            state = "restarted"
        return state

    def _fresh_stdin(self) -> None:
        """A new stdin socket, the old one closed without linger: the replies queued to a kernel that stopped
        reading them are dropped."""
        kc = self.kc
        channel = getattr(kc, "_stdin_channel", None)
        if channel is not None and isinstance(getattr(channel, "socket", None), zmq.Socket):
            channel.close()
            kc._stdin_channel = None  # jupyter_client connects a new one when next asked for it

    def caps(self) -> Caps:
        """The server's own per-cell caps: a little above what the kernel's cap forwards, so an honest
        kernel never meets them."""
        policy = self.spec.policy
        stream_cap = int(policy.get("stream_cap", 1_000_000))
        return Caps(stream_keep=stream_cap + stream_cap // 10 + 1000, spill_cap=max(int(policy.get("disk_cap", 64_000_000)), stream_cap))

    def _request(self, code: str, result_rule: ResultRule = "variable", *, allow_stdin: bool = False) -> dict[str, Any]:
        """The cell's execute_request (sent by ``execute`` through ``stdin.send_to_kernel``, as every message to a
        kernel while a cell runs: never blocking the event loop)."""
        content = {"code": code, "silent": False, "store_history": True, "user_expressions": {"report": "_kernelexec_report()"},
                   "allow_stdin": allow_stdin, "stop_on_error": False}
        # the rule travels in the request's metadata, which the runtime reads before the cell runs
        msg: dict[str, Any] = self.kc.session.msg("execute_request", content, metadata={"kernelexec_result": result_rule})
        return msg

    answers_stdin: ClassVar[bool] = True  # a backend whose client has no stdin channel says False
    serves_tool_calls: ClassVar[bool] = True  # code mode's calls over the stdin channel (broker.py); gateways too

    async def _collect(
        self, msg_id: str, collector: Collector, deadline: float, on_output: OnOutput | None, stdin: Stdin | None = None,
    ) -> str:
        """Read IOPub until the request's idle status: returns ``idle``, ``timeout``, ``dead`` or ``hung`` (the
        kernel stopped reading a reply, see ``stdin.send_to_kernel``); meanwhile ``stdin`` serves the cell's
        questions and tool calls. The deadline is checked before every message, on either channel."""
        next_check = time.monotonic() + self.liveness_every
        while True:
            if stdin is not None:
                served = await stdin.serve(deadline)
                if served != "ok":
                    return served
            now = time.monotonic()
            if now >= next_check:
                if not await self._manager().is_alive():
                    return "dead"
                next_check = now + self.liveness_every
            remaining = deadline - now
            if remaining <= 0:
                return "timeout"
            wait = min(remaining, _POLL)
            code_mode = stdin is not None and stdin.tools is not None
            if code_mode and await stdin_first(self.kc, wait):
                continue  # code mode: a tool call waits; served at the top, not after the next IOPub poll
            try:
                msg = await self.kc.get_iopub_msg(timeout=0 if code_mode else wait)
            except queue.Empty:
                continue
            except Exception as exc:  # a message that would not decode (see wire.loads): dropped, counted
                collector.handle({"msg_type": "?", "content": None, "error": repr(exc)})
                continue
            await anyio.lowlevel.checkpoint()  # a flood of ready messages must not starve other sessions
            parent = msg.get("parent_header") if isinstance(msg, dict) else None
            if not isinstance(parent, dict) or parent.get("msg_id") != msg_id:
                continue
            text = collector.handle(msg)
            if on_output is not None and text:
                await on_output(msg["content"]["name"], text)
            if collector.idle:
                return "idle"

    async def _escalate(self, msg_id: str, collector: Collector, grace: float, ex: Execution, why: str) -> str:
        """SIGINT, wait ``grace`` for idle; if the cell still runs (C loop, SIGINT ignored), restart."""
        if not await self.is_alive():
            await self._after_death(ex)
            return "dead-handled"
        await self._manager().interrupt_kernel()
        state = await self._collect(msg_id, collector, time.monotonic() + grace, None)
        if state == "idle":
            ex.ending = "interrupted"
            await self._finish(msg_id, ex, deadline=time.monotonic() + grace)
            return "interrupted"
        if state == "dead":
            await self._after_death(ex)
            return "dead-handled"
        ex.ending = "restarted"
        ex.restart_reason = f"{why}; the interrupt did not stop it within {grace:g} s, so the kernel was restarted (variables lost)"
        await self.restart()
        return "restarted"

    async def _after_death(self, ex: Execution, *, silent: bool = False) -> None:
        status = self.exit_status()
        ex.ending = "kernel_died"
        if silent:  # it may have died just before the request reached it, or run it and died at once
            ex.restart_reason = (f"the kernel died ({status}) before it reported running this code, which may have "
                                 "run in part or not at all (it is not run again); it was restarted and its variables are lost")
        else:
            ex.restart_reason = (
                f"the kernel died ({status}) while running this code; it was restarted and its variables are lost"
            )
        await self.restart()

    async def _finish(self, msg_id: str, ex: Execution, deadline: float) -> None:
        """Take the shell reply: execution count, the result report and (if no IOPub error came) the error."""
        try:
            reply = await self.reply_to(msg_id, deadline - time.monotonic())
        except (TimeoutError, KernelDied):
            logger.warning("no execute_reply for %s", msg_id)
            return
        content = reply.get("content") if isinstance(reply, dict) else None
        if not isinstance(content, dict):
            ex.notes.append("the server dropped a malformed execute_reply (content is not an object)")
            return
        take_reply(content, ex, self.spill_path_ok)

    async def reply_to(self, msg_id: str, timeout: float) -> dict[str, Any]:
        """The shell reply to request ``msg_id``, within ``timeout`` seconds. Replies to other requests
        and messages that would not decode are skipped; liveness is checked while waiting. The one
        place a shell reply is awaited (``_finish``, ``evaluate``, remote startup). Raises TimeoutError,
        or KernelDied when the kernel is gone."""
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"no shell reply to {msg_id}")
            try:
                reply = await self.kc.get_shell_msg(timeout=min(remaining, _POLL))
            except queue.Empty:
                if not await self._manager().is_alive():
                    raise KernelDied(self.exit_status()) from None
                continue
            except Exception:  # noqa: BLE001 - a reply that would not decode (wire.loads): not one to wait for
                continue
            if _parent_id(reply) == msg_id and isinstance(reply, dict):
                return reply

    async def evaluate(self, expression: str, *, timeout: float = 10.0) -> Any:
        """Evaluate one expression silently (no history, no IOPub output); return its JSON or text."""
        msg_id = self.kc.execute("", silent=True, store_history=False, user_expressions={"x": expression})
        try:
            reply = await self.reply_to(msg_id, timeout)
        except TimeoutError:
            raise TimeoutError(f"no reply evaluating {expression!r}") from None
        except KernelDied:
            raise KernelStartError("kernel died", self.log_tail()) from None
        content = reply.get("content")
        expressions = content.get("user_expressions") if isinstance(content, dict) else None
        value = expressions.get("x") if isinstance(expressions, dict) else None
        if not isinstance(value, dict) or value.get("status") != "ok":
            value = value if isinstance(value, dict) else {}
            return {"error": f"{value.get('ename')}: {value.get('evalue')}"}
        data = value.get("data")
        return data.get("application/json", data.get("text/plain")) if isinstance(data, dict) else None


def _parent_id(msg: Any) -> Any:
    parent = msg.get("parent_header") if isinstance(msg, dict) else None
    return parent.get("msg_id") if isinstance(parent, dict) else None


