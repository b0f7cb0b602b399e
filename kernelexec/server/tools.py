"""The MCP tools: small functions over one ``App`` (server/app.py), each a thin shell around it."""

import json
from typing import Annotated, Any

import anyio
from anyio import to_thread
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import (
    CallToolResult,
    InputRequiredResult,
    TextContent,
    ToolAnnotations,
)
from pydantic import Field

from kernelexec.errors import InvalidRequest
from kernelexec.server import durable, uploads, view
from kernelexec.server.app import RUN_PYTHON_TIMEOUT, App, SessionArg, SessionName, exposed_tools, info, translated, variables_answer
from kernelexec.server.questions import resumed
from kernelexec.server.render import Rendered
from kernelexec.server.results import ExecuteResult, InstalledPackage, InstallResult, Restored, RunPythonResult, SessionInfo, UploadGrant, VariablesResult
from kernelexec.server.view import VIEW_META
from kernelexec.session.restore import RestoreReport, describe_replayed
from kernelexec.session.runs import Run
from kernelexec.session.session import Session

CodeArg = Annotated[str, Field(description="Python code to run (IPython syntax: magics and top-level await work)")]
def run_view(app: App) -> Any:
    """The run view's MCP Apps extension (view.py), with this module's helpers; None when execute_code is not exposed."""
    names = exposed_tools(app.settings)
    if names is not None and "execute_code" not in names:
        return None
    return view.extension(app)


def _running_tools(app: App) -> dict[str, Any]:
    """execute_code and the tools that follow a run: get_run, send_input."""
    settings = app.settings

    @translated
    async def execute_code(
        code: CodeArg,
        ctx: Context,
        working_dir: Annotated[
            str | None, Field(description="Directory to run in (must lie in an allowed root); default: the session's directory")
        ] = None,
        session: SessionArg = None,
        timeout: Annotated[float | None, Field(description=f"Seconds before the code is interrupted "
                                               f"(default {settings.default_timeout:g}, max {settings.max_timeout:g})")] = None,
        background: Annotated[bool, Field(description="Start the code and return a run_id at once; get the answer with get_run")] = False,
    ) -> Annotated[CallToolResult, ExecuteResult]:
        """Run Python code in a persistent Jupyter kernel and return its result, output, rich outputs and errors."""
        still = (f"still running after {settings.yield_after:g} s (--yield-after); it goes on in the background, "
                 "nothing was cut")
        if ctx.request_state:  # a 2026-07-28 client's retry, answering its cell's input(): the cell is not run again
            return app.reply(ctx, await resume(ctx), still)  # type: ignore[return-value]
        if background:
            return await app.start_background(ctx, code, session, timeout, working_dir)
        return app.reply(ctx, await app.run_or_yield(ctx, code, session, timeout, working_dir), still)  # type: ignore[return-value]

    @translated
    async def get_run(
        ctx: Context,
        run_id: Annotated[str, Field(description="The run_id execute_code(background=true) returned")],
        wait_s: Annotated[float, Field(ge=0, le=600, description="Seconds to wait for it to finish (0 = just look)")] = 30,
    ) -> Annotated[CallToolResult, ExecuteResult]:
        """Get a background run's answer, waiting up to wait_s; while it runs, its output so far."""
        if ctx.request_state:
            return finished(await resume(ctx), ctx)  # type: ignore[return-value]
        try:
            found = app.sessions.runs.get(run_id, owner=app.owner())
        except InvalidRequest as unknown:  # not in this process: a run from before a restart, from the store
            return await durable.get_run(app, run_id, unknown, wait_s)
        return finished(await app.follow(ctx, found, wait_s), ctx)  # type: ignore[return-value]

    async def resume(ctx: Context) -> Rendered | Run | CallToolResult | InputRequiredResult:
        """A retry: of a run this process holds (app.resume), else of one another replica holds (relayed)."""
        try:
            app.sessions.runs.get(resumed(ctx.request_state)[0], owner=app.owner())
        except InvalidRequest as unknown:
            return await durable.resume_elsewhere(app, ctx, unknown)
        return await app.resume(ctx)

    def finished(done: Rendered | Run | CallToolResult | InputRequiredResult, ctx: Context,
                 what: str = "still running") -> CallToolResult | InputRequiredResult:
        return app.reply(ctx, done, what)

    @translated
    async def send_input(
        ctx: Context,
        run_id: Annotated[str, Field(description="The run_id of the answer that said ending: awaiting_input")],
        question_id: Annotated[str, Field(description="That answer's question_id: the question this answers (once)")],
        text: Annotated[str | None, Field(description="The user's answer, the value input() returns; null declines")] = None,
        cancel: Annotated[bool, Field(description="Decline the question: the code gets EOFError")] = False,
        wait_s: Annotated[float, Field(ge=0, le=600, description="Seconds to wait for the run after answering (0 = just look)")] = 30,
    ) -> Annotated[CallToolResult, ExecuteResult]:
        """Answer the input() a run waits on (ending: awaiting_input) with the user's answer; getpass() is never answered here."""
        try:
            found = app.sessions.runs.get(run_id, owner=app.owner())
        except InvalidRequest as unknown:  # not in this process: another replica's (relayed), or the store says why not
            if app.relay.store is None:
                await durable.send_input(app, run_id, unknown)
                raise
            await durable.refuse_if_lost(app, run_id)
            await app.relay.answer(run_id, question_id, None if cancel else text, "send_input", app.owner(), unknown)
            said = f"input {'declined' if cancel or text is None else 'sent'} to run {run_id} (it runs on another replica)"
            relayed = await durable.follow_relayed(app, run_id, question_id, wait_s, retry=False)
            if isinstance(relayed, CallToolResult):
                relayed.content = [TextContent(type="text", text=f"[{said}]"), *relayed.content]
            return relayed  # type: ignore[return-value]
        await app.relay.claim(found, question_id, app.owner(), None if cancel else text)
        question = found.answer(question_id, None if cancel else text)
        said = (f"input sent to run {found.id}" if question.answer is not None
                else f"input declined for run {found.id}: the code gets EOFError")
        reply = finished(await app.follow(ctx, found, wait_s), ctx, f"{said}; still running")
        if isinstance(reply, CallToolResult) and not (isinstance(reply.structured_content, dict)
                                                      and reply.structured_content.get("ending") == "running"):
            reply.content = [TextContent(type="text", text=f"[{said}]"), *reply.content]
        return reply  # type: ignore[return-value]

    return {"execute_code": execute_code, "get_run": get_run, "send_input": send_input}


def _control_tools(app: App) -> dict[str, Any]:
    """interrupt, run_python (the old safe executor's contract) and list_variables."""
    settings = app.settings

    @translated
    async def interrupt(ctx: Context, session: SessionArg = None) -> SessionInfo:
        """Interrupt (SIGINT) the code running in a session, e.g. a background run; its answer says it was interrupted."""
        target = await app.resolve(ctx, session)
        sent = await target.interrupt()
        app.sessions.runs.decline_waiting(target)  # a cell waiting in input() stops waiting too
        if not sent and await app.relay.ask_interrupt(target.handle, app.owner()):  # its cell runs on another replica
            return info(target, "interrupt sent to the replica of this fleet running its cell")
        return info(target, "interrupt sent" if sent else "nothing was running")

    @translated
    async def run_python(code: CodeArg, ctx: Context, session: SessionArg = None) -> RunPythonResult:
        """Run Python code and return {result, logs}: result is the value of the last statement (as the safe
        executor answered: `x = 3` gives 3). Errors raised by the code are reported as tool errors."""
        r = (await app.run(ctx, code, session, min(settings.default_timeout, RUN_PYTHON_TIMEOUT), None,
                           result_rule="statement")).structured
        if not r.success:
            raise ToolError(f"{r.error}\n{chr(10).join(r.traceback[-8:])}".strip())
        logs = r.stdout + (("\n" if r.stdout and not r.stdout.endswith("\n") else "") + r.stderr if r.stderr else "")
        return RunPythonResult(result=r.result, logs=logs)

    @translated
    async def list_variables(ctx: Context, session: SessionArg = None) -> Annotated[CallToolResult, VariablesResult]:
        """List the session's variables: name, type, a short repr, and shape or length where there is one."""
        target = await app.resolve(ctx, session)
        data = await target.variables()
        if isinstance(data, str):
            try:
                data = json.loads(data) if len(data) < 100_000 else await to_thread.run_sync(json.loads, data)
            except ValueError:
                raise ToolError("could not list variables: the kernel's answer is not JSON") from None
        return variables_answer(target.handle, data)

    return {"interrupt": interrupt, "run_python": run_python, "list_variables": list_variables}


def _session_tools(app: App) -> dict[str, Any]:
    """A session's life: new_session, restart_session, close_session, install_packages."""
    settings = app.settings

    @translated
    async def new_session(
        ctx: Context,
        working_dir: Annotated[str | None, Field(description="Default working directory (must lie in an allowed root)")] = None,
    ) -> SessionInfo:
        """Open a new, independent session (its own kernel) and return its handle."""
        app.sessions.check_working_dir(working_dir)  # what can be refused before a place is reserved
        created = await app.sessions.create(owner=app.owner(), working_dir=settings.working_dir)
        try:
            await created.open(working_dir)
        except BaseException:  # its handle never went out: its place is given back (a bad working_dir, a failed start)
            with anyio.CancelScope(shield=True):
                await app.sessions.discard(created)
            raise
        return info(created, "created")

    @translated
    async def restart_session(
        ctx: Context,
        session: SessionArg = None,
        replay: Annotated[bool, Field(description="Rebuild state by rerunning the successful cells since the last plain "
                                      "restart (side effects happen again)")] = False,
        restore: Annotated[bool, Field(description="Rebuild state from the checkpoint, rerunning only the cells it could "
                                       "not save")] = False,
    ) -> SessionInfo:
        """Restart the session's kernel: all variables are lost (unless restore or replay rebuilds them); the notebook record stays."""
        target = await app.resolve(ctx, session)
        done = await target.restart(replay=replay, restore=restore)
        restarted = info(target, "restarted")
        if isinstance(done, RestoreReport):
            restarted.restored, restarted.detail = Restored.of(done), done.detail
        elif replay:
            restarted.replayed, restarted.detail = done, describe_replayed(done)
        return restarted

    @translated
    async def close_session(
        ctx: Context, session: SessionName
    ) -> SessionInfo:
        """Shut the session's kernel down and forget its handle (its notebook stays on disk)."""
        return info(await app.sessions.close(session, owner=app.owner()), "closed")

    @translated
    async def install_packages(
        ctx: Context,
        packages: Annotated[list[str], Field(description="PEP 508 names with optional extras and version specifiers, "
                                             "e.g. [\"seaborn\", \"tabulate>=0.9\"]; wheels only")],
        session: SessionArg = None,
        upgrade: Annotated[bool, Field(description="Upgrade what the session's overlay already has")] = False,
    ) -> InstallResult:
        """Install packages for a session (the server fetches wheels; the kernel stays offline); importable at once."""
        target, outcome = await app.using(ctx, session, lambda s: _installed(s, packages, upgrade))
        return InstallResult(
            session=target.handle, duration_ms=outcome.duration_ms, index=outcome.index, summary=outcome.summary(),
            installed=[InstalledPackage(name=i.name, version=i.version, size=i.size) for i in outcome.installed])

    @translated
    async def fork_session(ctx: Context, session: SessionArg = None) -> SessionInfo:
        """A new session with this one's variables (from its checkpoint) and a copy of its record; each changes alone."""
        source = await app.resolve(ctx, session)
        created = await app.sessions.create(owner=source.owner, working_dir=settings.working_dir)
        try:
            report = await created.fork_from(source)
        except BaseException:
            await app.sessions.close(created.handle, owner=source.owner)
            raise
        forked = info(created, "forked")
        forked.forked_from, forked.restored = source.handle, Restored.of(report)
        forked.detail = f"forked from {source.handle}; " + (report.detail if report is not None else "nothing to restore")
        return forked

    @translated
    async def upload_url(
        ctx: Context,
        filename: Annotated[str, Field(description="The file's name in the session's working directory (one plain name, no path)")],
        session: SessionArg = None,
        max_bytes: Annotated[int, Field(ge=1, le=uploads.MAX_BYTES, description="The largest body the URL accepts")] = uploads.DEFAULT_MAX_BYTES,
        expires_s: Annotated[int, Field(ge=1, le=uploads.MAX_TTL_S, description="Seconds the URL stays valid")] = uploads.DEFAULT_TTL_S,
    ) -> UploadGrant:
        """A one-time URL to PUT a file's bytes to (outside the conversation: the bytes never pass through the model);
        they land in the session's working directory under filename, through its kernel. HTTP transport only."""
        origin = app.origin(ctx)
        if origin is None:
            raise InvalidRequest("upload_url works over the HTTP transport only; under stdio the working directory "
                                 "already is yours: put the file there")
        target = await app.resolve(ctx, session)
        g = await app.uploads.grant(target, app.owner(), filename, max_bytes, expires_s, origin)
        return UploadGrant(uploadUrl=g.url, headers=dict(uploads.PUT_HEADERS), expiresAt=g.expires_at, maxBytes=g.max_bytes,
                           session=target.handle, filename=g.filename)

    return {"new_session": new_session, "restart_session": restart_session, "close_session": close_session,
            "install_packages": install_packages, "fork_session": fork_session, "upload_url": upload_url}


async def _installed(target: Session, packages: list[str], upgrade: bool) -> tuple[Session, Any]:
    return target, await target.install(packages, upgrade=upgrade)


def register(mcp: MCPServer, app: App) -> None:
    """Add the tools the preset exposes (``plugin``: execute_code; ``safe-executor``: run_python; else all).
    ``tools`` below is also read, without importing this module, by hook.py (its string keys)."""
    fns = {**_running_tools(app), **_control_tools(app), **_session_tools(app)}
    acting = ToolAnnotations(read_only_hint=False, destructive_hint=False, idempotent_hint=False, open_world_hint=False)
    reading = ToolAnnotations(read_only_hint=True, idempotent_hint=True, open_world_hint=False)
    destroying = ToolAnnotations(destructive_hint=True, open_world_hint=False)
    tools: dict[str, tuple[Any, ToolAnnotations, str]] = {
        "execute_code": (fns["execute_code"], acting, "Execute Python code"),
        "run_python": (fns["run_python"], acting, "Run Python"),
        "list_variables": (fns["list_variables"], reading, "List variables"),
        "new_session": (fns["new_session"], acting, "New session"),
        "restart_session": (fns["restart_session"], destroying, "Restart session"),
        "close_session": (fns["close_session"], destroying, "Close session"),
        "fork_session": (fns["fork_session"], acting, "Fork session"),
        "get_run": (fns["get_run"], reading, "Get a background run"),
        "send_input": (fns["send_input"], acting, "Answer a run's input()"),
        "interrupt": (fns["interrupt"], acting, "Interrupt running code"),
        "install_packages": (fns["install_packages"], ToolAnnotations(read_only_hint=False, destructive_hint=False,
                                                               idempotent_hint=True, open_world_hint=True), "Install packages"),
        "upload_url": (fns["upload_url"], acting, "Upload URL for a file"),
    }
    exposed = exposed_tools(app.settings) or [n for n in tools if n != "upload_url" or app.settings.transport == "http"]
    for name in exposed:
        fn, annotations, title = tools[name]
        # the run view (view.py) for hosts that render MCP Apps; others ignore the _meta and get the same answer
        meta = VIEW_META if name in ("execute_code", "get_run") else None
        mcp.add_tool(fn, name=name, title=title, annotations=annotations, meta=meta)

