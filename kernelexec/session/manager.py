"""The session manager: every session of a server process, by handle (and the stdio default, and legacy
HTTP's transport ids), under the session limits; revives sessions a restarted server left; runs the warm
pool (pool.py) and the background upkeep (upkeep.py)."""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import secrets
import shutil
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio

from kernelexec.codemode.broker import from_settings as broker_from_settings
from kernelexec.config import Settings
from kernelexec.environment import fontcache
from kernelexec.environment.interpreter import Environment
from kernelexec.environment.overlay import prepare
from kernelexec.errors import InvalidRequest, KernelexecError, SessionError
from kernelexec.host import KernelReach
from kernelexec.layout import valid_handle
from kernelexec.sandbox.probe import kernel_reach
from kernelexec.session.fleet import Fleet
from kernelexec.session.pool import WarmPool
from kernelexec.session.reconcile import reconcile
from kernelexec.session.recording import JournalSink, mark_closed
from kernelexec.session.runs import Finished, RunRegistry
from kernelexec.session.session import SAVES_WAIT, Session
from kernelexec.session.upkeep import Upkeep
from kernelexec.store import Fence, RunRecord, SessionRecord, StaleLease, Store, StoreError, open_store

logger = logging.getLogger(__name__)


class SessionManager:
    """Owns all sessions of a server process. Use as an async context manager."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.sessions: dict[str, Session] = {}
        self.aliases: dict[str, str] = {}  # transport session id (legacy HTTP) -> handle
        self.default_handle: str | None = None
        self._create_lock = anyio.Lock()
        self._resolving: dict[Path | None, anyio.Lock] = {}  # environment_for's, per working dir while in use
        self.runs = RunRegistry(settings)  # the run budgets (--max-queued-runs*) and the finished runs kept
        self.store: Store | None = None  # the session store, while running (runs and tasks a restart keeps)
        self.fleet: Fleet | None = None  # on a shared store, or with gateway kernels: this server's place in its fleet
        self.broker = broker_from_settings(settings)  # code mode, or None; a config a kernel could write is refused here
        self.pool = WarmPool(settings, self.environment_for, self.remove_dir)
        self.upkeep = Upkeep(settings, self.sessions)
        self._taking: dict[str, anyio.Event] = {}  # sessions being taken over from a stopped replica (take_over)

    @asynccontextmanager
    async def running(self) -> AsyncIterator[SessionManager]:
        self.settings.state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)  # its own caches and upload spool, also
        self.settings.sessions_dir.mkdir(parents=True, exist_ok=True, mode=0o700)  # when sessions are on --shared-dir
        # nbformat is imported here, once, on the event loop thread before any worker thread uses it:
        # imported lazily from a worker thread and the loop at once, it fails with a circular import
        import nbformat.v4  # noqa: F401

        code_mode = self.broker.running() if self.broker is not None else contextlib.nullcontext()  # code mode's connections
        async with self._store(), code_mode:
            try:
                async with anyio.create_task_group() as tg:
                    self.runs.attach(tg)
                    if self.fleet is not None:
                        tg.start_soon(self.fleet.keep)
                    tg.start_soon(self.upkeep.run, tg)
                    tg.start_soon(self._start_up)
                    try:
                        yield self
                    finally:
                        self.hand_over()
                        tg.cancel_scope.cancel()
            finally:  # after the runs' ends (a cell cancelled here is recorded lost while its kernel is still attached)
                with anyio.CancelScope(shield=True):
                    await self.aclose()

    def _drop_connection(self, handle: str) -> None:
        """A fleet's session another replica drives now: this replica's connection to its kernel closed (not the
        kernel), unless a call of its own is at it."""
        session = self.sessions.get(handle)
        if session is not None and not session.lock.locked():
            session.forget_kernel()

    def hand_over(self) -> None:
        """A fleet's replica stopping (a drain past its deadline, a second signal): its cells still running are left
        running on their gateway kernels, not interrupted, and their runs stay collectable by the next holder of
        their session (``Session.collect_orphans``), their records saying they were handed over."""
        if self.fleet is None or not self.fleet.drives:
            return
        self.runs.handing_over = True
        for session in self.sessions.values():
            if session.kernel is not None:
                session.kernel.hand_over = True

    async def _start_up(self) -> None:
        """What each new kernel would pay once is paid here, once per install (matplotlib's font list,
        environment/fontcache.py), while the warm pool's first kernel starts: its directory is made at once, the
        pool's warm imports wait for the list, and a kernel links it when it boots and again before them."""
        reach = kernel_reach(self.settings)
        try:
            if fontcache.reserve(self.settings.cache_dir, reach) is None:  # else offered to the first pooled kernel already
                logger.warning("the cache directory %s is writable by kernels: matplotlib's font list is not prepared there",
                               self.settings.cache_dir)
        except OSError:
            logger.exception("the cache directory cannot hold matplotlib's font list")
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._prepare_font_list, reach)
            await self.pool.keep_filled()

    async def _prepare_font_list(self, reach: KernelReach) -> None:
        try:
            await anyio.to_thread.run_sync(fontcache.prepare, self.settings.cache_dir, reach)
        except Exception:  # a kernel builds its own, as without it: never the server's failure
            logger.exception("preparing matplotlib's font list failed")
        finally:
            self.pool.start_up_done.set()

    @asynccontextmanager
    async def _store(self) -> AsyncIterator[Store]:
        """The session store (--store, or <state dir>/kernelexec.db) while running. Runs a previous server left
        running or waiting for input died with it: they are marked lost, so they answer so."""
        url = self.settings.store.get_secret_value() if self.settings.store is not None else None
        store = await open_store(url, self.settings.state_dir)
        remote = bool(self.settings.kernel_gateway)
        shared = url is not None and url.split(":", 1)[0].lower() in ("postgresql", "postgres")
        try:
            if shared or remote:  # a store other servers may serve: admitted (fleet.py) or refused, before anything
                fleet = Fleet(store, remote=remote)
                fleet.connected = lambda: [h for h, s in self.sessions.items() if s.kernel is not None and not s.lock.locked()]
                fleet.drop = self._drop_connection
                await fleet.join()
                self.fleet = fleet
                if fleet.drives:  # reaping once per fleet: by its leader, from the store
                    self.upkeep.fleet_idle = self._idle_in_fleet
            if not remote:
                # a previous release's sessions imported, files and store made to agree (a killed server's last cells)
                await reconcile(store, self.settings.sessions_dir)
                lost = await store.lose_unfinished()
                if lost:
                    logger.warning("%d run(s) were still running when the previous server stopped: recorded as lost", lost)
            # with gateway kernels other replicas' runs go on: a session's are marked lost when its lease is taken over
            self.store = store
            self.upkeep.store_to_prune = self._store_to_prune
            yield store
        finally:
            self.store = None
            with anyio.CancelScope(shield=True):
                if self.fleet is not None:
                    await self.fleet.leave()
                    self.fleet = None
                await store.close()

    async def aclose(self) -> None:
        await self.pool.close()
        sessions = list(self.sessions.values())
        for session in sessions:
            try:
                if session.driver is not None:
                    session.forget_kernel()  # a fleet's kernel stays on the gateway for the other replicas
            except Exception:
                logger.exception("letting go of the kernel of session %s", session.handle)
        try:
            if any(session.kernel is not None for session in sessions):
                logger.info("waiting up to %g s for the kernels' last checkpoint saves", SAVES_WAIT)
            async with anyio.create_task_group() as tg:  # revived by a later server: from whole checkpoints, all at once
                for session in sessions:
                    tg.start_soon(session.finish_saves)
        finally:
            for session in sessions:
                try:
                    await session.stop_kernel()
                except Exception:
                    logger.exception("closing session %s", session.handle)
                session.release()  # a later server (or manager) may revive it

    def live_count(self) -> int:
        return sum(1 for s in self.sessions.values() if s.reserved and not s.closed)

    def admit(self, session: Session, owner: str | None = None) -> None:
        """Check the session limits and reserve a place for ``session``; raises SessionError when full.
        Synchronous, so no other call can slip in between the count and the reservation."""
        if session.reserved:
            return
        if self.live_count() >= self.settings.max_sessions:
            raise SessionError.limit(self.settings.max_sessions)
        owner = session.owner if owner is None else owner
        if owner is not None:
            held = sum(1 for s in self.sessions.values() if s.owner == owner and s.reserved and not s.closed)
            if held >= self.settings.max_sessions_per_token:
                raise SessionError(f"this token already holds {held} live sessions (--max-sessions-per-token); "
                                   "close one with close_session")
        session.reserved = True

    def _track(self, session: Session) -> Session:
        session.admit = self.admit
        session.broker = self.broker
        session.recorder.sink = self._journal_sink(session.handle)
        if self.fleet is not None and self.fleet.drives:
            session.driver = self.fleet
            session.remember = self._remember_kernel
            session.collected = self._collected
        self.sessions[session.handle] = session
        return session

    def _journal_sink(self, handle: str) -> JournalSink | None:
        """How the session's Recorder writes a cell into the store's journal, from its worker thread: SQLite's
        directly (one transaction in that thread), any other store through the event loop."""
        store = self.store
        if store is None:
            return None
        fleet = self.fleet if self.fleet is not None and self.fleet.drives else None

        def fence() -> Fence | None:  # a fleet's cell carries its lease's token: refused once another replica took it
            if fleet is None:
                return None
            taken = fleet.fence(handle)
            if taken is None:  # never unfenced: a write outside any lease of this replica's is no write
                raise StaleLease(f"session {handle}: this replica never held its lease; nothing recorded")
            return taken

        direct = getattr(store, "append_journal_sync", None)
        if direct is not None:
            return lambda record: int(direct(handle, record, fence=fence()))
        return lambda record: int(anyio.from_thread.run(functools.partial(store.append_journal, handle, record, fence=fence())))

    async def _remember(self, session: Session, *, closed: bool = False) -> None:
        """The session's record in the store (created, adopted, revived or closed): what a later lookup trusts.
        A closed session's record stays, closed: no file left behind brings it back (``reconcile``)."""
        if self.store is None:
            return
        try:
            await self.store.put_session(self._record(session, session.attach_to, closed=closed))
        except StoreError:
            logger.exception("recording session %s in the store", session.handle)

    def _record(self, session: Session, gateway_kernel_id: str | None, *, closed: bool = False) -> SessionRecord:
        env = session.environment.summary() if session.environment is not None else None
        remote = bool(self.settings.kernel_gateway)
        return SessionRecord(session.handle, session.owner, str(session.default_cwd),
                             json.dumps(env, sort_keys=True) if env is not None else "", session.profile,
                             local_slot=None if remote else "k", gateway_kernel_id=gateway_kernel_id if remote else None,
                             closed=time.time() if closed else None)

    async def _collected(self, session: Session, record: RunRecord, finished: Finished | None, why: str) -> None:
        """A run a stopped replica left on the session's kernel (session/fleet.py): finished here with its collected
        answer, or recorded lost (fenced by the session's lease) when nothing could be collected."""
        if finished is not None:
            await self.runs.adopt(session, record.id, finished)
            return
        fence = self.fleet.fence(session.handle) if self.fleet is not None else None
        if self.store is not None and fence is not None and await self.store.lose_run(record.id, fence=fence):
            logger.warning("session %s: run %s recorded as lost: %s", session.handle, record.id, why)

    def take_over(self, handle: str, *, owner: str | None) -> anyio.Event:
        """Take, in the background, a session whose driving replica stopped (a get_run of one of its runs found it
        so): attaching adopts the runs it left (``Fleet.adopt_orphans``: collected, or recorded lost), then collects
        them. Once at a time per session; a live holder keeps it (nothing waits for its lease). Set once the runs
        were adopted or lost (or nothing was taken)."""
        taking = self._taking.get(handle)
        if taking is not None:
            return taking
        adopted = self._taking[handle] = anyio.Event()

        async def take() -> None:
            try:
                session = await self.lookup(handle, owner=owner)
                async with session.driving(wait=False) as driven:
                    adopted.set()
                    if driven and session.reclaiming:
                        await session.ensure_kernel()
            except KernelexecError as exc:
                logger.warning("taking session %s over: %s", handle, exc)
            finally:
                adopted.set()
                self._taking.pop(handle, None)

        self.runs.spawn(take)
        return adopted

    async def _remember_kernel(self, session: Session, gateway_kernel_id: str | None, fence: Fence | None) -> None:
        """A fleet's session: the gateway kernel it now has, written under its lease (refused once lost)."""
        if self.store is not None:
            await self.store.put_session(self._record(session, gateway_kernel_id), fence=fence)

    async def environment_for(self, working_dir: Path | None) -> Environment | None:
        """The Python a new session working in ``working_dir`` runs in (``--python``; its ipykernel overlay
        built once when it has none), off the event loop. None for remote backends: they bring their own."""
        if self.settings.kernel_gateway or self.settings.kernel_spec:
            return None
        reach = kernel_reach(self.settings)
        # one resolve per directory at a time: the first call of a new server and the pool's first kernel asked at
        # once, and two threads parsing the same metadata on shared cores delayed the pool's kernel (the second
        # finds the first's answer cached: environment/interpreter.py)
        lock = self._resolving.setdefault(working_dir, anyio.Lock())
        try:
            async with lock:
                return await anyio.to_thread.run_sync(
                    functools.partial(prepare, self.settings.python, working_dir, self.settings.cache_dir, reach=reach))
        finally:
            if not lock.locked() and not lock.statistics().tasks_waiting:
                self._resolving.pop(working_dir, None)

    async def create(self, *, owner: str | None = None, working_dir: Path | None = None) -> Session:
        """Mint a new session, its place reserved at once (the kernel starts on first use, or is pooled).
        A pooled kernel is handed out only to a session of its own environment and working directory."""
        environment = await self.environment_for(working_dir)
        await self.pool.wait_for_filling(environment, working_dir)
        async with self._create_lock:
            session = await self.pool.take(environment, working_dir, lambda s: self.admit(s, owner))
            if session is not None:
                session.adopt(owner)
            else:
                session = Session(secrets.token_urlsafe(12), self.settings, owner=owner, working_dir=working_dir,
                                  environment=environment)
                try:
                    self.admit(session)
                except SessionError:
                    session.release()
                    self.remove_dir(session)
                    raise
            self._track(session)
        await self._remember(session)
        return session

    def check_working_dir(self, working_dir: str | None) -> None:
        """Check a call's ``working_dir`` for a session not made yet, before anything is reserved for it: what
        can be judged without the session (an absolute path, or one relative to --working-dir) must exist and
        lie in --work-roots, as ``Session.resolve_working_dir`` will ask. A path relative to the new session's
        own directory is checked once it exists (and the session given up if it fails: ``discard``)."""
        if working_dir is None or not isinstance(working_dir, str):
            return
        path = Path(os.path.expanduser(working_dir))
        if not path.is_absolute():
            if self.settings.working_dir is None:
                return
            path = self.settings.working_dir / path
        path = path.resolve()
        if not path.is_dir():
            raise InvalidRequest(f"working_dir {working_dir!r} does not exist or is not a directory")
        roots = [Path(r).resolve() for r in self.settings.work_roots]
        if self.settings.effective_profile == "trusted" and not roots:
            return
        if not any(path == r or r in path.parents for r in roots):
            allowed = ", ".join(map(str, roots)) or f"none: the {self.settings.effective_profile} profile needs --work-roots"
            raise InvalidRequest(f"working_dir {working_dir!r} is outside the allowed roots ({allowed}); see --work-roots")

    async def discard(self, session: Session) -> None:
        """Give up a session made for a call that failed before it ran anything (a bad working_dir, a run budget,
        a refused pip line, a kernel that did not start): its place under --max-sessions and
        --max-sessions-per-token is released, its handle forgotten, and its directory removed when nothing was
        recorded in it (else kept, closed). A session in use (its lock held) is left alone."""
        if session.closed or self.sessions.get(session.handle) is not session or session.lock.locked():
            return
        async with session.lock:
            if session.closed:
                return
            session.closed = True
            try:
                await session.stop_kernel()
            except Exception:  # its place is given back all the same
                logger.exception("stopping the kernel of discarded session %s", session.handle)
            session.reserved = False
            recorded = await anyio.to_thread.run_sync(session.recorder.cells)
            if recorded:
                mark_closed(session.dirs.root)
            session.release()
        self.sessions.pop(session.handle, None)
        for key in [k for k, h in self.aliases.items() if h == session.handle]:
            del self.aliases[key]
        if self.default_handle == session.handle:
            self.default_handle = None
        await self._remember(session, closed=True)
        if not recorded:
            self.remove_dir(session)

    def _store_to_prune(self) -> Store | None:
        """The store this server prunes now: its own; a fleet's only while this replica leads (once per fleet)."""
        fleet = self.fleet
        return self.store if fleet is None or not fleet.drives or fleet.leads else None

    async def _idle_in_fleet(self, idle_s: float) -> list[Session]:
        """On the fleet's leader: the sessions nobody drove for ``idle_s`` (the store's leases), as sessions here."""
        if self.fleet is None or not self.fleet.leads or self.store is None:
            return []
        found = []
        for record in await self.store.idle_sessions(idle_s):
            try:
                found.append(await self.lookup(record.handle, owner=record.owner))
            except KernelexecError as exc:
                logger.warning("idle session %s: %s", record.handle, exc)
        return found

    def get(self, handle: str, *, owner: str | None = None) -> Session:
        """Look a handle up; a session from another owner is reported exactly like an unknown one."""
        if not isinstance(handle, str) or not valid_handle(handle):
            raise SessionError.unknown(str(handle)[:80])
        session = self.sessions.get(handle)
        if session is None or session.closed or (session.owner is not None and session.owner != owner):
            raise SessionError.unknown(handle)
        return session

    async def lookup(self, handle: str, *, owner: str | None = None) -> Session:
        """``get``, or revive a session this process does not hold whose directory survives (the server
        was restarted): its first use starts a kernel refilled from its journal (``Session.ensure_kernel``).
        Closed sessions, other owners' and those another live server holds stay unknown."""
        try:
            return self.get(handle, owner=owner)
        except SessionError:
            known = isinstance(handle, str) and valid_handle(handle) and handle not in self.sessions
            # the store's record, never session.json: it is what this server (or the migration) wrote
            record = await self._stored_session(handle, owner) if known else None
            # a fleet's session may never have been on this replica: its directory is made here, its record from the store
            # (only a valid handle names a directory: another, e.g. longer than a file name may be, is just unknown)
            here = record is not None and ((self.settings.sessions_dir / handle).is_dir()
                                           or (self.fleet is not None and self.fleet.drives))
            if record is None or not here:
                raise
        async with self._create_lock:
            if handle not in self.sessions:
                if self.live_count() >= self.settings.max_sessions:
                    raise SessionError.limit(self.settings.max_sessions)
                session = Session(handle, self.settings, owner=owner,
                                  environment=await self.environment_for(self.settings.working_dir))
                recorded = record.working_dir
                if recorded and Path(recorded) != session.default_cwd:
                    try:  # a recorded directory is data: it must pass the same checks a call's does
                        cwd = session.resolve_working_dir(recorded)
                    except InvalidRequest as exc:
                        logger.warning("session %s: recorded working_dir not used: %s", handle, exc)
                        cwd = None
                    if cwd is not None:
                        session.default_cwd = session.cwd = cwd
                session.revive = True
                session.attach_to = record.gateway_kernel_id
                self._track(session)  # its place is reserved when its kernel starts (Session.ensure_kernel)
                await self._remember(session)
        return self.get(handle, owner=owner)

    async def _stored_session(self, handle: str, owner: str | None) -> SessionRecord | None:
        """The store's record of ``handle`` when ``owner`` may see it (exactly: an owned session is not anyone's)
        and it is not closed."""
        if self.store is None:
            return None
        try:
            record = await self.store.get_session(handle, owner=owner)
        except StoreError:
            logger.exception("reading session %s from the store", handle)
            return None
        return record if record is not None and record.owner == owner and record.closed is None else None

    async def default(self, *, working_dir: Path | None = None) -> Session:
        """The process's single default session (stdio and in-memory clients that pass no handle)."""
        async with self._create_lock:
            handle = self.default_handle
        if handle is not None and handle in self.sessions and not self.sessions[handle].closed:
            return self.sessions[handle]
        session = await self.create(working_dir=working_dir)
        self.default_handle = session.handle
        return session

    async def for_transport(self, key: str, *, owner: str | None, working_dir: Path | None = None) -> Session:
        """The session of a legacy HTTP client, keyed by its Mcp-Session-Id."""
        handle = self.aliases.get(key)
        if handle is not None and handle in self.sessions and not self.sessions[handle].closed:
            return self.sessions[handle]
        session = await self.create(owner=owner, working_dir=working_dir)
        self.aliases[key] = session.handle
        return session

    async def close(self, handle: str, *, owner: str | None = None) -> Session:
        session = self.get(handle, owner=owner)
        async with session.driving():
            if session.kernel is None and session.attach_to is not None:
                await session.ensure_kernel(refill=False)  # a fleet's: attached, so that it is stopped on the gateway
            session.closed = True
            await session.stop_kernel()
            mark_closed(session.dirs.root)
            session.release()
        self.sessions.pop(handle, None)
        await self._remember(session, closed=True)
        if self.default_handle == handle:
            self.default_handle = None
        return session

    def remove_dir(self, session: Session) -> None:
        shutil.rmtree(session.dirs.root, ignore_errors=True)
