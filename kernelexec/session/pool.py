"""The warm pool: sessions minted ahead with their kernel started (inside its sandbox) and warmed, their
owner unset, handed out by ``SessionManager.create`` to a session of the same environment and directory."""

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
                try:
                    environment = await self._environment_for(self.settings.working_dir)
                except Exception:  # --python not usable (now): sessions will say why
                    logger.exception("the kernels' environment is not usable; no warm pool for 5 s")
                    await anyio.sleep(5)
                    continue
                try:
                    session = Session(secrets.token_urlsafe(12), self.settings, working_dir=self.settings.working_dir,
                                      environment=environment)
                except Exception:  # the state dir cannot hold sessions: calls will say why; the server stays up
                    logger.exception("cannot create a pooled session; no warm pool")
                    return
                session.pooled = True
                try:
                    await session.ensure_kernel()
                    session.reserved = False  # a pooled kernel counts against the limits once adopted
                    if session.kernel is not None:
                        await self.start_up_done.wait()
                        await session.kernel.warm()
                except Exception:
                    logger.exception("starting a pooled kernel failed; retrying in 5 s")
                    await self.drop(session)
                    await anyio.sleep(5)
                    continue
                self.sessions.append(session)
            await self._changed.wait()
            self._changed = anyio.Event()
