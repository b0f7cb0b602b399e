"""Sessions: server-minted handles, each owning one kernel, one directory and one notebook record.

MCP 2026-07-28 is stateless, so a session is a handle the client passes back as a tool argument.
Calls to one session run one at a time in arrival order (a FIFO lock); different sessions run in
parallel. The manager enforces the live-session limit, reaps idle kernels and keeps notebooks
written in the background.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import secrets
import shutil
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio

from . import connections
from .broker import Approve, Broker, CellCalls
from .broker import from_settings as broker_from_settings
from .config import Settings
from .environments import Environment, prepare, project_modules
from .errors import InvalidRequest, SessionError
from .hints import install_hint
from .kernel import Ask, Kernel, LocalKernel, OnOutput
from .launch import LaunchSpec
from .layout import SessionDirs
from .models import CellError, Execution, ReplayedCell, ResultRule
from .packages import InstallError, InstallOutcome, check_allowed, install, installed_record, parse_specs, pip_lines
from .policy import kernel_policy
from .recording import Recorder, mark_closed, read_session_meta, rebuild_stale
from .render import Rendered, Renderer
from .restore import describe_replayed, restore
from .runs import RunRegistry
from .sandbox import kernel_reach, plan_for
from .spares import Spares

logger = logging.getLogger(__name__)

SPARE_AFTER_QUIET = 1.0  # seconds a session must be quiet before a warm spare is started for it
SPARE_KEPT_QUIET = 600.0  # seconds of quiet after which a session gives its spare's place up
_HANDLE_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_")


def valid_handle(handle: str) -> bool:
    return 8 <= len(handle) <= 64 and set(handle) <= _HANDLE_CHARS


def _claim(root: Path, handle: str) -> int:
    """Lock a session directory for this process (the OS drops the lock when the process dies, even
    by SIGKILL), so two servers sharing a state dir never run one session at once."""
    fd = os.open(root / ".lock", os.O_RDWR | os.O_CREAT, 0o600)  # not inherited by kernels
    try:
        import fcntl

        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        raise SessionError(f"session {handle!r} is in use by another kernelexec server") from None
    return fd


def same_environment(a: Environment | None, b: Environment | None) -> bool:
    return (a is None and b is None) or (a is not None and b is not None and a.key == b.key and a.overlay == b.overlay)


def kernel_class(settings: Settings) -> type[Kernel]:
    """Local kernels, kernels on a remote gateway, or kernels a kernelspec's provisioner launches
    (the last two imported only when configured)."""
    if settings.kernel_spec:
        from .kernelspecs import ProvisionedKernel

        return ProvisionedKernel.for_settings(settings)
    if settings.kernel_gateway:
        from .gateway import GatewayKernel

        return GatewayKernel.for_settings(settings)  # bound to the gateway's URL and token
    return LocalKernel


class Session:
    """One client's kernel, directory, renderer and notebook record."""

    def __init__(self, handle: str, settings: Settings, *, owner: str | None = None, working_dir: Path | None = None,
                 environment: Environment | None = None) -> None:
        self.handle = handle
        # the Python its kernels run in, for the session's whole life (None: a remote backend's own)
        self.environment = environment
        self.settings = settings
        self.profile = settings.effective_profile
        self.owner = owner
        self.dirs = SessionDirs(settings.sessions_dir / handle)
        self.dirs.create()
        self.default_cwd = working_dir or self.dirs.work
        self.cwd = self.default_cwd
        self.kernel: Kernel | None = None
        self.lock = anyio.Lock()
        self.last_used = time.monotonic()
        self.closed = False
        self.busy = False
        self.notice: str | None = None  # what happened to the kernel between calls, told in the next answer
        self.renderer = Renderer(
            handle, self.dirs.outputs, result_chars=settings.result_chars,
            stream_chars=settings.stream_chars, profile=self.profile,
            environment=environment.summary() if environment is not None else None,
        )
        meta = {"session": handle, "profile": self.profile, "created": time.time()}
        if environment is not None:
            meta["environment"] = environment.summary()
        self.recorder = Recorder(self.dirs.journal, self.dirs.notebook, meta)
        if not self.dirs.journal.exists():
            self.recorder.start()  # an empty notebook now, so every answer's `notebook` names a file
        meta_file = self.dirs.meta
        if not meta_file.exists():
            meta_file.write_text(json.dumps({**meta, "owner": owner, "working_dir": str(self.default_cwd)}))
        self._lock_fd: int | None = _claim(self.dirs.root, handle)
        self.revive = False  # set by SessionManager.lookup: refill the next kernel from the journal
        self.pooled = False  # in the pool: its kernel is not published for `kernelexec lab` until adopted
        # Counted against --max-sessions / --max-sessions-per-token from the moment it is reserved
        # (minted, or about to start a kernel) until its kernel stops: ``admit`` checks and reserves.
        self.reserved = False
        self.admit: Callable[[Session], None] | None = None
        self.broker: Broker | None = None  # code mode (--tools-config): the server's broker, set by the manager
        self._published: Path | None = None

    def launch_spec(self) -> LaunchSpec:
        s = self.settings
        env = self.environment
        rw = [] if self.profile == "strict" else [p for p in s.work_roots if p.is_dir()]
        plan = plan_for(s, self.profile, session_dir=self.dirs.root, rw=rw, ro=[p for p in s.read_dirs if p.is_dir()],
                        cwd=self.default_cwd, key=self.handle, environment=env)
        # the guard keeps them read-only too (the only keeper where bubblewrap is missing)
        protected = [*(env.protected_paths() if env is not None else ()), *plan.kernel_options.get("protected_names", ())]
        policy = kernel_policy(
            self.profile,
            session_dir=self.dirs.root,
            spill_dir=self.dirs.spill,
            work_roots=s.work_roots,
            read_dirs=s.read_dirs,
            allow_imports=s.allow_imports,
            result_cap=max(s.result_chars * 20, 1_000_000),
            stream_cap=s.kernel_stream_cap,
            disk_cap=s.kernel_disk_cap,
            environment_paths=[*env.read_paths, *([env.overlay] if env.overlay else [])] if env is not None else None,
            protected=protected or None,
            warm_imports=s.warm_imports,
            environment_modules=project_modules(env, self.default_cwd) if env is not None and not env.own else None,
            packages_dir=self.dirs.packages,
            figure_formats=list(s.figure_formats),
        )
        return LaunchSpec(dirs=self.dirs, cwd=self.default_cwd, policy=policy, plan=plan, env_pass=s.env_pass)

    async def ensure_kernel(self) -> Kernel:
        if self.kernel is None:
            if not self.reserved and self.admit is not None:
                self.admit(self)  # raises at the session limits; reserves otherwise
            self.reserved = True
            kernel = kernel_class(self.settings)(self.launch_spec(), startup_timeout=self.settings.startup_timeout)
            try:
                await kernel.start()
            except BaseException:
                self.reserved = False
                raise
            self.kernel = kernel
            self.cwd = self.default_cwd
            self.publish()
            if self.revive:
                self.revive = False
                replayed = await restore(self)
                self.notice = f"session revived after a server restart in a new kernel; {describe_replayed(replayed)}"
                self.recorder.mark("revive", self.notice, replayed=[r.model_dump() for r in replayed])
        return self.kernel

    def publish(self) -> None:
        """Expose the kernel's connection file for ``kernelexec lab`` (again when a spare took over)."""
        kernel = self.kernel
        if kernel is not None and not self.pooled and kernel.connection_file != self._published:
            connections.publish(self.settings.state_dir, self.handle, kernel.connection_file)
            self._published = kernel.connection_file

    def resolve_working_dir(self, working_dir: str | None) -> Path | None:
        """Check a call's working_dir: it must exist and lie in the session dir or a configured root."""
        if working_dir is None:
            return None
        path = Path(os.path.expanduser(working_dir))
        if not path.is_absolute():
            path = self.default_cwd / path
        path = path.resolve()
        if not path.is_dir():
            raise InvalidRequest(f"working_dir {working_dir!r} does not exist or is not a directory")
        roots = [self.dirs.root.resolve(), *(Path(r).resolve() for r in self.settings.work_roots)]
        unrestricted = self.profile == "trusted" and not self.settings.work_roots
        if not unrestricted and not any(path == r or r in path.parents for r in roots):
            allowed = ", ".join(map(str, roots))
            raise InvalidRequest(f"working_dir {working_dir!r} is outside the allowed roots ({allowed}); see --work-roots")
        return path

    async def run(self, code: str, *, timeout: float, working_dir: str | None = None, on_output: OnOutput | None = None,
                  result_rule: ResultRule = "variable", ask: Ask | None = None, approve: Approve | None = None) -> Rendered:
        """Run one cell in this session and return the rendered answer; record it in the notebook.
        ``pip install`` lines in the cell are served by the server's installer first (packages.py).
        ``result_rule``: which value is the result (Kernel.execute)."""
        cwd = self.resolve_working_dir(working_dir)
        request, runnable = pip_lines(code)  # an unsupported pip line is refused before anything runs
        async with self.lock:
            if self.closed:
                raise SessionError.unknown(self.handle)
            self.busy = True
            try:
                await self.check_alive()
                kernel = await self.ensure_kernel()
                if cwd is not None and cwd != self.cwd:
                    await kernel.evaluate(f"_kernelexec_chdir({str(cwd)!r})")
                    self.cwd = cwd
                installed: dict[str, Any] | None = None
                if request is not None:
                    try:
                        outcome = await self._install(kernel, request.specs, upgrade=request.upgrade)
                    except InstallError as exc:
                        ex = _install_failed(code, str(exc))
                        await anyio.to_thread.run_sync(self.record, ex, timeout)
                        return self.renderer.render(ex, notebook=str(self.dirs.notebook), layers=kernel.spec.plan.layers)
                    installed = installed_record(outcome, request.specs)
                calls = await self.code_mode(kernel, approve)
                ex = await kernel.execute(runnable, timeout=timeout, grace=self.settings.interrupt_grace, on_output=on_output, ask=ask,
                                          result_rule=result_rule, tools=calls.handle if calls is not None else None)
                if calls is not None:
                    ex.tool_calls = calls.records
                if request is not None:
                    ex.code = code  # the record shows the cell as written; replay installs again from its pip lines
                    ex.notes.insert(0, outcome.summary())
                    if not request.quiet:
                        line = outcome.summary() + "\n"
                        ex.stdout = line + ex.stdout
                        ex.outputs.insert(0, {"output_type": "stream", "name": "stdout", "text": line})
                if ex.ending in ("restarted", "kernel_died") or ex.restart_reason:
                    self.cwd = self.default_cwd
                if self.notice is not None:
                    ex.restart_reason = ex.restart_reason or self.notice
                    self.notice = None
                # the journal line is fsynced before the answer goes out, off the event loop
                await anyio.to_thread.run_sync(self.record, ex, timeout, installed)
                # a missing module: one line for the model on how to get it here (not in the record)
                hint = install_hint(self.settings, self.profile, ex.error, local_kernel=kernel.supports_packages)
                if hint is not None and ex.error is not None:
                    ex.error.traceback.append(hint)
                return self.renderer.render(ex, notebook=str(self.dirs.notebook), layers=kernel.spec.plan.layers)
            finally:
                self.busy = False
                self.last_used = time.monotonic()
                self.publish()  # a restart during the call (timeout, death, cancellation) may have swapped kernels

    async def code_mode(self, kernel: Kernel, approve: Approve | None) -> CellCalls | None:
        """Code mode (--tools-config): the kernel given the broker's catalog (once per kernel process and
        catalog), and this cell's calls; None when code mode is off."""
        if self.broker is None:
            return None
        catalog = await self.broker.kernel_catalog()
        if kernel.tools_catalog != catalog:
            count = await kernel.evaluate(f"_kernelexec_tools_catalog({catalog!r})")
            if isinstance(count, int):
                kernel.tools_catalog = catalog
            else:  # the kernel could not take it (an old startup file?): tried again at the next cell
                logger.warning("session %s: the kernel did not take code mode's catalog: %s", self.handle, str(count)[:200])
        return self.broker.cell(approve)

    async def open(self, working_dir: str | None = None) -> None:
        """Start the kernel of a new session (``new_session``), its default directory set first if given."""
        cwd = self.resolve_working_dir(working_dir)
        if cwd is not None:
            self.default_cwd = self.cwd = cwd
        await self.ensure_kernel()

    async def evaluate(self, expression: str) -> Any:
        """One silent expression in the kernel, in turn with the session's calls (not a cell: not recorded);
        the kernel's answer, untrusted. For views of the state (variables, a table page)."""
        async with self.lock:
            kernel = await self.ensure_kernel()
            return await kernel.evaluate(expression)

    async def variables(self) -> Any:
        """The kernel's list of its user variables (``_kernelexec_variables``), as it answered: untrusted."""
        return await self.evaluate("_kernelexec_variables()")

    async def check_alive(self) -> None:
        """Restart a kernel that died between calls (SIGKILL from outside, the OOM killer) and say so."""
        kernel = self.kernel
        if kernel is not None and not await kernel.is_alive():
            status = kernel.exit_status()
            await kernel.restart()
            self.cwd = self.default_cwd
            self.publish()
            self.notice = (f"before this call: the kernel had died ({status}) and was restarted; "
                           "variables from earlier calls are lost")

    async def interrupt(self) -> bool:
        """SIGINT to the running cell, without waiting for the session lock. False if nothing runs."""
        if self.kernel is None or not self.busy:
            return False
        await self.kernel.interrupt()
        return True

    def record(self, ex: Execution, timeout: float | None = None, installed: dict[str, Any] | None = None) -> None:
        layers = self.kernel.spec.plan.layers if self.kernel is not None else []
        meta: dict[str, Any] = {"session": self.handle, "profile": self.profile, "cwd": str(self.cwd), "layers": layers,
                                "timeout": timeout}
        if installed is not None:
            meta["installed"] = installed
        if ex.inputs:
            meta["inputs"] = ex.inputs  # a password as ***
        if ex.tool_calls:
            meta["tool_calls"] = ex.tool_calls  # code mode: server, tool, arguments, result or error, duration
        self.recorder.append(ex, meta)

    async def _install(self, kernel: Kernel, specs: list[str], *, upgrade: bool = False) -> InstallOutcome:
        """Install into this session's overlay (outside the sandbox) and make it importable in ``kernel``
        now. Caller holds the lock. A warm spare started before the install is given up (its allowlist
        predates it); the next one starts with the overlay as it is."""
        check_allowed(self.settings, self.profile, specs)
        if not kernel.supports_packages:
            raise InstallError("packages on demand need a local kernel: with --kernel-gateway or --kernel-spec, install "
                               "packages into the remote kernel's image")
        environment = getattr(self, "environment", None)  # the kernel's interpreter (wheels for its tags and markers)
        outcome = await install(self.settings, specs, self.dirs.packages, upgrade=upgrade, environment=environment)
        report = await kernel.evaluate("_kernelexec_packages_added()")
        if not isinstance(report, dict) or "modules" not in report:
            raise InstallError(f"installed, but the kernel did not take the new packages: {report!r}")
        if kernel.spares is not None:
            await kernel.spares.drop()
        return outcome

    async def install(self, specs: list[str], *, upgrade: bool = False) -> InstallOutcome:
        """``install_packages``: validated specs into this session's overlay, importable at once; recorded."""
        specs = parse_specs(specs)
        async with self.lock:
            if self.closed:
                raise SessionError.unknown(self.handle)
            self.busy = True
            try:
                kernel = await self.ensure_kernel()
                outcome = await self._install(kernel, specs, upgrade=upgrade)
                await anyio.to_thread.run_sync(lambda: self.recorder.mark(
                    "install", f"install_packages: {outcome.summary()}", **installed_record(outcome, specs)))
                return outcome
            finally:
                self.busy = False
                self.last_used = time.monotonic()

    async def restart(self, *, replay: bool = False, by: str = "restart_session") -> list[ReplayedCell]:
        """A fresh kernel; with ``replay``, refilled by running the journal's successful cells since the
        last plain restart again (``restore.restorable``). Returns what was replayed."""
        async with self.lock:
            self.revive = False  # this restart replaces a pending revival
            if self.kernel is None:
                await self.ensure_kernel()
            else:
                await self.kernel.restart()
            self.cwd = self.default_cwd
            self.publish()
            if not replay:
                self.recorder.mark("restart", f"kernel restarted by {by}; variables cleared")
                if by != "restart_session":
                    self.notice = (f"between calls the kernel was restarted from {by}; "
                                   "variables from earlier calls are lost")
                return []
            replayed = await restore(self)
            self.recorder.mark("restore", f"kernel restarted by restart_session; {describe_replayed(replayed)}",
                               replayed=[r.model_dump() for r in replayed])
            return replayed

    async def stop_kernel(self) -> None:
        """Shut the kernel down (idle reaping, close); the directory and notebook stay."""
        kernel, self.kernel = self.kernel, None
        self.reserved = False
        if kernel is not None:
            connections.withdraw(self.settings.state_dir, self.handle)
            self._published = None
            await kernel.shutdown()

    def adopt(self, owner: str | None) -> None:
        """A pooled session is handed to its first caller: bind it to the caller's principal."""
        self.owner = owner
        self.last_used = time.monotonic()
        self.pooled = False
        self.publish()
        meta_file = self.dirs.meta
        meta = json.loads(meta_file.read_text())
        tmp = meta_file.with_suffix(".tmp")
        tmp.write_text(json.dumps({**meta, "owner": owner, "created": time.time()}))
        os.replace(tmp, meta_file)

    def release(self) -> None:
        """Give up the session directory's lock (the session is closed or was a throwaway)."""
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None


class SessionManager:
    """Owns all sessions of a server process. Use as an async context manager."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.sessions: dict[str, Session] = {}
        self.aliases: dict[str, str] = {}  # transport session id (legacy HTTP) -> handle
        self.default_handle: str | None = None
        self._create_lock = anyio.Lock()
        self._tg: Any = None
        self.runs = RunRegistry()
        self.broker = broker_from_settings(settings)  # code mode, or None; a config a kernel could write is refused here
        self.pool: list[Session] = []  # sessions minted ahead with their kernel started, owner unset
        self._spare_task_running = False
        self._pool_changed = anyio.Event()

    @asynccontextmanager
    async def running(self) -> AsyncIterator[SessionManager]:
        self.settings.sessions_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        # nbformat is imported here, once, on the event loop thread before any worker thread uses it:
        # imported lazily from a worker thread and the loop at once, it fails with a circular import
        import nbformat.v4  # noqa: F401

        await anyio.to_thread.run_sync(rebuild_stale, self.settings.sessions_dir)  # a killed server's last cells
        code_mode = self.broker.running() if self.broker is not None else contextlib.nullcontext()  # code mode's connections
        async with code_mode, anyio.create_task_group() as tg:
            self._tg = tg
            self.runs.attach(tg)
            tg.start_soon(self._housekeeping)
            tg.start_soon(self._fill_pool)
            try:
                yield self
            finally:
                tg.cancel_scope.cancel()
                with anyio.CancelScope(shield=True):
                    await self.aclose()

    async def aclose(self) -> None:
        pooled, self.pool = self.pool, []
        for session in pooled:  # never handed out: nothing to keep
            await session.stop_kernel()
            session.release()
            self.remove_dir(session)
        for session in list(self.sessions.values()):
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
        self.sessions[session.handle] = session
        return session

    async def environment_for(self, working_dir: Path | None) -> Environment | None:
        """The Python a new session working in ``working_dir`` runs in (``--python``; its ipykernel overlay
        built once when it has none), off the event loop. None for remote backends: they bring their own."""
        if self.settings.kernel_gateway or self.settings.kernel_spec:
            return None
        reach = kernel_reach(self.settings)
        return await anyio.to_thread.run_sync(
            functools.partial(prepare, self.settings.python, working_dir, self.settings.cache_dir, reach=reach))

    async def create(self, *, owner: str | None = None, working_dir: Path | None = None) -> Session:
        """Mint a new session, its place reserved at once (the kernel starts on first use, or is pooled).
        A pooled kernel is handed out only to a session of its own environment and working directory."""
        environment = await self.environment_for(working_dir)
        async with self._create_lock:
            stale = [s for s in self.pool if not same_environment(s.environment, environment)]
            if stale and working_dir == self.settings.working_dir:  # the project's environment changed since
                self.pool = [s for s in self.pool if s not in stale]
                self._pool_changed.set()
                for session in stale:
                    await session.stop_kernel()
                    session.release()
                    self.remove_dir(session)
            if self.pool and working_dir == self.settings.working_dir and same_environment(self.pool[0].environment, environment):
                session = self.pool[0]
                self.admit(session, owner)
                self.pool.pop(0)  # popped under the lock: one kernel never goes to two sessions
                self._pool_changed.set()
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
            return self._track(session)

    async def _fill_pool(self) -> None:
        """Keep ``pool_size`` sessions with started kernels (inside their sandbox) ready for ``create``."""
        while True:
            while len(self.pool) < self.settings.pool_size:
                try:
                    environment = await self.environment_for(self.settings.working_dir)
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
                        await session.kernel.warm()
                except Exception:
                    logger.exception("starting a pooled kernel failed; retrying in 5 s")
                    await session.stop_kernel()
                    session.release()
                    self.remove_dir(session)
                    await anyio.sleep(5)
                    continue
                self.pool.append(session)
            await self._pool_changed.wait()
            self._pool_changed = anyio.Event()

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
            meta = read_session_meta(self.settings.sessions_dir / handle) if known else None
            if meta is None or meta.get("closed") or meta.get("owner") != owner:
                raise
        async with self._create_lock:
            if handle not in self.sessions:
                if self.live_count() >= self.settings.max_sessions:
                    raise SessionError.limit(self.settings.max_sessions)
                session = Session(handle, self.settings, owner=owner,
                                  environment=await self.environment_for(self.settings.working_dir))
                recorded = meta.get("working_dir")
                if isinstance(recorded, str) and Path(recorded) != session.default_cwd:
                    try:  # a session file is data: its directory must pass the same checks a call's does
                        cwd = session.resolve_working_dir(recorded)
                    except InvalidRequest as exc:
                        logger.warning("session %s: recorded working_dir not used: %s", handle, exc)
                        cwd = None
                    if cwd is not None:
                        session.default_cwd = session.cwd = cwd
                session.revive = True
                self._track(session)  # its place is reserved when its kernel starts (Session.ensure_kernel)
        return self.get(handle, owner=owner)

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
        async with session.lock:
            session.closed = True
            await session.stop_kernel()
            mark_closed(session.dirs.root)
            session.release()
        self.sessions.pop(handle, None)
        if self.default_handle == handle:
            self.default_handle = None
        return session

    async def _reap(self) -> None:
        """Stop kernels idle for longer than the idle timeout; their directories and notebooks stay."""
        idle = sorted(
            (s for s in self.sessions.values() if s.kernel is not None and not s.busy and not s.lock.locked()),
            key=lambda s: s.last_used,
        )
        timeout = self.settings.idle_timeout
        now = time.monotonic()
        for session in idle:
            if timeout and now - session.last_used > timeout:
                logger.info("stopping idle session %s", session.handle)
                async with session.lock:
                    await session.stop_kernel()
                    session.notice = (f"before this call: the session was idle for more than {timeout:g} s, so its kernel "
                                      "was shut down (--idle-timeout); this call runs in a fresh kernel and earlier variables are lost")

    async def _housekeeping(self) -> None:
        while True:
            await anyio.sleep(0.5)
            self._lab_restarts()
            await self._restart_dead()
            await self._reap()
            await self._keep_spares()

    async def _keep_spares(self) -> None:
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
            self._tg.start_soon(self._prepare_spare, chosen.spares)

    async def _prepare_spare(self, spares: Spares) -> None:
        try:
            await spares.prepare()  # a failure backs off (Spares.failed)
        finally:
            self._spare_task_running = False

    def _lab_restarts(self) -> None:
        """Restart the kernels ``kernelexec lab`` asked to restart (connections.request_restart), through
        their sessions: in turn with their calls, recorded, and said in the next answer."""
        directory = connections.connections_dir(self.settings.state_dir)
        for session in list(self.sessions.values()):
            if session.kernel is not None and not session.closed and connections.take_restart_request(directory, session.handle):
                logger.info("restarting the kernel of %s for JupyterLab", session.handle)
                self._tg.start_soon(self._restart_for_lab, session)

    async def _restart_for_lab(self, session: Session) -> None:
        directory = connections.connections_dir(self.settings.state_dir)
        try:
            await session.restart(by="JupyterLab (kernelexec lab)")
        except Exception as exc:
            logger.exception("restarting %s for JupyterLab failed", session.handle)
            connections.restart_done(directory, session.handle, f"the restart failed: {exc}")
        else:
            connections.restart_done(directory, session.handle, "ok")

    async def _restart_dead(self) -> None:
        """Notice kernels that died while idle (killed from outside, OOM) and restart them at once."""
        for session in list(self.sessions.values()):
            if session.kernel is None or session.busy or session.lock.locked():
                continue
            if not await session.kernel.is_alive():
                async with session.lock:
                    try:
                        await session.check_alive()
                    except Exception:
                        logger.exception("restarting the dead kernel of %s", session.handle)

    def remove_dir(self, session: Session) -> None:
        shutil.rmtree(session.dirs.root, ignore_errors=True)


def _install_failed(code: str, why: str) -> Execution:
    """A cell whose pip line could not be served: it fails as pip would, and nothing of it ran."""
    ex = Execution(code=code)
    ex.error = CellError("InstallError", why, [f"InstallError: {why}", "(the cell's code did not run)"])
    ex.outputs.append(ex.error.output())
    return ex
