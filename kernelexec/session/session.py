"""A session: a server-minted handle owning one kernel, one directory and one notebook record.

MCP 2026-07-28 is stateless, so a session is a handle the client passes back as a tool argument.
Calls to one session run one at a time in arrival order (a FIFO lock); different sessions run in
parallel (manager.py holds them all).
"""

from __future__ import annotations

import functools
import json
import logging
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any, Protocol

import anyio

from kernelexec.backends import new_kernel
from kernelexec.codemode.broker import Approve, Broker, CellCalls
from kernelexec.config import Settings, secret_env
from kernelexec.environment import fontcache
from kernelexec.environment.interpreter import Environment, project_modules
from kernelexec.environment.packages import InstallError, InstallOutcome, check_allowed, install, installed_record, parse_specs, pip_lines
from kernelexec.errors import InvalidRequest, SessionBusy, SessionError
from kernelexec.kernel.driver import Kernel, OnOutput
from kernelexec.kernel.execution import CellError, Execution, ResultRule
from kernelexec.kernel.launch import LaunchSpec
from kernelexec.kernel.stdin import Ask
from kernelexec.layout import SessionDirs
from kernelexec.sandbox.plan import plan_for
from kernelexec.sandbox.policy import kernel_policy
from kernelexec.sandbox.probe import kernel_reach
from kernelexec.session import connections
from kernelexec.session.checkpoint_copy import copy_checkpoint
from kernelexec.session.hints import install_hint
from kernelexec.session.recording import Recorder
from kernelexec.session.restore import ReplayedCell, RestoreReport, cell_names, checkpoint_restore, describe_replayed, rerun
from kernelexec.session.runs import Finished
from kernelexec.store import Fence, RunRecord, StaleLease

logger = logging.getLogger(__name__)


class Driver(Protocol):
    """Who may drive a session's kernel in a fleet (``fleet.Fleet``): its lease taken before, let go after."""

    async def attach(self, session: Session, *, wait: bool = True) -> bool: ...
    async def detach(self, session: Session) -> bool: ...
    async def check(self, handle: str) -> None: ...


Remember = Callable[["Session", "str | None", "Fence | None"], Awaitable[None]]  # its record, with its gateway kernel
# a fleet's run collected from a replica that stopped mid-cell (its answer, recorded) or not collectable (None, why)
Collected = Callable[["Session", "RunRecord", "Finished | None", str], Awaitable[None]]


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


# a gateway kernel's own word that its namespace is the session's (refilled, or started empty for it): set in the
# process when a server first fills it. A kernel restarted behind the same id (by the gateway itself, or by a replica
# killed before its next call refilled it) lacks it, so the replica that attaches refills it from the checkpoint.
NAMESPACE_MARK = "__import__('sys').__dict__.setdefault('_kernelexec_namespace', True)"
NAMESPACE_HELD = "__import__('sys').__dict__.get('_kernelexec_namespace') is True"
# Seconds a stopping server gives its kernels, all at once, to finish saving their last cells' variables
# (Session.finish_saves): else the session revived by the next server runs such a cell again.
SAVES_WAIT = 10.0


async def _holds_namespace(kernel: Kernel) -> bool:
    return await kernel.evaluate(NAMESPACE_HELD) in (True, "True")


async def _mark_namespace(kernel: Kernel) -> None:
    """After the namespace was filled (or cleared on purpose) to the end: a gateway kernel, which another replica may
    attach to, says so from now. Never before: a replica killed mid-refill leaves a kernel the next one refills."""
    if hasattr(kernel, "attach_to"):
        await kernel.evaluate(NAMESPACE_MARK)


class Session:
    """One client's kernel, directory and notebook record."""

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
        meta = {"session": handle, "profile": self.profile, "created": time.time()}
        if environment is not None:
            meta["environment"] = environment.summary()
        self.recorder = Recorder(self.dirs.journal, self.dirs.notebook, meta)
        if not self.dirs.journal.exists():
            self.recorder.start()  # an empty notebook now, so every answer's `notebook` names a file
        meta_file = self.dirs.meta
        if not meta_file.exists():
            meta_file.write_text(json.dumps({**meta, "owner": owner, "working_dir": str(self.default_cwd)}))
        # one server per session: its directory's lock; in a fleet (gateway kernels) the session's lease instead
        self._lock_fd: int | None = _claim(self.dirs.root, handle) if not settings.kernel_gateway else None
        self.driver: Driver | None = None  # a fleet's (set by the manager): every driving period under the lease
        self.remember: Remember | None = None
        self.attach_to: str | None = None  # the gateway kernel the store names for this session (a fleet's)
        # a fleet's takeover: runs a replica that stopped left running on that kernel, collected when it is attached
        self.reclaiming: list[RunRecord] = []
        self.collected: Collected | None = None
        self.revive = False  # set by SessionManager.lookup: refill the next kernel from the journal
        self.pooled = False  # in the pool: its kernel is not published for `kernelexec lab` until adopted
        # Counted against --max-sessions / --max-sessions-per-token from the moment it is reserved
        # (minted, or about to start a kernel) until its kernel stops: ``admit`` checks and reserves.
        self.reserved = False
        self.admit: Callable[[Session], None] | None = None
        self.broker: Broker | None = None  # code mode (--tools-config): the server's broker, set by the manager
        self._published: Path | None = None
        # the kernel process whose namespace this session knows (id of the Kernel, its restarts): another one
        # (a death, a timeout's restart, idle reaping, a revival) is refilled from the checkpoint before it runs anything
        self._epoch: tuple[int, int] | None = None
        self.restored: RestoreReport | None = None  # the last refill, told in the next answer

    def launch_spec(self) -> LaunchSpec:
        s = self.settings
        env = self.environment
        rw = [] if self.profile == "strict" else [p for p in s.work_roots if p.is_dir()]
        fonts = fontcache.ready(s.cache_dir, kernel_reach(s))  # read-only to the kernel, or None
        ro = [p for p in s.read_dirs if p.is_dir()] + ([fonts] if fonts is not None else [])
        plan = plan_for(s, self.profile, session_dir=self.dirs.root, rw=rw, ro=ro,
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
            checkpoint_dir=self.dirs.checkpoint,
            checkpoint_cap=int(s.checkpoint_mb * 1_000_000),
            font_cache=fonts,
        )
        return LaunchSpec(dirs=self.dirs, cwd=self.default_cwd, policy=policy, plan=plan, env_pass=s.env_pass,
                          secrets=secret_env(s))

    @asynccontextmanager
    async def driving(self, *, wait: bool = True) -> AsyncIterator[bool]:
        """The session's lock, and in a fleet its lease for as long (``Driver``): every use of its kernel is inside.
        A lease lost meanwhile (this replica was paused or cut off past its expiry) fails the call, said plainly.
        Yields True; without ``wait``, False at once when another replica holds the lease (background work skips)."""
        async with self.lock:
            driver = self.driver
            if driver is None:
                yield True
                return
            if not await driver.attach(self, wait=wait):
                yield False
                return
            kept = True
            try:
                yield True
            except StaleLease as exc:
                kept = False
                raise SessionError(self.lost_lease(str(exc))) from None
            finally:
                with anyio.CancelScope(shield=True):
                    kept = await driver.detach(self)
            if not kept:
                raise SessionError(self.lost_lease("its lease ran out while this call ran"))

    def lost_lease(self, why: str) -> str:
        said = (f"session {self.handle}: this replica lost the session's lease ({why}): another replica drives it now. "
                "This call's work may have run in the session's kernel, but nothing of it is recorded or answered here; "
                "call again (any replica serves it)")
        logger.warning("%s", said)
        return said

    def forget_kernel(self) -> None:
        """Let go of the kernel without stopping it (a fleet's session between its driving periods)."""
        kernel, self.kernel = self.kernel, None
        self._epoch = None
        self.reserved = False
        if kernel is not None:
            if self._published is not None:
                connections.withdraw(self.settings.state_dir, self.handle)
                self._published = None
            kernel.detach()

    async def ensure_kernel(self, *, refill: bool = True) -> Kernel:
        if self.kernel is None:
            if not self.reserved and self.admit is not None:
                self.admit(self)  # raises at the session limits; reserves otherwise
            self.reserved = True
            self._epoch = None  # a new Kernel may reuse the old one's id(): never taken for the old process
            kernel = new_kernel(self.settings, self.launch_spec())
            if self.attach_to is not None and hasattr(kernel, "attach_to"):
                kernel.attach_to = self.attach_to  # a fleet's session: its kernel on the gateway, if it still lives
            if self.driver is not None and hasattr(kernel, "fence"):  # a fleet's: no restart, shutdown or interrupt
                kernel.fence = functools.partial(self.driver.check, self.handle)  # unless its lease is still held
            if self.reclaiming and hasattr(kernel, "reclaim") and hasattr(kernel, "reclaim_deadline"):  # its channel's
                # buffered messages replayed to this one, its cell interrupted at its own deadline if it still runs
                channels = {str((r.resume or {}).get("channel")) for r in self.reclaiming}
                kernel.reclaim = (channels.pop(), frozenset(str((r.resume or {}).get("msg_id")) for r in self.reclaiming))
                sent = [r.resume or {} for r in self.reclaiming if (r.resume or {}).get("sent_at") is not None]
                kernel.reclaim_deadline = min((float(resume["sent_at"]) + float(resume.get("timeout") or
                                               self.settings.default_timeout) for resume in sent), default=None)
            try:
                await kernel.start()
            except BaseException as exc:
                self.reserved = False
                if self.reclaiming and isinstance(exc, Exception):  # adopted, not collectable now: honestly lost
                    runs, self.reclaiming = self.reclaiming, []
                    for record in runs:
                        if self.collected is not None:
                            await self.collected(self, record, None, f"its kernel could not be attached to ({exc})")
                raise
            self.kernel = kernel
            self.cwd = self.default_cwd
            self.publish()
            if getattr(kernel, "attached", False) and await _holds_namespace(kernel):
                self._epoch = (id(kernel), kernel.restarts)  # the kernel process another replica drove: nothing to refill
                self.revive = False
            elif self.attach_to is not None:  # the gateway lost it, or it is a new process behind the same id: refilled
                self.revive = not getattr(kernel, "attached", False)
            if self.reclaiming:
                await self.collect_orphans(kernel)
        kernel = self.kernel
        if refill and self._epoch != (id(kernel), kernel.restarts):
            revived, self.revive = self.revive, False
            self._epoch = (id(kernel), kernel.restarts)
            if self.dirs.checkpoint.joinpath("manifest.json").exists() or self.recorder.cells():
                report = await self.refill()
                why = "session revived after a server restart in a new kernel" if revived else "the kernel was replaced"
                self.restored = report
                before = (self.notice or "").replace("; variables from earlier calls are lost", "").replace(
                    " and earlier variables are lost", "")
                self.notice = f"{before or why}; {report.detail}"
                await anyio.to_thread.run_sync(lambda: self.recorder.mark(
                    "revive" if revived else "restore", f"{why}; {report.detail}", restored=report.model_dump()))
            await _mark_namespace(kernel)
        return kernel

    async def collect_orphans(self, kernel: Kernel) -> None:
        """The answers of the runs a replica of the fleet left running on this session's kernel when it stopped
        (SIGKILLed, or drained and handed over: session/fleet.py), from the messages the gateway kept for its
        channel and replayed to this connection: each recorded here, once, and its run finished as this replica's.
        A run whose messages did not all come (the kernel was restarted, another connection came first, the buffer
        was dropped) stays honestly lost. Called with the lock held, right after attaching, before anything runs."""
        runs, self.reclaiming = self.reclaiming, []
        release = getattr(kernel, "release_reclaimed", None)
        ended: dict[str, bool] = await release() if release is not None and getattr(kernel, "attached", False) else {}
        for record in runs:
            resume = record.resume or {}
            msg_id = str(resume.get("msg_id"))
            finished: Finished | None = None
            why = "the gateway did not keep its messages (the kernel was replaced, or another connection came first)"
            if msg_id in ended:  # its end is held: the timeout bounds only reading what was kept, not the cell again
                timeout = float(resume.get("timeout") or self.settings.default_timeout)
                ex = await kernel.collect(msg_id, str(resume.get("code", "")), timeout=timeout,
                                          grace=self.settings.interrupt_grace)
                # its name without the proof of identity (fleet.replica_name; fleet imports this module)
                stopped = record.holder.split(":", 2)[-1].partition("@")[0] if record.holder else "another replica"
                how = "was drained and handed it over" if resume.get("handed_over") else "stopped"
                ex.notes.append(f"the replica that ran this cell ({stopped}) {how}; this replica collected its answer from "
                                "the gateway" + ("" if ended[msg_id] else
                                                 ": what the cell printed before then went to that replica and is not here"))
                if getattr(kernel, "interrupted_reclaimed", False) and ex.error is not None:
                    ex.timed_out, ex.ending = True, "interrupted"
                    ex.notes.append(f"timed out after {timeout:.3g} s (counted from its start on the replica that "
                                    "stopped): this replica interrupted it")
                dropped, size = getattr(kernel, "held_dropped", {}).get(msg_id, (0, 0))
                if dropped:
                    ex.notes.append(f"{dropped} messages ({size / 1e6:.1f} MB) the cell sent while this replica took the "
                                    "session over were dropped: more than a takeover holds (gateway_channels.HOLD_CAP)")
                await anyio.to_thread.run_sync(self.record, ex, timeout)
                finished = Finished(ex, layers=kernel.spec.plan.layers)
            if self.collected is not None:
                await self.collected(self, record, finished, why)

    async def refill(self) -> RestoreReport:
        """The variables back in a new kernel: its checkpoint loaded inside it, then only the recorded cells
        that bind what it lacked (``restore.checkpoint_restore``). Caller holds the lock."""
        assert self.kernel is not None
        s = self.settings
        return await checkpoint_restore(self.kernel, self.recorder.cells(), default_timeout=s.default_timeout,
                                        max_timeout=s.max_timeout, grace=s.interrupt_grace, session=self)

    async def restore(self) -> list[ReplayedCell]:
        """Rebuild this session's state in its (fresh) kernel from its journal. Caller holds the lock."""
        assert self.kernel is not None
        s = self.settings
        return await rerun(self.kernel, self.recorder.cells(), default_timeout=s.default_timeout,
                           max_timeout=s.max_timeout, grace=s.interrupt_grace, session=self)

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
                  result_rule: ResultRule = "variable", ask: Ask | None = None, approve: Approve | None = None,
                  on_sent: Callable[[dict[str, Any]], Awaitable[None]] | None = None) -> Finished:
        """Run one cell in this session, record it in the notebook, and return what happened (the MCP
        layer renders it).
        ``pip install`` lines in the cell are served by the server's installer first (packages.py).
        ``result_rule``: which value is the result (Kernel.execute)."""
        cwd = self.resolve_working_dir(working_dir)
        request, runnable = pip_lines(code)  # an unsupported pip line is refused before anything runs
        async with self.driving():
            if self.closed:
                raise SessionError.unknown(self.handle)
            self.busy = True
            try:
                await self.check_alive()
                kernel = await self.ensure_kernel()
                restored, self.restored = self.restored, None
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
                        return Finished(ex, layers=kernel.spec.plan.layers, restored=restored)
                    installed = installed_record(outcome, request.specs)
                calls = await self.code_mode(kernel, approve, timeout)
                ex = await kernel.execute(runnable, timeout=timeout, grace=self.settings.interrupt_grace, on_output=on_output, ask=ask,
                                          result_rule=result_rule, tools=calls.handle if calls is not None else None,
                                          on_sent=on_sent if request is None else None)
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
                return Finished(ex, layers=kernel.spec.plan.layers, hint=hint, restored=restored)
            finally:
                self.busy = False
                self.last_used = time.monotonic()
                self.publish()  # a restart during the call (timeout, death, cancellation) may have swapped kernels

    async def code_mode(self, kernel: Kernel, approve: Approve | None, timeout: float) -> CellCalls | None:
        """Code mode (--tools-config): the kernel given the broker's catalog (once per kernel process and
        catalog), and this cell's calls; None when code mode is off."""
        if self.broker is None:
            return None
        catalog = await self.broker.kernel_catalog(self.owner)  # the owner's connections (broker.py)
        if kernel.tools_catalog != catalog:
            count = await kernel.evaluate(f"_kernelexec_tools_catalog({catalog!r})")  # the tools it took: "3"
            if isinstance(count, str) and count.isdigit():
                kernel.tools_catalog = catalog
            else:  # the kernel could not take it (an old startup file?): tried again at the next cell
                logger.warning("session %s: the kernel did not take code mode's catalog: %s", self.handle, str(count)[:200])
        return self.broker.cell(approve, timeout, principal=self.owner)

    async def open(self, working_dir: str | None = None) -> None:
        """Start the kernel of a new session (``new_session``), its default directory set first if given."""
        cwd = self.resolve_working_dir(working_dir)
        if cwd is not None:
            self.default_cwd = self.cwd = cwd
        async with self.driving():  # a fleet's: its kernel's id recorded at once, for any replica's next call
            await self.ensure_kernel()

    async def evaluate(self, expression: str) -> Any:
        """One silent expression in the kernel, in turn with the session's calls (not a cell: not recorded);
        the kernel's answer, untrusted. For views of the state (variables, a table page)."""
        async with self.driving():
            kernel = await self.ensure_kernel()
            return await kernel.evaluate(expression)

    @asynccontextmanager
    async def turn(self, wait_s: float) -> AsyncIterator[Kernel]:
        """The session's kernel for several silent steps in one driving period (an upload: nothing else runs between
        its steps, and in a fleet only under the session's lease), waiting at most ``wait_s`` for the lock and the
        lease: a busy session (or one another replica drives) raises SessionBusy, nothing done. The kernel is not
        refilled here (that writes the record): a replaced one is refilled at the session's next cell."""
        async with AsyncExitStack() as stack:
            entered = False
            with anyio.move_on_after(wait_s):  # a cancelled wait leaves the lock free and the lease untaken
                await stack.enter_async_context(self.driving())
                entered = True
            if not entered:
                raise SessionBusy(f"session {self.handle!r} is busy (a cell has run or waited over {wait_s:g} s, or "
                                  "another replica drives it); nothing was done: try again when it is idle, or interrupt it")
            try:
                if self.closed:
                    raise SessionError.unknown(self.handle)
                yield await self.ensure_kernel(refill=False)
            finally:
                self.last_used = time.monotonic()

    async def variables(self) -> Any:
        """The kernel's list of its user variables (``_kernelexec_variables``), as it answered: untrusted."""
        return await self.evaluate("_kernelexec_variables()")

    async def check_alive(self) -> None:
        """Restart a kernel that died between calls (SIGKILL from outside, the OOM killer) and say so."""
        kernel = self.kernel
        if kernel is not None and not await kernel.is_alive():
            self.notice = await kernel.restart_after_death()
            self.cwd = self.default_cwd
            self.publish()

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
        names = cell_names(ex.code)  # what it binds and reads (its syntax): restore reruns only the cells it needs
        if names is not None:
            meta["names"] = names
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
        async with self.driving():
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

    async def restart(self, *, replay: bool = False, by: str = "restart_session",
                      restore: bool = False) -> list[ReplayedCell] | RestoreReport:
        """A fresh kernel; with ``replay``, refilled by running the journal's successful cells since the
        last plain restart again (``restore.restorable``), and returns what was replayed; with ``restore``,
        refilled from the checkpoint and only the cells it lacks (``refill``), and returns how."""
        async with self.driving():
            self.revive = False  # this restart replaces a pending revival
            if self.kernel is None and self.attach_to is None:
                kernel = await self.ensure_kernel(refill=False)
            else:  # a fleet's session attaches to its kernel on the gateway first, then restarts it
                kernel = self.kernel if self.kernel is not None else await self.ensure_kernel(refill=False)
                await kernel.restart()
            self._epoch = (id(kernel), kernel.restarts)
            self.cwd = self.default_cwd
            self.publish()
            if restore and not replay:
                report = await self.refill()
                await _mark_namespace(kernel)
                await anyio.to_thread.run_sync(lambda: self.recorder.mark(
                    "restore", f"kernel restarted by {by}; {report.detail}", restored=report.model_dump()))
                return report
            await kernel.evaluate("_kernelexec_checkpoint_reset()")  # a clean kernel, by the user's wish
            if not replay:
                await _mark_namespace(kernel)
                await anyio.to_thread.run_sync(lambda: self.recorder.mark("restart", f"kernel restarted by {by}; variables cleared"))
                if by != "restart_session":
                    self.notice = (f"between calls the kernel was restarted from {by}; "
                                   "variables from earlier calls are lost")
                return []
            replayed = await self.restore()
            await _mark_namespace(kernel)
            await anyio.to_thread.run_sync(lambda: self.recorder.mark(
                "restore", f"kernel restarted by restart_session; {describe_replayed(replayed)}",
                replayed=[r.model_dump() for r in replayed]))
            return replayed

    async def fork_from(self, source: Session) -> RestoreReport | None:
        """Make this new session (same owner, checked by the caller) a fork of ``source``: its checkpoint copied
        from the source's kernel to this one's (``checkpoint_copy``: the files directly for local kernels, relayed
        unread through the kernels for a gateway's), its record up to now copied (working directories in it moved to
        this session's), then this kernel refilled from the copy. Nothing is shared afterwards: each has its own
        files, kernel and record."""
        s = self.settings
        timeout = max(60.0, s.default_timeout)
        async with source.driving():
            cells = await anyio.to_thread.run_sync(source.recorder.cells)
            if s.checkpoint_mb > 0:
                async with self.driving():
                    target = await self.ensure_kernel(refill=False)
                    # a source without a kernel (reaped, revived) gets one that only reads its checkpoint out:
                    # it is refilled at the source's next call, as after any replacement
                    origin = await source.ensure_kernel(refill=False)
                    cap = int(s.checkpoint_mb * 1_000_000) + 10_000_000  # the manifest and the pickles' slack
                    await copy_checkpoint(origin, target, source_dir=source.dirs.checkpoint,
                                          target_dir=self.dirs.checkpoint, max_bytes=cap, timeout=timeout)
        old, new = str(source.dirs.root), str(self.dirs.root)
        for cell in cells:
            meta = cell.get("metadata", {}).get("kernelexec") if isinstance(cell.get("metadata"), dict) else None
            cwd = meta.get("cwd") if isinstance(meta, dict) else None
            if isinstance(cwd, str) and (cwd == old or cwd.startswith(old + "/")):
                meta["cwd"] = new + cwd[len(old):]  # type: ignore[index]
        forked = {"session": source.handle, "cells": len(cells), "at": time.time()}
        await anyio.to_thread.run_sync(lambda: self.recorder.adopt(cells, forked_from=forked))
        async with self.driving():
            self._epoch = None  # a pooled kernel started before the copy: refilled now
            await self.ensure_kernel()
            report, self.restored, self.notice = self.restored, None, None
        return report

    async def stop_kernel(self) -> None:
        """Shut the kernel down (idle reaping, close); the directory and notebook stay."""
        kernel, self.kernel = self.kernel, None
        self._epoch = None
        self.reserved = False
        if kernel is not None:
            connections.withdraw(self.settings.state_dir, self.handle)
            self._published = None
            await kernel.shutdown()

    async def finish_saves(self) -> None:
        """Before the server stops the kernel of a session a later server revives: up to SAVES_WAIT for its checkpoint
        to hold every change so far (its status waits for the saves; a save starts once a cell's answer is out, so
        a stop right after a call killed it mid-save and the revived session ran that cell again). Under the
        session's lock, so that it is the kernel's one request in flight: a session in use is not waited for, nor
        a kernel that does not answer in time (or has no checkpoint); each is stopped all the same. Never raises."""
        kernel = self.kernel
        if kernel is None or self.busy or self.settings.checkpoint_mb <= 0:
            return
        try:
            self.lock.acquire_nowait()
        except anyio.WouldBlock:
            return
        try:
            with anyio.move_on_after(SAVES_WAIT) as waited:
                await kernel.evaluate("_kernelexec_checkpoint_status()", timeout=SAVES_WAIT)
            if waited.cancelled_caught:
                logger.warning("session %s: its kernel did not confirm its last save within %g s; stopped all the same",
                               self.handle, SAVES_WAIT)
        except Exception as exc:  # noqa: BLE001 - the kernel's answer is untrusted and never stops a stop
            logger.warning("session %s: its kernel's last save was not confirmed before it stopped: %s", self.handle, exc)
        finally:
            self.lock.release()

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


def _install_failed(code: str, why: str) -> Execution:
    """A cell whose pip line could not be served: it fails as pip would, and nothing of it ran."""
    ex = Execution(code=code)
    ex.error = CellError("InstallError", why, [f"InstallError: {why}", "(the cell's code did not run)"])
    ex.outputs.append(ex.error.output())
    return ex
