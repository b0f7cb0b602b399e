"""The built-in store: one SQLite file, ``<state dir>/kernelexec.db`` (WAL, synchronous=FULL, mode 0600).

But for the journal: a cell's commit skips the fsync (``synchronous=NORMAL`` for that one transaction), so it
is in the operating system when its answer goes out (a kill of the server, SIGKILL included, loses nothing) and
on the disk a moment later, when ``WalSync``'s thread has fsynced the WAL (one fsync for the commits that came
meanwhile). The per-call path pays no fsync; the next FULL commit or checkpoint would sync those frames anyway.

One connection, used by one worker thread at a time (``anyio.to_thread`` under a limiter of one): the event
loop never waits on the disk. Every write is one ``BEGIN IMMEDIATE`` transaction, so a check and its write
(a lease's compare-and-set, a fence, a question's single answer, the journal's next number) cannot interleave
with another process's. The schema is created and migrated when the store opens (``schema_version``).
"""

from __future__ import annotations

import json
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any, TypeVar

import anyio
import anyio.to_thread

from kernelexec.store.interface import (
    RUN_STATES,
    SCHEMA_VERSION,
    UNFINISHED,
    AlreadyAnswered,
    AskRecord,
    Fence,
    GrantRecord,
    JournalEntry,
    Lease,
    QuestionRecord,
    Reservation,
    RunRecord,
    SessionRecord,
    StaleLease,
    StoreError,
    TaskRecord,
    visible,
)

logger = logging.getLogger(__name__)
T = TypeVar("T")
DB_NAME = "kernelexec.db"

# the columns each record is read from, in its fields' order (never SELECT *: a migration may add columns)
SESSION_COLUMNS = "handle, owner, working_dir, environment, profile, local_slot, gateway_kernel_id, created, updated, closed"
RUN_COLUMNS = "id, session, owner, state, answer, created, updated, holder, resume"
TASK_COLUMNS = "id, owner, run_id, ttl_s, status, created, updated"
QUESTION_COLUMNS = "id, run_id, prompt, password, approval, answerer, answered, created"
ASK_COLUMNS = "run_id, kind, owner, question_id, text, channel, created"
GRANT_COLUMNS = "digest, kind, owner, session, expires, caps, used"
# a budget's live reservations (params: budget, now, now): unexpired, and no holder or a holder replica whose lease is live
LIVE_RESERVED = """(SELECT coalesce(sum(amount), 0) FROM reservations v WHERE v.budget = ? AND v.expires > ? AND (v.holder IS NULL
    OR EXISTS (SELECT 1 FROM leases l WHERE l.session = v.holder AND l.holder IS NOT NULL AND l.expires > ?)))"""

_STATES = ", ".join(f"'{s}'" for s in RUN_STATES)
MIGRATIONS: dict[int, list[str]] = {
    1: [
        """CREATE TABLE sessions (handle TEXT PRIMARY KEY, owner TEXT, working_dir TEXT NOT NULL, environment TEXT NOT NULL,
           profile TEXT NOT NULL, local_slot TEXT, gateway_kernel_id TEXT, created REAL NOT NULL, updated REAL NOT NULL,
           CHECK (local_slot IS NULL OR gateway_kernel_id IS NULL))""",
        f"""CREATE TABLE runs (id TEXT PRIMARY KEY, session TEXT NOT NULL, owner TEXT, state TEXT NOT NULL CHECK (state IN ({_STATES})),
           answer TEXT, created REAL NOT NULL, updated REAL NOT NULL)""",
        "CREATE INDEX runs_by_session ON runs (session)",
        "CREATE INDEX runs_by_state ON runs (state)",
        """CREATE TABLE tasks (id TEXT PRIMARY KEY, owner TEXT, run_id TEXT, ttl_s REAL NOT NULL, status TEXT NOT NULL,
           created REAL NOT NULL, updated REAL NOT NULL)""",
        """CREATE TABLE questions (id TEXT PRIMARY KEY, run_id TEXT NOT NULL, prompt TEXT NOT NULL, password INTEGER NOT NULL,
           approval INTEGER NOT NULL, answerer TEXT, answered INTEGER NOT NULL DEFAULT 0, created REAL NOT NULL)""",
        "CREATE INDEX questions_by_run ON questions (run_id)",
        "CREATE TABLE leases (session TEXT PRIMARY KEY, holder TEXT, token INTEGER NOT NULL, expires REAL NOT NULL)",
        "CREATE TABLE journal (session TEXT NOT NULL, seq INTEGER NOT NULL, record TEXT NOT NULL, PRIMARY KEY (session, seq))",
    ],
    2: ["ALTER TABLE sessions ADD COLUMN closed REAL"],
    3: ["""CREATE TABLE asks (seq INTEGER PRIMARY KEY AUTOINCREMENT, run_id TEXT NOT NULL, kind TEXT NOT NULL, owner TEXT,
           question_id TEXT, text TEXT, channel TEXT NOT NULL, created REAL NOT NULL)""",
        "CREATE INDEX asks_by_run ON asks (run_id)",
        """CREATE TABLE grants (digest TEXT PRIMARY KEY, kind TEXT NOT NULL, owner TEXT, session TEXT NOT NULL,
           expires REAL NOT NULL, caps TEXT NOT NULL, used INTEGER NOT NULL DEFAULT 0)"""],
    4: ["ALTER TABLE runs ADD COLUMN holder TEXT"],
    5: ["ALTER TABLE runs ADD COLUMN resume TEXT"],
    6: ["""CREATE TABLE reservations (key TEXT PRIMARY KEY, budget TEXT NOT NULL, amount INTEGER NOT NULL,
           expires REAL NOT NULL, holder TEXT)""",
        "CREATE INDEX reservations_by_budget ON reservations (budget, expires)",
        "CREATE INDEX reservations_by_expiry ON reservations (expires)",
        "CREATE INDEX asks_by_created ON asks (created)",  # pruning (Store.prune): each kind by its age, in batches
        "CREATE INDEX questions_by_created ON questions (created)",
        "CREATE INDEX grants_by_expiry ON grants (expires)",
        "CREATE INDEX tasks_by_expiry ON tasks (created + ttl_s)"],
}
assert max(MIGRATIONS) == SCHEMA_VERSION


def dumps(value: Any) -> str:
    try:
        return json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError) as exc:
        raise StoreError(f"not storable as JSON: {exc}") from None


class WalSync:
    """One thread that fsyncs the store's WAL when asked (``due``), after journal commits that skipped it: the
    commits asked for while it syncs share its next fsync. ``close`` waits for the last one."""

    def __init__(self, wal: Path) -> None:
        self.wal = wal
        self._wake = threading.Condition()
        self._due = self._closed = False
        self.synced = 0  # fsyncs done (the tests count them)
        self._thread = threading.Thread(target=self._run, name="kernelexec-wal-sync", daemon=True)
        self._thread.start()

    def due(self) -> None:
        with self._wake:
            self._due = True
            self._wake.notify()

    def close(self) -> None:
        with self._wake:
            self._closed = True
            self._wake.notify()
        self._thread.join()

    def _run(self) -> None:
        while True:
            with self._wake:
                while not self._due and not self._closed:
                    self._wake.wait()
                if not self._due:
                    return
                self._due = False
            self.sync()

    def sync(self) -> None:
        try:
            fd = os.open(self.wal, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:  # checkpointed away: SQLite synced it before, and the database after
            return
        try:
            os.fsync(fd)
            self.synced += 1
        except OSError as exc:
            logger.warning("fsync of the store's WAL %s failed: %s", self.wal, exc)
        finally:
            os.close(fd)


class SQLiteStore:
    """The ``Store`` in one SQLite file. Open with ``await SQLiteStore.open(path)``."""

    def __init__(self, path: Path, conn: sqlite3.Connection) -> None:
        self.path = path
        self._conn: sqlite3.Connection | None = conn
        self._lock = threading.Lock()
        self._limiter = anyio.CapacityLimiter(1)
        self.wal_sync = WalSync(path.with_name(path.name + "-wal"))

    def __repr__(self) -> str:
        return f"SQLiteStore({str(self.path)!r})"

    @property
    def url(self) -> str:
        return f"sqlite:///{self.path}"

    @classmethod
    async def open(cls, path: Path | str) -> SQLiteStore:
        return await anyio.to_thread.run_sync(cls.open_sync, Path(path))

    @classmethod
    def open_sync(cls, path: Path) -> SQLiteStore:
        path.parent.mkdir(parents=True, exist_ok=True)
        os.close(os.open(path, os.O_CREAT | os.O_RDWR | os.O_CLOEXEC, 0o600))  # the -wal and -shm files take its mode
        try:
            conn = sqlite3.connect(path, timeout=30, isolation_level=None, check_same_thread=False)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=FULL")
            conn.execute("PRAGMA foreign_keys=ON")
            store = cls(path, conn)
            store._migrate()
        except sqlite3.Error as exc:
            raise StoreError(f"cannot open the store {path}: {exc}") from None
        return store

    def _migrate(self) -> None:
        def migrate(db: sqlite3.Connection) -> None:
            db.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")
            found = db.execute("SELECT max(version) FROM schema_version").fetchone()[0] or 0
            if found > SCHEMA_VERSION:
                raise StoreError(f"the store {self.path} has schema version {found}, newer than this kernelexec's "
                                 f"({SCHEMA_VERSION}): upgrade kernelexec")
            for version in range(found + 1, SCHEMA_VERSION + 1):
                for statement in MIGRATIONS[version]:
                    db.execute(statement)
                db.execute("INSERT INTO schema_version (version) VALUES (?)", (version,))

        self._tx(migrate)

    def _tx(self, work: Callable[[sqlite3.Connection], T], *, fsync: bool = True) -> T:
        """``work`` in one immediate (write-locked) transaction, committed or rolled back. ``fsync=False``: the
        commit is not fsynced (in the OS, not yet on the disk); the caller has ``wal_sync`` do it."""
        with self._lock:
            db = self._conn
            if db is None:
                raise StoreError("the store is closed")
            if not fsync:
                db.execute("PRAGMA synchronous=NORMAL")
            try:
                db.execute("BEGIN IMMEDIATE")
                try:
                    result = work(db)
                except BaseException:
                    db.execute("ROLLBACK")
                    raise
                db.execute("COMMIT")
            finally:
                if not fsync:
                    db.execute("PRAGMA synchronous=FULL")
            return result

    def _read(self, work: Callable[[sqlite3.Connection], T]) -> T:
        with self._lock:
            db = self._conn
            if db is None:
                raise StoreError("the store is closed")
            return work(db)

    async def _write(self, work: Callable[[sqlite3.Connection], T]) -> T:
        try:
            return await anyio.to_thread.run_sync(self._tx, work, limiter=self._limiter)
        except sqlite3.Error as exc:
            raise StoreError(f"store write failed: {exc}") from None

    async def _query(self, work: Callable[[sqlite3.Connection], T]) -> T:
        try:
            return await anyio.to_thread.run_sync(self._read, work, limiter=self._limiter)
        except sqlite3.Error as exc:
            raise StoreError(f"store read failed: {exc}") from None

    async def close(self) -> None:
        def close() -> None:
            self.wal_sync.close()  # the journal's last commits on the disk first
            with self._lock:
                if self._conn is not None:
                    self._conn.close()
                    self._conn = None

        await anyio.to_thread.run_sync(close, limiter=self._limiter)

    @staticmethod
    def _fenced(db: sqlite3.Connection, fence: Fence | None) -> None:
        if fence is None:
            return
        row = db.execute("SELECT holder, token FROM leases WHERE session = ?", (fence.session,)).fetchone()
        if row is None or row[0] is None or row[1] != fence.token:
            raise StaleLease(f"session {fence.session}: fencing token {fence.token} is stale "
                             f"(the session's lease is {'free' if row is None or row[0] is None else f'token {row[1]}'})")

    # sessions

    async def put_session(self, record: SessionRecord, *, fence: Fence | None = None) -> None:
        if fence is not None and fence.session != record.handle:
            raise StaleLease(f"a fence of session {fence.session} cannot write session {record.handle}")
        now = time.time()

        def put(db: sqlite3.Connection) -> None:
            self._fenced(db, fence)
            db.execute(
                """INSERT INTO sessions (handle, owner, working_dir, environment, profile, local_slot, gateway_kernel_id, created, updated, closed)
                   VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
                   ON CONFLICT (handle) DO UPDATE SET working_dir = excluded.working_dir, environment = excluded.environment,
                   profile = excluded.profile, local_slot = excluded.local_slot, gateway_kernel_id = excluded.gateway_kernel_id,
                   updated = excluded.updated, closed = coalesce(sessions.closed, excluded.closed)""",
                (record.handle, record.owner, record.working_dir, record.environment, record.profile, record.local_slot,
                 record.gateway_kernel_id, record.created or now, now, record.closed))

        await self._write(put)

    async def get_session(self, handle: str, *, owner: str | None) -> SessionRecord | None:
        row = await self._query(lambda db: db.execute(f"SELECT {SESSION_COLUMNS} FROM sessions WHERE handle = ?", (handle,)).fetchone())
        found = session_row(row) if row is not None else None
        return found if found is not None and visible(found.owner, owner) else None

    async def list_sessions(self, *, owner: str | None) -> list[SessionRecord]:
        rows = await self._query(lambda db: db.execute(f"SELECT {SESSION_COLUMNS} FROM sessions ORDER BY created, handle").fetchall())
        return [s for s in map(session_row, rows) if visible(s.owner, owner)]

    async def delete_session(self, handle: str, *, fence: Fence | None = None) -> None:
        def delete(db: sqlite3.Connection) -> None:
            self._fenced(db, fence)
            db.execute("DELETE FROM sessions WHERE handle = ?", (handle,))

        await self._write(delete)

    # runs

    async def put_run(self, record: RunRecord, *, fence: Fence | None = None) -> None:
        if record.state not in RUN_STATES:
            raise StoreError(f"not a run state: {record.state!r}")
        if fence is not None and fence.session != record.session:
            raise StaleLease(f"a fence of session {fence.session} cannot write a run of session {record.session}")
        now = time.time()
        answer = dumps(record.answer) if record.answer is not None else None

        def put(db: sqlite3.Connection) -> None:
            self._fenced(db, fence)
            db.execute(
                """INSERT INTO runs (id, session, owner, state, answer, created, updated, holder, resume) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)
                   ON CONFLICT (id) DO UPDATE SET state = excluded.state, answer = excluded.answer, updated = excluded.updated,
                   holder = coalesce(excluded.holder, runs.holder), resume = coalesce(excluded.resume, runs.resume)
                   WHERE ? OR excluded.holder IS NULL OR runs.holder IS NULL OR runs.holder = excluded.holder""",
                (record.id, record.session, record.owner, record.state, answer, record.created or now, now, record.holder,
                 dumps(record.resume) if record.resume is not None else None, fence is not None))

        await self._write(put)

    async def get_run(self, run_id: str, *, owner: str | None) -> RunRecord | None:
        row = await self._query(lambda db: db.execute(f"SELECT {RUN_COLUMNS} FROM runs WHERE id = ?", (run_id,)).fetchone())
        found = run_row(row) if row is not None else None
        return found if found is not None and visible(found.owner, owner) else None

    async def runs_of(self, session: str, *, owner: str | None) -> list[RunRecord]:
        rows = await self._query(lambda db: db.execute(f"SELECT {RUN_COLUMNS} FROM runs WHERE session = ? ORDER BY created, id", (session,)).fetchall())
        return [r for r in map(run_row, rows) if visible(r.owner, owner)]

    async def lose_unfinished(self, *, session: str | None = None) -> int:
        now = time.time()
        marks = ", ".join("?" for _ in UNFINISHED)
        where = f"state IN ({marks})" + (" AND session = ?" if session is not None else "")
        params: tuple[Any, ...] = (now, *UNFINISHED, *((session,) if session is not None else ()))
        return await self._write(lambda db: db.execute(f"UPDATE runs SET state = 'lost', updated = ? WHERE {where}", params).rowcount)

    async def lose_run(self, run_id: str, *, fence: Fence) -> bool:
        marks = ", ".join("?" for _ in UNFINISHED)

        def lose(db: sqlite3.Connection) -> bool:
            self._fenced(db, fence)
            return bool(db.execute(f"UPDATE runs SET state = 'lost', updated = ? WHERE id = ? AND session = ? AND state IN ({marks})",
                                   (time.time(), run_id, fence.session, *UNFINISHED)).rowcount)

        return bool(await self._write(lose))

    async def delete_run(self, run_id: str, *, holder: str | None = None) -> None:
        await self._write(lambda db: db.execute("DELETE FROM runs WHERE id = ? AND (? IS NULL OR holder IS NULL OR holder = ?)",
                                                (run_id, holder, holder)))

    async def prune_runs(self, *, owner: str | None, keep: int) -> int:
        return await self._write(lambda db: db.execute(
            """DELETE FROM runs WHERE id IN (SELECT id FROM runs WHERE owner IS ? AND state IN ('finished', 'failed', 'lost')
               ORDER BY updated DESC, id DESC LIMIT -1 OFFSET ?)""", (owner, max(0, keep))).rowcount)

    # tasks

    async def put_task(self, record: TaskRecord) -> None:
        now = time.time()
        await self._write(lambda db: db.execute(
            """INSERT INTO tasks (id, owner, run_id, ttl_s, status, created, updated) VALUES (?, ?, ?, ?, ?, ?, ?)
               ON CONFLICT (id) DO UPDATE SET status = excluded.status, ttl_s = excluded.ttl_s, updated = excluded.updated""",
            (record.id, record.owner, record.run_id, record.ttl_s, record.status, record.created or now, record.updated or now)))

    async def get_task(self, task_id: str, *, owner: str | None) -> TaskRecord | None:
        row = await self._query(lambda db: db.execute(f"SELECT {TASK_COLUMNS} FROM tasks WHERE id = ?", (task_id,)).fetchone())
        found = task_row(row) if row is not None else None
        return found if found is not None and visible(found.owner, owner) else None

    # questions

    async def put_question(self, record: QuestionRecord, *, fence: Fence | None = None) -> None:
        now = time.time()

        def put(db: sqlite3.Connection) -> None:
            self._fenced(db, fence)
            db.execute(
                """INSERT INTO questions (id, run_id, prompt, password, approval, answerer, answered, created)
                   VALUES (?, ?, ?, ?, ?, ?, ?, ?)""",
                (record.id, record.run_id, record.prompt, record.password, record.approval, record.answerer, record.answered,
                 record.created or now))

        try:
            await self._write(put)
        except StaleLease:
            raise
        except StoreError as exc:
            raise StoreError(f"question {record.id} exists already: {exc}") from None

    async def get_question(self, question_id: str, *, owner: str | None) -> QuestionRecord | None:
        row = await self._query(lambda db: db.execute(f"SELECT {QUESTION_COLUMNS} FROM questions WHERE id = ?", (question_id,)).fetchone())
        found = question_row(row) if row is not None else None
        return found if found is not None and visible(found.answerer, owner) else None

    async def answer_question(self, question_id: str, *, by: str | None) -> QuestionRecord:
        def answer(db: sqlite3.Connection) -> QuestionRecord:
            row = db.execute(f"SELECT {QUESTION_COLUMNS} FROM questions WHERE id = ?", (question_id,)).fetchone()
            found = question_row(row) if row is not None else None
            if found is None or not visible(found.answerer, by):
                raise StoreError(f"unknown question {question_id[:80]!r}")
            if found.answered:
                raise AlreadyAnswered(f"question {question_id} was answered already")
            db.execute("UPDATE questions SET answered = 1 WHERE id = ? AND answered = 0", (question_id,))
            return QuestionRecord(**{**found.__dict__, "answered": True})

        return await self._write(answer)

    # asks

    async def ask(self, record: AskRecord) -> None:
        await self._write(lambda db: db.execute(
            f"INSERT INTO asks ({ASK_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?)",
            (record.run_id, record.kind, record.owner, record.question_id, record.text, record.channel, record.created or time.time())))

    async def take_asks(self, run_ids: Collection[str]) -> list[AskRecord]:
        ids = list(run_ids)
        if not ids:
            return []

        def take(db: sqlite3.Connection) -> list[AskRecord]:
            marks = ", ".join("?" * len(ids))
            rows = db.execute(f"SELECT seq, {ASK_COLUMNS} FROM asks WHERE run_id IN ({marks}) ORDER BY seq", ids).fetchall()
            db.executemany("DELETE FROM asks WHERE seq = ?", [(row[0],) for row in rows])
            return [AskRecord(*row[1:]) for row in rows]

        return await self._write(take)

    # grants

    async def put_grant(self, record: GrantRecord) -> None:
        await self._write(lambda db: db.execute(
            f"INSERT INTO grants ({GRANT_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?)",
            (record.digest, record.kind, record.owner, record.session, record.expires, dumps(record.caps), record.used)))

    async def get_grant(self, digest: str) -> GrantRecord | None:
        row = await self._query(lambda db: db.execute(f"SELECT {GRANT_COLUMNS} FROM grants WHERE digest = ?", (digest,)).fetchone())
        return grant_row(row) if row is not None else None

    async def use_grant(self, digest: str) -> GrantRecord | None:
        def use(db: sqlite3.Connection) -> GrantRecord | None:
            row = db.execute(f"SELECT {GRANT_COLUMNS} FROM grants WHERE digest = ? AND used = 0", (digest,)).fetchone()
            if row is not None:
                db.execute("UPDATE grants SET used = 1 WHERE digest = ?", (digest,))
            return grant_row(row) if row is not None else None

        return await self._write(use)

    # reservations

    async def reserve(self, record: Reservation, *, limit: int) -> bool:
        def reserve(db: sqlite3.Connection) -> bool:  # BEGIN IMMEDIATE: no other process counts meanwhile
            return bool(db.execute(
                f"""INSERT INTO reservations (key, budget, amount, expires, holder) SELECT ?, ?, ?, ?, ?
                    WHERE {LIVE_RESERVED} + ? <= ?""",
                (record.key, record.budget, record.amount, record.expires, record.holder, record.budget, time.time(),
                 time.time(), record.amount, limit)).rowcount)

        return await self._write(reserve)

    async def release(self, key: str) -> None:
        await self._write(lambda db: db.execute("DELETE FROM reservations WHERE key = ?", (key,)))

    async def reserved(self, budget: str) -> int:
        row = await self._query(lambda db: db.execute(f"SELECT {LIVE_RESERVED}", (budget, time.time(), time.time())).fetchone())
        return int(row[0])

    # pruning

    async def prune(self, *, ended_before: float, expired_before: float, limit: int) -> dict[str, int]:
        now = time.time()
        unfinished = ", ".join(f"'{s}'" for s in UNFINISHED)
        statements = {
            "asks": (f"""DELETE FROM asks WHERE seq IN (SELECT a.seq FROM asks a WHERE a.created < ? AND NOT EXISTS
                         (SELECT 1 FROM runs r WHERE r.id = a.run_id AND r.state IN ({unfinished})) ORDER BY a.created LIMIT ?)""",
                     (ended_before, limit)),
            "questions": (f"""DELETE FROM questions WHERE id IN (SELECT q.id FROM questions q WHERE q.created < ? AND NOT EXISTS
                              (SELECT 1 FROM runs r WHERE r.id = q.run_id AND r.state IN ({unfinished})) ORDER BY q.created LIMIT ?)""",
                          (ended_before, limit)),
            "grants": ("DELETE FROM grants WHERE digest IN (SELECT digest FROM grants WHERE expires < ? ORDER BY expires LIMIT ?)",
                       (expired_before, limit)),
            "tasks": ("DELETE FROM tasks WHERE id IN (SELECT id FROM tasks WHERE created + ttl_s < ? ORDER BY created + ttl_s LIMIT ?)",
                      (now, limit)),
            "reservations": ("DELETE FROM reservations WHERE key IN (SELECT key FROM reservations WHERE expires < ? "
                             "ORDER BY expires LIMIT ?)", (now, limit)),
            "replicas": ("DELETE FROM leases WHERE session IN (SELECT session FROM leases WHERE substr(session, 1, 8) = 'replica:' "
                         "AND (holder IS NULL OR expires < ?) AND expires < ? LIMIT ?)",
                         (now, expired_before, limit)),
        }

        def prune(db: sqlite3.Connection) -> dict[str, int]:
            return {table: db.execute(sql, params).rowcount for table, (sql, params) in statements.items()}

        return await self._write(prune)

    # leases

    async def acquire_lease(self, session: str, holder: str, ttl_s: float) -> Lease | None:
        def acquire(db: sqlite3.Connection) -> Lease | None:
            now = time.time()
            row = db.execute("SELECT holder, token, expires FROM leases WHERE session = ?", (session,)).fetchone()
            live = row is not None and row[0] is not None and row[2] > now
            if live and row[0] != holder:
                return None
            token = row[1] if live else (row[1] if row is not None else 0) + 1  # its own live lease: the same token
            taken = row[0] if row is not None and row[0] is not None and not live and row[0] != holder else None
            lease = Lease(session, holder, token, now + ttl_s, taken_from=taken)
            db.execute("""INSERT INTO leases (session, holder, token, expires) VALUES (?, ?, ?, ?)
                          ON CONFLICT (session) DO UPDATE SET holder = excluded.holder, token = excluded.token, expires = excluded.expires""",
                       (lease.session, lease.holder, lease.token, lease.expires))
            return lease

        return await self._write(acquire)

    async def renew_lease(self, lease: Lease, ttl_s: float) -> Lease | None:
        def renew(db: sqlite3.Connection) -> Lease | None:
            expires = time.time() + ttl_s
            done = db.execute("UPDATE leases SET expires = ? WHERE session = ? AND holder = ? AND token = ?",
                              (expires, lease.session, lease.holder, lease.token)).rowcount
            return Lease(lease.session, lease.holder, lease.token, expires) if done else None

        return await self._write(renew)

    async def release_lease(self, lease: Lease) -> bool:
        return bool(await self._write(lambda db: db.execute(
            "UPDATE leases SET holder = NULL, expires = ? WHERE session = ? AND holder = ? AND token = ?",
            (time.time(), lease.session, lease.holder, lease.token)).rowcount))

    async def idle_sessions(self, idle_s: float) -> list[SessionRecord]:
        rows = await self._query(lambda db: db.execute(
            f"""SELECT {', '.join('s.' + c.strip() for c in SESSION_COLUMNS.split(','))} FROM sessions s JOIN leases l
                ON l.session = s.handle WHERE s.closed IS NULL AND s.gateway_kernel_id IS NOT NULL AND l.expires < ?
                ORDER BY l.expires""", (time.time() - idle_s,)).fetchall())
        return [session_row(row) for row in rows]

    async def current_lease(self, session: str) -> Lease | None:
        row = await self._query(lambda db: db.execute("SELECT session, holder, token, expires FROM leases WHERE session = ?",
                                                      (session,)).fetchone())
        if row is None or row[1] is None or row[3] <= time.time():
            return None
        return Lease(*row)

    async def live_leases(self, prefix: str) -> list[Lease]:
        rows = await self._query(lambda db: db.execute(
            "SELECT session, holder, token, expires FROM leases WHERE substr(session, 1, ?) = ? AND holder IS NOT NULL "
            "AND expires > ? ORDER BY session", (len(prefix), prefix, time.time())).fetchall())
        return [Lease(*row) for row in rows]

    # the journal

    async def append_journal(self, session: str, record: dict[str, Any], *, fence: Fence | None = None) -> int:
        return await anyio.to_thread.run_sync(lambda: self.append_journal_sync(session, record, fence=fence), limiter=self._limiter)

    def append_journal_sync(self, session: str, record: dict[str, Any], *, fence: Fence | None = None) -> int:
        """``append_journal`` from a worker thread (the Recorder's, which writes a cell off the event loop): one
        transaction, without a hop through the event loop; in the OS when it returns (a kill of the server keeps
        it), fsynced a moment later by ``wal_sync``, off the call's path."""
        if fence is not None and fence.session != session:
            raise StaleLease(f"a fence of session {fence.session} cannot write session {session}'s journal")
        text = dumps(record)

        def append(db: sqlite3.Connection) -> int:
            self._fenced(db, fence)
            seq: int = db.execute("SELECT coalesce(max(seq), 0) + 1 FROM journal WHERE session = ?", (session,)).fetchone()[0]
            db.execute("INSERT INTO journal (session, seq, record) VALUES (?, ?, ?)", (session, seq, text))
            return seq

        try:
            seq = self._tx(append, fsync=False)
        except sqlite3.Error as exc:
            raise StoreError(f"store write failed: {exc}") from None
        self.wal_sync.due()
        return seq

    async def journal_counts(self) -> dict[str, int]:
        rows = await self._query(lambda db: db.execute("SELECT session, max(seq) FROM journal GROUP BY session").fetchall())
        return {session: count for session, count in rows}

    async def session_handles(self) -> set[str]:
        rows = await self._query(lambda db: db.execute("SELECT handle FROM sessions").fetchall())
        return {handle for (handle,) in rows}

    async def journal(self, session: str, *, after: int = 0) -> list[JournalEntry]:
        rows = await self._query(lambda db: db.execute("SELECT session, seq, record FROM journal WHERE session = ? AND seq > ? ORDER BY seq",
                                                       (session, after)).fetchall())
        return [JournalEntry(s, q, json.loads(r)) for s, q, r in rows]


def session_row(row: tuple[Any, ...]) -> SessionRecord:
    handle, owner, working_dir, environment, profile, local_slot, gateway_kernel_id, created, updated, closed = row
    return SessionRecord(handle, owner, working_dir, environment, profile, local_slot, gateway_kernel_id, created, updated, closed)


def run_row(row: tuple[Any, ...]) -> RunRecord:
    run_id, session, owner, state, answer, created, updated, holder, resume = row
    return RunRecord(run_id, session, owner, state, json.loads(answer) if answer is not None else None, created, updated, holder,
                     json.loads(resume) if resume is not None else None)


def task_row(row: tuple[Any, ...]) -> TaskRecord:
    return TaskRecord(*row)


def grant_row(row: tuple[Any, ...]) -> GrantRecord:
    digest, kind, owner, session, expires, caps, used = row
    return GrantRecord(digest, kind, owner, session, expires, json.loads(caps), bool(used))


def question_row(row: tuple[Any, ...]) -> QuestionRecord:
    qid, run_id, prompt, password, approval, answerer, answered, created = row
    return QuestionRecord(qid, run_id, prompt, bool(password), bool(approval), answerer, bool(answered), created)
