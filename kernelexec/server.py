"""The MCP face of kernelexec: tools and resources over a SessionManager.

Built by ``build_server(settings, sessions)``; nothing happens at import. Three error channels:
user code raising is a normal result; failures the model can act on (unknown session, bad input,
dead kernel) are ``ToolError``; protocol faults stay ``MCPError``.
"""


import json
import os
import stat
import time
from pathlib import Path
from typing import Annotated, Any

import anyio
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ResourceError, ResourceNotFoundError, ToolError
from mcp_types import CallToolResult, TextContent, ToolAnnotations
from pydantic import Field

from . import __version__
from .auth import StaticTokenVerifier, auth_settings, current_principal, load_tokens
from .config import Settings
from .errors import InvalidRequest, KernelexecError
from .models import ExecuteResult, RunPythonResult, SessionInfo, Variable, VariablesResult
from .policy import describe
from .render import TEXT_EXTENSIONS
from .runs import Run
from .restore import describe_replayed
from .sessions import Session, SessionManager
from .wire import clean_text

INSTRUCTIONS = """\
kernelexec runs Python in a persistent IPython kernel. Variables, imports and functions persist
between calls in the same session. The answer's `result` is the value of a variable named
`result` if your code assigns it, otherwise the value of the last expression. Print for logs.
Plots: matplotlib figures are returned as PNG images (and SVG files). Every answer names its
`session`; pass it back to keep working in the same kernel, or call new_session for a fresh one.
Long-running code is interrupted at `timeout` seconds; if it cannot be interrupted the kernel is
restarted and its variables are lost (the answer says so). Profile: {profile} ({what})."""

SessionArg = Annotated[
    str | None,
    Field(description="Session handle from an earlier answer; omit to use this connection's default session"),
]
CodeArg = Annotated[str, Field(description="Python code to run (IPython syntax: magics and top-level await work)")]


MAX_WORK_FILE = 10 * 1024 * 1024  # largest working-directory file served as a resource
MAX_LISTED_VARIABLES = 1000  # list_variables answers at most this many (a namespace can hold millions)


def _timeout(settings: Settings, timeout: float | None) -> float:
    if timeout is None:
        return settings.default_timeout
    if not 0 < timeout <= settings.max_timeout:
        raise InvalidRequest(f"timeout must be > 0 and at most {settings.max_timeout:g} seconds; got {timeout!r}")
    return float(timeout)


def _check_code(settings: Settings, code: str) -> None:
    if not isinstance(code, str):
        raise InvalidRequest("code must be a string")
    size = len(code.encode("utf-8", errors="surrogatepass"))
    if size > settings.max_code_bytes:
        raise InvalidRequest(f"code is {size:,} bytes; the limit is {settings.max_code_bytes:,} (--max-code-bytes)")
    if "\x00" in code:
        raise InvalidRequest("code contains NUL bytes (\\x00); send source text only")
    if code != clean_text(code):
        at = next(i for i, c in enumerate(code) if "\ud800" <= c <= "\udfff")
        raise InvalidRequest(f"code contains a lone UTF-16 surrogate ({code[at]!r} at character {at}); send valid Unicode text")


class _Progress:
    """Forwards output tails as progress notifications, at most every ``interval`` seconds."""

    def __init__(self, ctx: Context, interval: float = 0.5) -> None:
        self.ctx = ctx
        self.interval = interval
        self.chars = 0
        self.tail = ""
        self.last = 0.0

    async def __call__(self, name: str, text: str) -> None:
        self.chars += len(text)
        self.tail = (self.tail + text[-400:])[-400:]
        now = time.monotonic()
        if now - self.last >= self.interval:
            self.last = now
            await self.ctx.report_progress(self.chars, None, self.tail)


def build_server(settings: Settings, sessions: SessionManager) -> MCPServer:
    """Create the MCP server. ``sessions`` must be running (``SessionManager.running()``) while it serves."""
    profile = settings.effective_profile
    tokens = load_tokens(settings) if settings.transport == "http" else []
    mcp = MCPServer(
        "kernelexec",
        version=__version__,
        instructions=INSTRUCTIONS.format(profile=profile, what=describe(profile)),
        token_verifier=StaticTokenVerifier(tokens) if tokens else None,
        auth=auth_settings(settings) if tokens else None,
    )

    def owner_of(ctx: Context) -> str | None:
        return current_principal()

    async def resolve(ctx: Context, handle: str | None) -> Session:
        owner = owner_of(ctx)
        if handle:
            return await sessions.lookup(handle, owner=owner)  # revives a session a restarted server left
        headers = ctx.headers if ctx is not None else None
        if headers is None:  # stdio, in-memory: one client per process
            return await sessions.default(working_dir=settings.working_dir)
        transport_id = headers.get("mcp-session-id")
        if transport_id:  # legacy streamable HTTP (protocol <= 2025-11-25)
            return await sessions.for_transport(transport_id, owner=owner, working_dir=settings.working_dir)
        # stateless HTTP (2026-07-28): no way to tell clients apart, so a fresh session per call without a handle
        return await sessions.create(owner=owner, working_dir=settings.working_dir)

    async def run(ctx: Context, code: str, session: str | None, timeout: float | None, working_dir: str | None):
        try:
            _check_code(settings, code)
            seconds = _timeout(settings, timeout)
            target = await resolve(ctx, session)
            return await target.run(code, timeout=seconds, working_dir=working_dir, on_output=_Progress(ctx))
        except KernelexecError as exc:
            raise ToolError(str(exc)) from exc

    async def execute_code(
        code: CodeArg,
        ctx: Context,
        working_dir: Annotated[
            str | None, Field(description="Directory to run in (must lie in an allowed root); default: the session's directory")
        ] = None,
        session: SessionArg = None,
        timeout: Annotated[float | None, Field(description=f"Seconds before the code is interrupted (default {settings.default_timeout:g}, max {settings.max_timeout:g})")] = None,
        background: Annotated[bool, Field(description="Start the code and return a run_id at once; get the answer with get_run")] = False,
    ) -> Annotated[CallToolResult, ExecuteResult]:
        """Run Python code in a persistent Jupyter kernel and return its result, output, rich outputs and errors."""
        if background:
            return await start_background(ctx, code, session, timeout, working_dir)
        rendered = await run(ctx, code, session, timeout, working_dir)
        return _answer(rendered)

    async def start_background(ctx: Context, code: str, session: str | None, timeout: float | None, working_dir: str | None) -> CallToolResult:
        try:
            _check_code(settings, code)
            seconds = _timeout(settings, timeout if timeout is not None else settings.max_timeout)
            target = await resolve(ctx, session)
            target.resolve_working_dir(working_dir)
            started = sessions.runs.start(target, code, timeout=seconds, working_dir=working_dir)
        except KernelexecError as exc:
            raise ToolError(str(exc)) from exc
        return _running(started, f"started in the background (timeout {seconds:g} s)")

    def _running(started: Run, what: str) -> CallToolResult:
        s = started.session
        structured = ExecuteResult(
            success=True, session=s.handle, ending="running", run_id=started.id, stdout=started.tail,
            duration_ms=started.elapsed_ms, notebook=str(s.dirs.notebook), profile=s.profile,
        )
        text = (f"[running] run_id={started.id} session={s.handle}: {what}; {started.elapsed_ms / 1000:.1f} s so far, "
                f"{started.output_chars:,} characters of output. Call get_run(run_id) for the answer, interrupt(session) to stop it.")
        if started.tail:
            text += f"\n<kernelexec-stdout>\n{started.tail[-1000:]}\n</kernelexec-stdout>"
        return CallToolResult(content=[TextContent(type="text", text=text)], structured_content=structured.model_dump(mode="json"))

    async def get_run(
        ctx: Context,
        run_id: Annotated[str, Field(description="The run_id execute_code(background=true) returned")],
        wait_s: Annotated[float, Field(ge=0, le=600, description="Seconds to wait for it to finish (0 = just look)")] = 30,
    ) -> Annotated[CallToolResult, ExecuteResult]:
        """Get a background run's answer, waiting up to wait_s; while it runs, its output so far."""
        try:
            found = sessions.runs.get(run_id, owner=owner_of(ctx))
        except KernelexecError as exc:
            raise ToolError(str(exc)) from exc
        if not await sessions.runs.wait(found, wait_s):
            return _running(found, "still running")
        if found.failure is not None:
            raise ToolError(f"run {run_id} failed: {found.failure}")
        assert found.rendered is not None
        answer = _answer(found.rendered)
        answer.structured_content = {**answer.structured_content, "run_id": found.id}
        return answer

    async def interrupt(ctx: Context, session: SessionArg = None) -> SessionInfo:
        """Interrupt (SIGINT) the code running in a session, e.g. a background run; its answer says it was interrupted."""
        try:
            target = await resolve(ctx, session)
            sent = await target.interrupt()
        except KernelexecError as exc:
            raise ToolError(str(exc)) from exc
        return _info(target, "interrupt sent" if sent else "nothing was running")

    def _answer(rendered: Any) -> CallToolResult:
        return CallToolResult(
            content=rendered.content,
            structured_content=rendered.structured.model_dump(mode="json"),
            is_error=False,
        )

    async def run_python(code: CodeArg, ctx: Context, session: SessionArg = None) -> RunPythonResult:
        """Run Python code and return {result, logs}. Errors raised by the code are reported as tool errors."""
        rendered = await run(ctx, code, session, None, None)
        r = rendered.structured
        if not r.success:
            raise ToolError(f"{r.error}\n{chr(10).join(r.traceback[-8:])}".strip())
        logs = r.stdout + (("\n" if r.stdout and not r.stdout.endswith("\n") else "") + r.stderr if r.stderr else "")
        return RunPythonResult(result=r.result, logs=logs)

    async def list_variables(ctx: Context, session: SessionArg = None) -> Annotated[CallToolResult, VariablesResult]:
        """List the session's variables: name, type, a short repr, and shape or length where there is one."""
        try:
            target = await resolve(ctx, session)
            async with target.lock:
                kernel = await target.ensure_kernel()
                data = await kernel.evaluate("_kernelexec_variables()")
        except KernelexecError as exc:
            raise ToolError(str(exc)) from exc
        if isinstance(data, str):
            from anyio import to_thread

            try:
                data = json.loads(data) if len(data) < 100_000 else await to_thread.run_sync(json.loads, data)
            except ValueError:
                raise ToolError("could not list variables: the kernel's answer is not JSON") from None
        if isinstance(data, dict) and "error" in data:
            raise ToolError(f"could not list variables: {data['error']}")
        if not isinstance(data, list):
            raise ToolError("could not list variables: the kernel's answer is not a list")
        # the kernel's answer is untrusted and as long as its namespace: keep a bounded number, skip malformed ones
        variables: list[Variable] = []
        for entry in data[:MAX_LISTED_VARIABLES]:
            try:
                variables.append(Variable(**entry))
            except (TypeError, ValueError):
                continue
        found = VariablesResult(session=target.handle, variables=variables)
        text = found.model_dump_json()
        if len(data) > MAX_LISTED_VARIABLES:
            text += (f"\n(the first {MAX_LISTED_VARIABLES:,} of {len(data):,} variables; "
                     "inspect the others with execute_code)")
        return CallToolResult(content=[TextContent(type="text", text=text)], structured_content=found.model_dump(mode="json"))

    async def new_session(
        ctx: Context,
        working_dir: Annotated[str | None, Field(description="Default working directory (must lie in an allowed root)")] = None,
    ) -> SessionInfo:
        """Open a new, independent session (its own kernel) and return its handle."""
        try:
            created = await sessions.create(owner=owner_of(ctx), working_dir=settings.working_dir)
            cwd = created.resolve_working_dir(working_dir)
            if cwd is not None:
                created.default_cwd = created.cwd = cwd
            await created.ensure_kernel()
        except KernelexecError as exc:
            raise ToolError(str(exc)) from exc
        return _info(created, "created")

    async def restart_session(
        ctx: Context,
        session: SessionArg = None,
        replay: Annotated[bool, Field(description="Rebuild state: run the session's successful cells since its last plain restart again "
                                      "(their side effects happen again too); the answer lists them")] = False,
    ) -> SessionInfo:
        """Restart the session's kernel: all variables are lost (unless replay rebuilds them); the notebook record stays."""
        try:
            target = await resolve(ctx, session)
            replayed = await target.restart(replay=replay)
        except KernelexecError as exc:
            raise ToolError(str(exc)) from exc
        info = _info(target, "restarted")
        if replay:
            info.replayed, info.detail = replayed, describe_replayed(replayed)
        return info

    async def close_session(
        ctx: Context, session: Annotated[str, Field(description="Handle of the session to close")]
    ) -> SessionInfo:
        """Shut the session's kernel down and forget its handle (its notebook stays on disk)."""
        try:
            closed = await sessions.close(session, owner=owner_of(ctx))
        except KernelexecError as exc:
            raise ToolError(str(exc)) from exc
        return _info(closed, "closed")

    def _info(s: Session, status: str) -> SessionInfo:
        return SessionInfo(session=s.handle, status=status, profile=s.profile, working_dir=str(s.cwd), notebook=str(s.dirs.notebook))

    acting = ToolAnnotations(read_only_hint=False, destructive_hint=False, idempotent_hint=False, open_world_hint=False)
    reading = ToolAnnotations(read_only_hint=True, idempotent_hint=True, open_world_hint=False)
    tools: dict[str, tuple[Any, ToolAnnotations, str]] = {
        "execute_code": (execute_code, acting, "Execute Python code"),
        "run_python": (run_python, acting, "Run Python"),
        "list_variables": (list_variables, reading, "List variables"),
        "new_session": (new_session, acting, "New session"),
        "restart_session": (restart_session, ToolAnnotations(destructive_hint=True, open_world_hint=False), "Restart session"),
        "close_session": (close_session, ToolAnnotations(destructive_hint=True, open_world_hint=False), "Close session"),
        "get_run": (get_run, reading, "Get a background run"),
        "interrupt": (interrupt, acting, "Interrupt running code"),
    }
    exposed = {
        "plugin": ["execute_code"],
        "safe-executor": ["run_python"],
    }.get(settings.preset, list(tools))
    for name in exposed:
        fn, annotations, title = tools[name]
        mcp.add_tool(fn, name=name, title=title, annotations=annotations)

    def session_file(session: str, name: str) -> Path:
        try:
            s = sessions.get(session, owner=current_principal())
        except KernelexecError as exc:
            raise ResourceNotFoundError(str(exc)) from exc
        path = (s.dirs.outputs / name).resolve()
        if path.parent != s.dirs.outputs.resolve() or not path.is_file():
            raise ResourceNotFoundError(f"no file {name!r} in session {session}")
        return path

    def read_work_file(session: str, name: str) -> bytes:
        """A file the session's code wrote in its working directory. The kernel owns that directory, so
        the server opens it without following links and only as a plain file (no planted symlinks)."""
        try:
            s = sessions.get(session, owner=current_principal())
        except KernelexecError as exc:
            raise ResourceNotFoundError(str(exc)) from exc
        if "/" in name or name in ("", ".", ".."):
            raise ResourceNotFoundError(f"no file {name!r} in the working directory of session {session}")
        try:
            fd = os.open(s.dirs.work / name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError as exc:
            raise ResourceNotFoundError(f"no file {name!r} in the working directory of session {session}") from exc
        with os.fdopen(fd, "rb") as fh:
            st = os.fstat(fh.fileno())
            if not stat.S_ISREG(st.st_mode):
                raise ResourceNotFoundError(f"{name!r} is not a regular file")
            if st.st_size > MAX_WORK_FILE:
                raise ResourceError(f"{name!r} is {st.st_size:,} bytes; resources serve at most {MAX_WORK_FILE:,}")
            return fh.read(MAX_WORK_FILE)

    @mcp.resource("kernelexec://sessions/{session}/work/{name}", name="session-work-file", description="A file the session's code wrote in its working directory")
    def read_session_work_file(session: str, name: str) -> str | bytes:
        data = read_work_file(session, name)
        if name.rsplit(".", 1)[-1] in TEXT_EXTENSIONS | {"csv", "py", "md", "log", "tsv"}:
            return data.decode(errors="replace")
        return data

    @mcp.resource("kernelexec://sessions/{session}/files/{name}", name="session-file", description="A file a session produced (plots, spilled output)")
    def read_session_file(session: str, name: str) -> str | bytes:
        path = session_file(session, name)
        data = path.read_bytes()
        if path.suffix.lstrip(".") in TEXT_EXTENSIONS:
            return data.decode(errors="replace")
        return data

    @mcp.resource("kernelexec://sessions/{session}/notebook.ipynb", name="session-notebook", mime_type="application/x-ipynb+json", description="The session's notebook record")
    async def read_notebook(session: str) -> str:
        try:
            s = await sessions.lookup(session, owner=current_principal())  # also one from before a server restart
        except KernelexecError as exc:
            raise ResourceNotFoundError(str(exc)) from exc
        path = await anyio.to_thread.run_sync(s.recorder.current)
        return await anyio.to_thread.run_sync(path.read_text)

    # resources/list: besides the two templates, the concrete resources of the caller's live sessions
    # (each notebook, and each file in outputs/, newest first). MCPServer lists only static resources
    # and its list handler sees no request, so a middleware appends them to the SDK's own answer (its
    # wire envelope untouched). Whose sessions: stdio and in-memory serve one client, so all of them;
    # a legacy HTTP client, the session of its Mcp-Session-Id; a stateless HTTP client cannot be told
    # apart from the others, so none (listing would hand it other clients' handles).
    import heapq
    from mimetypes import guess_type
    from urllib.parse import quote

    from anyio import CapacityLimiter
    from anyio import to_thread as listing_thread
    from mcp_types import Resource

    from .render import EXTENSIONS

    max_listed_files = 200  # per directory of a session: the newest this many
    max_examined_entries = 5000  # per directory: a kernel can create millions; the listing looks at this many
    listing_threads: list[CapacityLimiter] = []  # listings run off the loop, at most two at a time (made on the loop)

    def visible_sessions(request: Any) -> list[Session]:
        headers = getattr(request, "headers", None)
        if headers is None:
            return [s for s in sessions.sessions.values() if not s.closed]
        handle = sessions.aliases.get(headers.get("mcp-session-id") or "")
        live = sessions.sessions.get(handle) if handle else None
        return [live] if live is not None and not live.closed else []

    def newest_files(directory: Path) -> tuple[list[tuple[str, os.stat_result]], int, bool]:
        """The newest regular, non-hidden files among the first ``max_examined_entries`` entries of
        ``directory``: (name, lstat) newest first, how many regular files were seen, and whether the
        directory has entries beyond those examined. Links are never followed (the kernel owns
        work/), and only files that are regular by their directory entry are lstat-ed."""
        newest: list[tuple[float, str, os.stat_result]] = []  # a min-heap of the newest kept so far
        seen = examined = 0
        more = False
        try:
            with os.scandir(directory) as entries:
                for entry in entries:
                    if examined >= max_examined_entries:
                        more = True
                        break
                    examined += 1
                    try:
                        if entry.name.startswith(".") or not entry.is_file(follow_symlinks=False):
                            continue
                        st = entry.stat(follow_symlinks=False)
                    except OSError:
                        continue
                    if not stat.S_ISREG(st.st_mode):
                        continue
                    seen += 1
                    item = (st.st_mtime, entry.name, st)
                    if len(newest) < max_listed_files:
                        heapq.heappush(newest, item)
                    elif item[:2] > newest[0][:2]:
                        heapq.heapreplace(newest, item)
        except OSError:
            pass
        newest.sort(key=lambda item: item[:2], reverse=True)
        return [(name, st) for _, name, st in newest], seen, more

    def shown(what: str, listed: int, seen: int, more: bool) -> str:
        """What a listing of a directory shows, when it is not everything."""
        if more:
            return (f"{what} has more than {max_examined_entries:,} entries: listed are the newest {listed} of the "
                    f"{seen:,} files among the first {max_examined_entries:,} examined; read any other by name")
        if listed < seen:
            return f"{what}: listed are the newest {listed} of its {seen:,} files; read any other by name"
        return ""

    def session_resources(handle: str, outputs: Path, work: Path) -> list[Resource]:
        """Runs in a worker thread: bounded work whatever the session's code created."""
        produced, produced_seen, produced_more = newest_files(outputs)
        written, written_seen, written_more = newest_files(work)
        notes = [n for n in (shown("outputs/", len(produced), produced_seen, produced_more),
                             shown("The working directory", len(written), written_seen, written_more)) if n]
        found = [
            Resource(
                uri=f"kernelexec://sessions/{handle}/notebook.ipynb", name="notebook.ipynb",
                title=f"Notebook of session {handle}",
                description="; ".join(["Every call of this session, as a notebook", *notes]),
                mime_type="application/x-ipynb+json",
            )
        ]
        produced_note = f" ({notes[0]})" if produced_seen > len(produced) or produced_more else ""
        for name, st in produced:
            mime = next((m for m, ext in EXTENSIONS.items() if ext == name.rsplit(".", 1)[-1]), None) if "." in name else None
            found.append(
                Resource(
                    uri=f"kernelexec://sessions/{handle}/files/{quote(name, safe='')}", name=name,
                    title=f"{name} (session {handle})", description="A file this session produced" + produced_note,
                    mime_type=mime or guess_type(name)[0] or "application/octet-stream", size=st.st_size,
                )
            )
        written_note = f" ({notes[-1]})" if written_seen > len(written) or written_more else ""
        for name, st in written:
            found.append(
                Resource(
                    uri=f"kernelexec://sessions/{handle}/work/{quote(name, safe='')}", name=name,
                    title=f"{name} (working directory of session {handle})",
                    description="A file the session's code wrote" + written_note, size=st.st_size,
                    mime_type=guess_type(name)[0] or "application/octet-stream",
                )
            )
        return found

    def listing(visible: list[tuple[str, Path, Path]]) -> list[dict[str, Any]]:
        return [
            r.model_dump(by_alias=True, mode="json", exclude_none=True)
            for handle, outputs, work in visible
            for r in session_resources(handle, outputs, work)
        ]

    async def list_session_resources(ctx: Any, call_next: Any) -> Any:
        result = await call_next(ctx)
        if ctx.method != "resources/list" or not isinstance(result, dict):
            return result
        visible = [(s.handle, s.dirs.outputs, s.dirs.work) for s in visible_sessions(ctx.request)]
        if not listing_threads:
            listing_threads.append(CapacityLimiter(2))
        extra = await listing_thread.run_sync(listing, visible, limiter=listing_threads[0]) if visible else []
        return {**result, "resources": [*result.get("resources", []), *extra]}

    mcp.middleware.append(list_session_resources)

    return mcp
