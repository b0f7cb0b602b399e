"""Warm spares: a session's next restart takes a kernel started ahead, inside the same sandbox.

A kernel's sandbox is bound to its session at exec (its uid, bind mounts, Landlock rules and
cgroup), so a generic pooled kernel cannot become a restarted session's kernel. The spare is
started ahead inside the same session's sandbox, in the session's other slot (own connection file,
sockets and cgroups), with its startup code run and its policy checked, and sits idle until the
next restart swaps it in: a restart then costs a SIGKILL instead of a kernel start.

``Spares`` belongs to one ``Kernel`` (``kernel.spares``); the session manager decides when a spare
is started or given up (``SessionManager._keep_spares``), ``Kernel.restart`` calls ``take_over``.
"""

from __future__ import annotations

import contextlib
import logging
import subprocess
import time
from typing import TYPE_CHECKING

import anyio

from kernelexec.kernel.launch import other_slot

if TYPE_CHECKING:
    from kernelexec.kernel.driver import Kernel

logger = logging.getLogger(__name__)

BACKOFF_FIRST = 5.0  # seconds before the next spare after a first failure, doubling per failure in a row
BACKOFF_MAX = 600.0


class Spares:
    """The warm spare of one kernel: at most one ready (``ready``) or starting at a time."""

    def __init__(self, kernel: Kernel) -> None:
        self.kernel = kernel
        self.ready: Kernel | None = None
        self.takeovers = 0
        self.failures = 0  # spares in a row that failed to start or died waiting
        self.retry_at = 0.0  # monotonic time before which no spare is started (back-off)
        self._starting: anyio.Event | None = None  # set when a spare being started is done (or failed)
        self._scope: anyio.CancelScope | None = None

    async def prepare(self) -> bool:
        """Start the spare (no-op if there is one or one is starting). True if one is ready."""
        owner = self.kernel
        if owner.km is None or self.ready is not None or self._starting is not None:
            return self.ready is not None
        done = self._starting = anyio.Event()
        spare = type(owner)(owner.spec, startup_timeout=owner.startup_timeout, slot=other_slot(owner.slot))
        try:
            with anyio.CancelScope() as self._scope:
                await spare.start()
                await spare.warm()  # the data stack imported ahead, before it can be swapped in
        except Exception:
            logger.exception("starting a warm spare kernel failed")
            self.failed()
            return False
        finally:
            self._scope = self._starting = None
            done.set()
        if spare.km is None:  # cancelled by shutdown(): start() has already cleaned up
            return False
        if owner.km is None or self.ready is not None or spare.slot == owner.slot:  # shut down or swapped meanwhile
            with anyio.CancelScope(shield=True):
                await spare.shutdown()
            return False
        self.ready = spare
        self.failures = 0
        return True

    def failed(self) -> None:
        """Back off: the live kernel can make spares fail on purpose (squatting their socket names,
        using up the processes), so each failure in a row doubles the wait, from 5 s to 10 minutes."""
        self.failures += 1
        self.retry_at = time.monotonic() + min(BACKOFF_FIRST * 2 ** (self.failures - 1), BACKOFF_MAX)

    async def drop(self) -> None:
        spare, self.ready = self.ready, None
        if spare is not None:
            await spare.shutdown()

    async def shutdown(self) -> None:
        """Stop a spare being started (its own start() cleans up) and the ready one."""
        if self._scope is not None:
            self._scope.cancel()
            if self._starting is not None:
                await self._starting.wait()
        await self.drop()

    async def take_over(self) -> bool:
        """Swap the spare in (waiting for one still starting) and kill the old kernel. False: no usable spare."""
        owner = self.kernel
        if self._starting is not None:
            with anyio.move_on_after(min(owner.startup_timeout, 30)):
                await self._starting.wait()
        if self.ready is None:
            return False
        with anyio.CancelScope(shield=True):  # bounded; never leaves a detached spare or a half-swapped kernel
            spare, self.ready = self.ready, None
            try:  # alive, and its policy still installed (its startup code ran when it started)
                report = await spare.evaluate("_kernelexec_policy()", timeout=5) if await spare.is_alive() else None
            except Exception:
                report = None
            if not (isinstance(report, dict) and report.get("active")):
                logger.warning("the warm spare is dead or lost its policy (%r); starting a fresh kernel", report)
                self.failed()
                await spare.shutdown()
                return False
            old_km, old_kc, old_log = owner.km, owner.kc, owner._log
            owner.adopt(spare)
            self.takeovers += 1
            if old_kc is not None:
                old_kc.stop_channels()
            if old_km is None:
                return True
            try:
                # SIGKILL and reap it here: jupyter_client's own wait polls every 0.1 s
                provisioner = old_km.provisioner
                process = getattr(provisioner, "process", None)
                if provisioner is not None and process is not None:
                    await provisioner.kill()
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        await anyio.to_thread.run_sync(process.wait, 5.0)
                await old_km.shutdown_kernel(now=True)
            except Exception:
                logger.exception("stopping the replaced kernel failed")
            finally:
                await old_km._async_cleanup_resources()
                if old_log is not None:
                    old_log.close()
        return True
