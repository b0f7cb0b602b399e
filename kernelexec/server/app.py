"""What every tool works over: ``App`` (the settings, the session manager, a renderer per session) and
the answers it builds from a session's ``Finished`` cell or a ``Run`` still going.

Three error channels: user code raising is a normal result; failures the model can act on (unknown
session, bad input, dead kernel) are ``KernelexecError``s, which ``translated`` turns into
``ToolError`` (the one place that happens); protocol faults stay ``MCPError``.
"""

import functools
import math
import time
import weakref
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any, Protocol, TypeVar

import anyio
from mcp.server.mcpserver import Context
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import (
    CallToolResult,
    ElicitResult,
    InputRequiredResult,
    TextContent,
)
from pydantic import Field, WithJsonSchema

from kernelexec import tracing
from kernelexec.codemode.broker import Broker
from kernelexec.config import Settings
from kernelexec.display import display
from kernelexec.errors import InvalidRequest, KernelexecError
from kernelexec.kernel.execution import ResultRule
from kernelexec.kernel.wire import clean_text
from kernelexec.longtext import live_tail
from kernelexec.server.auth import current_principal
from kernelexec.server.drain import Drain
from kernelexec.server.questions import (
    INPUT_KEY,
    approver,
    asker,
    elicits,
    input_required,
    multi_round_trip,
    page_asker,
    resumed,
    url_elicits,
)
from kernelexec.server.relay import Relay
from kernelexec.server.render import Rendered, Renderer, escape_tags
from kernelexec.server.results import ExecuteResult, SessionInfo, Variable, VariablesResult
from kernelexec.server.secret_page import SecretPages
from kernelexec.server.uploads import Uploads
from kernelexec.session.manager import SessionManager
from kernelexec.session.runs import APPROVED, KEEP_FINISHED, Finished, OpenPage, Question, Run
from kernelexec.session.session import Session

RUN_PYTHON_TIMEOUT = 60.0  # run_python keeps the old tool's contract: one answer, a timeout, no yielding
MAX_LISTED_VARIABLES = 1000  # list_variables answers at most this many (a namespace can hold millions)

T = TypeVar("T")

# The session argument as an `x-mcp-header`: a 2026-07-28 client mirrors it into the `Mcp-Param-Session` HTTP header,
# so a load balancer can route a session's calls by it without reading the body (deploy/haproxy.cfg hashes on it);
# a header that disagrees with the body is refused (the SDK's check; server/session_header.py keeps the header
# optional). A plain string in the schema (an `anyOf` with null
# may not carry the annotation), optional by not being required; older clients just leave the header out.
SESSION_HEADER = "Session"


def _session_schema(schema: dict[str, Any]) -> None:
    schema.pop("default", None)  # omitted means the default session; null is accepted but not advertised


SessionArg = Annotated[
    str | None,
    WithJsonSchema({"type": "string", "x-mcp-header": SESSION_HEADER}),
    Field(description="Session handle from an earlier answer; omit for this connection's default",
          json_schema_extra=_session_schema),
]
SessionName = Annotated[str, WithJsonSchema({"type": "string", "x-mcp-header": SESSION_HEADER}),
                        Field(description="Session handle")]


class Call(Protocol):
    """What resolving a session and this server's origin read of a request: its HTTP headers (None: stdio, in memory).
    A tool's Context has them; an extension method's request gives them too (file_transfer.py)."""

    @property
    def headers(self) -> Mapping[str, str] | None: ...


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
    heartbeat when a cell prints nothing (``beat``). A tail held back by the interval goes out once the
    interval has passed (the waiting call's ``beat``), not only with the next output: a cell that prints
    once and then works shows that line. Without a progress token the SDK sends nothing."""

    def __init__(self, ctx: Context, interval: float = 0.5) -> None:
        self.ctx = ctx
        self.interval = interval
        self.chars = 0
        self.tail = ""
        self.unsent = False  # output came since the last notification
        self.wake: Callable[[], None] | None = None  # the waiting call's (Run.stir): it sends a held-back tail in time
        self.failed = False  # a send failed: no more (beat)
        self.started = self.last = time.monotonic()

    async def __call__(self, name: str, text: str) -> None:
        self.chars += len(text)
        self.tail = live_tail(self.tail, text)
        held, self.unsent = self.unsent, True
        await self._send_tail()
        if self.unsent and not held and self.wake is not None:
            self.wake()  # held back: the waiting call wakes to send it when due (once per held tail, not per output)

    async def _send_tail(self) -> None:
        now = time.monotonic()
        if self.unsent and now - self.last >= self.interval:
            self.last, self.unsent = now, False
            await self.ctx.report_progress(self.chars, None, display(self.tail))

    def due(self) -> float:
        """Seconds until ``beat`` has something to send: the held-back tail's turn, else the heartbeat's."""
        if self.failed:
            return HEARTBEAT / 2  # nothing to send any more: the call only watches its run
        wait = self.interval if self.unsent else HEARTBEAT - 0.5
        return max(0.0, self.last + wait - time.monotonic())

    async def beat(self) -> None:
        """The waiting call's turn: the held-back tail when due, else a heartbeat when due. A send that fails stops
        the notifications, never the call or its cell (as ``Run.on_output`` treats the output's own)."""
        if self.failed:
            return
        try:
            await self._send_tail()
            now = time.monotonic()
            if now - self.last >= HEARTBEAT - 0.5:
                self.last = now
                await self.ctx.report_progress(self.chars, None, f"still running ({now - self.started:.0f} s)")
        except Exception:  # noqa: BLE001 - a client gone mid-call never stops the cell
            self.failed = True


@dataclass
class App:
    """What every tool works over: the settings, the running session manager, and a renderer per session
    (the session layer returns data; answers are made here)."""

    settings: Settings
    sessions: SessionManager
    _renderers: "weakref.WeakKeyDictionary[Session, Renderer]" = field(default_factory=weakref.WeakKeyDictionary)
    # finished runs' answers, once each, by owner (token): the last KEEP_FINISHED of each, like the runs kept
    _answers: "dict[str | None, OrderedDict[str, Rendered]]" = field(default_factory=dict)
    pages: SecretPages = field(default_factory=SecretPages)  # getpass() pages (HTTP: routes of build.py's app)
    uploads: Uploads = field(init=False)  # upload URLs (HTTP only: routes of build.py's app)
    relay: Relay = field(init=False)  # a fleet's: what calls here ask of runs other replicas hold, and the reverse
    drain: Drain = field(default_factory=Drain)  # begun by a SIGTERM over HTTP (drain.py); never, otherwise

    def __post_init__(self) -> None:
        self.uploads = Uploads(self.settings.max_upload_urls_per_token, spool_dir=self.settings.state_dir,
                              max_spool_bytes=self.settings.max_upload_spool_mb * 1024 * 1024)
        self.relay = Relay(self.settings, self.sessions)
        self.pages.relay = self.uploads.relay = self.relay

    def page_opener(self, ctx: Context | None) -> OpenPage | None:
        """How a run started by this call asks a getpass(): on a one-time page, where the client declared URL-mode
        elicitation (else None: the cell's getpass() raises). Over HTTP the page is at this server's own origin
        (its bound host and port; for a wildcard bind, the Host the client reached); else a listener of its own."""
        if not url_elicits(ctx):
            return None
        origin = self.origin(ctx)
        return lambda run, question: self.pages.open(run, question, origin)

    def origin(self, ctx: Call | None) -> str | None:
        """Over HTTP, this server's own origin (its bound host and port; for a wildcard bind, the Host the client
        reached); else None."""
        headers = ctx.headers if ctx is not None else None
        if self.settings.transport != "http" or headers is None:
            return None
        host = self.settings.host
        if host in ("0.0.0.0", "::", ""):
            return f"http://{headers.get('host', '127.0.0.1')}"
        return f"http://{'[' + host + ']' if ':' in host else host}:{self.settings.port}"

    def renderer(self, session: Session) -> Renderer:
        """The session's renderer (it numbers the session's output files and tells the header once)."""
        renderer = self._renderers.get(session)
        if renderer is None:
            s, env = self.settings, session.environment
            renderer = self._renderers[session] = Renderer(
                session.handle, session.dirs.outputs, result_chars=s.result_chars, stream_chars=s.stream_chars,
                profile=session.profile, environment=env.summary() if env is not None else None)
        return renderer

    def render(self, session: Session, finished: Finished) -> Rendered:
        """A finished cell as the model reads it (text, images, structured), through the session's renderer."""
        return self.renderer(session).render(finished.execution, notebook=str(session.dirs.notebook), layers=finished.layers,
                               hint=finished.hint, restored=finished.restored)

    def finished_answer(self, run: Run) -> CallToolResult:
        """A finished run's answer, as get_run gives it (and a task's result, tasks.py); a failed run raises."""
        if run.failure is not None:
            raise KernelexecError(f"run {run.id} failed: {run.failure}")
        reply = answer(self.answer_of(run))
        reply.structured_content = {**(reply.structured_content or {}), "run_id": run.id}
        return reply

    def answer_of(self, run: Run) -> Rendered:
        """A finished run's answer, rendered once (its output files are written once) and kept like the run."""
        kept = self._answers.setdefault(run.session.owner, OrderedDict())
        rendered = kept.get(run.id)
        if rendered is None:
            assert run.finished is not None and isinstance(run.session, Session)
            rendered = kept[run.id] = self.render(run.session, run.finished)
            while len(kept) > KEEP_FINISHED:
                kept.popitem(last=False)
        return rendered

    @staticmethod
    def owner() -> str | None:
        """The caller's auth principal (its token over HTTP), or None."""
        return current_principal()

    async def resolve(self, ctx: Call | None, handle: str | None) -> Session:
        """The session a call that runs no code means (interrupt, list_variables, restart, the view's buttons): its
        handle, else its connection's default (see DESIGN.md, sessions). Over stateless HTTP a call without a
        handle names no session, and a session made for it would hold a place for nothing: refused, nothing made."""
        headers = ctx.headers if ctx is not None else None
        if not handle and headers is not None and not headers.get("mcp-session-id"):
            raise InvalidRequest("over stateless HTTP (protocol 2026-07-28) a call without a session handle names no "
                                 "session: pass session=... from an earlier answer (execute_code and new_session give it)")
        return (await self._resolve(ctx, handle))[0]

    async def using(self, ctx: Context | None, handle: str | None, work: Callable[[Session], Awaitable[T]]) -> T:
        """``work`` on the call's session (made for it when it names none); a session made for this call is given up
        when ``work`` fails (its place is never held by a failure)."""
        target, fresh = await self._resolve(ctx, handle)
        try:
            return await work(target)
        except BaseException:
            if fresh:
                with anyio.CancelScope(shield=True):
                    await self.sessions.discard(target)
            raise

    async def _resolve(self, ctx: Call | None, handle: str | None, working_dir: str | None = None) -> tuple[Session, bool]:
        """``resolve``, and whether the session was made for this call. A call's ``working_dir`` is checked
        before a session is made for it (what can be checked without one: ``SessionManager.check_working_dir``),
        and again on the session; a session made for this call that fails that is given up (``discard``)."""
        owner, default_dir = self.owner(), self.settings.working_dir
        if handle:
            target = await self.sessions.lookup(handle, owner=owner)  # revives a session a restarted server left
            target.resolve_working_dir(working_dir)  # a bad working_dir is answered before anything starts
            return target, False
        self.sessions.check_working_dir(working_dir)  # before anything is reserved
        known = set(self.sessions.sessions)
        headers = ctx.headers if ctx is not None else None
        if headers is None:  # stdio, in-memory: one client per process
            target = await self.sessions.default(working_dir=default_dir)
        elif transport_id := headers.get("mcp-session-id"):  # legacy streamable HTTP (protocol <= 2025-11-25)
            target = await self.sessions.for_transport(transport_id, owner=owner, working_dir=default_dir)
        else:  # stateless HTTP (2026-07-28): no way to tell clients apart, so a fresh session per call without a handle
            target = await self.sessions.create(owner=owner, working_dir=default_dir)
        fresh = target.handle not in known
        try:
            target.resolve_working_dir(working_dir)
        except BaseException:
            if fresh:
                await self.sessions.discard(target)
            raise
        return target, fresh

    async def _start(self, ctx: Context, session: str | None, working_dir: str | None,
                     start: Callable[[Session, Callable[[Run], Awaitable[None]] | None], Run]) -> Run:
        """Resolve the call's session and start its run; a session made for this call is given up when the run
        cannot start (a run budget) or ends without running anything (its place is never held by a failure)."""
        target, fresh = await self._resolve(ctx, session, working_dir)
        headers = ctx.headers if ctx is not None else None
        # the SDK's tools/call span: the MCP session (legacy streamable HTTP) and ours
        tracing.annotate(**{"mcp.session.id": headers.get("mcp-session-id") if headers is not None else None,
                            "kernelexec.session": target.handle})

        async def unused(run: Run) -> None:
            if target.kernel is None or not await anyio.to_thread.run_sync(target.recorder.cells):  # nothing ran in it
                await self.sessions.discard(target)

        try:
            return start(target, unused if fresh else None)
        except BaseException:
            if fresh:
                await self.sessions.discard(target)
            raise

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
        progress = _Progress(ctx)
        started = await self._start(ctx, session, working_dir, lambda target, unused: self.sessions.runs.start(
            target, code, timeout=seconds, working_dir=working_dir, listener=progress, result_rule=result_rule,
            ask=asker(ctx, target.handle), approve=approver(ctx), elicit_retry=elicits(ctx) and multi_round_trip(ctx),
            open_page=self.page_opener(ctx), url_retry=url_elicits(ctx) and multi_round_trip(ctx),
            ask_page=page_asker(ctx, target.handle),
            # a question waits for send_input only where there is one (not in the presets)
            wait_for_input=yield_after is None and exposed_tools(self.settings) is None, unused=unused))
        patience = self.settings.yield_after if yield_after is None else yield_after
        return await self.follow(ctx, started, patience or math.inf, progress, cancel=True)

    async def follow(self, ctx: Context, started: Run, patience: float, progress: "_Progress | None" = None, *,
                     cancel: bool = False) -> Rendered | Run:
        """Wait up to ``patience`` for a run: its answer, or the run (still going, or waiting for input).
        ``cancel``: the call started the run, so the call cancelled cancels the cell."""
        progress = progress or _Progress(ctx)
        progress.wake = started.stir
        if cancel:  # only the call that started the run may ask its client directly (Run.asker)
            started.listener = progress
        try:
            with anyio.move_on_after(patience), self.drain.waiting():  # a drain's end: answered as it stands
                # a secret typed on its page is waited for like output: there is nothing for the call to answer
                while True:
                    while not started.done.is_set() and (started.awaiting is None or started.on_page is not None):
                        await started.settled(min(HEARTBEAT / 2, progress.due()))
                        await progress.beat()
                    if started.done.is_set():
                        break
                    # it waits on a question: in a fleet, an answer given on another replica may be on its way
                    await self.relay.deliver_pending(started)
                    if started.awaiting is not None and started.on_page is None:
                        break
        except BaseException:
            if cancel and not started.done.is_set():
                started.cancel()
            raise
        finally:
            if cancel:
                started.detach()  # a question asked over this call's back-channel now waits on the run too
        if not started.done.is_set() or not cancel:
            await self.sessions.runs.keep(started)  # its id goes out in the answer: recorded first
            return started  # still going, or finished for a later call (its answer names the run)
        self.sessions.runs.forget(started)
        if started.failure is not None:
            raise KernelexecError(started.failure)
        return self.answer_of(started)

    async def resume(self, ctx: Context) -> Rendered | Run:
        """A 2026-07-28 client's retried call: its input_responses answer the one question its request_state names
        (the run id and the question id, sealed by the SDK), and the call waits for the run again as a new call
        would. A retry for a question already answered or no longer asked (a replayed retry, a second viewer's
        late answer) is refused: it never answers the question the run waits on now. (A run another replica of a
        fleet holds: durable.resume_elsewhere.)"""
        run_id, question_id = resumed(ctx.request_state)
        found = self.sessions.runs.get(run_id, owner=self.owner())
        question = found.find(question_id)
        response = (ctx.input_responses or {}).get(INPUT_KEY)
        if (question is not None and question.url is not None and isinstance(response, ElicitResult)
                and response.action == "accept"):  # (the page may have been sent before the client said yes)
            return await self.follow(ctx, found, self.settings.yield_after or math.inf)  # the page answers it, not this
        text = None
        if isinstance(response, ElicitResult) and response.action == "accept" and isinstance(response.content, dict):
            approval = question is not None and question.approval
            value = response.content.get("approve" if approval else "answer")
            text = (APPROVED if value is True else None) if approval else value if isinstance(value, str) else None
        try:
            await self.relay.claim(found, question_id, self.owner(), text, by_human=True)
            found.answer(question_id, text, by_human=True)
        except InvalidRequest as exc:
            raise InvalidRequest(f"{exc}. This retry's answer was not used; get_run(run_id={found.id!r}) follows the run") from None
        return await self.follow(ctx, found, self.settings.yield_after or math.inf)

    def reply(self, ctx: Context, done: Rendered | Run | CallToolResult | InputRequiredResult,
              what: str) -> CallToolResult | InputRequiredResult:
        """The tool answer for what ``follow`` gave: the answer, the run still going, or its question (an
        InputRequiredResult for a 2026-07-28 client that elicits, else ``awaiting_input`` for send_input); or
        the answer a run on another replica gave (relayed)."""
        if isinstance(done, CallToolResult | InputRequiredResult):
            return done
        if not isinstance(done, Run):
            return answer(done)
        if done.done.is_set():
            return self.finished_answer(done)
        question = done.awaiting
        if question is None:
            return running(done, what)
        if question.url is not None:  # a getpass(): typed on its page by the human, never sent by the model
            if not question.sent and url_elicits(ctx) and multi_round_trip(ctx):
                question.sent = True
                return input_required(done, question)
            return running(done, f"{what}; the code waits in getpass() for a secret the user types on its own page "
                           "(the client was sent it as a URL-mode elicitation): nothing for the assistant to send")
        if elicits(ctx) and multi_round_trip(ctx):
            return input_required(done, question)
        if question.approval:  # only the human approves a tool call: nothing for the model to answer
            return running(done, f"{what}; it waits for the user's approval of a tool call (a client that elicits can give it)")
        return awaiting_input(done, question)

    async def start_background(self, ctx: Context, code: str, session: str | None, timeout: float | None,
                               working_dir: str | None) -> CallToolResult:
        _check_code(self.settings, code)
        seconds = _timeout(self.settings, timeout if timeout is not None else self.settings.max_timeout)
        started = await self._start(ctx, session, working_dir, lambda target, unused: self.sessions.runs.start(
            target, code, timeout=seconds, working_dir=working_dir, unused=unused, open_page=self.page_opener(ctx),
            url_retry=url_elicits(ctx) and multi_round_trip(ctx)))
        await self.sessions.runs.keep(started)  # its id goes out in the answer: recorded first
        return running(started, f"started in the background (timeout {seconds:g} s)")


def answer(rendered: Rendered) -> CallToolResult:
    return CallToolResult(content=rendered.content, structured_content=rendered.structured.model_dump(mode="json"),
                          is_error=False)


def _unfinished(started: Run, ending: str, text: str, **fields: Any) -> CallToolResult:
    """The answer for a run that has not ended: its structured fields so far, ``text`` and its output's tail."""
    s = started.session
    structured = ExecuteResult(
        success=True, session=s.handle, ending=ending, run_id=started.id, stdout=display(started.tail),
        duration_ms=started.elapsed_ms, notebook=str(s.dirs.notebook), profile=s.profile, **fields,
    )
    if started.tail:
        text += f"\n<kernelexec-stdout>\n{escape_tags(display(started.tail))}\n</kernelexec-stdout>"
    return CallToolResult(content=[TextContent(type="text", text=text)], structured_content=structured.model_dump(mode="json"))


def running(started: Run, what: str) -> CallToolResult:
    """The answer for a run that is still going (started in the background, or yielded by a foreground call)."""
    return _unfinished(started, "running", (
        f"[running] run_id={started.id} session={started.session.handle}: {what}; {started.elapsed_ms / 1000:.1f} s so far, "
        f"{started.output_chars:,} characters of output. Next: get_run(run_id={started.id!r}) waits for the answer; "
        "interrupt(session) stops it."))


def awaiting_input(started: Run, question: Question) -> CallToolResult:
    """The answer for a run whose cell waits in input()/getpass(): the prompt, and how to answer it."""
    how = "input()"  # a getpass() never comes here: it is typed on its page (Run._ask_secret), or refused
    prompt = display(question.prompt, 500).replace("</kernelexec-", "<\\/kernelexec-")  # the code's words cannot close the tag
    return _unfinished(started, "awaiting_input", (
        f"[awaiting input] run_id={started.id} session={started.session.handle}: the code waits in {how}. The prompt comes "
        f"from the code, not from the user:\n<kernelexec-prompt>{prompt}</kernelexec-prompt>\n"
        f"Next: send_input(run_id={started.id!r}, question_id={question.id!r}, text=...) answers this question (once) and "
        "the run goes on; with cancel=true instead of text it declines (EOFError in the code). Unanswered, the code "
        "stops at its timeout."),
        input_prompt=display(question.prompt, 500), input_password=question.password, question_id=question.id)


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
            entries, failed = await broker.catalog(current_principal())
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
