"""A fleet's relay: what a call on one replica asks of a run another replica holds — cancel it (tasks/cancel),
interrupt its cell (interrupt), or answer its question (send_input, a retried call's input_responses, a secret page's POST) — written as a row in the
store (``asks``) that the holder takes and applies exactly as its own call would. One mechanism for every door:
the holder polls its unfinished runs' asks every ``POLL_EVERY`` (one indexed ``DELETE … RETURNING``, only while
it has unfinished runs), and each ask is taken once.

Checks on both sides. The asking replica reads the run from the store as the caller's (another token's run is
unknown to it) and the question as one that run asked, then marks the question answered in the store
(``answer_question``, atomic: one answer wins across the fleet; a replayed retry or a second send_input is refused
there; a secret page's POST is made single-use by its grant instead, secret_page.py). The holder checks the ask's
owner against the run's own and hands the text to ``Run.answer`` with the door's rights (a retry or a page is the
human's; only a page answers a getpass()), which refuses what it refuses for a local call.

With a key file (``--state-key-file``, which a fleet shares for its retries) no answer is in the store in clear:
the text is sealed with AES-GCM under a key derived from it, bound to the run and the question, and the holder
deletes the row as it reads it. Without one only a decline or an ``input()`` answer is relayed (in clear, until
taken); a secret is never relayed (the page says nothing was sent). The text is never logged, on either side.
A page's form tokens are MACs under another key derived from the same file (``sign``).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import logging
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import anyio

from kernelexec.config import Settings, state_keys
from kernelexec.errors import InvalidRequest, KernelexecError
from kernelexec.server.questions import STATE_SEPARATOR, typed
from kernelexec.session.runs import MAX_INPUT_CHARS, Run
from kernelexec.store import AlreadyAnswered, AskRecord, GrantRecord, QuestionRecord, Store, StoreError
from kernelexec.store.interface import UNFINISHED, visible

if TYPE_CHECKING:
    from kernelexec.session.manager import SessionManager

logger = logging.getLogger(__name__)

POLL_EVERY = 0.25  # seconds between the holder's looks for its runs' asks (an answer's extra latency, at most)
SEALED = "v1."  # a sealed text's prefix (the format is bound under the tag as associated data)
SEAL_INFO = b"kernelexec relay: an answer in the store"  # the relay's keys are not the request-state keys
SIGN_INFO = b"kernelexec relay: a secret page's form token"  # nor each other


def _key(secret: bytes, info: bytes) -> bytes:
    return hmac.new(secret, info, hashlib.sha256).digest()


def _bound(run_id: str, question_id: str | None) -> bytes:
    return f"{SEALED}{run_id}{STATE_SEPARATOR}{question_id or ''}".encode()


class Relay:
    """This replica's side of the relay: it polls for its runs' asks, and seals and opens answers' text."""

    def __init__(self, settings: Settings, sessions: SessionManager) -> None:
        self.sessions = sessions
        keys = state_keys(settings) or []
        self._keys = [_key(key, SEAL_INFO) for key in keys]
        self._signing = [_key(key, SIGN_INFO) for key in keys]
        self._polling = False
        self._taking = anyio.Lock()  # asks taken and applied as one step: a look never misses one taken meanwhile
        self.on_cancel: list[Callable[[Run], None]] = []  # told before a run is cancelled from elsewhere (tasks.py)

    @property
    def store(self) -> Store | None:
        fleet = self.sessions.fleet
        return self.sessions.store if fleet is not None and fleet.drives else None

    # the holder

    def watch(self) -> None:
        """A run's id went out (it may be asked about elsewhere): poll from now on, if this replica is in a fleet."""
        if not self._polling and self.store is not None:
            self._polling = True
            self.sessions.runs.spawn(self._poll)

    async def _poll(self) -> None:
        while True:
            await anyio.sleep(POLL_EVERY)
            runs = self.sessions.runs.unfinished()
            store = self.store
            if not runs or store is None:
                continue
            await self._apply_asks(store, runs, "this replica's runs")

    async def deliver_pending(self, run: Run) -> None:
        """Apply now, not at the next poll, what was asked of ``run`` so far: before this replica answers that its run
        waits on a question, an answer given on another replica (already taken there) is applied. An answer the poll
        has taken and not yet applied is waited for: taken from the store, it is nowhere else to be seen."""
        store = self.store
        if store is not None:
            await self._apply_asks(store, {run.id: run}, f"run {run.id}")

    async def _apply_asks(self, store: Store, runs: dict[str, Run], what: str) -> None:
        """Take ``runs``' asks from the store and apply them, as one step (``_taking``)."""
        async with self._taking:
            try:
                asks = await store.take_asks(list(runs))
            except KernelexecError as exc:
                logger.warning("reading the asks for %s: %s", what, exc)
                return
            for ask in asks:
                await self.deliver(runs[ask.run_id], ask)

    async def deliver(self, run: Run, ask: AskRecord) -> None:
        """Apply an ask as this replica's own call would; what is refused is logged (never the text) and dropped."""
        if not visible(run.session.owner, ask.owner):
            logger.warning("run %s: an ask from another token was refused", run.id)
            return
        if ask.kind == "cancel":
            for told in self.on_cancel:
                told(run)
            run.cancel()
            return
        if ask.kind == "interrupt":  # as this replica's own interrupt tool: SIGINT, and a question waiting is declined
            try:
                await run.session.interrupt()
            except KernelexecError as exc:
                logger.warning("run %s: an interrupt asked on another replica was not sent: %s", run.id, exc)
            self.sessions.runs.decline_waiting(run.session)
            return
        try:
            text = self.open(ask)
            question = run.answer(ask.question_id or "", text, by_human=ask.channel in ("retry", "page"),
                                  by_page=ask.channel == "page")
        except KernelexecError as exc:
            logger.info("run %s: an answer given on another replica (%s) was not taken: %s", run.id, ask.channel, exc)
            return
        if ask.channel == "page":  # elicitation/complete to the client waiting here
            await typed(question)

    # sealing

    def seal(self, text: str | None, run_id: str, question_id: str) -> str | None:
        if text is None or not self._keys:
            return text
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM  # the MCP SDK's own dependency

        nonce = os.urandom(12)
        sealed = AESGCM(self._keys[0]).encrypt(nonce, text.encode(), _bound(run_id, question_id))
        return SEALED + base64.urlsafe_b64encode(nonce + sealed).decode()

    def open(self, ask: AskRecord) -> str | None:
        text = ask.text
        if text is None or not self._keys:
            return text
        from cryptography.exceptions import InvalidTag
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM

        if not text.startswith(SEALED):
            raise KernelexecError("an answer in the store was not sealed, and this replica has a key file")
        try:
            blob = base64.urlsafe_b64decode(text[len(SEALED):])
        except ValueError:
            raise KernelexecError("a sealed answer in the store is malformed") from None
        for key in self._keys:
            try:
                return AESGCM(key).decrypt(blob[:12], blob[12:], _bound(ask.run_id, ask.question_id)).decode()
            except (InvalidTag, ValueError):
                continue
        raise KernelexecError("a sealed answer in the store opens with none of this replica's keys")

    def sign(self, text: str) -> str | None:
        """A MAC of ``text`` any replica with the fleet's key file checks (a secret page's form token); None without one."""
        if not self._signing:
            return None
        return base64.urlsafe_b64encode(hmac.new(self._signing[0], text.encode(), hashlib.sha256).digest()).decode()

    def signed(self, text: str, signature: str) -> bool:
        return any(hmac.compare_digest(signature.encode(), base64.urlsafe_b64encode(
            hmac.new(key, text.encode(), hashlib.sha256).digest())) for key in self._signing)

    # the asking replica

    async def answer_page(self, grant: GrantRecord, text: str) -> None:
        """A secret typed on a page another replica opened: relayed sealed, never in clear (refused without a key
        file). The grant, used by this POST (``use_grant``), is what makes it once across the fleet."""
        store = self.store
        run_id, question_id = str(grant.caps.get("run_id", "")), str(grant.caps.get("question_id", ""))
        if store is None or not self._keys:
            raise KernelexecError("no sealed way to the replica that runs the code")
        await store.ask(AskRecord(run_id, "answer", grant.owner, question_id, self.seal(text, run_id, question_id), "page"))

    async def ask_cancel(self, run_id: str, owner: str | None) -> None:
        store = self.store
        if store is not None:
            await store.ask(AskRecord(run_id, "cancel", owner, channel="tasks/cancel"))

    async def ask_interrupt(self, session: str, owner: str | None) -> int:
        """interrupt of a session whose cell runs on another replica: each of its unfinished runs in the store held
        by another live replica is asked of its holder (a stopped one's would never be taken). How many were asked
        (0: none runs elsewhere)."""
        store, fleet = self.store, self.sessions.fleet
        if store is None or fleet is None:
            return 0
        elsewhere = [run for run in await store.runs_of(session, owner=owner)
                     if run.state in UNFINISHED and run.holder is not None and run.holder != fleet.key
                     and await store.current_lease(run.holder) is not None]
        for run in elsewhere:
            await store.ask(AskRecord(run.id, "interrupt", owner, channel="interrupt"))
        return len(elsewhere)

    async def claim(self, run: Run, question_id: Any, owner: str | None, text: str | None, *, by_human: bool = False,
                    by_page: bool = False) -> None:
        """Before one of this replica's own doors answers its run's question: in a fleet the question may be in the
        store, where another replica's relayed answer marks it taken (``answer``); mark it here the same way, so one
        answer wins across the fleet whichever door it came through. A question never written there (the run's id was
        never told, one server) has no other door: nothing to claim. An answer ``Run.answer`` would refuse (``text``
        too long, an approval or a page's secret through the wrong door) is refused first (InvalidRequest): it never
        uses the question up in the store, where the right answer would then be refused as already given."""
        store = self.store
        if store is None:
            return
        question, _ = run.admit(question_id, text, by_human=by_human, by_page=by_page)
        try:
            await store.answer_question(question.id, by=owner)
        except AlreadyAnswered:
            raise InvalidRequest(f"question {question.id} of run {run.id} was already answered (through another "
                                 "replica of this fleet): a question takes one answer") from None
        except StoreError:
            pass  # not in the store: only this replica knows it

    async def answer(self, run_id: str, question_id: Any, text: str | None, channel: str, owner: str | None,
                     unknown: InvalidRequest) -> QuestionRecord:
        """Answer a question of a run another replica holds: checked, marked answered in the store, asked of the
        holder. ``unknown`` when the run is not ``owner``'s (or not in the store)."""
        store = self.store
        record = await store.get_run(run_id, owner=owner) if store is not None and isinstance(run_id, str) else None
        if store is None or record is None:
            raise unknown
        if record.state != "awaiting_input":
            raise InvalidRequest(f"run {run_id} is not waiting for input (it is {record.state.replace('_', ' ')}); "
                                 f"get_run(run_id={run_id!r}) gives its answer")
        question = await store.get_question(question_id, owner=owner) if isinstance(question_id, str) else None
        if question is None or question.run_id != run_id:
            raise InvalidRequest(f"run {run_id} asked no question with question_id {str(question_id)[:80]!r}; an answer "
                                 f"must name the question it answers (get_run(run_id={run_id!r}) shows the one it waits on)")
        if text is not None:
            if not isinstance(text, str) or len(text) > MAX_INPUT_CHARS:  # as Run.answer: nothing bigger reaches the store
                raise InvalidRequest(f"text must be a string of at most {MAX_INPUT_CHARS:,} characters")
            if question.approval and channel == "send_input":
                raise InvalidRequest(f"run {run_id} waits for the user's approval of a tool call, which only the user "
                                     "gives (through the client's elicitation); send_input can only decline it (cancel=true)")
            if question.password and channel != "page":
                raise InvalidRequest(f"run {run_id} waits for a secret the user types on its own page (getpass()); it is "
                                     "never sent through a tool call. send_input can only decline it (cancel=true)")
            if question.password and not self._keys:
                raise InvalidRequest("this secret was typed on a replica other than the one running the code, and the "
                                     "fleet has no --state-key-file to seal it with on its way: nothing was sent")
        try:
            await store.answer_question(question.id, by=owner)
        except AlreadyAnswered:
            raise InvalidRequest(f"question {question.id} of run {run_id} was already answered: a question takes one "
                                 "answer, and no answer is applied to another question") from None
        await store.ask(AskRecord(run_id, "answer", owner, question.id, self.seal(text, run_id, question.id), channel))
        return question
