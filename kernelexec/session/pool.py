"""The warm pool: sessions minted ahead with their kernel started (inside its sandbox) and warmed, their
owner unset, handed out by ``SessionManager.create`` to a session of the same environment and directory.
A session created while the pool is empty but its next kernel is on the way waits for that kernel
(``wait_for_filling``) rather than starting a cold one beside it: the first call of a new server."""

from __future__ import annotations

import logging
import secrets
from collections.abc import Awaitable, Callable
from pathlib import Path

import anyio

from kernelexec.config import Settings
from kernelexec.environment.interpreter import Environment
from kernelexec.session.session import Session

logger = logging.getLogger(__name__)


def same_environment(a: Environment | None, b: Environment | None) -> bool:
    return (a is None and b is None) or (a is not None and b is not None and a.key == b.key and a.overlay == b.overlay)


class WarmPool:
    """``sessions``: the pooled sessions, oldest first. Taken from under the manager's create lock."""

    def __init__(self, settings: Settings, environment_for: Callable[[Path | None], Awaitable[Environment | None]],
                 discard: Callable[[Session], None]) -> None:
        self.settings = settings
        self.sessions: list[Session] = []
        self._environment_for = environment_for
        self._discard = discard  # removes a never-handed-out session's directory
        self._changed = anyio.Event()
        self.filling = False  # keep_filled is making the next pooled session (its environment, kernel, warm-up)
        self._next_session: Session | None = None  # that session, once its environment is known
        self._filled = anyio.Event()  # set when it is pooled, or given up
        self._awaited = False  # one caller waits for ``filling``: the next finds the pool empty and starts its own
        # set once the server's start-up work is done (SessionManager._start_up: matplotlib's font list): warm
        # imports wait for it, the kernel's start does not
        self.start_up_done = anyio.Event()

    async def take(self, environment: Environment | None, working_dir: Path | None,
                   admit: Callable[[Session], None]) -> Session | None:
        """A pooled session for ``environment`` in ``working_dir`` (``admit`` reserves its place or raises), or
        None. Pooled kernels of another environment are stopped when the project's environment changed."""
        if working_dir != self.settings.working_dir:
            return None
        stale = [s for s in self.sessions if not same_environment(s.environment, environment)]
        if stale:
            self.sessions = [s for s in self.sessions if s not in stale]
            self._changed.set()
            for session in stale:
                await self.drop(session)
        if not self.sessions:
            return None
        session = self.sessions[0]
        admit(session)
        self.sessions.pop(0)  # popped under the create lock: one kernel never goes to two sessions
        self._changed.set()
        return session

    async def wait_for_filling(self, environment: Environment | None, working_dir: Path | None) -> None:
        """When the pool is empty but its next kernel (of ``environment``, in ``working_dir``) is being started and
        warmed, wait (up to --startup-timeout) until it is pooled or given up; then ``take`` finds it. Starting a
        cold kernel beside it instead made the first call of a new server pay a second kernel's start on the same
        cores, and its first cell the data stack's imports (first plot: 1.06 s against 0.16 s from the pool)."""
        known = self._next_session
        if (self.sessions or not self.filling or self._awaited or working_dir != self.settings.working_dir
                or (known is not None and not same_environment(known.environment, environment))):
            return
        self._awaited = True
        try:
            with anyio.move_on_after(self.settings.startup_timeout):
                await self._filled.wait()
        finally:
            self._awaited = False

    def _end_filling(self) -> None:
        self.filling, self._next_session = False, None
        self._filled.set()

    async def drop(self, session: Session) -> None:
        await session.stop_kernel()
        session.release()
        self._discard(session)

    async def close(self) -> None:
        pooled, self.sessions = self.sessions, []
        for session in pooled:  # never handed out: nothing to keep
            await self.drop(session)

    async def keep_filled(self) -> None:
        """Keep ``pool_size`` sessions with started kernels (inside their sandbox) ready for ``create``."""
        while True:
            while len(self.sessions) < self.settings.pool_size:
                self.filling, self._filled = True, anyio.Event()
                try:
                    environment = await self._environment_for(self.settings.working_dir)
                except Exception:  # --python not usable (now): sessions will say why
                    logger.exception("the kernels' environment is not usable; no warm pool for 5 s")
                    self._end_filling()
                    await anyio.sleep(5)
                    continue
                try:
                    session = Session(secrets.token_urlsafe(12), self.settings, working_dir=self.settings.working_dir,
                                      environment=environment)
                except Exception:  # the state dir cannot hold sessions: calls will say why; the server stays up
                    logger.exception("cannot create a pooled session; no warm pool")
                    self._end_filling()
                    return
                session.pooled = True
                self._next_session = session
                try:
                    await session.ensure_kernel()
                    session.reserved = False  # a pooled kernel counts against the limits once adopted
                    if session.kernel is not None:
                        await self.start_up_done.wait()
                        await session.kernel.warm()
                    self.sessions.append(session)
                except Exception:
                    logger.exception("starting a pooled kernel failed; retrying in 5 s")
                    self._end_filling()  # a caller waiting for it starts its own now, not after the back-off
                    await self.drop(session)
                    await anyio.sleep(5)
                    continue
                finally:
                    self._end_filling()
            await self._changed.wait()
            self._changed = anyio.Event()
