"""MCP Tasks (``io.modelcontextprotocol/tasks``, an extension of the 2026-07-28 protocol): a long call as a
task the client polls, built on the SDK's extension API (``MCPServer(extensions=[...])``, server.py).

A task is a view of what already runs, not a second way to run it:

- ``execute_code``: the call goes its usual way (``tools.App.run_or_yield``). When it would answer with the
  run still going (``ending: "running"`` after ``--yield-after``) and the request declared the extension
  in its per-request client capabilities, the interceptor answers a ``CreateTaskResult`` over that run
  instead (``resultType: "task"``). A question the cell asks before that is the call's own round trip
  (an ``InputRequiredResult``, as the spec asks of input before a task exists); ``background=true``
  keeps its run_id answer: the model asked for it.
- ``install_packages``: the same call, started in the runs' task group (``RunRegistry.spawn``) and waited
  for up to ``--yield-after``; still installing → a task over that job.

``tasks/get`` reads the run: ``working``; ``input_required`` with the cell's question as one
``elicitation/create`` in ``inputRequests`` (keys ``input-1``, ``input-2``… never reused; a client that
declared no elicitation sees ``working`` and a status message naming ``send_input``); ``completed`` with
exactly the ``CallToolResult`` get_run would give (a failed run: ``isError``); ``cancelled``.
``tasks/update`` answers the question (as ``send_input``): each key is bound to the one question it was issued
for (its ``Question.id``), so an answer under an old key never answers a later question (it is ignored, as an
unknown key is); ``tasks/cancel`` cancels the run as a
cancelled call would: SIGINT, the cell stops, variables stay.

Ownership: a task belongs to the auth principal that created it (``auth.current_principal``); to any
other it does not exist (-32602, as an unknown id). Lifetime: ``ttlMs`` from creation, the cell's timeout
plus ``KEEP_AFTER`` (an install: ``--max-timeout`` plus it), and at most ``KEEP_FINISHED`` finished tasks per owner;
tasks live in this server process, and are recorded in the session store (durable.py): a restarted server
reads back a task it does not hold (its run's stored answer, or that the run was lost with the server).
A request that did not declare the extension never gets a task, and ``tasks/*`` answer it -32021.
"""

from __future__ import annotations

import math
import secrets
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import anyio
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.extension import Extension, MethodBinding
from mcp.server.mcpserver import require_client_extension
from mcp.shared.exceptions import MCPError
from mcp_types import CallToolRequestParams, CallToolResult, RequestParams, TextContent
from mcp_types.jsonrpc import INVALID_PARAMS
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import Field

from kernelexec.errors import KernelexecError
from kernelexec.server import durable
from kernelexec.server.app import App, exposed_tools
from kernelexec.server.auth import current_principal
from kernelexec.server.questions import question_request
from kernelexec.session.runs import APPROVED, KEEP_QUESTIONS, Question, Run

EXTENSION_ID = "io.modelcontextprotocol/tasks"
TASK_TOOLS = ("execute_code", "install_packages")
POLL_INTERVAL_MS = 1000
KEEP_AFTER = 3600.0  # seconds a task outlives its cell's timeout (ttlMs)
KEEP_FINISHED = 200  # finished tasks kept per owner (token), the most recent


class TaskParams(RequestParams):
    """tasks/get and tasks/cancel params (and tasks/update's, with inputResponses)."""

    task_id: str = Field(alias="taskId", max_length=200)


class UpdateTaskParams(TaskParams):
    input_responses: dict[str, Any] = Field(alias="inputResponses")


@dataclass
class Job:
    """A call (install_packages) running on in the runs' task group after its request answered with a task."""

    done: anyio.Event = field(default_factory=anyio.Event)
    result: CallToolResult | None = None
    scope: anyio.CancelScope = field(default_factory=anyio.CancelScope)
    # the job's end written to the session store, awaited before ``done``: a told job (a task) is never answered
    # completed here while another replica's tasks/get still reads it working from the store
    record_end: Callable[[], Awaitable[None]] | None = None


@dataclass
class Task:
    """One task: a view of a run (or an install's job), its owner, its TTL and the question keys it issued."""

    id: str
    owner: str | None
    run: Run | None  # execute_code
    job: Job | None  # install_packages
    elicits: bool  # the creating request declared form elicitation: a question is input_required
    ttl_s: float
    created: float = field(default_factory=time.time)
    updated: float = field(default_factory=time.time)
    seen: tuple[str, str] = ("working", "")  # the status (and question key) lastUpdatedAt is the time of
    cancelled: bool = False
    question: Question | None = None  # the question inputRequests carries under ``key``
    key: str = ""
    asked: int = 0
    keys: dict[str, str] = field(default_factory=dict)  # each key issued -> the id of the one question it asks

    @property
    def finished(self) -> bool:
        work = self.run if self.run is not None else self.job
        return work is not None and work.done.is_set()

    @property
    def expired(self) -> bool:
        return time.time() > self.created + self.ttl_s


def _stamp(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _wire(result: Any) -> dict[str, Any]:
    dumped: dict[str, Any] = result.model_dump(by_alias=True, mode="json", exclude_none=True)
    return dumped


def declared(ctx: ServerRequestContext[Any, Any]) -> bool:
    """This request declared the extension in its per-request (2026-07-28) client capabilities."""
    if ctx.protocol_version not in MODERN_PROTOCOL_VERSIONS:
        return False
    capabilities = ctx.session.client_capabilities
    extensions = capabilities.extensions if capabilities is not None else None
    return extensions is not None and EXTENSION_ID in extensions


def _elicits(ctx: ServerRequestContext[Any, Any]) -> bool:
    capabilities = ctx.session.client_capabilities
    elicitation = getattr(capabilities, "elicitation", None)
    return elicitation is not None and (getattr(elicitation, "form", None) is not None or getattr(elicitation, "url", None) is None)


class TaskStore:
    """The tasks of one server process, by id."""

    def __init__(self) -> None:
        self._tasks: OrderedDict[str, Task] = OrderedDict()

    def add(self, task: Task) -> Task:
        self._prune(task.owner)
        self._tasks[task.id] = task
        return task

    def get(self, task_id: str) -> Task:
        """The caller's task; another owner's, an expired or an unknown one is the same -32602."""
        task = self._tasks.get(task_id)
        if task is not None and task.expired:
            del self._tasks[task_id]
            task = None
        if task is None or (task.owner is not None and task.owner != current_principal()):
            raise MCPError(code=INVALID_PARAMS, message="Failed to retrieve task: Task not found")
        return task

    def _prune(self, owner: str | None) -> None:
        """Expired tasks go; of ``owner``'s finished tasks the last KEEP_FINISHED - 1 stay (room for the one added).
        Kept per owner (token): one token's many quick tasks never evict another's unread result."""
        for key in [k for k, t in self._tasks.items() if t.expired]:
            del self._tasks[key]
        finished = [k for k, t in self._tasks.items() if t.finished and t.owner == owner]
        for key in finished[: max(0, len(finished) - KEEP_FINISHED + 1)]:
            del self._tasks[key]


class Tasks(Extension):
    """The Tasks extension: the ``tools/call`` interceptor that turns a long call into a task, and
    ``tasks/get``, ``tasks/update``, ``tasks/cancel`` (2026-07-28 only)."""

    identifier = EXTENSION_ID

    def __init__(self, app: App) -> None:
        self.app = app
        self.store = TaskStore()
        app.relay.on_cancel.append(self._cancelled_elsewhere)

    def _cancelled_elsewhere(self, run: Run) -> None:
        """A tasks/cancel that landed on another replica, relayed here (relay.py): its task marked as a local
        tasks/cancel marks it (the relay then cancels the run)."""
        for task in list(self.store._tasks.values()):
            if task.run is run and not task.finished:
                task.cancelled = True

    def methods(self) -> Sequence[MethodBinding]:
        versions = frozenset(MODERN_PROTOCOL_VERSIONS)
        return (MethodBinding("tasks/get", TaskParams, self.get, versions),
                MethodBinding("tasks/update", UpdateTaskParams, self.update, versions),
                MethodBinding("tasks/cancel", TaskParams, self.cancel, versions))

    async def intercept_tool_call(self, params: CallToolRequestParams, ctx: ServerRequestContext[Any, Any],
                                  call_next: CallNext) -> HandlerResult:
        if params.name not in TASK_TOOLS or not declared(ctx):
            return await call_next(ctx)
        if params.name == "install_packages":
            return await self._job(ctx, call_next)
        result = await call_next(ctx)
        run = self._unfinished_run(params, result)
        if run is None:
            return result
        task = self.store.add(Task(
            id=secrets.token_urlsafe(18), owner=current_principal(), run=run, job=None, elicits=_elicits(ctx),
            ttl_s=run.timeout + KEEP_AFTER))
        await durable.record_task(self.app, task.id, task.owner, run.id, task.ttl_s, task.created)  # a restart keeps it
        return self._created(task)

    def _unfinished_run(self, params: CallToolRequestParams, result: HandlerResult) -> Run | None:
        """The run a call answered as still going (``ending: "running"``). Not background=true (its run_id was
        asked for); not a question asked before the yield, which the call's own round trip answers (an
        InputRequiredResult, or awaiting_input for send_input) as the spec would have it, before any task."""
        if (params.arguments or {}).get("background") is True or not isinstance(result, CallToolResult):
            return None
        structured = result.structured_content
        if not isinstance(structured, dict) or structured.get("ending") != "running":
            return None
        try:
            return self.app.sessions.runs.get(str(structured.get("run_id")), owner=current_principal())
        except KernelexecError:
            return None

    async def _job(self, ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> HandlerResult:
        """install_packages: the call runs on in the runs' task group; waited for up to --yield-after."""
        job = Job()

        async def work() -> None:
            try:
                with job.scope:
                    outcome = await call_next(ctx)
                    job.result = outcome if isinstance(outcome, CallToolResult) else CallToolResult.model_validate(outcome)
                if job.scope.cancelled_caught:
                    job.result = CallToolResult(content=[TextContent(type="text", text="cancelled by the client")], is_error=True)
            except Exception as exc:  # noqa: BLE001 - never lose a job silently: the failure is its result
                job.result = CallToolResult(content=[TextContent(type="text", text=f"{type(exc).__name__}: {exc}")], is_error=True)
            finally:
                try:
                    if job.record_end is not None:
                        with anyio.CancelScope(shield=True):  # a cancelled job's end is recorded too
                            await job.record_end()
                finally:
                    job.done.set()

        self.app.sessions.runs.spawn(work)
        with anyio.move_on_after(self.app.settings.yield_after or math.inf):
            await job.done.wait()
        if job.done.is_set():
            return job.result
        task = self.store.add(Task(
            id=secrets.token_urlsafe(18), owner=current_principal(), run=None, job=job, elicits=False,
            ttl_s=self.app.settings.max_timeout + KEEP_AFTER))
        await self._record_job(task, job)
        return self._created(task)

    async def _record_job(self, task: Task, job: Job) -> None:
        """The job in the session store as a run record (running, then its result, written by the job before it is
        done), and the task over it. ``record_end`` is set before the first await: the job cannot end unseen."""
        job_id = "job-" + task.id
        started = anyio.Event()

        async def record_end() -> None:
            await started.wait()  # never before the running record, which would overwrite the end
            await durable.record_job(self.app, job_id, task.owner, job.result)

        job.record_end = record_end
        try:
            await durable.record_job(self.app, job_id, task.owner, None)
            await durable.record_task(self.app, task.id, task.owner, job_id, task.ttl_s, task.created)
        finally:
            started.set()

    async def _stored(self, task_id: str) -> dict[str, Any] | None:
        """A task this process does not hold (one from before a restart), read back from the session store."""
        found = await durable.stored_task(self.app, task_id, current_principal())
        if found is None:
            return None
        task, run = found
        shown: dict[str, Any] = {"taskId": task.id}
        extra: dict[str, Any]
        if run is None:
            status, extra = "completed", {"result": durable.wire(durable.error(f"task {task.id}: its run was not recorded"))}
        elif run.state in ("running", "awaiting_input"):
            said = durable.stored_answer(run).content[0]
            status, extra = "working", {"statusMessage": said.text if isinstance(said, TextContent) else run.state}
        elif task.status == durable.CANCEL_ASKED:  # cancelled through another replica
            status, extra = "cancelled", {"statusMessage": "cancelled by the client: the cell was interrupted; the session's variables stay"}
        else:
            status, extra = "completed", {"result": durable.wire(durable.stored_answer(run))}
        updated = run.updated if run is not None else task.updated
        return shown | {"status": status, "createdAt": _stamp(task.created), "lastUpdatedAt": _stamp(updated),
                        "ttlMs": int(task.ttl_s * 1000), "pollIntervalMs": POLL_INTERVAL_MS} | extra

    def _created(self, task: Task) -> dict[str, Any]:
        """The CreateTaskResult (``Result & Task``): the task's seed state with ``resultType: "task"``, its
        status's payload (result, inputRequests) left for tasks/get (a run may have ended meanwhile)."""
        seed = {k: v for k, v in self._task(task).items() if k not in ("result", "error", "inputRequests")}
        return {"resultType": "task", **seed}

    def _task(self, task: Task) -> dict[str, Any]:
        """The task's current state (a DetailedTask): its status and, per status, result / inputRequests."""
        status, extra, message = self._observe(task)
        if (status, task.key) != task.seen:
            task.updated, task.seen = time.time(), (status, task.key)
        shown: dict[str, Any] = {"taskId": task.id, "status": status}
        if message:
            shown["statusMessage"] = message
        shown |= {"createdAt": _stamp(task.created), "lastUpdatedAt": _stamp(task.updated),
                  "ttlMs": int(task.ttl_s * 1000), "pollIntervalMs": POLL_INTERVAL_MS}
        return shown | extra

    def _observe(self, task: Task) -> tuple[str, dict[str, Any], str]:
        run, job = task.run, task.job
        if job is not None:
            if not job.done.is_set():
                return "working", {}, "installing"
            if task.cancelled and job.result is not None and job.result.is_error:
                return "cancelled", {}, "cancelled by the client"
            assert job.result is not None
            return "completed", {"result": _wire(job.result)}, ""
        assert run is not None
        if run.done.is_set():
            if task.cancelled and run.failure is not None:
                return "cancelled", {}, "cancelled by the client: the cell was interrupted; the session's variables stay"
            try:
                result = self.app.finished_answer(run)
            except KernelexecError as exc:  # what the call would have answered: a tool error
                result = CallToolResult(content=[TextContent(type="text", text=str(exc))], is_error=True)
            return "completed", {"result": _wire(result)}, ""
        where = f"run_id={run.id} session={run.session.handle}"
        question = run.awaiting
        if question is None:
            return "working", {}, (f"running ({where}): {run.elapsed_ms / 1000:.0f} s so far, "
                                   f"{run.output_chars:,} characters of output")
        if question.url is not None and (question.sent or run.on_page is not None):
            return "working", {}, (f"the code waits in getpass() ({where}) for a secret the user types on its own page "
                                   "(sent to the client as a URL-mode elicitation)")
        if question.url is None and not task.elicits:
            return "working", {}, (f"the code waits in {'getpass()' if question.password else 'input()'} ({where}); "
                                   f"send_input(run_id={run.id!r}, question_id={question.id!r}, text=...) answers it")
        if question is not task.question:  # a new question: a new key, never one used before, bound to its id
            task.asked += 1
            task.question, task.key = question, f"input-{task.asked}"
            task.keys[task.key] = question.id
            for old in list(task.keys)[:-KEEP_QUESTIONS]:
                del task.keys[old]
        request = question_request(run, question)
        return "input_required", {"inputRequests": {task.key: _wire(request)}}, "the code waits for input"

    async def get(self, ctx: ServerRequestContext[Any, Any], params: TaskParams) -> dict[str, Any]:
        require_client_extension(ctx, EXTENSION_ID)
        try:
            task = self.store.get(params.task_id)
        except MCPError:
            stored = await self._stored(params.task_id)
            if stored is None:
                raise
            return {"resultType": "complete", **stored}
        return {"resultType": "complete", **self._task(task)}

    async def update(self, ctx: ServerRequestContext[Any, Any], params: UpdateTaskParams) -> dict[str, Any]:
        """inputResponses answer, each, the one question its key was issued for (``Run.answer`` with that
        question's id); a key the task never issued, or one whose question was answered or is no longer asked,
        is ignored: it never answers another question."""
        require_client_extension(ctx, EXTENSION_ID)
        try:
            task = self.store.get(params.task_id)
        except MCPError:  # a task from before a restart: its question went with that server; nothing to answer
            if await self._stored(params.task_id) is None:
                raise
            return {"resultType": "complete"}
        run = task.run
        for key, response in params.input_responses.items():
            question = run.find(task.keys.get(key)) if run is not None else None
            if run is None or question is None or question.closed is not None or not isinstance(response, Mapping):
                continue  # unknown or stale: ignored
            if question.url is not None and response.get("action") == "accept":
                question.sent = True  # the user opened its page: the page's POST answers it, nothing here
                continue
            found = response.get("content")
            content: Mapping[str, Any] = found if response.get("action") == "accept" and isinstance(found, Mapping) else {}
            if question.approval:  # code mode's approval: the form's yes/no (elicited from the human by the client)
                text = APPROVED if content.get("approve") is True else None
            else:
                text = content.get("answer")
            try:
                answer = text if isinstance(text, str) else None
                await self.app.relay.claim(run, question.id, task.owner, answer, by_human=True)
                run.answer(question.id, answer, by_human=True)
            except KernelexecError as exc:  # too long, or answered through another replica: said as invalid params
                raise MCPError(code=INVALID_PARAMS, message=str(exc)) from None
        return {"resultType": "complete"}

    async def cancel(self, ctx: ServerRequestContext[Any, Any], params: TaskParams) -> dict[str, Any]:
        """Cancel as a cancelled call would: the cell is interrupted (SIGINT), the session's variables stay."""
        require_client_extension(ctx, EXTENSION_ID)
        try:
            task = self.store.get(params.task_id)
        except MCPError:  # a task another replica holds (asked there through the store), or one from before a restart
            found = await durable.stored_task(self.app, params.task_id, current_principal())
            if found is None:
                raise
            await durable.ask_cancel(self.app, *found)
            return {"resultType": "complete"}
        if not task.finished:
            task.cancelled = True
            if task.run is not None:
                task.run.cancel()
            elif task.job is not None:
                task.job.scope.cancel()
        return {"resultType": "complete"}


def extension(app: App) -> Tasks | None:
    """The Tasks extension for ``MCPServer(extensions=[...])`` (server.build_server); None where no call can
    outlast ``--yield-after`` (0: every call waits to its end) or neither execute_code nor install_packages is exposed."""
    exposed = exposed_tools(app.settings)
    if not app.settings.yield_after or (exposed is not None and not set(exposed) & set(TASK_TOOLS)):
        return None
    return Tasks(app)
