"""``kernelexec replay``: the command around ``replay.replay_notebook``.

Reading the notebook (a session directory or journal works too, rebuilt when stale), the notes said before
anything runs (profile, interpreter, installs, code mode, metadata ignored), the per-cell lines, the summary
and the exit code, and ``--output``. Kept apart from the cell runner so each reads on its own.
"""

from __future__ import annotations

import contextlib
import functools
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import anyio

from kernelexec.environment.interpreter import Environment
from kernelexec.environment.overlay import prepare
from kernelexec.environment.packages import pip_lines
from kernelexec.errors import InvalidRequest, KernelexecError
from kernelexec.host import check_reach
from kernelexec.layout import SessionDirs
from kernelexec.sandbox.probe import kernel_reach
from kernelexec.session.record_meta import NotebookMeta, read_cell_meta, read_notebook_meta, read_session_meta
from kernelexec.session.recording import Recorder, notebook_meta
from kernelexec.session.replay import CellReport, annotate, replay_notebook
from kernelexec.terminal import safe

if TYPE_CHECKING:
    from nbformat import NotebookNode

    from kernelexec.config import Profile, Settings


@dataclass
class RecordedInstall:
    """An install a notebook records: an ``install_packages`` marker, or a cell's pip lines."""

    cell: int  # 1-based position in the notebook
    via: Literal["install_packages", "pip"]
    specs: list[str]

    def describe(self) -> str:
        names = ", ".join(s[:60] for s in self.specs[:10]) + (" …" if len(self.specs) > 10 else "")
        return f"cell {self.cell} {'%pip' if self.via == 'pip' else self.via} {names or '(no names)'}"


def recorded_installs(nb: NotebookNode) -> list[RecordedInstall]:
    """Every install ``nb`` records, in order (a pip line that is refused installs nothing: not listed)."""
    found = []
    for number, cell in enumerate(nb.cells, 1):
        meta = read_cell_meta(cell)
        if meta.event == "install":
            if meta.specs:  # a marker without a list of names installs nothing (its specs were ignored)
                found.append(RecordedInstall(number, "install_packages", list(meta.specs)))
        elif cell.get("cell_type") == "code":
            try:
                request, _ = pip_lines(cell.source)
            except InvalidRequest:
                continue
            if request is not None:
                found.append(RecordedInstall(number, "pip", request.specs))
    return found


def installs_line(installs: list[RecordedInstall], *, install: bool, policy: str) -> str:
    """The one console line naming the installs a notebook records, and whether replay redoes them."""
    listed = "; ".join(i.describe() for i in installs[:20]) + (f"; … ({len(installs)} in all)" if len(installs) > 20 else "")
    if install and policy == "off":
        return f"installs recorded: {listed} — not redone: --install, but --install-policy off refuses them"
    if install:
        return f"installs recorded: {listed} — redone (--install), within --install-policy {policy}, from your index"
    return (f"installs recorded: {listed} — not redone (a cell with pip lines is skipped, unless the environment has them "
            "all); replay with --install to redo them (within --install-policy)")


def load_notebook(path: Path) -> tuple[NotebookNode, Path, str | None]:
    """Read a notebook; a session directory or its journal works too.

    When the notebook sits in a session directory whose journal is newer (the server was killed
    before writing it), it is rebuilt from the journal first. Returns (notebook, path, note).
    """
    import nbformat

    if path.is_dir():
        path = SessionDirs(path).notebook
    if path.name == SessionDirs(path.parent).journal.name:
        path = SessionDirs(path.parent).notebook
    note = None
    session_dir = path.parent
    meta = read_session_meta(session_dir)
    journal = SessionDirs(session_dir).journal
    if meta is not None and journal.exists():
        recorder = Recorder(journal, path, notebook_meta(session_dir))
        if recorder.stale():
            recorder.write_notebook()
            note = "rebuilt from its journal"
    with open(path, encoding="utf-8") as fh:
        text = fh.read()
    try:
        found = json.loads(text)
        if not isinstance(found, dict) or not isinstance(found.get("nbformat"), int) or isinstance(found["nbformat"], bool):
            raise ValueError("no nbformat version")
        # nbformat's converters (old versions to 4) raise what they meet on malformed input: this is the one door
        nb = nbformat.reads(text, as_version=4)
        nbformat.validate(nb)
    except nbformat.ValidationError as exc:
        raise ValueError(f"not a valid notebook ({' '.join(str(exc.message).split())[:200]})") from None
    except RecursionError:
        raise ValueError("not a notebook kernelexec reads (JSON nested too deeply)") from None
    except (ValueError, TypeError, KeyError, AttributeError, IndexError) as exc:
        raise ValueError(f"not a valid notebook ({' '.join(str(exc).split())[:200]})") from None
    return nb, path, note


def ignored_metadata(nb: NotebookNode) -> list[str]:
    """What of ``nb``'s kernelexec metadata is not of kernelexec's shape (ignored by replay), one item a place."""
    found = [f"notebook: {item}" for item in read_notebook_meta(nb.metadata).ignored]
    for number, cell in enumerate(nb.cells, 1):
        found += [f"cell {number}: {item}" for item in read_cell_meta(cell).ignored]
    return found


def _line(report: CellReport) -> str:
    label = {"same": "same", "different": "DIFFERENT", "new": "new", "skipped": "skipped"}[report.status]
    extra = ""
    if report.status != "skipped" and (report.recorded_ending not in ("completed", "unknown") or report.replayed_ending != "completed"):
        extra = f"   [{report.recorded_ending} live, {report.replayed_ending} on replay]"
    if report.status == "different" and report.error:
        extra += f"   raised {report.error}"
    lines = [f"cell {report.number:<4} {label:<9} {report.first_line}{extra}"]
    lines += [f"           {d}" for d in report.details]
    return "\n".join(lines)


async def terminal_ask(question: str, password: bool) -> str | None:
    """``--ask``: a cell's question on this terminal (a password not echoed); end of input declines it."""
    import getpass

    def read() -> str | None:
        print(safe(question.rstrip()), flush=True)
        try:
            return getpass.getpass("(secret, not echoed) ") if password else input("> ")
        except EOFError:
            return None

    return await anyio.to_thread.run_sync(read)


def _fail(message: str) -> int:
    """A reason replay cannot run, on stderr; exit code 2."""
    print(safe(f"kernelexec replay: {message}"), file=sys.stderr)
    return 2


def _say(text: str) -> None:
    print(safe(text), flush=True)


def _beside_notebook(settings: Settings, path: Path, chosen: Profile) -> Settings:
    """The settings to replay under: with no working directory chosen, the notebook's folder (not for a session
    directory, nor under strict). Raises KernelexecError when that folder is not one a kernel may be given."""
    if settings.working_dir is None and chosen != "strict" and read_session_meta(path.parent) is None:
        # as nbclient and papermill do: in the notebook's folder, so it reads the files beside it (what is
        # writable there follows the profile and the protected names, as for any working directory; strict
        # has no file access at all)
        folder = path.parent.resolve()
        settings = settings.model_copy(update={"working_dir": folder, "work_roots": [*settings.work_roots, folder]})
        check_reach(settings, kernel_reach(settings))
    return settings


def _say_plan(nb: NotebookNode, path: Path, note: str | None, settings: Settings, chosen: Profile,
              recorded: NotebookMeta) -> None:
    """The opening lines: what is replayed, where, under which profile, and what of the record is ignored or capped."""
    code_cells = sum(1 for c in nb.cells if c.get("cell_type") == "code")
    _say(f"replaying {path} ({code_cells} code cells, profile {chosen}{'; ' + note if note else ''})"
         f"{f' in {settings.working_dir}' if settings.working_dir else ''}")
    if recorded.profile is not None and recorded.profile != chosen:
        _say(f"note: recorded under profile {str(recorded.profile)[:40]!r}; replayed under {chosen}, which your "
             "flags and config choose (a notebook never chooses its own profile or limits)")
    ignored = ignored_metadata(nb)
    if ignored:
        _say(f"note: kernelexec metadata not of kernelexec's shape, ignored: {'; '.join(ignored[:8])}"
             f"{f'; … ({len(ignored)} in all)' if len(ignored) > 8 else ''}")
    capped = [i for i, c in enumerate(nb.cells, 1) if c.get("cell_type") == "code"
              and (t := read_cell_meta(c).timeout) is not None and t > settings.max_timeout]
    if capped:
        _say(f"note: cell {', '.join(map(str, capped[:20]))}{' …' if len(capped) > 20 else ''}: recorded timeout "
             f"above --max-timeout ({settings.max_timeout:g} s); capped")


def _say_environment(environment: Environment, recorded: NotebookMeta) -> None:
    _say(f"environment: {environment.describe()}: {environment.reason}")
    was = recorded.environment
    if was is not None and was != (environment.python, environment.version):
        _say(f"note: recorded in Python {str(was[1])[:20]} at {str(was[0])[:200]}; replayed in "
             f"Python {environment.version} at {environment.python}, which your flags and config choose (--python; "
             "a notebook never chooses its interpreter)")


def _say_tools(nb: NotebookNode, live_tools: bool) -> None:
    tools = [c for c in nb.cells if read_cell_meta(c).tool_calls]
    if tools:
        _say(f"code mode: {len(tools)} cell{'s' if len(tools) != 1 else ''} made MCP tool calls; "
             + ("calling the live servers (--live-tools)" if live_tools else
                "serving their recorded results (offline; --live-tools calls the servers)"))


async def _run(nb: NotebookNode, settings: Settings, chosen: Profile, environment: Environment, *, install: bool,
               ask: bool, live_tools: bool) -> list[CellReport]:
    """Replay the cells, each report said as it comes; with ``live_tools``, the broker running meanwhile.
    Raises KernelexecError when replay cannot run."""
    async with contextlib.AsyncExitStack() as stack:
        broker = None
        if live_tools:
            from kernelexec.codemode.broker import from_settings

            broker = from_settings(settings)
            if broker is None:
                raise KernelexecError("--live-tools needs --tools-config (the servers to call)")
            await stack.enter_async_context(broker.running())
        return await replay_notebook(nb, settings, profile=chosen, on_cell=lambda r: _say(_line(r)),
                                     environment=environment, install=install, ask=terminal_ask if ask else None,
                                     live_tools=broker)


def summary_line(reports: list[CellReport]) -> str:
    """The closing line: how many cells were the same, different, new and skipped (and which)."""
    different = [r.number for r in reports if r.status == "different"]
    skipped = [r.number for r in reports if r.status == "skipped"]
    counts = {s: sum(1 for r in reports if r.status == s) for s in ("same", "different", "new")}
    summary = f"{len(reports)} cells: {counts['same']} same, {counts['different']} different"
    if counts["new"]:
        summary += f", {counts['new']} not run before"
    if different:
        summary += " (cell " + ", ".join(map(str, different)) + ")"
    if skipped:
        summary += f", {len(skipped)} skipped (cell {', '.join(map(str, skipped))})"
    return summary


async def replay_command(settings: Settings, notebook: str, *, output: str | None, profile: Profile | None,
                         install: bool = False, ask: bool = False, live_tools: bool = False) -> int:
    """``kernelexec replay``: 0 when every cell matches, 1 when one differs, 2 when replay cannot run.
    Cells skipped (their installs not redone without ``install``) are listed but do not differ."""
    import nbformat

    try:
        nb, path, note = load_notebook(Path(notebook))
    except (OSError, ValueError) as exc:
        return _fail(f"cannot read {notebook}: {exc}")
    recorded = read_notebook_meta(nb.metadata)
    chosen: Profile = profile or settings.effective_profile  # the user's flags and config; a notebook is data
    try:
        settings = _beside_notebook(settings, path, chosen)
    except KernelexecError as exc:
        return _fail(f"{exc}; or pass --working-dir DIR for the notebook to run in")
    _say_plan(nb, path, note, settings, chosen, recorded)
    try:
        environment = await anyio.to_thread.run_sync(
            functools.partial(prepare, settings.python, settings.working_dir, settings.cache_dir, reach=kernel_reach(settings)))
    except KernelexecError as exc:
        return _fail(str(exc))
    _say_environment(environment, recorded)
    installs, policy = recorded_installs(nb), settings.effective_install_policy(chosen)
    if installs:
        _say(installs_line(installs, install=install, policy=policy))
    _say_tools(nb, live_tools)
    try:
        reports = await _run(nb, settings, chosen, environment, install=install, ask=ask, live_tools=live_tools)
    except KernelexecError as exc:
        return _fail(str(exc))
    different = [r.number for r in reports if r.status == "different"]
    _say(summary_line(reports))
    if output:
        annotate(nb, replay={"profile": chosen, "different": different,
                             "skipped": [r.number for r in reports if r.status == "skipped"],
                             "environment": environment.summary(),
                             "installs": {"redone": install and policy != "off", "recorded": [
                                 {"cell": i.cell, "via": i.via, "specs": i.specs} for i in installs]}})
        nbformat.write(nb, output)
        _say(f"wrote {output}")
    return 1 if different else 0
