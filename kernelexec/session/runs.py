"""Runs: work longer than a client will wait for one tool call.

Every ``execute_code`` cell is a run, a task in the session manager's task group: a foreground call
waits for it up to ``--yield-after`` seconds and then answers with what it has and the run id (the
cell goes on); ``execute_code(background=True)`` returns the run id at once. ``get_run(run_id,
wait_s)`` waits up to ``wait_s`` for it and returns the finished answer, or the output so far. A run holds its session's lock like any call, so calls
to that session queue behind it; ``interrupt(session)`` stops it without waiting for the lock.

A cell's ``input()``/``getpass()`` is asked directly (an elicitation over the back-channel of the call that
started the run, while it waits) or else waits on the run as a ``Question`` until the cell's timeout:
``send_input`` answers it, or a 2026-07-28 client's retried call (its ``input_responses``), or a task's
``tasks/update`` (tasks.py: a task is a view of a run). A direct question still open when its call stops
waiting (``Run.detach``) waits on the run too: the first answer wins.

A ``getpass()`` is never such a question (``Run._ask_secret``): where the starting call's client declared
URL-mode elicitation it gets a one-time page (``open_page``, server/secret_page.py) whose POST alone answers it
(``answer(..., by_page=True)``), the page's URL going out over that call's back-channel or in an
InputRequiredResult; anywhere else the cell's getpass() raises (a ``Refusal``: NO_SECRET_CHANNEL).

An answer names the question it answers: every question (an ``input()``, a tool call's approval) has a
single-use, unguessable ``Question.id``, and ``Run.answer(question_id, text)`` — the one way any channel
answers — refuses an answer for a question the run does not wait on, and a second answer to one it did. An
approval's question keeps the call it shows (``ApprovalCall``), and its verdict names that call (the broker
makes the call only if it is the one it is about to make): a yes never approves another call.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import secrets
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import anyio
import anyio.lowlevel

from kernelexec import tracing
from kernelexec.codemode.broker import ApprovalCall, Approve, Verdict
from kernelexec.config import Settings
from kernelexec.errors import InvalidRequest, KernelexecError, SessionError
from kernelexec.kernel.execution import Execution, ResultRule
from kernelexec.kernel.stdin import Refusal
from kernelexec.layout import SessionDirs
from kernelexec.longtext import live_tail
from kernelexec.session.restore import RestoreReport

KEEP_FINISHED = 200  # finished runs remembered for get_run
APPROVED = "approve"  # the answer that approves a tool call (Question.approval)
QUESTIONS_PER_MINUTE = 5  # a cell cannot make the client ask more often; the rest get EOFError
MAX_INPUT_CHARS = 1_000_000  # one answer to input()
KEEP_QUESTIONS = 32  # a run's last questions remembered, so that a late or second answer is told why it is refused
# A question unanswered this long before its cell's timeout (at most half the timeout) is declined: the cell ends by
# the EOFError it is sent, as documented, and the timeout's interrupt does not race it (on a warm kernel the two
# came within milliseconds, and a KeyboardInterrupt could land first).
QUESTION_MARGIN = 1.0

logger = logging.getLogger(__name__)

Ask = Callable[[str, bool], Awaitable[str | Refusal | None]]  # the cell's input()/getpass(), as the kernel asks it (kernel.stdin.Ask)
DirectAsk = Callable[["Question"], Awaitable[str | None]]  # the question as an elicitation over the call's back-channel
DirectApprove = Callable[["Question"], Awaitable[bool | None]]  # an approval the same way (None: nobody could be asked)
# told of each run's changes: "started", "awaiting_input", "running" (answered), "finished" (done is set); the
# server records them in the session store (server/durable.py). Never raises into the run; shielded from cancellation.
RunObserver = Callable[["Run", str], Awaitable[None]]
# a getpass() question's one-time page (server/secret_page.py): entered, the page serves and its URL is given;
# left (the question answered, declined, timed out, the cell stopped), the page is gone
OpenPage = Callable[["Run", "Question"], contextlib.AbstractAsyncContextManager[str]]
NO_SECRET_CHANNEL = (
    "kernelexec asks for a secret only on a one-time page of its own, through a URL-mode elicitation, so that it "
    "never passes through the model; this MCP client {why}. To give the code a secret without the model seeing "
    "it, start the server with --secret NAME=@/path/to/file (repeatable): every kernel of that server sees it as "
    "the environment variable NAME (os.environ['NAME']).")


@dataclass
class Finished:
    """What one cell run produced: the recorded ``Execution`` (as the notebook has it), the sandbox
    layers it ran under, and a line for the model on how to install a missing module (not recorded)."""

    execution: Execution
    layers: list[str] | None = None
    hint: str | None = None
    restored: RestoreReport | None = None  # the kernel had been replaced: how its variables came back


class RunHost(Protocol):
    """What a run needs of its session (``session.Session``): whose it is, where its record is, and a cell
    run under its lock."""

    @property
    def handle(self) -> str: ...
    @property
    def owner(self) -> str | None: ...
    @property
    def profile(self) -> str: ...
    @property
    def dirs(self) -> SessionDirs: ...

    async def run(self, code: str, *, timeout: float, working_dir: str | None = None, on_output: Any = None,
                  result_rule: ResultRule = "variable", ask: Ask | None = None, approve: Approve | None = None,
                  on_sent: Callable[[dict[str, Any]], Awaitable[None]] | None = None) -> Finished: ...
    async def interrupt(self) -> bool:
        """SIGINT to the running cell (an interrupt relayed from another replica of a fleet); False if none runs."""
        ...


def question_id() -> str:
    """A new question's id: single-use and unguessable (an answer must name it)."""
    return "q-" + secrets.token_urlsafe(12)


@dataclass
class Question:
    """A cell's input()/getpass(), or a tool call's approval, waiting for its one answer (``Run.answer`` with its
    ``id``: send_input, a retried call's input_responses, tasks/update, or the direct elicitation's)."""

    prompt: str
    password: bool
    answered: anyio.Event = field(default_factory=anyio.Event)
    answer: str | None = None
    approval: bool = False  # code mode: a tool call's approval, which only the human answers (an elicitation)
    call: ApprovalCall | None = None  # an approval: the one call its prompt shows, the only call its answer is for
    id: str = field(default_factory=question_id)
    closed: str | None = None  # why it takes no (more) answer: answered, declined, no longer asked
    url: str | None = None  # a getpass(): its one-time page, the only place its answer is typed (Run.answer by_page)
    sent: bool = False  # a page question's URL went to the client (accepted): the run waits on the page, not the model
    typed: Callable[[], Awaitable[None]] | None = None  # told when its page was submitted (elicitation/complete)

    def verdict(self) -> Verdict:
        """An answered approval as the broker takes it: approved or not, for the call this question showed."""
        assert self.call is not None
        return Verdict(self.call, self.answered.is_set() and self.answer == APPROVED)


@dataclass
class Run:
    id: str
    session: RunHost
    started: float = field(default_factory=time.monotonic)
    done: anyio.Event = field(default_factory=anyio.Event)
    finished: Finished | None = None
    failure: str | None = None
    output_chars: int = 0
    tail: str = ""
    listener: Callable[[str, str], Awaitable[None]] | None = None  # the waiting call's progress, while it waits
    scope: anyio.CancelScope | None = None
    timeout: float = math.inf  # the cell's timeout in seconds, as the call asked for it
    deadline: float = math.inf  # a question unanswered by then is declined: QUESTION_MARGIN before the cell's timeout
    question: Question | None = None  # the cell's input() waiting for an answer
    posted: anyio.Event = field(default_factory=anyio.Event)  # set while a question waits
    stirred: anyio.Event = field(default_factory=anyio.Event)  # set, then replaced, when done, posted or answered is
    wait_for_input: bool = True  # False (run_python): a question nobody can answer at once is declined
    elicit_retry: bool = False  # the starting call's client elicits through InputRequiredResult (2026-07-28)
    asked: list[float] = field(default_factory=list)
    approving: anyio.Lock = field(default_factory=anyio.Lock)  # code mode's approvals, one at a time
    pending: Question | None = None  # a question asked over the waiting call's back-channel (detach posts it)
    asked_questions: OrderedDict[str, Question] = field(default_factory=OrderedDict)  # the last KEEP_QUESTIONS, by id
    notify: Callable[[str], Awaitable[None]] | None = None  # the registry's observers (RunRegistry.observers)
    open_page: OpenPage | None = None  # the starting call's client takes URL-mode elicitation: getpass() asks on a page
    ask_page: DirectAsk | None = None  # ... the page's URL sent over the waiting call's back-channel (2025-11-25)
    url_retry: bool = False  # ... and it is a 2026-07-28 client: the page goes out in an InputRequiredResult
    # a fleet's: how another replica collects its answer if this one stops (RunRecord.resume), once the cell is sent
    resume: dict[str, Any] | None = None
    handed_over: bool = False  # stopped here by a drain's deadline, its cell left running for the next holder

    async def sent(self, point: dict[str, Any], code: str, timeout: float) -> None:
        """The cell's request is about to go to a kernel another replica could collect it from: said to the observers
        (the store's record, when its id was told) before it is sent."""
        # sent_at (wall-clock, as replicas share it): the holder that takes the run over interrupts the cell at
        # sent_at + timeout (GatewayKernel.start), not a fresh timeout from the takeover
        self.resume = {**point, "code": code, "timeout": timeout, "sent_at": time.time()}
        if self.notify is not None:
            await self.notify("sent")

    async def on_output(self, name: str, text: str) -> None:
        self.output_chars += len(text)
        self.tail = live_tail(self.tail, text)
        listener = self.listener
        if listener is not None:
            try:
                await listener(name, text)
            except Exception:  # noqa: BLE001 - a client gone mid-call never stops the cell
                self.listener = None

    def _may_ask(self) -> bool:
        """One more question (input() or an approval) within QUESTIONS_PER_MINUTE, counted if so."""
        now = time.monotonic()
        self.asked[:] = [t for t in self.asked if now - t < 60]
        if len(self.asked) >= QUESTIONS_PER_MINUTE:
            return False
        self.asked.append(now)
        return True

    def asker(self, direct: DirectAsk | None) -> Ask:
        """How the cell's input()/getpass() is answered: ``direct`` (an elicitation over the waiting call's
        back-channel) while the call that started the run waits for it; otherwise the question waits on the
        run (``question``) for ``answer`` — send_input, or the retried call of a 2026-07-28 client — until
        the cell's timeout. At most QUESTIONS_PER_MINUTE questions a minute; the rest are declined."""
        async def ask(prompt: str, password: bool) -> str | Refusal | None:
            if not self._may_ask():
                return None
            if password:
                return await self._ask_secret(prompt)
            if direct is not None and self.listener is not None:
                return await self._ask_directly(direct, Question(prompt, password))
            if not self.wait_for_input:
                return None
            return await self._wait_for_answer(Question(prompt, password))

        return ask

    async def _ask_secret(self, prompt: str) -> str | Refusal | None:
        """A getpass(): never a form and never a question the model answers. On a one-time page (``open_page``)
        the human types it, sent to the client as a URL-mode elicitation over the waiting call's back-channel or,
        for a 2026-07-28 client, in an InputRequiredResult; where neither can be, a Refusal that says how to give
        the code a secret (--secret)."""
        if self.open_page is None:
            return Refusal(NO_SECRET_CHANNEL.format(why="does not declare URL-mode elicitation (capabilities: "
                                                    "elicitation.url), so nobody can be asked for this secret"))
        direct = self.ask_page if self.listener is not None else None
        if direct is None and not self.url_retry:
            return Refusal(NO_SECRET_CHANNEL.format(
                why="can be sent the page only while the call that started the cell waits for it (this cell runs in "
                    "the background, or its call has ended): run the code in the foreground to be asked"))
        question = Question(prompt, True)
        async with self.open_page(self, question) as url:
            question.url = url
            if direct is not None:
                return await self._ask_directly(direct, question)
            return await self._wait_for_answer(question)

    def opened(self, question: Question) -> Question:
        """Register a question the run asks: from now on ``answer`` takes one answer for its id."""
        self.asked_questions[question.id] = question
        while len(self.asked_questions) > KEEP_QUESTIONS:
            self.asked_questions.popitem(last=False)
        return question

    def find(self, question_id: Any) -> Question | None:
        """A question this run asked (answered or not), by its id."""
        return self.asked_questions.get(question_id) if isinstance(question_id, str) else None

    @staticmethod
    def _close(question: Question) -> None:
        """Its time is up (the cell's timeout, the cell stopped): no answer is taken for it any more."""
        if question.closed is None:
            question.closed = "is no longer asked (the cell's timeout passed, or the cell stopped)"

    def _answered_directly(self, question: Question, text: str | None) -> None:
        """The direct elicitation's answer, through ``answer`` like any other; the first answer wins, and an
        answer ``answer`` refuses (too long) declines the question."""
        try:
            self.answer(question.id, text, by_human=True)
        except InvalidRequest:
            if question.closed is None:
                self.answer(question.id, None, by_human=True)

    async def _ask_directly(self, direct: DirectAsk, question: Question) -> str | None:
        """Ask over the waiting call's back-channel until the cell's timeout. If that call stops waiting first
        (it yielded: ``detach``), the same question also waits on the run for send_input; the first answer wins,
        and a failed elicitation after the call went (None: no back-channel any more) is not an answer."""
        self.pending = self.opened(question)

        async def directly() -> None:
            answer = await direct(question)
            if self.pending is question or answer is not None:
                self._answered_directly(question, answer)

        try:
            with anyio.move_on_after(max(0.0, self.deadline - time.monotonic())):  # unanswered: the cell's timeout
                async with anyio.create_task_group() as tg:
                    tg.start_soon(directly)
                    await question.answered.wait()
                    tg.cancel_scope.cancel()
            return question.answer
        finally:
            self._close(question)
            self.pending = None
            if self.question is question:
                self.question = None
                self.posted = anyio.Event()

    def detach(self) -> None:
        """The call that started the run stops waiting for it (answered, yielded, gone): no more progress to it,
        and a question in flight over its back-channel now waits on the run too (``awaiting``, send_input)."""
        self.listener = None
        pending, self.pending = self.pending, None
        if pending is not None and not pending.answered.is_set() and self.question is None:
            self.question = pending
            self.posted.set()
            self.stir()

    def approver(self, direct: DirectApprove | None) -> Approve:
        """How a brokered tool call that needs approval (--tools-approve) is asked: ``direct`` (an elicitation over
        the waiting call's back-channel) while the call that started the run waits; else, for a 2026-07-28 client,
        the question waits on the run and goes out in an InputRequiredResult; otherwise nobody can be asked (None:
        the broker refuses the call). Unanswered by the cell's timeout: declined. The question keeps the call it
        shows, and the verdict names it: the broker makes the call only if it is that call."""
        async def approve(message: str, call: ApprovalCall) -> Verdict | None:
            # one approval at a time per run, so the question waiting is always the one the human sees; and
            # approvals share input()'s QUESTIONS_PER_MINUTE (a cell cannot wear the human down with prompts)
            async with self.approving:
                if not self._may_ask():
                    return Verdict(call, False)
                question = Question(message, False, approval=True, call=call)
                if direct is not None and self.listener is not None:
                    self.opened(question)
                    try:
                        with anyio.move_on_after(max(0.0, self.deadline - time.monotonic())):
                            said = await direct(question)
                            if said is None and not question.answered.is_set():
                                return None  # nobody could be asked
                            if not question.answered.is_set():
                                self._answered_directly(question, APPROVED if said else None)
                        return question.verdict()
                    finally:
                        self._close(question)
                if not self.elicit_retry:
                    return None
                # a 2026-07-28 client: the question waits on the run and goes out in an InputRequiredResult
                await self._wait_for_answer(question)
                return question.verdict()

        return approve

    async def _wait_for_answer(self, question: Question) -> str | None:
        self.question = self.opened(question)
        self.posted.set()
        self.stir()
        try:
            if self.notify is not None:
                await self.notify("awaiting_input")
            with anyio.move_on_after(max(0.0, self.deadline - time.monotonic())):
                await question.answered.wait()
            return question.answer
        finally:
            self._close(question)
            self.question = None
            self.posted = anyio.Event()
            if self.notify is not None:
                await self.notify("running")

    def answer(self, question_id: str, text: str | None, *, by_human: bool = False, by_page: bool = False) -> Question:
        """Answer the question ``question_id`` (None declines it: EOFError in the cell, or the call not made) — the
        one way every channel answers. Refused: an id this run did not ask (or no longer remembers), a question
        already answered or no longer asked (an answer is used once, and never for another question), a tool
        call's approval not ``by_human`` (an elicitation's answer; send_input can only decline it), a getpass() asked
        on a page answered anywhere but ``by_page`` (its page's POST; any other channel can only decline it), a bad
        text."""
        question, text = self.admit(question_id, text, by_human=by_human, by_page=by_page)
        question.answer = text
        question.closed = "was already answered" if text is not None else "was already declined"
        question.answered.set()
        self.stir()
        return question

    def admit(self, question_id: str, text: str | None, *, by_human: bool = False,
              by_page: bool = False) -> tuple[Question, str | None]:
        """``answer``'s checks, nothing changed: the question and the text it would take, or InvalidRequest. Run before
        a fleet's claim in the store (``Relay.claim``), so a refused answer never uses up the question there."""
        question = self.find(question_id)
        if question is None:
            raise InvalidRequest(
                f"run {self.id} asked no question with question_id {str(question_id)[:80]!r}"
                + (" (it has finished)" if self.done.is_set() else
                   "; an answer must name the question it answers (get_run shows the question the run waits on now)"))
        if question.closed is not None:
            raise InvalidRequest(f"question {question.id} of run {self.id} {question.closed}: a question takes one answer, "
                                 "and no answer is applied to another question")
        if question.approval and not by_human and text is not None:
            raise InvalidRequest(f"run {self.id} waits for the user's approval of a tool call, which only the user gives "
                                 "(through the client's elicitation); send_input can only decline it (cancel=true)")
        if question.url is not None and not by_page and text is not None:
            raise InvalidRequest(f"run {self.id} waits for a secret the user types on its own page (getpass(), asked "
                                 "through the client's URL-mode elicitation); it is never sent through a tool call. "
                                 "send_input can only decline it (cancel=true)")
        if text is not None and (not isinstance(text, str) or len(text) > MAX_INPUT_CHARS):
            raise InvalidRequest(f"text must be a string of at most {MAX_INPUT_CHARS:,} characters")
        if question.approval and text is not None and text != APPROVED:
            text = None  # anything but the yes declines
        return question, text

    def stir(self) -> None:
        """Wake whoever waits in ``settled`` (done, posted or a question's answer changed, or the waiting call's
        progress holds back output it must send later)."""
        self.stirred.set()
        self.stirred = anyio.Event()

    async def settled(self, wait_s: float) -> None:
        """Wait up to ``wait_s`` until the run finishes, asks a question or is stirred; the caller looks again.
        (One event waited on, not a task group of one waiter per event: this is every call's wait for its cell.)"""
        question = self.question
        on_page = question is not None and question.url is not None and question.sent and not question.answered.is_set()
        # a secret typed on its page: nothing for a call to answer, so its answer is waited for, not a question
        until = question.answered if on_page and question is not None else self.posted
        if self.done.is_set() or until.is_set():
            await anyio.lowlevel.checkpoint()  # settled already: the run's own task still gets its turn (a caller loops)
            return
        with anyio.move_on_after(wait_s):
            await self.stirred.wait()

    @property
    def on_page(self) -> Question | None:
        """The getpass() the run waits on whose page the client was sent: only the human's typing answers it."""
        question = self.awaiting
        return question if question is not None and question.url is not None and question.sent else None

    @property
    def awaiting(self) -> Question | None:
        """The question the run waits on, if it is still going and waits."""
        question = self.question
        return question if question is not None and not question.answered.is_set() and not self.done.is_set() else None

    def cancel(self) -> None:
        """Cancel the cell as a cancelled call would (the kernel is interrupted, the cell recorded)."""
        if self.scope is not None:
            self.scope.cancel()

    @property
    def elapsed_ms(self) -> float:
        return round((time.monotonic() - self.started) * 1000, 3)


class RunRegistry:
    """All runs of one server process: those queued or running, under the run budgets (``--max-queued-runs-per-
    session``, ``-per-token``, ``--max-queued-runs``, checked in ``start`` before anything is made), and the
    finished ones kept for get_run, the last ``KEEP_FINISHED`` of each owner (token), so that one token's runs
    never evict another's unread answer."""

    def __init__(self, settings: Settings | None = None) -> None:
        self._runs: OrderedDict[str, Run] = OrderedDict()
        self._tg: Any = None
        defaults = Settings.model_construct() if settings is None else settings
        self.per_session = defaults.max_queued_runs_per_session
        self.per_token = defaults.max_queued_runs_per_token
        self.per_server = defaults.max_queued_runs
        self.observers: list[RunObserver] = []  # each run's start, its id told (kept), questions and end (the store's record)
        self.handing_over = False  # a fleet's drain past its deadline: runs stopped now are handed over, not lost

    def attach(self, task_group: Any) -> None:
        self._tg = task_group

    def check_budget(self, session: RunHost) -> None:
        """Refuse one more run for ``session`` when it, its owner or the server is at its run budget."""
        live = [r for r in self._runs.values() if not r.done.is_set()]
        if len(live) >= self.per_server:
            raise SessionError(f"the server already has {len(live)} runs queued or running (--max-queued-runs); "
                               "wait for one to finish (get_run) and try again")
        owner = session.owner
        if owner is not None:
            held = sum(1 for r in live if r.session.owner == owner)
            if held >= self.per_token:
                raise SessionError(f"this token already has {held} runs queued or running (--max-queued-runs-per-token); "
                                   "wait for one to finish (get_run) or interrupt one")
        queued = sum(1 for r in live if r.session is session)
        if queued >= self.per_session:
            raise SessionError(f"session {session.handle} already has {queued} runs queued or running "
                               "(--max-queued-runs-per-session); wait for one to finish (get_run) or interrupt(session)")

    def start(self, session: RunHost, code: str, *, timeout: float, working_dir: str | None,
              listener: Callable[[str, str], Awaitable[None]] | None = None, result_rule: ResultRule = "variable",
              ask: DirectAsk | None = None, wait_for_input: bool = True, approve: DirectApprove | None = None,
              elicit_retry: bool = False, unused: Callable[[Run], Awaitable[None]] | None = None,
              open_page: OpenPage | None = None, url_retry: bool = False, ask_page: DirectAsk | None = None) -> Run:
        """Start a cell as a run (the budgets checked first: at a limit nothing is made). ``unused``: called when
        the run ended without a cell run and no other run of its session is pending (a session made for this
        call gives its place back)."""
        if self._tg is None:
            raise KernelexecError("background runs need a running session manager")
        self.check_budget(session)
        run = Run(id="run-" + secrets.token_urlsafe(9), session=session, listener=listener, scope=anyio.CancelScope(),
                  wait_for_input=wait_for_input, elicit_retry=elicit_retry, open_page=open_page, url_retry=url_retry, ask_page=ask_page,
                  timeout=timeout)
        run.deadline = run.started + timeout - min(QUESTION_MARGIN, timeout / 2)  # (the cell's counts from its send)
        run.notify = functools.partial(self._notify, run)
        self._runs[run.id] = run
        self._prune(session.owner)

        async def body() -> None:
            assert run.scope is not None
            await self._notify(run, "started")
            try:
                with run.scope:  # the tool call's span stays current here (start_soon copies the caller's context)
                    run.finished = await session.run(code, timeout=timeout, working_dir=working_dir, on_output=run.on_output,
                                                     result_rule=result_rule, ask=run.asker(ask), approve=run.approver(approve),
                                                     on_sent=functools.partial(run.sent, code=code, timeout=timeout))
                    sent = run.finished.execution.started if run.finished is not None else None
                    if sent is not None:  # run started → code sent to the kernel: the queue, the kernel's start, installs
                        tracing.record("kernelexec.queue_wait", run.started, sent, **{"kernelexec.run.id": run.id})
                if run.scope.cancelled_caught:
                    run.failure = "cancelled by the client; the kernel was interrupted"
            except KernelexecError as exc:
                run.failure = str(exc)
            except Exception as exc:  # never lose a run silently: the failure is its answer
                run.failure = f"{type(exc).__name__}: {exc}"
            finally:
                # stopped with the server (its task group cancelled) once its cell was sent: in a fleet, handed over
                run.handed_over = self.handing_over and run.finished is None and run.failure is None and run.resume is not None
                # told first (the store's final record), then done: no waiter here answers what another replica's
                # get_run cannot read yet (it read ``running`` for a moment after this replica's answer)
                await self._notify(run, "finished")
                run.done.set()
                run.stir()
                if unused is not None and run.finished is None and not run.scope.cancelled_caught and not any(
                        r.session is session and not r.done.is_set() for r in self._runs.values()):
                    with anyio.CancelScope(shield=True):
                        await unused(run)

        self._tg.start_soon(body)
        return run

    async def _notify(self, run: Run, event: str) -> None:
        """Tell the observers; shielded (a cancelled run's end is still told), and never failing the run."""
        with anyio.CancelScope(shield=True):  # one scope for all of them: this is every run's start and end
            for observer in self.observers:
                try:
                    await observer(run, event)
                except Exception:
                    logger.exception("run %s: recording %s", run.id, event)

    async def keep(self, run: Run) -> None:
        """``run``'s id is about to leave the server (its call answers it still going or waiting for input, or it
        was started in the background): the observers are told and waited for, so the session store holds the run
        before anyone can ask for it. A run its own call answers in full never is: the store keeps nothing of it.
        An observer that fails here fails the call (unlike ``_notify``): no id goes out that the store lacks."""
        for observer in self.observers:
            with anyio.CancelScope(shield=True):
                await observer(run, "kept")

    async def adopt(self, session: RunHost, run_id: str, finished: Finished) -> Run:
        """A fleet's run another replica started and stopped before its end, whose answer this one collected
        (``Session.collect_orphans``): finished here as this replica's own, told to the observers (the store)."""
        run = Run(id=run_id, session=session, scope=anyio.CancelScope())
        run.notify = functools.partial(self._notify, run)
        self._runs[run.id] = run
        self._prune(session.owner)
        await self.keep(run)
        run.finished = finished
        await self._notify(run, "finished")  # recorded, then done (as ``start``'s runs)
        run.done.set()
        run.stir()
        return run

    def spawn(self, work: Callable[[], Awaitable[None]]) -> None:
        """Start ``work`` in the runs' task group: work that outlives the call that started it (a task's job)."""
        if self._tg is None:
            raise KernelexecError("background work needs a running session manager")
        self._tg.start_soon(work)

    def get(self, run_id: str, *, owner: str | None) -> Run:
        run = self._runs.get(run_id) if isinstance(run_id, str) else None
        if run is None or (run.session.owner is not None and run.session.owner != owner):
            raise InvalidRequest(f"unknown run {str(run_id)[:80]!r} (finished runs are kept for the last {KEEP_FINISHED} "
                                 "runs of each token)")
        return run

    def unfinished(self) -> dict[str, Run]:
        """This process's runs still going, by id (a fleet's relay polls for what other replicas ask of them; a
        draining server waits for them: server/drain.py)."""
        return {run_id: run for run_id, run in self._runs.items() if not run.done.is_set()}

    def decline_waiting(self, session: RunHost) -> None:
        """Decline the question a run of ``session`` waits on (the cell was interrupted: nobody will answer)."""
        for run in list(self._runs.values()):
            waiting = run.awaiting
            if run.session is session and waiting is not None:
                run.answer(waiting.id, None)

    def forget(self, run: Run) -> None:
        """Drop a run whose answer its own call returned (no get_run will ask), so the finished runs kept
        for get_run are the ones that yielded or ran in the background. The observers are told (the store forgets
        it too), off the answer's path."""
        self._runs.pop(run.id, None)
        if self.observers and self._tg is not None:
            self._tg.start_soon(self._notify, run, "forgotten")

    async def wait(self, run: Run, wait_s: float) -> bool:
        with anyio.move_on_after(wait_s):
            await run.done.wait()
        return run.done.is_set()


    def _prune(self, owner: str | None) -> None:
        """Keep the last KEEP_FINISHED finished runs of ``owner``; other owners' are not touched."""
        finished = [k for k, r in self._runs.items() if r.done.is_set() and r.session.owner == owner]
        for key in finished[: max(0, len(finished) - KEEP_FINISHED)]:
            del self._runs[key]
