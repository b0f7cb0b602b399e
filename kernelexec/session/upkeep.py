"""The session manager's background round: restarts JupyterLab asked for, kernels that died idle, idle
kernels reaped, warm spares kept for the sessions most likely to need one, and the store's rows nobody can use
any more pruned (once per fleet: by its leader)."""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import anyio

from kernelexec.config import Settings
from kernelexec.errors import KernelexecError
from kernelexec.kernel.driver import SpareKeeper
from kernelexec.session import connections
from kernelexec.session.session import Session
from kernelexec.store import Store, StoreError

logger = logging.getLogger(__name__)

SPARE_AFTER_QUIET = 1.0  # seconds a session must be quiet before a warm spare is started for it
SPARE_KEPT_QUIET = 600.0  # seconds of quiet after which a session gives its spare's place up
PRUNE_EVERY = 10.0  # seconds between passes over the store's dead rows (Store.prune)
PRUNE_BATCH = 500  # rows of each kind per statement: a pass never holds the store for long
PRUNE_BATCHES = 20  # statements of each kind per pass at most (a backlog goes over several passes)
ENDED_KEPT_S = 300.0  # a relay row (ask, question) is kept this long after it was made (a question is written just
# before its run's first record), then only while its run is unfinished
EXPIRED_KEPT_S = 3600.0  # an expired capability URL's grant is kept this long: it answers 410, then 404 (uploads.py)


class Upkeep:
    """Runs over the manager's live sessions (the same dict); started in the manager's task group."""

    def __init__(self, settings: Settings, sessions: dict[str, Session]) -> None:
        self.settings = settings
        self.sessions = sessions
        self._tg: Any = None
        self._spare_task_running = False
        # a fleet's (set by the manager): the sessions idle across the whole fleet, on its leader only (else [])
        self.fleet_idle: Callable[[float], Awaitable[list[Session]]] | None = None
        # the store this server prunes now (set by the manager): its own, or a fleet's on its leader only (else None)
        self.store_to_prune: Callable[[], Store | None] = lambda: None
        self._prune_at = time.monotonic() + PRUNE_EVERY

    async def reap(self) -> None:
        """Stop kernels idle for longer than the idle timeout; their directories and notebooks stay. In a fleet,
        once per fleet: only its leader reaps, by the store's last use of each session (``reap_fleet``)."""
        if self.fleet_idle is not None:
            await self.reap_fleet(self.fleet_idle)
            return
        idle = sorted(
            (s for s in self.sessions.values() if s.kernel is not None and not s.busy and not s.lock.locked()),
            key=lambda s: s.last_used,
        )
        timeout = self.settings.idle_timeout
        now = time.monotonic()
        for session in idle:
            if timeout and now - session.last_used > timeout:
                logger.info("stopping idle session %s", session.handle)
                # a fleet's: only when no other replica drives it now or drove it since (its kernel is then let go here)
                async with session.driving(wait=False) as driven:
                    if not driven or session.kernel is None:
                        continue
                    await session.stop_kernel()
                    session.notice = (f"before this call: the session was idle for more than {timeout:g} s, so its kernel "
                                      "was shut down (--idle-timeout); this call runs in a fresh kernel and earlier variables are lost")

    async def reap_fleet(self, fleet_idle: Callable[[float], Awaitable[list[Session]]]) -> None:
        """The leader's reaping: each session nobody in the fleet drove for ``--idle-timeout`` (its lease let go that
        long ago, whichever replica drove it last, alive or not) has its gateway kernel shut down, under its lease."""
        timeout = self.settings.idle_timeout
        if not timeout:
            return
        try:
            idle = await fleet_idle(timeout)
        except KernelexecError as exc:  # the store unreachable a moment: the next reap looks again (never the server's end)
            logger.warning("reading the fleet's idle sessions: %s", exc)
            return
        for session in idle:
            try:
                await self._stop_idle(session, timeout)
            except KernelexecError as exc:  # the store, or its lease lost meanwhile: looked at again on the next reap
                logger.warning("stopping idle session %s: %s", session.handle, exc)

    async def _stop_idle(self, session: Session, timeout: float) -> None:
        async with session.driving(wait=False) as driven:  # not while a replica drives it (a call came meanwhile)
            if not driven or session.attach_to is None:
                return
            logger.warning("stopping idle session %s: nobody in the fleet drove it for %g s (--idle-timeout); "
                           "its variables go with its kernel", session.handle, timeout)
            try:
                await session.ensure_kernel(refill=False)  # attached to its gateway kernel, to shut it down
            except Exception:  # noqa: BLE001 - gone already: nothing to stop
                logger.warning("attaching to the idle kernel of %s failed", session.handle, exc_info=True)
            await session.stop_kernel()

    async def run(self, tg: Any) -> None:
        """Every half second: Lab's restart requests, dead kernels, idle kernels, warm spares."""
        self._tg = tg
        while True:
            await anyio.sleep(0.5)
            self.lab_restarts()
            await self.restart_dead()
            await self.reap()
            await self.keep_spares()
            await self.prune()

    async def prune(self) -> dict[str, int]:
        """Every ``PRUNE_EVERY``: the store's rows nobody can use any more deleted, in bounded batches, by one server
        (a fleet's leader; ``Store.prune`` says which rows). What went, by table."""
        store = self.store_to_prune() if time.monotonic() >= self._prune_at else None
        if store is None:
            return {}
        self._prune_at = time.monotonic() + PRUNE_EVERY
        gone: dict[str, int] = {}
        try:
            for _ in range(PRUNE_BATCHES):
                now = time.time()
                batch = await store.prune(ended_before=now - ENDED_KEPT_S, expired_before=now - EXPIRED_KEPT_S,
                                          limit=PRUNE_BATCH)
                for table, count in batch.items():
                    gone[table] = gone.get(table, 0) + count
                if max(batch.values(), default=0) < PRUNE_BATCH:
                    break
                await anyio.sleep(0)  # the loop's other work between batches
        except StoreError as exc:
            logger.warning("pruning the session store: %s", exc)
        if any(gone.values()):
            logger.info("pruned the session store: %s", ", ".join(f"{n} {t}" for t, n in gone.items() if n))
        return gone

    async def keep_spares(self) -> None:
        """Up to ``restart_spares`` sessions hold a warm spare kernel for their next restart
        (``spares.Spares``). A free place goes to the most recently used session that has been
        quiet for a second; a spare is given up when it died or its session has been quiet for
        ``SPARE_KEPT_QUIET`` (the place then goes to a session in use), and goes with its session's
        kernel. One spare starts at a time, so spares neither churn under many clients nor compete
        with each other, and none is started for a session while it runs a call."""
        if not self.settings.restart_spares:
            return
        now = time.monotonic()
        live = [s for s in self.sessions.values() if s.kernel is not None and s.kernel.spares is not None and not s.closed]
        for session in live:
            spares = session.kernel.spares if session.kernel is not None else None
            if spares is None or spares.ready is None or session.lock.locked():
                continue
            if not await spares.ready.is_alive():  # killed while it waited: counts as a failure
                spares.failed()
                await spares.drop()
            elif now - session.last_used > SPARE_KEPT_QUIET:
                await spares.drop()
        if self._spare_task_running:
            return
        held = [s.kernel.spares for s in live if s.kernel is not None and s.kernel.spares is not None]
        if sum(1 for spares in held if spares.ready is not None) >= self.settings.restart_spares:
            return
        quiet = [s for s in live if s.kernel is not None and s.kernel.spares is not None and s.kernel.spares.ready is None
                 and not s.busy and not s.lock.locked() and SPARE_AFTER_QUIET <= now - s.last_used <= SPARE_KEPT_QUIET
                 and now >= s.kernel.spares.retry_at]
        if quiet:
            chosen = max(quiet, key=lambda s: s.last_used).kernel
            assert chosen is not None and chosen.spares is not None
            self._spare_task_running = True
            self._tg.start_soon(self.prepare_spare, chosen.spares)

    async def prepare_spare(self, spares: SpareKeeper) -> None:
        try:
            await spares.prepare()  # a failure backs off (Spares.failed)
        finally:
            self._spare_task_running = False

    def lab_restarts(self) -> None:
        """Restart the kernels ``kernelexec lab`` asked to restart (connections.request_restart), through
        their sessions: in turn with their calls, recorded, and said in the next answer."""
        directory = connections.connections_dir(self.settings.state_dir)
        for session in list(self.sessions.values()):
            if session.kernel is not None and not session.closed and connections.take_restart_request(directory, session.handle):
                logger.info("restarting the kernel of %s for JupyterLab", session.handle)
                self._tg.start_soon(self.restart_for_lab, session)

    async def restart_for_lab(self, session: Session) -> None:
        directory = connections.connections_dir(self.settings.state_dir)
        try:
            await session.restart(by="JupyterLab (kernelexec lab)")
        except Exception as exc:
            logger.exception("restarting %s for JupyterLab failed", session.handle)
            connections.restart_done(directory, session.handle, f"the restart failed: {exc}")
        else:
            connections.restart_done(directory, session.handle, "ok")

    async def restart_dead(self) -> None:
        """Notice kernels that died while idle (killed from outside, OOM) and restart them at once."""
        for session in list(self.sessions.values()):
            if session.kernel is None or session.busy or session.lock.locked():
                continue
            if not await session.kernel.is_alive():
                async with session.driving(wait=False) as driven:  # a fleet's: not while another replica drives it
                    if not driven:
                        continue
                    try:
                        await session.check_alive()
                    except Exception:
                        logger.exception("restarting the dead kernel of %s", session.handle)
