"""The session store's seam: what a session owns outside its kernel, as plain records, and the one async
interface (``Store``) both backends fill (sqlite.py, postgres.py).

Records are frozen dataclasses of plain data (str, int, float, bool, JSON-able dicts); times are seconds
since the epoch. Ownership: a record with an owner is unknown to any other caller (``None`` included),
exactly as the in-memory registries treat runs and tasks; a record without one (stdio, no auth) is anyone's.
Nothing read from a store is ever executed: it is data, rendered or compared.

Leases keep two processes apart on one session: ``acquire`` succeeds when the session's lease is free,
expired or already the caller's (one atomic statement or transaction), and every acquisition from another
holder takes a new fencing token, strictly greater than every token the session had before (a released lease
keeps its token row; the holder's own acquire while it holds keeps its token and extends it). A write that
carries a ``Fence`` is refused (``StaleLease``) unless it is still the session's current token — so a holder
whose lease expired and was taken by another can no longer write, even if it does not know yet. A released
lease keeps the time it was let go (``expires``): when the fleet last drove the session. Leases whose
key is not a session handle (``replica:<id>``, ``fleet:upkeep``) are a fleet's own (``session/fleet.py``).
"""

from __future__ import annotations

import re
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable
from urllib.parse import urlsplit, urlunsplit

from kernelexec.errors import KernelexecError

SCHEMA_VERSION = 6  # 2: sessions.closed; 3: asks, grants; 4: runs.holder; 5: runs.resume; 6: reservations, pruning indexes

RunState = Literal["running", "awaiting_input", "finished", "failed", "lost"]
RUN_STATES: tuple[RunState, ...] = ("running", "awaiting_input", "finished", "failed", "lost")
UNFINISHED: tuple[RunState, ...] = ("running", "awaiting_input")


class StoreError(KernelexecError):
    """The store cannot be opened or refused a write (its message never holds a store URL's password)."""


class StaleLease(StoreError):
    """A write fenced by a token that is no longer the session's current lease."""


class AlreadyAnswered(StoreError):
    """A pending question was answered before: an answer is single-use."""


@dataclass(frozen=True)
class SessionRecord:
    handle: str
    owner: str | None
    working_dir: str
    environment: str  # the interpreter the session's kernels run (Environment's description)
    profile: str
    local_slot: str | None = None  # where its kernel is: a local slot ("k"/"s")…
    gateway_kernel_id: str | None = None  # …or a kernel on a gateway
    created: float = 0.0
    updated: float = 0.0
    closed: float | None = None  # when it was closed (close_session): never revived, kept so no file brings it back


@dataclass(frozen=True)
class RunRecord:
    id: str
    session: str  # the session's handle
    owner: str | None
    state: RunState
    answer: dict[str, Any] | None = None  # the final answer (a CallToolResult's JSON dump), once there is one
    created: float = 0.0
    updated: float = 0.0
    holder: str | None = None  # a fleet's: the replica lease (``replica:<kind>:<id>``) of the replica running it
    # a fleet's: how another replica collects the cell's answer from the gateway if its holder stops (session/fleet.py):
    # the gateway kernel, the channels' session id, the request's msg_id, the code and timeout; kept once written
    resume: dict[str, Any] | None = None


@dataclass(frozen=True)
class TaskRecord:
    id: str
    owner: str | None
    run_id: str | None  # None: a job that is not a cell (install_packages)
    ttl_s: float
    status: str  # the Tasks extension's status: working, input_required, completed, cancelled, failed
    created: float = 0.0
    updated: float = 0.0

    @property
    def expires(self) -> float:
        return self.created + self.ttl_s


@dataclass(frozen=True)
class QuestionRecord:
    """A cell's input()/getpass() or a tool call's approval, waiting for one answer. The answer's text is
    never stored (a getpass() answer is a secret); ``answered`` makes the question single-use."""

    id: str
    run_id: str
    prompt: str
    password: bool = False
    approval: bool = False  # only the human answers it (an elicitation)
    answerer: str | None = None  # who may answer: the run's owner (None: anyone)
    answered: bool = False
    created: float = 0.0


AskKind = Literal["cancel", "answer", "interrupt"]


@dataclass(frozen=True)
class AskRecord:
    """A request for the replica that runs ``run_id``, made on another replica of a fleet (``server/relay.py``):
    cancel the run (tasks/cancel), interrupt its session's cell (interrupt), or answer its question ``question_id`` (send_input, a retried call, a secret
    page's POST). The holder polls for its runs' asks and takes each once (``take_asks`` deletes what it reads)."""

    run_id: str
    kind: AskKind
    owner: str | None = None  # who asked: checked again by the holder against the run's owner
    question_id: str | None = None
    text: str | None = None  # an answer, sealed with the fleet's key (relay.py) when it has one; None declines
    channel: str = ""  # the door it came through: "send_input", "retry", "page", "tasks/cancel", "interrupt"
    created: float = 0.0


@dataclass(frozen=True)
class GrantRecord:
    """A capability URL a fleet's replica minted (an upload URL, a getpass() page), so any replica serves it: only
    the SHA-256 of its secret key (``digest``), never the key; single use through ``use_grant``."""

    digest: str  # hex SHA-256 of the URL's key
    kind: Literal["upload", "secret"]
    owner: str | None
    session: str  # the session's handle
    expires: float
    caps: dict[str, Any] = field(default_factory=dict)  # what it allows: a file's name and cap; the question it answers
    used: bool = False


@dataclass(frozen=True)
class Reservation:
    """A share of a budget a fleet counts in the store (``Store.reserve``): one upload URL of a token, the bytes
    of a body being received. It counts until released, until ``expires``, or until its holder replica's lease ran
    out, whichever comes first: a killed replica's reservations do not stay counted."""

    key: str  # unique: what releases it
    budget: str  # what it counts against: ``urls:<owner>``, ``spool``
    amount: int
    expires: float
    holder: str | None = None  # the replica lease (``replica:<kind>:<id>``) whose death frees it; None: only expiry


@dataclass(frozen=True)
class Lease:
    """Which process drives a session now."""

    session: str
    holder: str
    token: int  # the fencing token: strictly increasing per session
    expires: float
    taken_from: str | None = None  # acquire only: the holder whose lease had expired (it died or was paused)


@dataclass(frozen=True)
class Fence:
    """What a fenced write carries: the session and the token its writer's lease had."""

    session: str
    token: int

    @classmethod
    def of(cls, lease: Lease) -> Fence:
        return cls(lease.session, lease.token)


@dataclass(frozen=True)
class JournalEntry:
    session: str
    seq: int  # 1, 2, 3… per session, in append order
    record: dict[str, Any] = field(default_factory=dict)  # one cell's record (outputs or references to output files)


def visible(owner: str | None, caller: str | None) -> bool:
    """A record of ``owner`` exists for ``caller``."""
    return owner is None or owner == caller


@runtime_checkable
class Store(Protocol):
    """Everything a session owns outside its kernel. Every method is async and safe to call from the event
    loop (a backend does its blocking work elsewhere); each write is one transaction, durable when it returns
    (SQLite's journal appends: kept by a kill of the server when they return, fsynced a moment later)."""

    @property
    def url(self) -> str:
        """Where the store is, its password redacted."""
        ...

    async def close(self) -> None: ...

    # sessions
    async def put_session(self, record: SessionRecord, *, fence: Fence | None = None) -> None: ...
    async def get_session(self, handle: str, *, owner: str | None) -> SessionRecord | None: ...
    async def list_sessions(self, *, owner: str | None) -> list[SessionRecord]: ...
    async def delete_session(self, handle: str, *, fence: Fence | None = None) -> None: ...

    # runs
    async def put_run(self, record: RunRecord, *, fence: Fence | None = None) -> None:
        """Write (or update) a run. An update naming a ``holder`` other than the stored one is not applied unless
        fenced: a fleet's run another replica adopted (``Fleet.adopt_orphans``, under the session's lease) is no
        longer written by the replica that left it (paused past its lease, then woken)."""
        ...
    async def get_run(self, run_id: str, *, owner: str | None) -> RunRecord | None: ...
    async def runs_of(self, session: str, *, owner: str | None) -> list[RunRecord]: ...
    async def lose_unfinished(self, *, session: str | None = None) -> int:
        """Mark every running/awaiting_input run (of ``session``, or all) as lost: its server died. How many."""
        ...

    async def lose_run(self, run_id: str, *, fence: Fence) -> bool:
        """Mark one running/awaiting_input run lost (compare-and-set, fenced by its session's lease): its holder
        replica died. Whether this call did (False: it had ended, or was marked already)."""
        ...

    async def delete_run(self, run_id: str, *, holder: str | None = None) -> None:
        """Forget one run (its answer went back to its own call: no get_run will ask for it); with ``holder``, only
        while the store names no other holder (a fleet's run another replica adopted keeps its record)."""
        ...

    async def prune_runs(self, *, owner: str | None, keep: int) -> int:
        """Forget all but the ``keep`` most recently updated ended runs (finished, failed, lost) of ``owner``: the
        budget of kept results, per token, in the store as in memory. How many went."""
        ...

    # tasks
    async def put_task(self, record: TaskRecord) -> None: ...
    async def get_task(self, task_id: str, *, owner: str | None) -> TaskRecord | None: ...

    # pending questions
    async def put_question(self, record: QuestionRecord, *, fence: Fence | None = None) -> None: ...
    async def get_question(self, question_id: str, *, owner: str | None) -> QuestionRecord | None: ...
    async def answer_question(self, question_id: str, *, by: str | None) -> QuestionRecord:
        """Mark the question answered (compare-and-set): ``AlreadyAnswered`` if it was; ``StoreError`` if
        ``by`` may not answer it or it is unknown."""
        ...

    # asks: requests for the replica that runs a run (a fleet's relay)
    async def ask(self, record: AskRecord) -> None: ...
    async def take_asks(self, run_ids: Collection[str]) -> list[AskRecord]:
        """Every ask for these runs, oldest first, deleted as it is read (one transaction: each ask is taken once,
        by one replica)."""
        ...

    # grants: capability URLs any replica serves
    async def put_grant(self, record: GrantRecord) -> None: ...
    async def get_grant(self, digest: str) -> GrantRecord | None: ...
    async def use_grant(self, digest: str) -> GrantRecord | None:
        """Mark the grant used (compare-and-set, one statement): the grant as it was when this call used it; None when
        it is unknown or was used already (by any replica)."""
        ...

    # reservations: budgets counted across a fleet (upload URLs per token, bytes being received)
    async def reserve(self, record: Reservation, *, limit: int) -> bool:
        """Add ``record`` to its budget unless the budget's live reservations and it would pass ``limit`` (atomic
        across processes): whether it was. Live: unexpired, and held by no replica or by one whose lease is live
        (a SIGKILLed replica's reservations stop counting once its replica lease ran out)."""
        ...

    async def release(self, key: str) -> None:
        """The reservation ``key`` ended (its upload finished, failed or was refused): it no longer counts."""
        ...

    async def reserved(self, budget: str) -> int:
        """The sum of ``budget``'s live reservations."""
        ...

    # pruning: the rows nobody can use any more, in bounded batches (once per fleet, by its leader: upkeep.py)
    async def prune(self, *, ended_before: float, expired_before: float, limit: int) -> dict[str, int]:
        """Delete at most ``limit`` rows of each kind nobody can still use, and say how many went, by table: asks and
        questions of runs that ended (or are gone) made before ``ended_before``; grants that expired before
        ``expired_before``; tasks past their ttl; reservations past their expiry; replica leases (``replica:``) let
        go or run out before ``expired_before``. Runs are kept by count (``prune_runs``), never here."""
        ...

    # leases
    async def acquire_lease(self, session: str, holder: str, ttl_s: float) -> Lease | None:
        """The lease when it was free, expired or ``holder``'s (then its token kept), else None: atomic."""
        ...

    async def renew_lease(self, lease: Lease, ttl_s: float) -> Lease | None: ...
    async def release_lease(self, lease: Lease) -> bool: ...
    async def current_lease(self, session: str) -> Lease | None: ...
    async def idle_sessions(self, idle_s: float) -> list[SessionRecord]:
        """Open sessions with a gateway kernel whose lease was let go (a released lease keeps the time, ``expires``)
        or ran out more than ``idle_s`` seconds ago: idle across the whole fleet (a fleet's reaping, upkeep.py)."""
        ...
    async def live_leases(self, prefix: str) -> list[Lease]:
        """Every held, unexpired lease whose key starts with ``prefix`` (a fleet's replicas: ``replica:``)."""
        ...

    # the journal
    async def append_journal(self, session: str, record: dict[str, Any], *, fence: Fence | None = None) -> int: ...
    async def journal(self, session: str, *, after: int = 0) -> list[JournalEntry]: ...
    async def journal_counts(self) -> dict[str, int]:
        """Every session with a journal, and its last ``seq`` (how many cells it holds): a start's one look."""
        ...

    # what a start compares with the state directory (``session/reconcile.py``): no owner filter, server use only
    async def session_handles(self) -> set[str]: ...


_PASSWORD_IN_TEXT = re.compile(r"(?i)(password\s*=\s*)('[^']*'|\S+)")


def redacted(url: str) -> str:
    """``url`` with its password (``user:PASSWORD@``, ``?password=``) replaced by ``***``; anything unparsable
    is returned with every ``:…@`` userinfo and ``password=`` value masked."""
    try:
        parts = urlsplit(url)
        netloc = parts.netloc
        if "@" in netloc:
            userinfo, host = netloc.rsplit("@", 1)
            if ":" in userinfo:
                userinfo = userinfo.split(":", 1)[0] + ":***"
            netloc = f"{userinfo}@{host}"
        query = re.sub(r"(?i)(^|&)(password=)[^&]*", r"\1\2***", parts.query)
        return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))
    except ValueError:
        return _PASSWORD_IN_TEXT.sub(r"\1***", re.sub(r":[^:@/]*@", ":***@", url))


def url_password(url: str) -> str | None:
    """The password a store URL carries, if any (to scrub it from a driver's messages)."""
    try:
        parts = urlsplit(url)
        found = parts.password
        if not found:
            match = re.search(r"(?i)(?:^|&)password=([^&]*)", parts.query)
            found = match.group(1) if match else None
        return found or None
    except ValueError:
        return None


def scrubbed(text: str, url: str) -> str:
    """A driver's message with the URL's password (raw and URL-encoded) masked, and any ``password=…``."""
    from urllib.parse import unquote

    secret = url_password(url)
    for form in {secret, unquote(secret)} if secret else set():
        if form:
            text = text.replace(form, "***")
    return _PASSWORD_IN_TEXT.sub(r"\1***", text)
