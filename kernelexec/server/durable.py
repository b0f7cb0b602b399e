"""Runs and tasks a restart keeps: each run whose id was told recorded in the session store from then on
(``RunRegistry.observers``; a run its own call answers in full is not: nobody could ask for it), with its final
answer as the client would get it (the ``CallToolResult``'s JSON); and read back for a run or task this process
does not hold — one from before a restart, or one no longer kept in memory.

A run recorded as running or waiting for input when its server died is marked ``lost`` when the next server
starts (``SessionManager``). In a fleet, once its holder replica's lease ran out (each run's record names its
replica), the next call to its session or a get_run on any replica takes the session over, which collects the
run's answer from the gateway or, when nothing is left to collect, marks it lost (session/fleet.py); its answer
says so, honestly, and never "unknown". Nothing read back is executed:
a stored answer is JSON validated as a ``CallToolResult``.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections import OrderedDict
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import anyio
from mcp_types import CallToolResult, ElicitResult, InputRequiredResult, TextContent

from kernelexec.errors import InvalidRequest, KernelexecError
from kernelexec.server.questions import INPUT_KEY, STATE_SEPARATOR, resumed, stored_request
from kernelexec.server.results import ExecuteResult
from kernelexec.session.fleet import LEASE_TTL, REPLICAS, replica_name
from kernelexec.session.runs import APPROVED, KEEP_FINISHED, Run
from kernelexec.store import QuestionRecord, RunRecord, RunState, Store, TaskRecord
from kernelexec.store.interface import UNFINISHED

if TYPE_CHECKING:
    from kernelexec.server.app import App

logger = logging.getLogger(__name__)


def _when(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def wire(result: CallToolResult) -> dict[str, Any]:
    dumped: dict[str, Any] = result.model_dump(by_alias=True, mode="json", exclude_none=True)
    return dumped


def error(text: str) -> CallToolResult:
    return CallToolResult(content=[TextContent(type="text", text=text)], is_error=True)


FORGET_WINDOW = 1000  # told runs whose end was recorded, remembered until their own call may forget them
KEEP_TRIES = (0.0, 0.2, 0.5)  # seconds before each try of a told run's first record


async def put_first(store: Any, record: RunRecord) -> None:
    """A run's first record, before its id is told: tried again briefly, then the answer fails (a run id the store
    does not hold would answer ``unknown run`` from any other replica or after a restart)."""
    failure: KernelexecError | None = None
    for pause in KEEP_TRIES:
        await anyio.sleep(pause)
        try:
            await store.put_run(record)
            return
        except KernelexecError as exc:
            failure = exc
            logger.warning("recording run %s: %s", record.id, exc)
    raise KernelexecError(f"run {record.id} could not be recorded in the session store ({failure}), so its id is not "
                          "told: its cell may still run and is recorded in the session's notebook when it ends") from None


def observer(app: App) -> Any:
    """The RunRegistry observer that records ``app``'s runs in its session store: a run from the moment its id
    is told (``kept``: written before the answer that tells it), then each change. A run its own call answers in
    full is never written: nobody holds its id to ask for it, and its cell is in the journal, so the per-call
    path pays no store write for it."""

    written_questions: dict[str, str] = {}  # run id -> the id of the last question of it in the store

    async def asked(run: Run) -> dict[str, Any] | None:
        """The question a told run waits on, in the store (another replica answers it through the relay), and the
        answer its call would give now (awaiting_input, for get_run on another replica); None if it waits on none."""
        question = run.awaiting
        if question is None:
            return None
        shared = app.relay.store  # a fleet's: another replica may answer it (one server's own runs need no row)
        if written_questions.get(run.id) != question.id and shared is not None:
            written_questions[run.id] = question.id
            try:
                await shared.put_question(QuestionRecord(
                    question.id, run.id, question.prompt, question.password, question.approval, run.session.owner))
            except KernelexecError as exc:  # answered here only, then
                logger.warning("run %s: recording its question: %s", run.id, exc)
        if question.url is not None or question.approval:  # typed on its page / given by the human: no send_input
            return None
        from kernelexec.server.app import awaiting_input

        return wire(awaiting_input(run, question))

    def holder() -> str | None:
        """This replica's lease key in a fleet: another replica's get_run sees from it whether the run's holder lives."""
        fleet = app.sessions.fleet
        return fleet.key if fleet is not None and fleet.drives else None

    recorded: dict[str, anyio.Event] = {}  # runs whose id was told, until their end is recorded: set once the first record is
    # told runs whose end is recorded, until their own call takes the answer (``forgotten``: the copy is deleted) or
    # the next get_run does (kept): the last FORGET_WINDOW, as a call that takes its answer does so at once
    ended: OrderedDict[str, None] = OrderedDict()

    async def record(run: Run, event: str) -> None:
        store = app.sessions.store
        if store is None:
            return
        if event == "kept":
            if run.id in recorded or run.done.is_set():  # recorded already (a later call following it), or its end is
                return
            written = recorded[run.id] = anyio.Event()
            try:
                first: RunState = "awaiting_input" if run.awaiting is not None else "running"
                await put_first(store, RunRecord(run.id, run.session.handle, run.session.owner, first, await asked(run),
                                                 holder=holder(), resume=run.resume if holder() else None))
            except BaseException:  # never told: its later records have nothing to follow
                recorded.pop(run.id, None)
                raise
            finally:
                written.set()
            app.relay.watch()  # its id goes out: another replica may be asked about it
            return
        if event == "forgotten":  # its own call returned its answer: the store keeps no copy (kept results' budget)
            if run.id in ended:  # told, and its end recorded (a run's end is recorded before it is done)
                del ended[run.id]
                await store.delete_run(run.id, holder=holder())  # not once another replica adopted it
            return
        first_written = recorded.get(run.id)
        if first_written is None:  # never told (answered in full by its own call), or its end recorded already
            return
        await first_written.wait()  # every later record after the first, in order
        state: RunState
        answer: dict[str, Any] | None = None
        resume: dict[str, Any] | None = None
        if event == "sent":  # where another replica collects it from, should this one stop (session/fleet.py)
            if run.done.is_set() or run.resume is None or holder() is None:
                return
            state, resume = ("awaiting_input" if run.awaiting is not None else "running"), run.resume
            answer = await asked(run) if state == "awaiting_input" else None
        elif run.handed_over:  # a drain's deadline: the cell goes on in the kernel, for the next holder to collect
            state, resume = "running", {**(run.resume or {}), "handed_over": time.time()}
        elif event != "finished":
            state = "awaiting_input" if event == "awaiting_input" else "running"
            if run.done.is_set():  # a question's end told after the run's: the run's end stands
                return
            answer = await asked(run) if state == "awaiting_input" else None
        elif run.finished is None and run.failure is None:  # stopped with the server (cancelled by its shutdown)
            state = "lost"
        else:
            try:
                result, state = app.finished_answer(run), "finished"
            except KernelexecError as exc:  # what get_run answers for a failed run: a tool error
                result, state = error(str(exc)), "failed"
            answer = wire(result)
        try:
            # named as this replica's: not applied once another replica adopted the run (this one paused, then woken)
            await store.put_run(RunRecord(run.id, run.session.handle, run.session.owner, state, answer, holder=holder(),
                                          resume=resume))
        finally:
            if event == "finished":
                recorded.pop(run.id, None)
                written_questions.pop(run.id, None)
                ended[run.id] = None
                while len(ended) > FORGET_WINDOW:
                    ended.popitem(last=False)
                # the kept finished results: the last KEEP_FINISHED per token, here as in memory
                await store.prune_runs(owner=run.session.owner, keep=KEEP_FINISHED)

    return record


def _lost(record: RunRecord) -> str:
    if record.holder is not None and record.holder.startswith(f"{REPLICAS}gateway:"):
        return (f"run {record.id} of session {record.session} was lost: the replica of this fleet that ran it "
                f"({replica_name(record.holder)}) stopped (killed, cut off, or drained past its deadline) while its cell ran "
                f"(started {_when(record.created)}, last recorded {_when(record.updated)}), so its answer is not known. "
                "The cell may have finished in the session's kernel, which kept running on the gateway: its output went "
                "to the replica that stopped and is not recorded, but whatever variables it set are in the kernel, and the "
                "session's next call uses that kernel. Look at them (or at the files it writes) before running the code again.")
    return (f"run {record.id} of session {record.session} was lost: the server was stopped or died while its cell ran "
            f"(started {_when(record.created)}, last recorded {_when(record.updated)}), so it has no answer and cannot go on. "
            "The session's notebook keeps every cell that finished before it; the variables this cell was making "
            "were in the kernel that went with the server. Run the code again if it is needed.")


def stored_answer(record: RunRecord) -> CallToolResult:
    """A stored run's answer: the one it finished with, or what happened to it."""
    if record.state in ("finished", "failed") and record.answer is not None:
        return CallToolResult.model_validate(record.answer)
    if record.state == "lost":
        return error(_lost(record))
    return error(f"run {record.id} of session {record.session} is recorded as {record.state.replace('_', ' ')}, but "
                 "not by this server process (another server's, or one that has not marked it lost yet); ask again later")


async def stored_run(store: Store | None, run_id: str, owner: str | None) -> RunRecord | None:
    if store is None or not isinstance(run_id, str):
        return None
    try:
        return await store.get_run(run_id, owner=owner)
    except KernelexecError:
        logger.exception("reading run %s from the store", run_id[:80])
        return None


FOLLOW_EVERY = 0.25  # seconds between reads of another replica's unfinished run (one indexed row)


async def get_run(app: App, run_id: str, unknown: InvalidRequest, wait_s: float = 0) -> CallToolResult:
    """get_run for a run this process does not hold: from the store (the caller's only), else ``unknown``. In a
    fleet, a run another replica drives is followed in the store for up to ``wait_s`` (its holder writes the answer
    there when it ends): its answer once finished, its question once it waits for send_input, else an honest
    ``running`` naming where it runs."""
    owner = app.owner()
    record = await stored_run(app.sessions.store, run_id, owner)
    if record is None:
        raise unknown
    fleet = app.sessions.fleet
    if fleet is None or not fleet.drives:
        return stored_answer(record)
    record = await lose_if_orphaned(app, record)
    with anyio.move_on_after(wait_s), app.drain.waiting():  # a draining replica answers at its drain's end
        while record.state in UNFINISHED and waits_on(record) is None:
            await anyio.sleep(FOLLOW_EVERY)
            record = await stored_run(app.sessions.store, run_id, owner) or record
            record = await lose_if_orphaned(app, record)
    return await answer_of(app, record)


async def lose_if_orphaned(app: App, record: RunRecord) -> RunRecord:
    """An unfinished run whose holder replica's lease ran out (SIGKILLed, cut off, drained): its session taken over
    by this replica in the background (``SessionManager.take_over``), which collects its answer or records it
    ``lost``, so get_run never follows a dead replica's run as ``running``. A live replica driving the session keeps
    it (nothing waits for its lease); a holder that was only paused finds its lease taken. The run as it is once the
    takeover adopted it (or recorded it lost: a run waiting for input is, its question having gone with its replica)."""
    store, fleet = app.sessions.store, app.sessions.fleet
    if (store is None or fleet is None or record.state not in UNFINISHED or record.holder is None
            or record.holder == fleet.key or record.session in fleet.held):
        return record
    try:
        if await store.current_lease(record.holder) is not None:  # its replica lives
            return record
    except KernelexecError as exc:  # the store is unreachable a moment: looked at again on the next read
        logger.warning("run %s: looking whether its replica lives: %s", record.id, exc)
        return record
    adopted = app.sessions.take_over(record.session, owner=record.owner)  # collected (or recorded lost) here
    with anyio.move_on_after(LEASE_TTL):  # until the takeover adopted or lost its runs (the collection goes on)
        await adopted.wait()
    return await stored_run(store, record.id, record.owner) or record


def waits_on(record: RunRecord) -> str | None:
    """The question a run another replica holds waits on for send_input (its stored awaiting_input answer's)."""
    structured = (record.answer or {}).get("structuredContent") if record.state == "awaiting_input" else None
    found = structured.get("question_id") if isinstance(structured, dict) else None
    return found if isinstance(found, str) else None


async def answer_of(app: App, record: RunRecord) -> CallToolResult:
    """What get_run answers for a stored run: its end, its question (awaiting_input, as its holder would say it),
    or that it runs on another replica."""
    if record.state not in UNFINISHED:
        return stored_answer(record)
    if waits_on(record) is not None:
        return CallToolResult.model_validate(record.answer)
    store = app.sessions.store
    session = await store.get_session(record.session, owner=app.owner()) if store is not None else None
    return elsewhere(record, session.profile if session is not None else app.settings.profile)


def elsewhere(record: RunRecord, profile: str) -> CallToolResult:
    """A run another replica of the fleet drives, still going: said as the holder would say ``running``, without the
    output so far (that streams to the holder only)."""
    what = "waits for input" if record.state == "awaiting_input" else "is still running"
    text = (f"[running] run_id={record.id} session={record.session}: {what} on another replica of this fleet "
            f"({time.time() - record.created:.1f} s since it started; its output so far is with that replica). "
            f"Next: get_run(run_id={record.id!r}) waits for the answer, from any replica.")
    structured = ExecuteResult(success=True, session=record.session, ending="running", run_id=record.id,
                               duration_ms=max(0.0, time.time() - record.created) * 1000, profile=profile)
    return CallToolResult(content=[TextContent(type="text", text=text)], structured_content=structured.model_dump(mode="json"))


async def send_input(app: App, run_id: str, unknown: InvalidRequest) -> None:
    """Why a run this process does not hold cannot be answered (from the store), else ``unknown``. (One that waits
    on another replica of a fleet is answered through the relay, relay.py.)"""
    record = await stored_run(app.sessions.store, run_id, app.owner())
    if record is None:
        raise unknown
    if record.state == "lost":
        raise InvalidRequest(_lost(record) + " Its question cannot be answered any more.")
    if record.state == "awaiting_input":
        raise InvalidRequest(f"run {record.id} waits for input in another server process that this one cannot reach "
                             "(not a replica of its fleet); it is answered through that server")
    raise InvalidRequest(f"run {record.id} is not waiting for input (it is {record.state.replace('_', ' ')}); "
                         f"get_run(run_id={record.id!r}) gives its answer")


async def refuse_if_lost(app: App, run_id: str) -> None:
    """Before an answer is relayed to a run another replica holds: a run whose holder stopped (its lease ran out) is
    recorded lost (``lose_if_orphaned``) and its question refused, as for a run lost any other way; else the answer
    went to a row nobody takes and the caller was told it was sent to a run still going."""
    record = await stored_run(app.relay.store, run_id, app.owner())
    if record is not None and record.state in UNFINISHED:
        record = await lose_if_orphaned(app, record)
    if record is not None and record.state == "lost":
        raise InvalidRequest(_lost(record) + " Its question cannot be answered any more.")


async def resume_elsewhere(app: App, ctx: Any, unknown: InvalidRequest) -> CallToolResult | InputRequiredResult:
    """A 2026-07-28 retry whose run another replica of the fleet holds (app.resume's, by the same rules): its answer
    relayed to the holder (relay.py), then the run followed in the store."""
    run_id, question_id = resumed(ctx.request_state)
    store, owner = app.relay.store, app.owner()
    if store is None:
        raise unknown
    question = await store.get_question(question_id, owner=owner) if question_id else None
    response = (ctx.input_responses or {}).get(INPUT_KEY)
    accepted = isinstance(response, ElicitResult) and response.action == "accept"
    wait_s = app.settings.yield_after or math.inf
    await refuse_if_lost(app, run_id)
    if question is not None and question.password and accepted:  # its page answers it, not this
        return await follow_relayed(app, run_id, question_id, wait_s, retry=True)
    text = None
    if accepted and isinstance(response.content, dict):  # type: ignore[union-attr]
        approval = question is not None and question.approval
        value = response.content.get("approve" if approval else "answer")  # type: ignore[union-attr]
        text = (APPROVED if value is True else None) if approval else value if isinstance(value, str) else None
    try:
        await app.relay.answer(run_id, question_id, text, "retry", owner, unknown)
    except InvalidRequest as exc:
        if exc is unknown:
            raise
        raise InvalidRequest(f"{exc}. This retry's answer was not used; get_run(run_id={run_id!r}) follows the run") from None
    return await follow_relayed(app, run_id, question_id, wait_s, retry=True)


async def follow_relayed(app: App, run_id: str, answered: str, wait_s: float, *,
                         retry: bool) -> CallToolResult | InputRequiredResult:
    """After an answer relayed to the run's holder: the run's record followed in the store for up to ``wait_s``
    until it ends or waits on another question; its answer, that question (an InputRequiredResult for a retried
    call), or that it runs on."""
    store, owner = app.sessions.store, app.owner()
    record = await stored_run(store, run_id, owner)  # looked at once whatever wait_s (0: just look), not in its scope
    with anyio.move_on_after(wait_s):
        while record is not None and record.state in UNFINISHED and not (
                record.state == "awaiting_input" and waits_on(record) not in (None, answered)):
            await anyio.sleep(FOLLOW_EVERY)
            record = await stored_run(store, run_id, owner) or record
    if record is None:
        raise InvalidRequest(f"unknown run {run_id[:80]!r}")
    if waits_on(record) == answered:  # the holder has not taken the answer yet: never that question handed back again
        record = dataclasses.replace(record, state="running", answer=None)
    asked = waits_on(record) if record.state == "awaiting_input" else None
    question = await store.get_question(asked, owner=owner) if retry and asked and store is not None else None
    if question is not None and not question.password:  # the next question, as the holder would ask it
        return InputRequiredResult(input_requests={INPUT_KEY: stored_request(record.session, question)},
                                   request_state=run_id + STATE_SEPARATOR + question.id)
    return await answer_of(app, record)


async def record_task(app: App, task_id: str, owner: str | None, run_id: str, ttl_s: float, created: float) -> None:
    """A task as created (its status is its run's: read from the run record when the task is read back)."""
    store = app.sessions.store
    if store is None:
        return
    try:
        await store.put_task(TaskRecord(task_id, owner, run_id, ttl_s, "working", created, created))
    except KernelexecError:
        logger.exception("recording task %s", task_id)


async def record_job(app: App, job_id: str, owner: str | None, result: CallToolResult | None) -> None:
    """An install_packages job (a task's work that is not a cell) as a run record: running, then its result."""
    store = app.sessions.store
    if store is None:
        return
    state: RunState = "running" if result is None else ("failed" if result.is_error else "finished")
    try:
        await store.put_run(RunRecord(job_id, "", owner, state, wire(result) if result is not None else None))
    except KernelexecError:
        logger.exception("recording job %s", job_id)


async def stored_task(app: App, task_id: str, owner: str | None) -> tuple[TaskRecord, RunRecord | None] | None:
    """A task this process does not hold, with its run's record; None if unknown to ``owner`` or expired."""
    store = app.sessions.store
    if store is None:
        return None
    try:
        task = await store.get_task(task_id, owner=owner)
        if task is None or time.time() > task.expires:
            return None
        run = await store.get_run(task.run_id, owner=owner) if task.run_id is not None else None
    except KernelexecError:
        logger.exception("reading task %s from the store", task_id[:80])
        return None
    return task, run


CANCEL_ASKED = "cancel_asked"  # a task's status in the store: cancelled through another replica (tasks/get reads it)


async def ask_cancel(app: App, task: TaskRecord, run: RunRecord | None) -> None:
    """tasks/cancel of a task another replica holds: the task's row says so (tasks/get on any replica), and the
    holder is asked through the relay (relay.py), which cancels it as its own tasks/cancel would. A task whose run
    ended is left as it is."""
    store = app.sessions.store
    if store is None or run is None or run.state not in UNFINISHED or task.status == CANCEL_ASKED:
        return
    try:
        await store.put_task(TaskRecord(task.id, task.owner, task.run_id, task.ttl_s, CANCEL_ASKED, task.created, time.time()))
        await app.relay.ask_cancel(run.id, task.owner)
    except KernelexecError:
        logger.exception("asking for the cancellation of task %s", task.id)
