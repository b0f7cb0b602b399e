"""The MCP tools: small functions over one ``App`` (the settings and the session manager).

Three error channels: user code raising is a normal result; failures the model can act on (unknown
session, bad input, dead kernel) are ``KernelexecError``s, which ``translated`` turns into
``ToolError`` (the one place that happens); protocol faults stay ``MCPError``.
"""

import functools
import json
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Annotated, Any, TypeVar

import anyio
from anyio import to_thread
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import (
    CallToolResult,
    ElicitRequest,
    ElicitRequestFormParams,
    ElicitResult,
    InputRequiredResult,
    TextContent,
    ToolAnnotations,
)
from pydantic import BaseModel, Field

from . import view
from .auth import current_principal
from .broker import Broker
from .config import Settings
from .errors import InvalidRequest, KernelexecError
from .models import ExecuteResult, InstalledPackage, InstallResult, ResultRule, RunPythonResult, SessionInfo, Variable, VariablesResult
from .render import Rendered
from .restore import describe_replayed
from .runs import APPROVED, Question, Run
from .sessions import Session, SessionManager
from .view import VIEW_META
from .wire import clean_text

SessionArg = Annotated[
    str | None,
    Field(description="Session handle from an earlier answer; omit to use this connection's default session"),
]
CodeArg = Annotated[str, Field(description="Python code to run (IPython syntax: magics and top-level await work)")]
RUN_PYTHON_TIMEOUT = 60.0  # run_python keeps the old tool's contract: one answer, a timeout, no yielding
MAX_LISTED_VARIABLES = 1000  # list_variables answers at most this many (a namespace can hold millions)

T = TypeVar("T")


def translated(fn: Callable[..., Awaitable[T]]) -> Callable[..., Awaitable[T]]:
    """The tool's KernelexecErrors as ToolErrors (messages the model can act on)."""

    @functools.wraps(fn)
    async def tool(*args: Any, **kwargs: Any) -> T:
        try:
            return await fn(*args, **kwargs)
        except KernelexecError as exc:
            raise ToolError(str(exc)) from exc

    return tool


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


HEARTBEAT = 10.0  # seconds: a working call sends progress at least this often (clients reset idle timers on it)


class _Progress:
    """Forwards output tails as progress notifications, at most every ``interval`` seconds, and a
    heartbeat when a cell prints nothing (``beat``). Without a progress token the SDK sends nothing."""

    def __init__(self, ctx: Context, interval: float = 0.5) -> None:
        self.ctx = ctx
        self.interval = interval
        self.chars = 0
        self.tail = ""
        self.started = self.last = time.monotonic()

    async def __call__(self, name: str, text: str) -> None:
        self.chars += len(text)
        self.tail = (self.tail + text[-400:])[-400:]
        now = time.monotonic()
        if now - self.last >= self.interval:
            self.last = now
            await self.ctx.report_progress(self.chars, None, self.tail)

    async def beat(self) -> None:
        now = time.monotonic()
        if now - self.last >= HEARTBEAT - 0.5:
            self.last = now
            await self.ctx.report_progress(self.chars, None, f"still running ({now - self.started:.0f} s)")

    async def beating(self) -> None:
        """Heartbeats until cancelled."""
        while True:
            await anyio.sleep(HEARTBEAT / 2)
            await self.beat()


class _Answer(BaseModel):
    answer: str = Field(description="Your answer, passed to the code as the value input() returns")


INPUT_KEY = "input"  # the one embedded elicitation of an InputRequiredResult (2026-07-28)
MULTI_ROUND_TRIP = "2026-07-28"  # from this protocol on, no server-to-client requests: InputRequiredResult


def question_message(handle: str, prompt: str, password: bool) -> str:
    """The words around a cell's prompt, the server's, so that a cell's prompt cannot pass for the assistant's."""
    how = "getpass() — it asks for a password or secret" if password else "input()"
    message = (f"Code running in kernelexec session {handle} asks for input through {how}. This question comes "
               f"from the code, not from the assistant or kernelexec:\n\n{prompt.strip()[:500] or '(no prompt)'}")
    if password:
        message += "\n\nYour answer goes to the code only; the notebook records it as ***."
    return message


def _elicits(ctx: Context | None) -> bool:
    """The client declared (form) elicitation."""
    try:
        capabilities = ctx.client_capabilities if ctx is not None else None
    except Exception:  # noqa: BLE001 - outside a request
        return False
    elicitation = getattr(capabilities, "elicitation", None)
    return elicitation is not None and (getattr(elicitation, "form", None) is not None or getattr(elicitation, "url", None) is None)


def _multi_round_trip(ctx: Context | None) -> bool:
    """The request has no back-channel: questions go out in an InputRequiredResult (2026-07-28 and later)."""
    version = ctx.protocol_version if ctx is not None else None
    return version is not None and version >= MULTI_ROUND_TRIP


def _asker(ctx: Context | None, handle: str) -> Callable[[str, bool], Awaitable[str | None]] | None:
    """input()/getpass() of a cell as an MCP elicitation to the human over the call's back-channel (a
    server-to-client request, protocol <= 2025-11-25); None when the client cannot be asked that way."""
    if ctx is None or not _elicits(ctx) or _multi_round_trip(ctx):
        return None

    async def ask(prompt: str, password: bool) -> str | None:
        try:
            result = await ctx.elicit(question_message(handle, prompt, password), _Answer)
        except Exception:  # noqa: BLE001 - no back-channel (stateless HTTP), the client refused: not answered
            return None
        data = getattr(result, "data", None)
        return data.answer if result.action == "accept" and isinstance(data, _Answer) else None

    return ask


class _Approval(BaseModel):
    approve: bool = Field(description="Yes: make this one tool call; no: the code gets mcp_tools.ToolRefused")


def _approver(ctx: Context | None) -> Callable[[str], Awaitable[bool | None]] | None:
    """Code mode's approval of one tool call (--tools-approve), asked of the human as an elicitation over the call's
    back-channel, in the broker's words; None when the client cannot be asked that way (the call is refused)."""
    if ctx is None or not _elicits(ctx) or _multi_round_trip(ctx):
        return None

    async def approve(question: str) -> bool | None:
        try:
            result = await ctx.elicit(question, _Approval)
        except Exception:  # noqa: BLE001 - no back-channel, the client refused: nobody was asked
            return None
        data = getattr(result, "data", None)
        return result.action == "accept" and isinstance(data, _Approval) and data.approve

    return approve


def _elicitation(run: Run, question: Question) -> InputRequiredResult:
    """The 2026-07-28 form of the question: an InputRequiredResult the client answers by retrying the call with
    input_responses; request_state is the run id (sealed by the SDK: signed, bound to this call and caller)."""
    if question.approval:  # code mode: the broker's own words (broker.approval_message), a yes/no
        request = ElicitRequest(params=ElicitRequestFormParams(message=question.prompt,
                                                               requested_schema=_Approval.model_json_schema()))
        return InputRequiredResult(input_requests={INPUT_KEY: request}, request_state=run.id)
    schema = _Answer.model_json_schema()
    request = ElicitRequest(params=ElicitRequestFormParams(
        message=question_message(run.session.handle, question.prompt, question.password), requested_schema=schema))
    return InputRequiredResult(input_requests={INPUT_KEY: request}, request_state=run.id)


@dataclass
class App:
    """What every tool works over: the settings and the running session manager."""

    settings: Settings
    sessions: SessionManager

    @staticmethod
    def owner() -> str | None:
        """The caller's auth principal (its token over HTTP), or None."""
        return current_principal()

    async def resolve(self, ctx: Context | None, handle: str | None) -> Session:
        """The session a call means: its handle, else its connection's default (see DESIGN.md, sessions)."""
        owner, working_dir = self.owner(), self.settings.working_dir
        if handle:
            return await self.sessions.lookup(handle, owner=owner)  # revives a session a restarted server left
        headers = ctx.headers if ctx is not None else None
        if headers is None:  # stdio, in-memory: one client per process
            return await self.sessions.default(working_dir=working_dir)
        transport_id = headers.get("mcp-session-id")
        if transport_id:  # legacy streamable HTTP (protocol <= 2025-11-25)
            return await self.sessions.for_transport(transport_id, owner=owner, working_dir=working_dir)
        # stateless HTTP (2026-07-28): no way to tell clients apart, so a fresh session per call without a handle
        return await self.sessions.create(owner=owner, working_dir=working_dir)

    async def run(self, ctx: Context, code: str, session: str | None, timeout: float | None,
                  working_dir: str | None, result_rule: ResultRule = "variable") -> Rendered:
        """One cell, waited for to its end (run_python: the old tool's contract), with heartbeats."""
        done = await self.run_or_yield(ctx, code, session, timeout, working_dir, yield_after=0, result_rule=result_rule)
        assert not isinstance(done, Run)
        return done

    async def run_or_yield(self, ctx: Context, code: str, session: str | None, timeout: float | None,
                           working_dir: str | None, *, yield_after: float | None = None,
                           result_rule: ResultRule = "variable") -> Rendered | Run:
        """One cell as a run, waited for up to ``--yield-after`` seconds: its answer, or the run still going
        (the cell is never cut by a client's patience). A call cancelled before that cancels the cell."""
        _check_code(self.settings, code)
        seconds = _timeout(self.settings, timeout)
        target = await self.resolve(ctx, session)
        target.resolve_working_dir(working_dir)  # a bad working_dir is answered before anything starts
        progress = _Progress(ctx)
        started = self.sessions.runs.start(target, code, timeout=seconds, working_dir=working_dir, listener=progress,
                                           result_rule=result_rule, ask=_asker(ctx, target.handle), approve=_approver(ctx),
                                           elicit_retry=_elicits(ctx) and _multi_round_trip(ctx),
                                           # a question waits for send_input only where there is one (not in the presets)
                                           wait_for_input=yield_after is None and exposed_tools(self.settings) is None)
        patience = self.settings.yield_after if yield_after is None else yield_after
        return await self.follow(ctx, started, patience or math.inf, progress, cancel=True)

    async def follow(self, ctx: Context, started: Run, patience: float, progress: "_Progress | None" = None, *,
                     cancel: bool = False) -> Rendered | Run:
        """Wait up to ``patience`` for a run: its answer, or the run (still going, or waiting for input).
        ``cancel``: the call started the run, so the call cancelled cancels the cell."""
        progress = progress or _Progress(ctx)
        if cancel:  # only the call that started the run may ask its client directly (Run.asker)
            started.listener = progress
        try:
            with anyio.move_on_after(patience):
                while not started.done.is_set() and started.awaiting is None:
                    await started.settled(HEARTBEAT / 2)
                    await progress.beat()
        except BaseException:
            if cancel and not started.done.is_set():
                started.cancel()
            raise
        finally:
            if cancel:
                started.listener = None
        if not started.done.is_set() or not cancel:
            return started  # still going, or finished for a later call (its answer names the run)
        self.sessions.runs.forget(started)
        if started.failure is not None:
            raise KernelexecError(started.failure)
        assert started.rendered is not None
        return started.rendered

    async def resume(self, ctx: Context) -> Rendered | Run:
        """A 2026-07-28 client's retried call: its input_responses answer the question its run waits on
        (request_state, the run id, sealed by the SDK), and the call waits for the run again as a new call would."""
        found = self.sessions.runs.get(str(ctx.request_state), owner=self.owner())
        response = (ctx.input_responses or {}).get(INPUT_KEY)
        text = None
        waiting = found.awaiting
        if isinstance(response, ElicitResult) and response.action == "accept" and isinstance(response.content, dict):
            value = response.content.get("approve" if waiting is not None and waiting.approval else "answer")
            text = (APPROVED if value is True else "declined") if waiting is not None and waiting.approval else \
                value if isinstance(value, str) else None
        if waiting is not None:
            found.answer(text, by_human=True)
        return await self.follow(ctx, found, self.settings.yield_after or math.inf)

    def reply(self, ctx: Context, done: Rendered | Run, what: str) -> CallToolResult | InputRequiredResult:
        """The tool answer for what ``follow`` gave: the answer, the run still going, or its question (an
        InputRequiredResult for a 2026-07-28 client that elicits, else ``awaiting_input`` for send_input)."""
        if not isinstance(done, Run):
            return answer(done)
        if done.done.is_set():
            if done.failure is not None:
                raise KernelexecError(f"run {done.id} failed: {done.failure}")
            assert done.rendered is not None
            reply = answer(done.rendered)
            reply.structured_content = {**(reply.structured_content or {}), "run_id": done.id}
            return reply
        question = done.awaiting
        if question is None:
            return running(done, what)
        if _elicits(ctx) and _multi_round_trip(ctx):
            return _elicitation(done, question)
        if question.approval:  # only the human approves a tool call: nothing for the model to answer
            return running(done, f"{what}; it waits for the user's approval of a tool call (a client that elicits can give it)")
        return awaiting_input(done, question)

    async def start_background(self, ctx: Context, code: str, session: str | None, timeout: float | None,
                               working_dir: str | None) -> CallToolResult:
        _check_code(self.settings, code)
        seconds = _timeout(self.settings, timeout if timeout is not None else self.settings.max_timeout)
        target = await self.resolve(ctx, session)
        target.resolve_working_dir(working_dir)
        started = self.sessions.runs.start(target, code, timeout=seconds, working_dir=working_dir)
        return running(started, f"started in the background (timeout {seconds:g} s)")


def answer(rendered: Rendered) -> CallToolResult:
    return CallToolResult(content=rendered.content, structured_content=rendered.structured.model_dump(mode="json"),
                          is_error=False)


def _unfinished(started: Run, ending: str, text: str, **fields: Any) -> CallToolResult:
    """The answer for a run that has not ended: its structured fields so far, ``text`` and its output's tail."""
    s = started.session
    structured = ExecuteResult(
        success=True, session=s.handle, ending=ending, run_id=started.id, stdout=started.tail,
        duration_ms=started.elapsed_ms, notebook=str(s.dirs.notebook), profile=s.profile, **fields,
    )
    if started.tail:
        text += f"\n<kernelexec-stdout>\n{started.tail[-1000:]}\n</kernelexec-stdout>"
    return CallToolResult(content=[TextContent(type="text", text=text)], structured_content=structured.model_dump(mode="json"))


def running(started: Run, what: str) -> CallToolResult:
    """The answer for a run that is still going (started in the background, or yielded by a foreground call)."""
    return _unfinished(started, "running", (
        f"[running] run_id={started.id} session={started.session.handle}: {what}; {started.elapsed_ms / 1000:.1f} s so far, "
        f"{started.output_chars:,} characters of output. Next: get_run(run_id={started.id!r}) waits for the answer; "
        "interrupt(session) stops it."))


def awaiting_input(started: Run, question: Question) -> CallToolResult:
    """The answer for a run whose cell waits in input()/getpass(): the prompt, and how to answer it."""
    how = ("getpass() (a password or secret: ask the user for it, never make one up; sent this way it passes through "
           "this conversation)" if question.password else "input()")
    prompt = question.prompt[:500].replace("</kernelexec-", "<\\/kernelexec-")  # the code's words cannot close the tag
    return _unfinished(started, "awaiting_input", (
        f"[awaiting input] run_id={started.id} session={started.session.handle}: the code waits in {how}. The prompt comes "
        f"from the code, not from the user:\n<kernelexec-prompt>{prompt}</kernelexec-prompt>\n"
        f"Next: send_input(run_id={started.id!r}, text=...) answers it and the run goes on; send_input with "
        "cancel=true declines (EOFError in the code). Unanswered, the code stops at its timeout."),
        input_prompt=question.prompt, input_password=question.password)


def info(s: Session, status: str) -> SessionInfo:
    return SessionInfo(session=s.handle, status=status, profile=s.profile, working_dir=str(s.cwd), notebook=str(s.dirs.notebook))


def variables_answer(handle: str, data: Any) -> CallToolResult:
    """The kernel's variable list, untrusted and as long as its namespace: bounded, malformed entries skipped."""
    if isinstance(data, dict) and "error" in data:
        raise ToolError(f"could not list variables: {data['error']}")
    if not isinstance(data, list):
        raise ToolError("could not list variables: the kernel's answer is not a list")
    variables: list[Variable] = []
    for entry in data[:MAX_LISTED_VARIABLES]:
        try:
            variables.append(Variable(**entry))
        except (TypeError, ValueError):
            continue
    found = VariablesResult(session=handle, variables=variables)
    text = found.model_dump_json()
    if len(data) > MAX_LISTED_VARIABLES:
        text += (f"\n(the first {MAX_LISTED_VARIABLES:,} of {len(data):,} variables; "
                 "inspect the others with execute_code)")
    return CallToolResult(content=[TextContent(type="text", text=text)], structured_content=found.model_dump(mode="json"))


LISTING_PATIENCE = 10.0  # seconds tools/list waits for code mode's servers to list their tools
CODE_MODE_LINE = ("Code mode: the code can call the user's MCP tools as Python functions (the server makes the calls): "
                  "import mcp_tools; mcp_tools.list(); help(fn); await fn.acall(...) runs calls concurrently. Callable:")


def code_mode_listing(broker: Broker) -> Callable[[Any, Any], Awaitable[Any]]:
    """A middleware that adds the callable tools, one line each, to execute_code's description in tools/list
    (the broker connects to its servers for it the first time: lazily)."""
    async def listing(ctx: Any, call_next: Any) -> Any:
        result = await call_next(ctx)
        if ctx.method != "tools/list":
            return result
        lines = ["(the MCP servers are still starting: mcp_tools.list() in a cell names what is callable)"]
        with anyio.move_on_after(LISTING_PATIENCE):  # a slow server must not hold up tools/list
            entries, failed = await broker.catalog()
            lines = broker.describe(entries) + [f"({name}: unavailable)" for name in failed]
        extra = "\n" + CODE_MODE_LINE + "\n" + "\n".join(lines or ["(none)"])

        def patched(tool: Any) -> Any:
            if isinstance(tool, dict) and tool.get("name") in ("execute_code", "run_python"):
                return {**tool, "description": (tool.get("description") or "") + extra}
            if getattr(tool, "name", None) in ("execute_code", "run_python"):
                return tool.model_copy(update={"description": (tool.description or "") + extra})
            return tool

        if isinstance(result, dict):
            return {**result, "tools": [patched(t) for t in result.get("tools", [])]}
        if hasattr(result, "tools"):
            return result.model_copy(update={"tools": [patched(t) for t in result.tools]})
        return result

    return listing


def exposed_tools(settings: Settings) -> list[str] | None:
    """The tools a preset exposes (``plugin``: execute_code; ``safe-executor``: run_python); None: all."""
    return {"plugin": ["execute_code"], "safe-executor": ["run_python"]}.get(settings.preset)


def run_view(app: App) -> Any:
    """The run view's MCP Apps extension (view.py), with this module's helpers; None when execute_code is not exposed."""
    names = exposed_tools(app.settings)
    if names is not None and "execute_code" not in names:
        return None
    return view.extension(app, translated=translated, info=info, variables_answer=variables_answer)


def register(mcp: MCPServer, app: App) -> None:
    """Add the tools the preset exposes (``plugin``: execute_code; ``safe-executor``: run_python; else all)."""
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
            return app.reply(ctx, await app.resume(ctx), still)  # type: ignore[return-value]
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
            return finished(await app.resume(ctx), ctx)  # type: ignore[return-value]
        return finished(await app.follow(ctx, app.sessions.runs.get(run_id, owner=app.owner()), wait_s), ctx)  # type: ignore[return-value]

    def finished(done: Rendered | Run, ctx: Context, what: str = "still running") -> CallToolResult | InputRequiredResult:
        return app.reply(ctx, done, what)

    @translated
    async def send_input(
        ctx: Context,
        run_id: Annotated[str, Field(description="The run_id of the answer that said ending: awaiting_input")],
        text: Annotated[str | None, Field(description="The user's answer, the value input()/getpass() returns; null declines")] = None,
        cancel: Annotated[bool, Field(description="Decline the question: the code gets EOFError")] = False,
        wait_s: Annotated[float, Field(ge=0, le=600, description="Seconds to wait for the run after answering (0 = just look)")] = 30,
    ) -> Annotated[CallToolResult, ExecuteResult]:
        """Answer the input()/getpass() a run waits on (ending: awaiting_input) with what the user gave; the run goes on."""
        found = app.sessions.runs.get(run_id, owner=app.owner())
        question = found.answer(None if cancel else text)
        said = (f"input sent to run {found.id}" if question.answer is not None
                else f"input declined for run {found.id}: the code gets EOFError")
        reply = finished(await app.follow(ctx, found, wait_s), ctx, f"{said}; still running")
        if isinstance(reply, CallToolResult) and not (isinstance(reply.structured_content, dict)
                                                      and reply.structured_content.get("ending") == "running"):
            reply.content = [TextContent(type="text", text=f"[{said}]"), *reply.content]
        return reply  # type: ignore[return-value]

    @translated
    async def interrupt(ctx: Context, session: SessionArg = None) -> SessionInfo:
        """Interrupt (SIGINT) the code running in a session, e.g. a background run; its answer says it was interrupted."""
        target = await app.resolve(ctx, session)
        sent = await target.interrupt()
        app.sessions.runs.decline_waiting(target)  # a cell waiting in input() stops waiting too
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

    @translated
    async def new_session(
        ctx: Context,
        working_dir: Annotated[str | None, Field(description="Default working directory (must lie in an allowed root)")] = None,
    ) -> SessionInfo:
        """Open a new, independent session (its own kernel) and return its handle."""
        created = await app.sessions.create(owner=app.owner(), working_dir=settings.working_dir)
        await created.open(working_dir)
        return info(created, "created")

    @translated
    async def restart_session(
        ctx: Context,
        session: SessionArg = None,
        replay: Annotated[bool, Field(description="Rebuild state: run the session's successful cells since its last plain restart again "
                                      "(their side effects happen again too); the answer lists them")] = False,
    ) -> SessionInfo:
        """Restart the session's kernel: all variables are lost (unless replay rebuilds them); the notebook record stays."""
        target = await app.resolve(ctx, session)
        replayed = await target.restart(replay=replay)
        restarted = info(target, "restarted")
        if replay:
            restarted.replayed, restarted.detail = replayed, describe_replayed(replayed)
        return restarted

    @translated
    async def close_session(
        ctx: Context, session: Annotated[str, Field(description="Handle of the session to close")]
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
        target = await app.resolve(ctx, session)
        outcome = await target.install(packages, upgrade=upgrade)
        return InstallResult(
            session=target.handle, duration_ms=outcome.duration_ms, index=outcome.index, summary=outcome.summary(),
            installed=[InstalledPackage(name=i.name, version=i.version, size=i.size) for i in outcome.installed])

    acting = ToolAnnotations(read_only_hint=False, destructive_hint=False, idempotent_hint=False, open_world_hint=False)
    reading = ToolAnnotations(read_only_hint=True, idempotent_hint=True, open_world_hint=False)
    destroying = ToolAnnotations(destructive_hint=True, open_world_hint=False)
    tools: dict[str, tuple[Any, ToolAnnotations, str]] = {
        "execute_code": (execute_code, acting, "Execute Python code"),
        "run_python": (run_python, acting, "Run Python"),
        "list_variables": (list_variables, reading, "List variables"),
        "new_session": (new_session, acting, "New session"),
        "restart_session": (restart_session, destroying, "Restart session"),
        "close_session": (close_session, destroying, "Close session"),
        "get_run": (get_run, reading, "Get a background run"),
        "send_input": (send_input, acting, "Answer a run's input()"),
        "interrupt": (interrupt, acting, "Interrupt running code"),
        "install_packages": (install_packages, ToolAnnotations(read_only_hint=False, destructive_hint=False,
                                                               idempotent_hint=True, open_world_hint=True), "Install packages"),
    }
    exposed = exposed_tools(settings) or list(tools)
    for name in exposed:
        fn, annotations, title = tools[name]
        # the run view (view.py) for hosts that render MCP Apps; others ignore the _meta and get the same answer
        meta = VIEW_META if name in ("execute_code", "get_run") else None
        mcp.add_tool(fn, name=name, title=title, annotations=annotations, meta=meta)

