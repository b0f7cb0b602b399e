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
- **never** override: the request protocol (``execute``, ``evaluate``, ``comm``, ``send_comm``, ``comm_answer``, ``reply_to``, ``interrupt``,
  ``is_alive``, ``adopt``, ``warm``): every backend's messages go through the same checks.

``Kernel.execute`` sends one request through a ``cell.CellRun``, which reads IOPub (filtered by ``parent_header.msg_id``)
and the shell reply against one monotonic deadline, racing ``is_alive()`` so a dead kernel is noticed in well under a
second. On timeout it escalates: SIGINT, a short grace, then a restart. The stdin channel (questions, code mode's calls)
is ``stdin.py``'s; reading the reply, ``report.py``'s. Callers hold the session lock: one request in flight per kernel.
"""

from __future__ import annotations

import logging
import queue
import signal
import time
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import IO, Any, ClassVar, Protocol

import anyio
from jupyter_client.manager import AsyncKernelManager

from kernelexec import tracing
from kernelexec.errors import KernelDied, KernelStartError
from kernelexec.kernel.cell import POLL, CellRun, OnOutput, follow_sent
from kernelexec.kernel.channels import drain, receive
from kernelexec.kernel.collector import Caps, Collector
from kernelexec.kernel.execution import Execution, ResultRule
from kernelexec.kernel.launch import LaunchSpec
from kernelexec.kernel.stdin import Ask, Stdin, ToolCalls, drop_stdin, send_to_kernel
from kernelexec.kernel.wire import harden, shared_context
from kernelexec.layout import SLOTS

logger = logging.getLogger(__name__)



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
    liveness_every: ClassVar[float] = POLL  # seconds between liveness checks while a request runs
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
        self.spares: SpareKeeper | None = None  # a warm spare for the next restart, where the backend has one (spares.py)

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
                self.kc = km.client(context=shared_context())  # not a zmq context (two threads) per kernel
                self.kc.start_channels(hb=False, control=False)  # liveness is km.is_alive(); interrupts go by km
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
        writes them; anything else a hostile kernel names is dropped from the answer. Called by ``CellRun._finish`` (cell.py).
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

    def detach(self) -> None:
        """Let go of the kernel without stopping it: its channels closed, its manager dropped, the kernel left
        running where it is (a gateway's, which another replica of a fleet drives next: ``session/fleet.py``)."""
        if self.kc is not None:
            self.kc.stop_channels()
            self.kc = None
        self.km = None
        if self._log is not None:
            self._log.close()
            self._log = None

    async def restart(self) -> None:
        """Kill the kernel (and its process group) and start a fresh one; the startup code runs again. A warm spare,
        if ready or being started, takes over instead; in place, the new process gets a new stdin socket (drop_stdin)."""
        assert self.km is not None
        self.restarts += 1
        if self.spares is not None and await self.spares.take_over():
            return
        drop_stdin(self.kc)  # the replies queued to the old process must not reach the new one
        try:
            await self.km.restart_kernel(now=True)
            await self._wait_ready()
        except Exception:
            # a restart that fails leaves us with a broken manager: start over from scratch
            logger.exception("restart failed; starting a new kernel")
            await self.shutdown()
            await self.start()
        await drain(self.kc)

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
        on_sent: Callable[[dict[str, Any]], Awaitable[None]] | None = None,
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
        run = CellRun(self, ex, msg_id, collector, grace, on_output, stdin)
        if on_sent is not None and (point := self.resume_point(msg_id)) is not None:  # told before it is sent
            await on_sent(point)
        span = tracing.span("kernelexec.kernel.execute", **{"kernelexec.kernel.msg_id": msg_id})
        try:
            with span as s:
                await run.run(request, started, timeout)
                if s is not None and ex.error is not None:
                    tracing.error(s, "cell_error")
        except anyio.get_cancelled_exc_class():
            ex.cancelled = True  # the client gave up: the cell stopped, for a quiet kernel next (unless handed over)
            if not (self.hand_over and on_sent is not None):
                with anyio.CancelScope(shield=True):
                    await run.escalate("the call was cancelled")
            raise
        finally:
            collector.finish()
            ex.duration_ms = round((time.monotonic() - started) * 1000, 3)
        return ex

    def resume_point(self, msg_id: str) -> dict[str, Any] | None:
        """How another process collects request ``msg_id``'s answer if this one stops (``collect``): a gateway's."""
        return None

    async def collect(self, msg_id: str, code: str, *, timeout: float, grace: float) -> Execution:
        """The answer of a request another process sent (a fleet's replica that stopped mid-cell): ``cell.follow_sent``."""
        ex = Execution(code=code)
        collector = Collector(ex, self.caps(), self.spec.dirs.outputs, tag=f"stream-{msg_id[:12]}")
        return await follow_sent(CellRun(self, ex, msg_id, collector, grace, None, None), timeout)

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

    hand_over = False  # set when this server stops with its cells handed over: a cancelled cell is not interrupted
    answers_stdin: ClassVar[bool] = True  # a backend whose client has no stdin channel says False
    serves_tool_calls: ClassVar[bool] = True  # code mode's calls over the stdin channel (broker.py); gateways too

    async def reply_to(self, msg_id: str, timeout: float) -> dict[str, Any]:
        """The shell reply to request ``msg_id``, within ``timeout`` seconds. Replies to other requests
        and messages that would not decode are skipped; liveness is checked while waiting. The one
        place a shell reply is awaited (``CellRun._finish``, ``evaluate``, remote startup). Raises TimeoutError,
        or KernelDied when the kernel is gone."""
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"no shell reply to {msg_id}")
            try:
                reply = await receive(self.kc, "shell", min(remaining, POLL))
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

    async def comm(self, msg_type: str, content: dict[str, Any], buffers: Sequence[bytes | memoryview] = (), *,
                   timeout: float = 10.0) -> tuple[Any, list[memoryview]]:
        """Send ``msg_type`` (``comm_open``, ``comm_msg``) with binary ``buffers`` and return the kernel's answer on
        that comm (``send_comm``, then ``comm_answer``)."""
        return await self.comm_answer(await self.send_comm(msg_type, content, buffers, within=timeout), timeout=timeout)

    async def send_comm(self, msg_type: str, content: dict[str, Any], buffers: Sequence[bytes | memoryview] = (), *,
                        within: float = 10.0) -> str:
        """Send a comm message with binary ``buffers``, which travel as they are (zmq frames; a gateway's binary
        WebSocket frames): a fork's relay, which base64 in JSON made slow. Sent by ``stdin.send_to_kernel`` (never
        blocking the event loop; ``KernelStalled`` after ``within`` seconds). Returns its id for ``comm_answer``;
        several may be sent before their answers are read, in the order sent (the kernel answers in that order)."""
        msg: dict[str, Any] = self.kc.session.msg(msg_type, content)
        msg["buffers"] = list(buffers)
        await send_to_kernel(self.kc.shell_channel, msg, within=within)
        return str(msg["header"]["msg_id"])

    async def comm_answer(self, msg_id: str, *, timeout: float = 10.0) -> tuple[Any, list[memoryview]]:
        """The ``data`` and buffers of the first IOPub ``comm_msg`` whose parent is ``msg_id``. A kernel that goes
        idle without answering gives ``{"error": ...}``, like ``evaluate``. Nothing else may run on the kernel
        meanwhile (the caller holds the session): other IOPub messages are dropped, those of comm messages sent
        earlier too (read their answers first)."""
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError("no answer on a comm")
            try:
                got = await self.kc.get_iopub_msg(timeout=min(remaining, POLL))
            except queue.Empty:
                if not await self._manager().is_alive():
                    raise KernelStartError("kernel died", self.log_tail()) from None
                continue
            except Exception:  # noqa: BLE001 - a message that would not decode (wire.loads): not the answer
                continue
            if not isinstance(got, dict) or _parent_id(got) != msg_id:
                continue
            body = got.get("content")
            if got.get("msg_type") == "comm_msg" and isinstance(body, dict):
                found = got.get("buffers") or []
                return body.get("data"), [memoryview(b) for b in found]
            if got.get("msg_type") == "status" and isinstance(body, dict) and body.get("execution_state") == "idle":
                return {"error": "the kernel went idle without answering on its comm"}, []


def _parent_id(msg: Any) -> Any:
    parent = msg.get("parent_header") if isinstance(msg, dict) else None
    return parent.get("msg_id") if isinstance(parent, dict) else None


