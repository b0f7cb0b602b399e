"""One IPython kernel, driven through jupyter_client's async API.

``Kernel.execute`` sends one request, reads IOPub (filtered by ``parent_header.msg_id``) and the
shell reply against one monotonic deadline, and races that against ``is_alive()`` so a dead kernel
is noticed in well under a second. On timeout it escalates: SIGINT, a short grace, then a restart.
Callers hold the session lock: at most one request is ever in flight per kernel.
"""

from __future__ import annotations

import contextlib
import json
import logging
import queue
import signal
import subprocess
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import IO, Any

import anyio
import anyio.lowlevel
from jupyter_client.manager import AsyncKernelManager

from .errors import KernelStartError
from .launch import SLOTS, LaunchSpec, kernel_manager, other_slot
from .collector import Caps, Collector, strip_ansi
from .models import Execution
from .wire import harden

logger = logging.getLogger(__name__)

_POLL = 0.2  # seconds between liveness checks while waiting on output

OnOutput = Callable[[str, str], Awaitable[None]]  # (stream name, text) for progress reporting


class Kernel:
    """A running kernel for one session. Not safe for concurrent ``execute`` calls: the session serialises them."""

    # Local kernels can keep a warm spare for their next restart (see ``prepare_spare``). Remote
    # backends restart their own way and say False.
    spares = True
    liveness_every = _POLL  # seconds between liveness checks while a request runs

    def __init__(self, spec: LaunchSpec, *, startup_timeout: float = 60.0, slot: str = SLOTS[0]) -> None:
        self.spec = spec
        self.startup_timeout = startup_timeout
        self.slot = slot
        self.km: AsyncKernelManager | None = None
        self.kc: Any = None
        self._log: IO[bytes] | None = None
        self.restarts = 0
        self.spare: Kernel | None = None  # started ahead in this session's sandbox; the next restart takes it
        self.spare_takeovers = 0
        self._spare_starting: anyio.Event | None = None  # set when a spare being started is done (or failed)
        self._spare_scope: anyio.CancelScope | None = None
        self.spare_failures = 0  # spares in a row that failed to start or died waiting
        self.spare_retry_at = 0.0  # monotonic time before which no spare is started (back-off)

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

    # Seams for other kernel backends (a remote gateway): how the manager is made and started, and
    # how the startup code gets into the kernel. Locally, the provisioner and exec_files do it all.
    def create_manager(self) -> AsyncKernelManager:
        return kernel_manager(self.spec, self.slot)

    @property
    def connection_file(self) -> Path:
        return self.spec.dirs.connection_file_for(self.slot)

    def start_kwargs(self) -> dict[str, Any]:
        return self.spec.start_kwargs(self._log)

    async def install_startup(self) -> None:
        """Locally a no-op: ipykernel ran ``startup/kernel_init.py`` (exec_files) before answering."""

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
                if not await self.km.is_alive():
                    raise KernelStartError("kernel exited during startup", self.log_tail()) from exc
                raise
        await self.install_startup()
        report = await self.evaluate("_kernelexec_policy()", timeout=self.startup_timeout)
        if not (isinstance(report, dict) and report.get("active")):
            raise KernelStartError(f"kernel started without its policy: {report!r}", self.log_tail())

    async def shutdown(self) -> None:
        """Stop the kernel (and its spare) and release their sockets and files. Safe to call more than once."""
        if self._spare_scope is not None:
            self._spare_scope.cancel()  # a spare still starting is stopped by its own start()
            if self._spare_starting is not None:
                await self._spare_starting.wait()
        spare, self.spare = self.spare, None
        if spare is not None:
            await spare.shutdown()
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
        if await self._take_spare():
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

    # --- warm spares -----------------------------------------------------------------------------
    # A kernel's sandbox is bound to its session at exec (its uid, bind mounts, Landlock rules and
    # cgroup), so a generic pooled kernel cannot become a restarted session's kernel. The spare is
    # started ahead inside the same session's sandbox, in the session's other slot (own connection
    # file and sockets), with its startup code run and its policy checked, and sits idle until the
    # next restart swaps it in: a restart then costs a SIGKILL instead of a kernel start.
    async def prepare_spare(self) -> bool:
        """Start this kernel's spare (no-op if there is one or one is starting). True if one is ready."""
        if not self.spares or self.km is None or self.spare is not None or self._spare_starting is not None:
            return self.spare is not None
        done = self._spare_starting = anyio.Event()
        spare = type(self)(self.spec, startup_timeout=self.startup_timeout, slot=other_slot(self.slot))
        try:
            with anyio.CancelScope() as self._spare_scope:
                await spare.start()
                await spare.warm()  # the data stack imported ahead, before it can be swapped in
        except Exception:
            logger.exception("starting a warm spare kernel failed")
            self.spare_failed()
            return False
        finally:
            self._spare_scope = self._spare_starting = None
            done.set()
        if spare.km is None:  # cancelled by shutdown(): start() has already cleaned up
            return False
        if self.km is None or self.spare is not None or spare.slot == self.slot:  # shut down or swapped meanwhile
            with anyio.CancelScope(shield=True):
                await spare.shutdown()
            return False
        self.spare = spare
        self.spare_failures = 0
        return True

    def spare_failed(self) -> None:
        """Back off: the live kernel can make spares fail on purpose (squatting their socket names,
        using up the processes), so each failure in a row doubles the wait, from 5 s to 10 minutes."""
        self.spare_failures += 1
        self.spare_retry_at = time.monotonic() + min(5.0 * 2 ** (self.spare_failures - 1), 600.0)

    async def drop_spare(self) -> None:
        spare, self.spare = self.spare, None
        if spare is not None:
            await spare.shutdown()

    async def _take_spare(self) -> bool:
        """Swap the spare in (waiting for one still starting) and kill the old kernel. False: no usable spare."""
        if self._spare_starting is not None:
            with anyio.move_on_after(min(self.startup_timeout, 30)):
                await self._spare_starting.wait()
        if self.spare is None:
            return False
        with anyio.CancelScope(shield=True):  # bounded; never leaves a detached spare or a half-swapped kernel
            spare, self.spare = self.spare, None
            try:  # alive, and its policy still installed (its startup code ran when it started)
                report = await spare.evaluate("_kernelexec_policy()", timeout=5) if await spare.is_alive() else None
            except Exception:
                report = None
            if not (isinstance(report, dict) and report.get("active")):
                logger.warning("the warm spare is dead or lost its policy (%r); starting a fresh kernel", report)
                self.spare_failed()
                await spare.shutdown()
                return False
            old_km, old_kc, old_log = self.km, self.kc, self._log
            self.km, self.kc, self._log, self.slot = spare.km, spare.kc, spare._log, spare.slot
            spare.km = spare.kc = spare._log = None
            self.spare_takeovers += 1
            old_kc.stop_channels()
            try:
                # SIGKILL and reap it here: jupyter_client's own wait polls every 0.1 s
                process = getattr(old_km.provisioner, "process", None)
                if process is not None:
                    await old_km.provisioner.kill()
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        await anyio.to_thread.run_sync(process.wait, 5.0)
                await old_km.shutdown_kernel(now=True)
            except Exception:
                logger.exception("stopping the replaced kernel failed")
            finally:
                await old_km._async_cleanup_resources()
                old_log.close()
        return True

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

    def exit_code(self) -> int | None:
        process = getattr(self.km.provisioner, "process", None) if self.km else None
        return None if process is None else process.poll()

    def note(self, text: str) -> None:
        """A timestamped line in the session's ``kernel.log`` (what a remote backend did; the kernel's
        own stderr goes there too for local kernels)."""
        if self._log is not None and not self._log.closed:
            stamp = time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime())
            self._log.write(f"{stamp} {text}\n".encode())
            self._log.flush()

    def log_tail(self, limit: int = 2000) -> str:
        try:
            return self.spec.dirs.log.read_bytes()[-limit:].decode(errors="replace")
        except OSError:
            return ""

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
    ) -> Execution:
        """Run ``code`` as one cell. Never raises for the user's errors; those are in ``Execution.error``."""
        ex = Execution(code=code)
        started = time.monotonic()
        if not await self.is_alive():
            # It died before this request (killed between calls, noticed only now): the code has not
            # run, so run it in a fresh kernel rather than report a death it did not cause. Once sent,
            # a request is never sent again: a kernel that dies without a word may have run part of it.
            status = self.exit_status()
            await self.restart()
            ex.restart_reason = (f"before this code ran, the kernel had died ({status}); it was restarted, "
                                 "so variables from earlier calls are lost")
        msg_id = self._send(code)
        collector = Collector(ex, self.caps(), self.spec.dirs.outputs, tag=f"stream-{msg_id[:12]}")
        try:
            state = await self._collect(msg_id, collector, started + timeout, on_output)
            if state == "timeout":
                ex.timed_out = True
                state = await self._escalate(msg_id, collector, grace, ex, "timed out after %.3g s" % timeout)
            if state == "dead":
                await self._after_death(ex, silent=not collector.began)
            elif state == "idle":
                await self._finish(msg_id, ex, deadline=time.monotonic() + max(grace, 5.0))
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

    def caps(self) -> Caps:
        """The server's own per-cell caps: a little above what the kernel's cap forwards, so an honest
        kernel never meets them."""
        policy = self.spec.policy
        stream_cap = int(policy.get("stream_cap", 1_000_000))
        return Caps(stream_keep=stream_cap + stream_cap // 10 + 1000, spill_cap=max(int(policy.get("disk_cap", 64_000_000)), stream_cap))

    def _send(self, code: str) -> str:
        return self.kc.execute(
            code,
            store_history=True,
            allow_stdin=False,
            stop_on_error=False,
            user_expressions={"report": "_kernelexec_report()"},
        )

    async def _collect(
        self, msg_id: str, collector: Collector, deadline: float, on_output: OnOutput | None
    ) -> str:
        """Read IOPub until the request's idle status: returns ``idle``, ``timeout`` or ``dead``."""
        next_check = time.monotonic() + self.liveness_every
        while True:
            now = time.monotonic()
            if now >= next_check:
                if not await self.km.is_alive():
                    return "dead"
                next_check = now + self.liveness_every
            remaining = deadline - now
            if remaining <= 0:
                return "timeout"
            try:
                msg = await self.kc.get_iopub_msg(timeout=min(remaining, _POLL))
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
        await self.km.interrupt_kernel()
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
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                logger.warning("no execute_reply for %s", msg_id)
                return
            try:
                reply = await self.kc.get_shell_msg(timeout=remaining)
            except queue.Empty:
                return
            except Exception:  # a reply that would not decode (wire.loads): not ours to wait for
                ex.notes.append("the server dropped an unreadable shell message")
                continue
            if _parent_id(reply) == msg_id:
                break
        content = reply.get("content") if isinstance(reply, dict) else None
        if not isinstance(content, dict):
            ex.notes.append("the server dropped a malformed execute_reply (content is not an object)")
            return
        count = content.get("execution_count")
        if isinstance(count, int) and not isinstance(count, bool):
            ex.execution_count = count
        if content.get("status") == "error" and ex.error is None:
            traceback = content.get("traceback", [])
            ex.error = {
                "ename": str(content.get("ename", "Error")),
                "evalue": str(content.get("evalue", "")),
                "traceback": [strip_ansi(t) for t in traceback if isinstance(t, str)] if isinstance(traceback, list) else [],
            }
        expressions = content.get("user_expressions")
        report = expressions.get("report") if isinstance(expressions, dict) else None
        data = report.get("data") if isinstance(report, dict) and report.get("status") == "ok" else None
        payload = data.get("application/json") if isinstance(data, dict) else None
        if isinstance(payload, dict):
            ex.streams_cut = _streams_cut(payload.pop("streams", None), self.spec.dirs.spill)
            ex.result = _result(payload, self.spec.dirs.spill)

    async def evaluate(self, expression: str, *, timeout: float = 10.0) -> Any:
        """Evaluate one expression silently (no history, no IOPub output); return its JSON or text."""
        msg_id = self.kc.execute("", silent=True, store_history=False, user_expressions={"x": expression})
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"no reply evaluating {expression!r}")
            try:
                reply = await self.kc.get_shell_msg(timeout=min(remaining, _POLL))
            except queue.Empty:
                if not await self.km.is_alive():
                    raise KernelStartError("kernel died", self.log_tail()) from None
                continue
            except Exception:  # a reply that would not decode (wire.loads)
                continue
            if _parent_id(reply) == msg_id:
                break
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


def _streams_cut(report: Any, spill_dir: Path) -> dict[str, Any]:
    """The kernel's report of what its stream cap cut, kept only in the shape the runtime gives it
    (a file it names must be in the session's spill directory)."""
    if not isinstance(report, dict):
        return {}
    kept: dict[str, Any] = {}
    for name in ("stdout", "stderr"):
        item = report.get(name)
        if isinstance(item, dict):
            path = item.get("file")
            ok = isinstance(path, str) and Path(path).parent == spill_dir
            kept[name] = {**{k: v for k, v in item.items() if k != "file"}, **({"file": path} if ok else {})}
    return kept


def _result(payload: dict[str, Any], spill_dir: Path) -> dict[str, Any] | None:
    """The runtime's result report, if it has the runtime's shape (kind, format, text, file)."""
    if payload.get("kind") == "none" or not isinstance(payload.get("text"), str):
        return None
    if payload.get("format") == "json":
        try:
            json.loads(payload["text"])
        except ValueError:
            payload = {**payload, "format": "text"}
    path = payload.get("file")
    if path is not None and not (isinstance(path, str) and Path(path).parent == spill_dir):
        payload = {k: v for k, v in payload.items() if k != "file"}
    return payload
