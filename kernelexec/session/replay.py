"""Run recorded cells again: ``kernelexec replay`` of a notebook, and restoring a session's state.

Replay re-executes a notebook with ``nbclient.NotebookClient`` in a fresh kernel started exactly as
a live session's is (a throwaway ``Session`` gives the launch spec: startup code, policy, OS layers),
under the profile the notebook was recorded with. Each code cell gets its recorded timeout; at the
timeout the kernel is interrupted, and killed and restarted if that does not stop it, as live.
Marker cells (``restart_session``, restores, revivals) are redone where they were recorded. Outputs
are compared by ``compare.py``'s rules; the ``kernelexec replay`` command around this is ``replay_cli.py``.

Rebuilding a live session's state (restore, revival) is ``restore.py``'s; replay uses its
``rerun`` for restores recorded in a notebook.
"""

from __future__ import annotations

import copy
import functools
import json
import logging
import secrets
import shutil
import signal
import tempfile
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import anyio

from kernelexec.codemode.broker import Broker
from kernelexec.codemode.recorded_calls import RecordedCalls, catalog_from_records
from kernelexec.environment.interpreter import Environment
from kernelexec.environment.overlay import prepare
from kernelexec.environment.packages import PipRequest, parse_specs, pip_lines
from kernelexec.errors import InvalidRequest, KernelexecError
from kernelexec.kernel.stdin import TOOL_CALL_MARK
from kernelexec.kernel.wire import harden, shared_context
from kernelexec.sandbox.probe import kernel_reach
from kernelexec.session.compare import comparable, differences
from kernelexec.session.record_meta import CellMeta, RecordedInput, read_cell_meta, read_notebook_meta
from kernelexec.session.restore import cell_timeout, first_line, rerun
from kernelexec.session.session import Session

if TYPE_CHECKING:
    from nbformat import NotebookNode

    from kernelexec.config import Profile, Settings

logger = logging.getLogger(__name__)

Ask = Callable[[str, bool], Awaitable[str | None]]

Status = Literal["same", "different", "new", "skipped"]


@dataclass
class CellReport:
    """How one code cell fared on replay."""

    number: int  # 1-based position in the notebook
    first_line: str
    status: Status
    recorded_ending: str = "completed"  # "unknown" for a notebook kernelexec did not record
    replayed_ending: str = "completed"
    details: list[str] = field(default_factory=list)
    error: str | None = None  # the error the replayed cell raised, in one line


def _session_roots(nb: NotebookNode) -> list[str]:
    """The recorded session's directory, as it appears in paths in its outputs."""
    handle = read_notebook_meta(nb.metadata).session
    roots = set()
    for cell in nb.cells:
        cwd = read_cell_meta(cell).cwd
        if cwd is None:
            continue
        marker = f"/sessions/{handle}" if handle else None
        if marker and marker in cwd:
            roots.add(cwd[: cwd.index(marker) + len(marker)])
    return sorted(roots, key=len, reverse=True)


def annotate(holder: Any, **fields: Any) -> None:
    """Add replay's fields to a cell's or notebook's ``metadata.kernelexec`` (foreign content there is replaced)."""
    if not isinstance(holder.metadata.get("kernelexec"), dict):
        holder.metadata["kernelexec"] = {}
    holder.metadata["kernelexec"].update(fields)


def _raised(outputs: list[Any]) -> str | None:
    for out in outputs:
        if isinstance(out, dict) and out.get("output_type") == "error" and out.get("ename") != "KernelexecError":
            return f"{out.get('ename')}: {str(out.get('evalue', ''))[:160]}".splitlines()[0] if out.get("evalue") else str(out.get("ename"))
    return None


class _Replayer:
    """One replay: a throwaway session's kernel driven by nbclient, one cell at a time."""

    def __init__(self, nb: NotebookNode, settings: Settings, session: Session, roots: list[str], *, install: bool,
                 ask: Ask | None = None, live_tools: Broker | None = None) -> None:
        from nbclient import NotebookClient

        kernel = session.kernel
        assert kernel is not None
        self.nb = nb
        self.settings = settings
        self.session = session
        self.kernel = kernel
        self.roots = roots
        self.compared: list[tuple[CellReport, list[Any], NotebookNode]] = []  # compared by output: settle() again
        self.install = install  # redo recorded installs (a notebook's %pip lines and install markers)
        self.ask = ask  # --ask: a cell's input()/getpass() asked on the terminal, not answered from the record
        self.stdin_notes: list[str] = []  # the current cell's
        self.notes: dict[int, list[str]] = {}  # by cell number: its stdin notes (kept when settle() compares again)
        self.live_tools = live_tools  # --live-tools: code mode's calls go to the live servers, not the record
        self.tool_calls: RecordedCalls | None = None  # the current cell's
        # timeouts are ours (per cell, with escalation), so nbclient waits without its own
        self.client = NotebookClient(nb, km=kernel.km, timeout=None, allow_errors=False,
                                     startup_timeout=int(settings.startup_timeout), record_timing=True)

    async def _connect(self) -> None:
        """Give nbclient its own client. ``km.client()`` would share the manager's wire session, whose
        id is the zmq identity of the shell socket: the newer client then takes the older one's replies."""
        from jupyter_client.session import Session as WireSession

        km = self.kernel.km
        assert km is not None  # replay runs in the session's started kernel
        wire = harden(WireSession(key=km.session.key, signature_scheme=km.session.signature_scheme))
        kc = km.client(session=wire, context=shared_context())
        kc.start_channels(hb=False, control=False)  # liveness and interrupts are the manager's: no socket nobody reads
        await kc.wait_for_ready(timeout=self.settings.startup_timeout)
        kc.allow_stdin = True  # input()/getpass(): answered from the record, or asked (--ask); see _serve_stdin
        self.client.km, self.client.kc = km, kc

    async def run(self, on_cell: Callable[[CellReport], None] | None) -> list[CellReport]:
        reports: list[CellReport] = []
        await self._connect()
        async with self.client.async_setup_kernel():
            try:
                await self._tools_catalog()
                for index, cell in enumerate(self.nb.cells):
                    meta = read_cell_meta(cell)
                    if meta.event is not None:
                        await self._redo(meta, index)
                    if cell.cell_type != "code" or not cell.source.strip():
                        continue
                    report = await self._cell(index, cell, meta)
                    reports.append(report)
                    if on_cell is not None:
                        on_cell(report)
                for report in self.settle():
                    if on_cell is not None:
                        on_cell(report)
            finally:
                if self.client.kc is not None:
                    self.client.kc.stop_channels()
                    self.client.kc = None
        return reports

    async def _redo(self, meta: CellMeta, index: int) -> None:
        """A marker: the live kernel was restarted here (and, for a restore or revival, refilled), or
        packages were installed (installed again here with --install, from the index the current
        settings name; listed and left out without it)."""
        if meta.event == "install":
            if self.install and meta.specs:
                await self._install(list(meta.specs))
            return
        await self._restart()
        if meta.event in ("restore", "revive"):
            await rerun(self.kernel, self.nb.cells[:index], default_timeout=self.settings.default_timeout,
                        max_timeout=self.settings.max_timeout, grace=self.settings.interrupt_grace)

    async def _install(self, specs: list[str], *, upgrade: bool = False) -> str | None:
        """Install recorded specs into the replay session's overlay; the answer's summary, or None
        (said on the console) when it cannot: the cells that need them then differ."""
        try:
            outcome = await self.session._install(self.kernel, parse_specs(specs), upgrade=upgrade)
        except KernelexecError as exc:
            logger.warning("replay could not install %s: %s", specs, exc)
            return None
        return outcome.summary()

    async def _tools_catalog(self) -> None:
        """Code mode: give the kernel ``mcp_tools`` for every server.tool the notebook recorded a call to (and,
        with --live-tools, the live catalog)."""
        records = [call for cell in self.nb.cells for call in read_cell_meta(cell).tool_calls]
        if not records and self.live_tools is None:
            return
        live = await self.live_tools.kernel_catalog() if self.live_tools is not None else None
        await self.kernel.evaluate(f"_kernelexec_tools_catalog({catalog_from_records(records, live)!r})")

    async def _restart(self) -> None:
        await self.kernel.restart()
        await self._tools_catalog()
        if self.client.km is not self.kernel.km:  # the restart fell back to a new kernel manager
            if self.client.kc is not None:
                self.client.kc.stop_channels()
            await self._connect()

    async def _execute(self, index: int, cell: NotebookNode, timeout: float, *, stdin: bool = True) -> str:
        """Run one cell through nbclient; return how it ended (completed, interrupted, restarted, kernel_died).
        Without ``stdin`` the kernel is told no one answers (input() raises StdinNotImplementedError, as under nbclient)."""
        from nbclient.exceptions import CellExecutionError, DeadKernelError

        state = {"ending": "completed"}
        km = self.kernel.km
        assert km is not None  # replay runs in the session's started kernel
        assert self.client.kc is not None
        self.client.kc.allow_stdin = stdin  # the execute_request's allow_stdin

        async def watchdog() -> None:
            await anyio.sleep(timeout)
            state["ending"] = "interrupted"
            await km.interrupt_kernel()
            await anyio.sleep(self.settings.interrupt_grace)
            state["ending"] = "restarted"
            await km.signal_kernel(signal.SIGKILL)  # nbclient notices the death within a second

        async with anyio.create_task_group() as tg:
            tg.start_soon(watchdog)
            tg.start_soon(self._serve_stdin, list(read_cell_meta(cell).inputs), index)
            try:
                await self.client.async_execute_cell(cell, index)
            except CellExecutionError:
                pass  # the error is in the cell's outputs, where the comparison sees it
            except DeadKernelError:
                if state["ending"] != "restarted":
                    state["ending"] = "kernel_died"
            except Exception as exc:  # noqa: BLE001 - nbclient choked on what the kernel sent: the cell differs
                logger.warning("replaying cell %d: %r", index + 1, exc)  # its type: some say nothing in str()
                state["ending"] = "unreadable output"
            finally:
                tg.cancel_scope.cancel()
        if state["ending"] in ("restarted", "kernel_died"):
            await self._restart()
        return state["ending"]

    async def _serve_stdin(self, recorded: list[RecordedInput], index: int) -> None:
        """Answer the cell's input()/getpass() requests: the recorded answers in order (a password recorded as
        *** cannot be, nor a question beyond the record: EOFError in the cell, with a note), or with --ask
        the terminal's."""
        kc = self.client.kc
        assert kc is not None
        while True:
            try:
                msg = await kc.get_stdin_msg(timeout=0.2)  # type: ignore[attr-defined]  # an async client
            except Exception:  # noqa: BLE001 - nothing yet (queue.Empty), or a message that would not decode
                continue
            content = msg.get("content") if isinstance(msg, dict) else None
            if not isinstance(msg, dict) or msg.get("msg_type") != "input_request" or not isinstance(content, dict):
                continue
            metadata = msg.get("metadata")
            if isinstance(metadata, dict) and TOOL_CALL_MARK in metadata:  # code mode: a brokered call, by its mark
                served = self.tool_calls
                reply = await served.handle(metadata[TOOL_CALL_MARK]) if served is not None else {"error": "no tool calls here"}
                kc.input(json.dumps(reply))
                continue
            prompt, password = str(content.get("prompt", ""))[:2000], content.get("password") is True
            how = "getpass()" if password else "input()"
            answer: str | None
            if self.ask is not None:
                answer = await self.ask(f"cell {index + 1} asks through {how}: {prompt}", password)
                if answer is None:
                    self.stdin_notes.append(f"{how} {prompt[:80]!r}: not answered on the terminal; the cell got EOFError")
            elif not recorded:
                answer = None
                self.stdin_notes.append(f"{how} {prompt[:80]!r}: no recorded answer; the cell got EOFError (--ask asks)")
            else:
                entry = recorded.pop(0)
                answer = entry.answer
                if entry.password and answer is not None:
                    answer = None
                    self.stdin_notes.append(f"{how} {prompt[:80]!r}: a password is recorded as ***, so it cannot be "
                                            "replayed; the cell got EOFError (--ask asks for it)")
                elif answer is None:
                    self.stdin_notes.append(f"{how} {prompt[:80]!r}: unanswered when recorded; EOFError again")
            kc.input("\x04" if answer is None else answer)  # ipykernel raises EOFError for \x04

    def _present(self, request: PipRequest) -> list[str] | None:
        """"name version" for each package a pip line asks for when the kernel's environment has them all at versions
        it accepts (so pip would install nothing and the index is asked nothing); None when one is missing, asks for
        extras or a URL, or the line upgrades."""
        from packaging.requirements import InvalidRequirement, Requirement
        from packaging.version import InvalidVersion, Version

        env = self.session.environment
        if env is None or request.upgrade:
            return None
        markers = dict(env.markers) | {"extra": ""}
        found = []
        for spec in request.specs:
            try:
                req = Requirement(spec)
                if req.marker is not None and not req.marker.evaluate(markers):
                    continue  # pip leaves it out here too
                have = env.version_of(req.name)
                if req.extras or req.url or have is None or not req.specifier.contains(Version(have), prereleases=True):
                    return None
            except (InvalidRequirement, InvalidVersion):
                return None
            found.append(f"{req.name} {have}")
        return found

    def _skip(self, index: int, cell: NotebookNode, meta: CellMeta, note: str) -> CellReport:
        """A cell not run: said on its report line and in its metadata; its recorded outputs are dropped."""
        cell.outputs, cell.execution_count = [], None
        annotate(cell, replay_ending="skipped", replay_note=note)
        return CellReport(index + 1, first_line(cell.source), "skipped", meta.ending, "skipped", [note])

    async def _cell(self, index: int, cell: NotebookNode, meta: CellMeta) -> CellReport:
        if self.client.skip_cells_with_tag in (cell.metadata.get("tags") or ()):  # nbclient leaves it as it is
            note = f"not run: tagged {self.client.skip_cells_with_tag}, as nbclient and papermill leave it"
            annotate(cell, replay_ending="skipped", replay_note=note)
            return CellReport(index + 1, first_line(cell.source), "skipped", meta.ending, "skipped", [note])
        recorded_outputs = copy.deepcopy(list(cell.get("outputs", [])))
        never_ran = cell.get("execution_count") is None and not recorded_outputs and not meta.recorded
        recorded_ending = meta.ending if meta.recorded else "unknown"  # Jupyter does not record how a cell ended
        timeout = cell_timeout(meta.timeout, self.settings.default_timeout, self.settings.max_timeout)
        source = cell.source
        try:
            request, runnable = pip_lines(source)
        except InvalidRequest as exc:  # refused live before anything of the cell ran: not run here either
            return self._skip(index, cell, meta, f"not run: its pip line is refused, as it is live ({exc})"[:400])
        notes = []
        if request is not None and not self.install:
            present = self._present(request)
            if present is None:
                return self._skip(index, cell, meta, f"not run: it installs {', '.join(request.specs)[:200]}; "
                                  "replay with --install to redo installs")
            # pip would only say "Requirement already satisfied": the rest of the cell runs, as under Jupyter
            notes.append(f"its pip line asks only for what the environment has ({', '.join(present)[:200]}): "
                         "nothing installed, the rest of the cell ran")
            request = None
        installed = await self._install(request.specs, upgrade=request.upgrade) if request is not None else None
        cell.source = runnable  # the kernel cannot run pip; the install was done here, as live
        self.stdin_notes = notes
        self.tool_calls = RecordedCalls(list(meta.tool_calls), self.live_tools.cell(None) if self.live_tools else None)
        # a cell kernelexec did not record (a Jupyter notebook's) asks no one, as under nbclient and papermill:
        # input() raises StdinNotImplementedError there, not the EOFError of a question beyond a record
        stdin = meta.recorded or self.ask is not None or self.live_tools is not None
        try:
            ending = await self._execute(index, cell, timeout, stdin=stdin)
        finally:
            cell.source = source
        said = self.tool_calls.summary()
        self.stdin_notes.extend(self.tool_calls.notes + ([said] if said else []))
        if installed and request is not None and not request.quiet:
            from nbformat.v4 import new_output

            cell.outputs.insert(0, new_output("stream", name="stdout", text=installed + "\n"))
        annotate(cell, replay_ending=ending)
        report = CellReport(index + 1, first_line(cell.source), "same", recorded_ending, ending, error=_raised(cell.outputs))
        if never_ran:
            report.status = "new"
        elif recorded_ending not in (ending, "unknown"):
            report.status = "different"
            report.details.append(f"ending: recorded {recorded_ending}, replayed {ending}")
        elif ending == "completed" or recorded_ending == "unknown":
            self.compared.append((report, recorded_outputs, cell))
            report.details = differences(comparable(recorded_outputs, self.roots), comparable(cell.outputs, self.roots))
            report.status = "different" if report.details else "same"
        # a cell cut short both times: its partial output depends on timing, so only endings count
        if self.stdin_notes:
            report.details.extend(self.stdin_notes)
            self.notes[report.number] = list(self.stdin_notes)
            annotate(cell, replay_note="; ".join(self.stdin_notes)[:1000])
        return report

    def settle(self) -> list[CellReport]:
        """Compare again the cells a later cell's display update rewrote (as the recorded notebook shows
        them, in their final state); the reports whose verdict changed."""
        changed = []
        for report, recorded_outputs, cell in self.compared:
            details = differences(comparable(recorded_outputs, self.roots), comparable(cell.outputs, self.roots))
            status: Status = "different" if details else "same"
            details += self.notes.get(report.number, [])
            if (status, details) != (report.status, report.details):
                report.status, report.details = status, details
                report.details.append("(after a later cell's display update)")
                changed.append(report)
        return changed


async def replay_notebook(
    nb: NotebookNode,
    settings: Settings,
    *,
    profile: Profile,
    on_cell: Callable[[CellReport], None] | None = None,
    environment: Environment | None = None,
    install: bool = False,
    ask: Ask | None = None,
    live_tools: Broker | None = None,
) -> list[CellReport]:
    """Execute ``nb`` (in place) in a fresh kernel launched as a live session's, under ``profile``.

    Always a local kernel: nbclient drives it through its kernel manager (``--kernel-gateway`` and ``--kernel-spec`` are ignored),
    in ``environment`` (default: what the current settings choose; a notebook never chooses its interpreter).
    The installs it records (``recorded_installs``) are redone only with ``install`` (within
    --install-policy, as live); without it, a cell with pip lines is skipped (run without them when the environment has every package
    they name) and install markers are left out."""

    base = Path(tempfile.mkdtemp(prefix="kxr"))
    session = None
    try:
        scratch = settings.model_copy(update={"state_dir": base, "profile": profile, "kernel_gateway": None,
                                                  "kernel_spec": None})
        if environment is None:
            environment = await anyio.to_thread.run_sync(
            functools.partial(prepare, settings.python, settings.working_dir, settings.cache_dir, reach=kernel_reach(settings)))
        session = Session(f"replay-{secrets.token_urlsafe(6)}", scratch, environment=environment,
                          working_dir=settings.working_dir if profile != "strict" else None)  # strict: no files at all
        await session.ensure_kernel()
        roots = [*_session_roots(nb), str(session.dirs.root)]
        return await _Replayer(nb, scratch, session, roots, install=install, ask=ask, live_tools=live_tools).run(on_cell)
    finally:
        with anyio.CancelScope(shield=True):
            if session is not None:
                await session.stop_kernel()
                session.release()
        shutil.rmtree(base, ignore_errors=True)
