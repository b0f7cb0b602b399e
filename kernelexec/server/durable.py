"""Runs and tasks a restart keeps: each run whose id was told recorded in the session store from then on
(``RunRegistry.observers``; a run its own call answers in full is not: nobody could ask for it), with its final
answer as the client would get it (the ``CallToolResult``'s JSON); and read back for a run or task this process
does not hold — one from before a restart, or one no longer kept in memory.

A run recorded as running or waiting for input when its server died is marked ``lost`` when the next server
starts (``SessionManager``); its answer says so, honestly, and never "unknown". Nothing read back is executed:
a stored answer is JSON validated as a ``CallToolResult``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import anyio
from mcp_types import CallToolResult, TextContent

from kernelexec.errors import InvalidRequest, KernelexecError
from kernelexec.server.results import ExecuteResult
from kernelexec.session.runs import KEEP_FINISHED, Run
from kernelexec.store import RunRecord, RunState, Store, TaskRecord
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

    recorded: dict[str, anyio.Event] = {}  # runs whose id was told, until their end is recorded: set once the first record is
    forgotten: set[str] = set()  # runs whose own call took their answer before their final record was written

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
                await put_first(store, RunRecord(run.id, run.session.handle, run.session.owner, first))
            except BaseException:  # never told: its later records have nothing to follow
                recorded.pop(run.id, None)
                raise
            finally:
                written.set()
            return
        first_written = recorded.get(run.id)
        if first_written is None:  # never told (answered in full by its own call), or its end recorded already
            return
        if event == "forgotten":  # its own call returned its answer: the store keeps no copy (kept results' budget)
            forgotten.add(run.id)  # its final record is still to come: forgotten right after it
            return
        await first_written.wait()  # every later record after the first, in order
        state: RunState
        answer: dict[str, Any] | None = None
        if event != "finished":
            state = "awaiting_input" if event == "awaiting_input" else "running"
            if run.done.is_set():  # a question's end told after the run's: the run's end stands
                return
        elif run.finished is None and run.failure is None:  # stopped with the server (cancelled by its shutdown)
            state = "lost"
        else:
            try:
                result, state = app.finished_answer(run), "finished"
            except KernelexecError as exc:  # what get_run answers for a failed run: a tool error
                result, state = error(str(exc)), "failed"
            answer = wire(result)
        try:
            await store.put_run(RunRecord(run.id, run.session.handle, run.session.owner, state, answer))
        finally:
            if event == "finished":
                recorded.pop(run.id, None)
                if run.id in forgotten:
                    forgotten.discard(run.id)
                    await store.delete_run(run.id)
                else:  # the kept finished results: the last KEEP_FINISHED per token, here as in memory
                    await store.prune_runs(owner=run.session.owner, keep=KEEP_FINISHED)

    return record


def _lost(record: RunRecord) -> str:
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
    there when it ends): its answer once finished, else an honest ``running`` naming where it runs."""
    owner = app.owner()
    record = await stored_run(app.sessions.store, run_id, owner)
    if record is None:
        raise unknown
    fleet = app.sessions.fleet
    if fleet is None or not fleet.drives:
        return stored_answer(record)
    with anyio.move_on_after(wait_s), app.drain.waiting():  # a draining replica answers at its drain's end
        while record.state in UNFINISHED:
            await anyio.sleep(FOLLOW_EVERY)
            record = await stored_run(app.sessions.store, run_id, owner) or record
    if record.state in UNFINISHED:
        session = await app.sessions.store.get_session(record.session, owner=owner) if app.sessions.store else None
        return elsewhere(record, session.profile if session is not None else app.settings.profile)
    return stored_answer(record)



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
    """send_input for a run this process does not hold: a clear refusal (from the store), else ``unknown``."""
    record = await stored_run(app.sessions.store, run_id, app.owner())
    if record is None:
        raise unknown
    if record.state == "lost":
        raise InvalidRequest(_lost(record) + " Its question cannot be answered any more.")
    if record.state == "awaiting_input":  # a fleet's: the run is another replica's
        raise InvalidRequest(f"run {record.id} waits for input in another server process (another replica of this fleet); "
                             "its question is answered through the replica that runs it (docs/fleet.md: Limits)")
    raise InvalidRequest(f"run {record.id} is not waiting for input (it is {record.state.replace('_', ' ')}); "
                         f"get_run(run_id={record.id!r}) gives its answer")


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


CANCEL_ASKED = "cancel_asked"  # a task's status in the store: another replica was asked to cancel it (a fleet's bus)
CANCELLED = "cancelled"


async def ask_cancel(app: App, task: TaskRecord, run: RunRecord | None) -> None:
    """tasks/cancel of a task another replica holds: the request written on its row, which that replica polls
    (``cancels_asked``) and acts on as on its own tasks/cancel. A task whose run ended is left as it is."""
    store = app.sessions.store
    if store is None or run is None or run.state not in UNFINISHED or task.status in (CANCEL_ASKED, CANCELLED):
        return
    try:
        await store.put_task(TaskRecord(task.id, task.owner, task.run_id, task.ttl_s, CANCEL_ASKED, task.created, time.time()))
    except KernelexecError:
        logger.exception("asking for the cancellation of task %s", task.id)


async def cancels_asked(app: App, tasks: Mapping[str, tuple[str | None, float, float, str | None]]) -> list[str]:
    """Of this process's unfinished tasks (id → owner, ttl, created, run id), those another replica was asked to
    cancel; each marked cancelled in the store as it is taken."""
    store = app.sessions.store
    if store is None:
        return []
    asked = []
    for task_id, (owner, ttl_s, created, run_id) in tasks.items():
        try:
            found = await store.get_task(task_id, owner=owner)
            if found is not None and found.status == CANCEL_ASKED:
                await store.put_task(TaskRecord(task_id, owner, run_id, ttl_s, CANCELLED, created, time.time()))
                asked.append(task_id)
        except KernelexecError:
            logger.exception("reading task %s from the store", task_id)
    return asked
