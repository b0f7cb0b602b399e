"""The store for a fleet: PostgreSQL through psycopg 3 (async), ``--store postgresql://user:pass@host/db``.

psycopg is an extra (``pip install 'kernelexec[postgres]'``), imported only when a PostgreSQL store opens.
One connection per process, one transaction per call (an ``anyio.Lock`` keeps this process's calls in
turn); checks and their writes are made atomic against other processes by row locks (``FOR UPDATE`` on the
lease, the question) and a per-session advisory lock (the journal's next number). Lease times are the
database's clock, so processes on different hosts agree on expiry. The schema is created and migrated at
open under an advisory lock (two servers starting together migrate once), recorded in ``schema_version``.
JSON is stored as ``json`` (text kept as written: key order, and the NUL characters ``jsonb`` refuses).

The URL's password never leaves this module: ``url`` and ``repr`` show it redacted, and every driver
message is scrubbed before it becomes a ``StoreError`` (raised ``from None``: no chained driver exception).
"""

from __future__ import annotations

import json
import time
from collections.abc import Collection
from typing import Any

import anyio

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
    redacted,
    scrubbed,
    visible,
)
from kernelexec.store.sqlite import (
    ASK_COLUMNS,
    GRANT_COLUMNS,
    QUESTION_COLUMNS,
    SESSION_COLUMNS,
    TASK_COLUMNS,
    dumps,
    grant_row,
    question_row,
    run_row,
    session_row,
    task_row,
)

IDLE_TX_MS = 3000  # ms PostgreSQL lets a transaction of ours sit idle: less than a lease's 5 s (session/fleet.py)
RUN_COLUMNS = "id, session, owner, state, answer::text, created, updated, holder, resume::text"
MIGRATION_LOCK = 0x6B65_7865  # pg_advisory_xact_lock key: "kexe"

_STATES = ", ".join(f"'{s}'" for s in RUN_STATES)
MIGRATIONS: dict[int, list[str]] = {
    1: [
        """CREATE TABLE sessions (handle TEXT PRIMARY KEY, owner TEXT, working_dir TEXT NOT NULL, environment TEXT NOT NULL,
           profile TEXT NOT NULL, local_slot TEXT, gateway_kernel_id TEXT, created DOUBLE PRECISION NOT NULL,
           updated DOUBLE PRECISION NOT NULL, CHECK (local_slot IS NULL OR gateway_kernel_id IS NULL))""",
        f"""CREATE TABLE runs (id TEXT PRIMARY KEY, session TEXT NOT NULL, owner TEXT, state TEXT NOT NULL CHECK (state IN ({_STATES})),
           answer JSON, created DOUBLE PRECISION NOT NULL, updated DOUBLE PRECISION NOT NULL)""",
        "CREATE INDEX runs_by_session ON runs (session)",
        "CREATE INDEX runs_by_state ON runs (state)",
        """CREATE TABLE tasks (id TEXT PRIMARY KEY, owner TEXT, run_id TEXT, ttl_s DOUBLE PRECISION NOT NULL, status TEXT NOT NULL,
           created DOUBLE PRECISION NOT NULL, updated DOUBLE PRECISION NOT NULL)""",
        """CREATE TABLE questions (id TEXT PRIMARY KEY, run_id TEXT NOT NULL, prompt TEXT NOT NULL, password BOOLEAN NOT NULL,
           approval BOOLEAN NOT NULL, answerer TEXT, answered BOOLEAN NOT NULL DEFAULT false, created DOUBLE PRECISION NOT NULL)""",
        "CREATE INDEX questions_by_run ON questions (run_id)",
        "CREATE TABLE leases (session TEXT PRIMARY KEY, holder TEXT, token BIGINT NOT NULL, expires DOUBLE PRECISION NOT NULL)",
        "CREATE TABLE journal (session TEXT NOT NULL, seq BIGINT NOT NULL, record JSON NOT NULL, PRIMARY KEY (session, seq))",
    ],
    2: ["ALTER TABLE sessions ADD COLUMN closed DOUBLE PRECISION"],
    3: ["""CREATE TABLE asks (seq BIGSERIAL PRIMARY KEY, run_id TEXT NOT NULL, kind TEXT NOT NULL, owner TEXT,
           question_id TEXT, text TEXT, channel TEXT NOT NULL, created DOUBLE PRECISION NOT NULL)""",
        "CREATE INDEX asks_by_run ON asks (run_id)",
        """CREATE TABLE grants (digest TEXT PRIMARY KEY, kind TEXT NOT NULL, owner TEXT, session TEXT NOT NULL,
           expires DOUBLE PRECISION NOT NULL, caps TEXT NOT NULL, used BOOLEAN NOT NULL DEFAULT false)"""],
    4: ["ALTER TABLE runs ADD COLUMN holder TEXT"],
    5: ["ALTER TABLE runs ADD COLUMN resume JSON"],
    6: ["""CREATE TABLE reservations (key TEXT PRIMARY KEY, budget TEXT NOT NULL, amount BIGINT NOT NULL,
           expires DOUBLE PRECISION NOT NULL, holder TEXT)""",
        "CREATE INDEX reservations_by_budget ON reservations (budget, expires)",
        "CREATE INDEX reservations_by_expiry ON reservations (expires)",
        "CREATE INDEX asks_by_created ON asks (created)",  # pruning (Store.prune): each kind by its age, in batches
        "CREATE INDEX questions_by_created ON questions (created)",
        "CREATE INDEX grants_by_expiry ON grants (expires)",
        "CREATE INDEX tasks_by_expiry ON tasks ((created + ttl_s))"],
}
assert max(MIGRATIONS) == SCHEMA_VERSION

NOW = "extract(epoch from clock_timestamp())::float8"
# a budget's live reservations (params: budget): unexpired, and no holder or a holder replica whose lease is live
LIVE_RESERVED = f"""(SELECT coalesce(sum(amount), 0) FROM reservations v WHERE v.budget = %(budget)s AND v.expires > %(now)s
    AND (v.holder IS NULL OR EXISTS (SELECT 1 FROM leases l WHERE l.session = v.holder AND l.holder IS NOT NULL
    AND l.expires > {NOW})))"""
RESERVE_LOCK = 0x6B65_7872  # pg_advisory_xact_lock's first key for a budget ("kexr"; the second: the budget's hash)


class PostgresStore:
    """The ``Store`` in a PostgreSQL database. Open with ``await PostgresStore.open(url)``."""

    def __init__(self, url: str, conn: Any) -> None:
        self._url = url
        self._conn: Any = conn
        self._lock = anyio.Lock()

    def __repr__(self) -> str:
        return f"PostgresStore({self.url!r})"

    @property
    def url(self) -> str:
        return redacted(self._url)

    def _error(self, exc: BaseException, doing: str) -> StoreError:
        return StoreError(f"{doing} ({self.url}): {scrubbed(str(exc).strip(), self._url)}")

    @staticmethod
    async def _connect(url: str) -> Any:
        try:
            import psycopg
        except ImportError:
            raise StoreError("a PostgreSQL store needs psycopg: pip install 'kernelexec[postgres]'") from None
        try:
            # a transaction left open (its process paused mid-way) is ended by the server before a lease runs out
            return await psycopg.AsyncConnection.connect(url, autocommit=True, connect_timeout=10, application_name="kernelexec",
                                                         options=f"-c idle_in_transaction_session_timeout={IDLE_TX_MS}")
        except (psycopg.Error, ValueError) as exc:  # ValueError: a malformed URL, whose text holds the password
            raise StoreError(f"cannot open the store {redacted(url)}: {scrubbed(str(exc).strip(), url)}") from None

    @classmethod
    async def open(cls, url: str) -> PostgresStore:
        conn = await cls._connect(url)
        store = cls(url, conn)
        try:
            await store._migrate()
        except BaseException:
            await conn.close()
            raise
        return store

    async def _run(self, work: Any, doing: str, *, single: bool = False) -> Any:
        """``await work(cursor)`` in one transaction; driver errors become scrubbed ``StoreError``s. ``single``: the
        work is one statement, its own transaction (autocommit): no BEGIN and COMMIT round trips."""
        import psycopg

        async with self._lock:
            if self._conn is None:
                raise StoreError("the store is closed")
            if self._conn.closed:  # the connection was lost (a failed call said so): a new one. A call is never
                self._conn = await self._connect(self._url)  # retried: whether a lost commit happened is unknown
            try:
                if single:
                    async with self._conn.cursor() as cur:
                        return await work(cur)
                async with self._conn.transaction(), self._conn.cursor() as cur:
                    return await work(cur)
            except psycopg.Error as exc:
                raise self._error(exc, doing) from None

    async def _migrate(self) -> None:
        async def migrate(cur: Any) -> None:
            await cur.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,))
            await cur.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")
            await cur.execute("SELECT max(version) FROM schema_version")
            found = (await cur.fetchone())[0] or 0
            if found > SCHEMA_VERSION:
                raise StoreError(f"the store {self.url} has schema version {found}, newer than this kernelexec's "
                                 f"({SCHEMA_VERSION}): upgrade kernelexec")
            for version in range(found + 1, SCHEMA_VERSION + 1):
                for statement in MIGRATIONS[version]:
                    await cur.execute(statement)
                await cur.execute("INSERT INTO schema_version (version) VALUES (%s)", (version,))

        await self._run(migrate, "cannot create the store's schema")

    async def close(self) -> None:
        async with self._lock:
            if self._conn is not None:
                await self._conn.close()
                self._conn = None

    @staticmethod
    async def _fenced(cur: Any, fence: Fence | None) -> None:
        if fence is None:
            return
        await cur.execute("SELECT holder, token FROM leases WHERE session = %s FOR SHARE", (fence.session,))
        row = await cur.fetchone()
        if row is None or row[0] is None or row[1] != fence.token:
            raise StaleLease(f"session {fence.session}: fencing token {fence.token} is stale "
                             f"(the session's lease is {'free' if row is None or row[0] is None else f'token {row[1]}'})")

    async def _one(self, sql: str, params: tuple[Any, ...] | dict[str, Any], doing: str) -> Any:
        async def one(cur: Any) -> Any:
            await cur.execute(sql, params)
            return await cur.fetchone()

        return await self._run(one, doing)

    async def _all(self, sql: str, params: tuple[Any, ...], doing: str) -> list[Any]:
        async def rows(cur: Any) -> list[Any]:
            await cur.execute(sql, params)
            return list(await cur.fetchall())

        result: list[Any] = await self._run(rows, doing)
        return result

    # sessions

    async def put_session(self, record: SessionRecord, *, fence: Fence | None = None) -> None:
        if fence is not None and fence.session != record.handle:
            raise StaleLease(f"a fence of session {fence.session} cannot write session {record.handle}")
        now = time.time()

        async def put(cur: Any) -> None:
            await self._fenced(cur, fence)
            await cur.execute(
                """INSERT INTO sessions (handle, owner, working_dir, environment, profile, local_slot, gateway_kernel_id, created, updated, closed)
                   VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s)
                   ON CONFLICT (handle) DO UPDATE SET working_dir = excluded.working_dir, environment = excluded.environment,
                   profile = excluded.profile, local_slot = excluded.local_slot, gateway_kernel_id = excluded.gateway_kernel_id,
                   updated = excluded.updated, closed = coalesce(sessions.closed, excluded.closed)""",
                (record.handle, record.owner, record.working_dir, record.environment, record.profile, record.local_slot,
                 record.gateway_kernel_id, record.created or now, now, record.closed))

        await self._run(put, "cannot write the session")

    async def get_session(self, handle: str, *, owner: str | None) -> SessionRecord | None:
        row = await self._one(f"SELECT {SESSION_COLUMNS} FROM sessions WHERE handle = %s", (handle,), "cannot read the session")
        found = session_row(row) if row is not None else None
        return found if found is not None and visible(found.owner, owner) else None

    async def list_sessions(self, *, owner: str | None) -> list[SessionRecord]:
        rows = await self._all(f"SELECT {SESSION_COLUMNS} FROM sessions ORDER BY created, handle", (), "cannot read the sessions")
        return [s for s in map(session_row, rows) if visible(s.owner, owner)]

    async def delete_session(self, handle: str, *, fence: Fence | None = None) -> None:
        async def delete(cur: Any) -> None:
            await self._fenced(cur, fence)
            await cur.execute("DELETE FROM sessions WHERE handle = %s", (handle,))

        await self._run(delete, "cannot delete the session")

    # runs

    async def put_run(self, record: RunRecord, *, fence: Fence | None = None) -> None:
        if record.state not in RUN_STATES:
            raise StoreError(f"not a run state: {record.state!r}")
        if fence is not None and fence.session != record.session:
            raise StaleLease(f"a fence of session {fence.session} cannot write a run of session {record.session}")
        now = time.time()
        answer = dumps(record.answer) if record.answer is not None else None

        async def put(cur: Any) -> None:
            await self._fenced(cur, fence)
            await cur.execute(
                """INSERT INTO runs (id, session, owner, state, answer, created, updated, holder, resume)
                   VALUES (%s, %s, %s, %s, %s::json, %s, %s, %s, %s::json)
                   ON CONFLICT (id) DO UPDATE SET state = excluded.state, answer = excluded.answer, updated = excluded.updated,
                   holder = coalesce(excluded.holder, runs.holder), resume = coalesce(excluded.resume, runs.resume)
                   WHERE %s OR excluded.holder IS NULL OR runs.holder IS NULL OR runs.holder = excluded.holder""",
                (record.id, record.session, record.owner, record.state, answer, record.created or now, now, record.holder,
                 dumps(record.resume) if record.resume is not None else None, fence is not None))

        await self._run(put, "cannot write the run", single=fence is None)

    async def get_run(self, run_id: str, *, owner: str | None) -> RunRecord | None:
        row = await self._one(f"SELECT {RUN_COLUMNS} FROM runs WHERE id = %s", (run_id,), "cannot read the run")
        found = run_row(row) if row is not None else None
        return found if found is not None and visible(found.owner, owner) else None

    async def runs_of(self, session: str, *, owner: str | None) -> list[RunRecord]:
        rows = await self._all(f"SELECT {RUN_COLUMNS} FROM runs WHERE session = %s ORDER BY created, id", (session,), "cannot read the runs")
        return [r for r in map(run_row, rows) if visible(r.owner, owner)]

    async def lose_unfinished(self, *, session: str | None = None) -> int:
        async def lose(cur: Any) -> int:
            await cur.execute(
                "UPDATE runs SET state = 'lost', updated = %s WHERE state = ANY(%s) AND (%s::text IS NULL OR session = %s)",
                (time.time(), list(UNFINISHED), session, session))
            count: int = cur.rowcount
            return count

        result: int = await self._run(lose, "cannot mark the unfinished runs lost")
        return result

    async def lose_run(self, run_id: str, *, fence: Fence) -> bool:
        async def lose(cur: Any) -> bool:
            await self._fenced(cur, fence)
            await cur.execute("UPDATE runs SET state = 'lost', updated = %s WHERE id = %s AND session = %s AND state = ANY(%s)",
                              (time.time(), run_id, fence.session, list(UNFINISHED)))
            return bool(cur.rowcount)

        result: bool = await self._run(lose, "cannot mark the run lost")
        return result

    async def delete_run(self, run_id: str, *, holder: str | None = None) -> None:
        async def delete(cur: Any) -> None:
            await cur.execute("DELETE FROM runs WHERE id = %s AND (%s::text IS NULL OR holder IS NULL OR holder = %s)",
                              (run_id, holder, holder))

        await self._run(delete, "cannot forget a run", single=True)

    async def prune_runs(self, *, owner: str | None, keep: int) -> int:
        async def prune(cur: Any) -> int:
            await cur.execute(
                """DELETE FROM runs WHERE id IN (SELECT id FROM runs WHERE owner IS NOT DISTINCT FROM %s
                   AND state IN ('finished', 'failed', 'lost') ORDER BY updated DESC, id DESC OFFSET %s)""",
                (owner, max(0, keep)))
            count: int = cur.rowcount
            return count

        result: int = await self._run(prune, "cannot prune the kept runs", single=True)
        return result

    # tasks

    async def put_task(self, record: TaskRecord) -> None:
        now = time.time()

        async def put(cur: Any) -> None:
            await cur.execute(
                """INSERT INTO tasks (id, owner, run_id, ttl_s, status, created, updated) VALUES (%s, %s, %s, %s, %s, %s, %s)
                   ON CONFLICT (id) DO UPDATE SET status = excluded.status, ttl_s = excluded.ttl_s, updated = excluded.updated""",
                (record.id, record.owner, record.run_id, record.ttl_s, record.status, record.created or now, record.updated or now))

        await self._run(put, "cannot write the task")

    async def get_task(self, task_id: str, *, owner: str | None) -> TaskRecord | None:
        row = await self._one(f"SELECT {TASK_COLUMNS} FROM tasks WHERE id = %s", (task_id,), "cannot read the task")
        found = task_row(row) if row is not None else None
        return found if found is not None and visible(found.owner, owner) else None

    # questions

    async def put_question(self, record: QuestionRecord, *, fence: Fence | None = None) -> None:
        async def put(cur: Any) -> None:
            await self._fenced(cur, fence)
            await cur.execute(
                """INSERT INTO questions (id, run_id, prompt, password, approval, answerer, answered, created)
                   VALUES (%s, %s, %s, %s, %s, %s, %s, %s)""",
                (record.id, record.run_id, record.prompt, record.password, record.approval, record.answerer, record.answered,
                 record.created or time.time()))

        await self._run(put, f"cannot write question {record.id}")

    async def get_question(self, question_id: str, *, owner: str | None) -> QuestionRecord | None:
        row = await self._one(f"SELECT {QUESTION_COLUMNS} FROM questions WHERE id = %s", (question_id,), "cannot read the question")
        found = question_row(row) if row is not None else None
        return found if found is not None and visible(found.answerer, owner) else None

    async def answer_question(self, question_id: str, *, by: str | None) -> QuestionRecord:
        async def answer(cur: Any) -> QuestionRecord:
            await cur.execute(f"SELECT {QUESTION_COLUMNS} FROM questions WHERE id = %s FOR UPDATE", (question_id,))
            row = await cur.fetchone()
            found = question_row(row) if row is not None else None
            if found is None or not visible(found.answerer, by):
                raise StoreError(f"unknown question {question_id[:80]!r}")
            if found.answered:
                raise AlreadyAnswered(f"question {question_id} was answered already")
            await cur.execute("UPDATE questions SET answered = true WHERE id = %s AND NOT answered", (question_id,))
            return QuestionRecord(**{**found.__dict__, "answered": True})

        result: QuestionRecord = await self._run(answer, "cannot answer the question")
        return result

    # asks

    async def ask(self, record: AskRecord) -> None:
        async def put(cur: Any) -> None:
            await cur.execute(f"INSERT INTO asks ({ASK_COLUMNS}) VALUES (%s, %s, %s, %s, %s, %s, %s)",
                              (record.run_id, record.kind, record.owner, record.question_id, record.text, record.channel,
                               record.created or time.time()))

        await self._run(put, "cannot write the ask", single=True)

    async def take_asks(self, run_ids: Collection[str]) -> list[AskRecord]:
        ids = list(run_ids)
        if not ids:
            return []
        rows = await self._all(f"DELETE FROM asks WHERE run_id = ANY(%s) RETURNING seq, {ASK_COLUMNS}", (ids,),
                               "cannot take the asks")
        return [AskRecord(*row[1:]) for row in sorted(rows)]

    # grants

    async def put_grant(self, record: GrantRecord) -> None:
        async def put(cur: Any) -> None:
            await cur.execute(f"INSERT INTO grants ({GRANT_COLUMNS}) VALUES (%s, %s, %s, %s, %s, %s, %s)",
                              (record.digest, record.kind, record.owner, record.session, record.expires, dumps(record.caps),
                               record.used))

        await self._run(put, "cannot write the grant", single=True)

    async def get_grant(self, digest: str) -> GrantRecord | None:
        row = await self._one(f"SELECT {GRANT_COLUMNS} FROM grants WHERE digest = %s", (digest,), "cannot read the grant")
        return grant_row(row) if row is not None else None

    async def use_grant(self, digest: str) -> GrantRecord | None:
        row = await self._one(f"UPDATE grants SET used = true WHERE digest = %s AND NOT used RETURNING {GRANT_COLUMNS}",
                              (digest,), "cannot use the grant")
        return grant_row(row) if row is not None else None

    # reservations

    async def reserve(self, record: Reservation, *, limit: int) -> bool:
        async def reserve(cur: Any) -> bool:
            # the budget's lock, then one statement that counts and inserts: two replicas reserving at once take turns
            await cur.execute("SELECT pg_advisory_xact_lock(%s, hashtext(%s))", (RESERVE_LOCK, record.budget))
            await cur.execute(
                f"""INSERT INTO reservations (key, budget, amount, expires, holder)
                    SELECT %(key)s, %(budget)s, %(amount)s, %(expires)s, %(holder)s WHERE {LIVE_RESERVED} + %(amount)s <= %(limit)s""",
                {"key": record.key, "budget": record.budget, "amount": record.amount, "expires": record.expires,
                 "holder": record.holder, "now": time.time(), "limit": limit})
            return bool(cur.rowcount)

        result: bool = await self._run(reserve, "cannot reserve from a budget")
        return result

    async def release(self, key: str) -> None:
        async def release(cur: Any) -> None:
            await cur.execute("DELETE FROM reservations WHERE key = %s", (key,))

        await self._run(release, "cannot release a reservation", single=True)

    async def reserved(self, budget: str) -> int:
        row = await self._one(f"SELECT {LIVE_RESERVED}", {"budget": budget, "now": time.time()}, "cannot read a budget")
        return int(row[0])

    # pruning

    async def prune(self, *, ended_before: float, expired_before: float, limit: int) -> dict[str, int]:
        unfinished = ", ".join(f"'{s}'" for s in UNFINISHED)
        now = time.time()
        statements = {
            "asks": (f"""DELETE FROM asks WHERE seq IN (SELECT a.seq FROM asks a WHERE a.created < %s AND NOT EXISTS
                         (SELECT 1 FROM runs r WHERE r.id = a.run_id AND r.state IN ({unfinished})) ORDER BY a.created LIMIT %s)""",
                     (ended_before, limit)),
            "questions": (f"""DELETE FROM questions WHERE id IN (SELECT q.id FROM questions q WHERE q.created < %s AND NOT EXISTS
                              (SELECT 1 FROM runs r WHERE r.id = q.run_id AND r.state IN ({unfinished})) ORDER BY q.created LIMIT %s)""",
                          (ended_before, limit)),
            "grants": ("DELETE FROM grants WHERE digest IN (SELECT digest FROM grants WHERE expires < %s ORDER BY expires LIMIT %s)",
                       (expired_before, limit)),
            "tasks": ("""DELETE FROM tasks WHERE id IN (SELECT id FROM tasks WHERE (created + ttl_s) < %s
                         ORDER BY (created + ttl_s) LIMIT %s)""", (now, limit)),
            "reservations": ("DELETE FROM reservations WHERE key IN (SELECT key FROM reservations WHERE expires < %s "
                             "ORDER BY expires LIMIT %s)", (now, limit)),
            "replicas": (f"""DELETE FROM leases WHERE session IN (SELECT session FROM leases WHERE left(session, 8) = 'replica:'
                             AND (holder IS NULL OR expires < {NOW}) AND expires < %s LIMIT %s)""",
                         (expired_before, limit)),
        }

        async def prune(cur: Any) -> dict[str, int]:
            done = {}
            for table, (sql, params) in statements.items():
                await cur.execute(sql, params)
                done[table] = int(cur.rowcount)
            return done

        result: dict[str, int] = await self._run(prune, "cannot prune the store")
        return result

    # leases

    async def acquire_lease(self, session: str, holder: str, ttl_s: float) -> Lease | None:
        async def acquire(cur: Any) -> Lease | None:
            # one statement: taken when free, expired or already the holder's (then its token kept); the CTE reads the
            # row as it was, to tell a takeover (an expired holder) from a free lease
            await cur.execute(
                f"""WITH before AS (SELECT holder, expires FROM leases WHERE session = %(s)s)
                    INSERT INTO leases AS l (session, holder, token, expires) VALUES (%(s)s, %(h)s, 1, {NOW} + %(ttl)s)
                    ON CONFLICT (session) DO UPDATE SET holder = excluded.holder, expires = excluded.expires,
                      token = CASE WHEN l.holder = excluded.holder AND l.expires > {NOW} THEN l.token ELSE l.token + 1 END
                    WHERE l.holder IS NULL OR l.expires <= {NOW} OR l.holder = excluded.holder
                    RETURNING l.token, l.expires, (SELECT holder FROM before WHERE holder <> %(h)s)""",
                {"s": session, "h": holder, "ttl": ttl_s})
            row = await cur.fetchone()
            return Lease(session, holder, int(row[0]), row[1], taken_from=row[2]) if row is not None else None

        result: Lease | None = await self._run(acquire, "cannot acquire the lease", single=True)
        return result

    async def renew_lease(self, lease: Lease, ttl_s: float) -> Lease | None:
        async def renew(cur: Any) -> Lease | None:
            await cur.execute(f"UPDATE leases SET expires = {NOW} + %s WHERE session = %s AND holder = %s AND token = %s RETURNING expires",
                              (ttl_s, lease.session, lease.holder, lease.token))
            row = await cur.fetchone()
            return Lease(lease.session, lease.holder, lease.token, row[0]) if row is not None else None

        # one statement, its own transaction: a replica paused between an UPDATE and its COMMIT would hold the row's
        # lock, and every other replica's acquire of the lease would wait for it (the fleet stalled by one SIGSTOP)
        result: Lease | None = await self._run(renew, "cannot renew the lease", single=True)
        return result

    async def release_lease(self, lease: Lease) -> bool:
        async def release(cur: Any) -> bool:
            await cur.execute(f"UPDATE leases SET holder = NULL, expires = {NOW} WHERE session = %s AND holder = %s AND token = %s",
                              (lease.session, lease.holder, lease.token))
            return bool(cur.rowcount)

        result: bool = await self._run(release, "cannot release the lease", single=True)
        return result

    async def idle_sessions(self, idle_s: float) -> list[SessionRecord]:
        columns = ", ".join("s." + c.strip() for c in SESSION_COLUMNS.split(","))
        rows = await self._all(f"""SELECT {columns} FROM sessions s JOIN leases l ON l.session = s.handle
                                   WHERE s.closed IS NULL AND s.gateway_kernel_id IS NOT NULL AND l.expires < {NOW} - %s
                                   ORDER BY l.expires""", (idle_s,), "cannot read the idle sessions")
        return [session_row(row) for row in rows]

    async def current_lease(self, session: str) -> Lease | None:
        row = await self._one(f"SELECT session, holder, token, expires FROM leases WHERE session = %s AND holder IS NOT NULL AND expires > {NOW}",
                              (session,), "cannot read the lease")
        return Lease(*row) if row is not None else None

    async def live_leases(self, prefix: str) -> list[Lease]:
        rows = await self._all(f"""SELECT session, holder, token, expires FROM leases WHERE left(session, %s) = %s
                                   AND holder IS NOT NULL AND expires > {NOW} ORDER BY session""",
                               (len(prefix), prefix), "cannot read the leases")
        return [Lease(*row) for row in rows]

    # the journal

    async def append_journal(self, session: str, record: dict[str, Any], *, fence: Fence | None = None) -> int:
        if fence is not None and fence.session != session:
            raise StaleLease(f"a fence of session {fence.session} cannot write session {session}'s journal")
        text = dumps(record)

        if fence is None:  # one statement, one round trip (the common case: a Recorder's cell)
            return await self._append_unfenced(session, text)

        async def append(cur: Any) -> int:
            await self._fenced(cur, fence)
            await cur.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", ("journal:" + session,))
            await cur.execute("SELECT coalesce(max(seq), 0) + 1 FROM journal WHERE session = %s", (session,))
            seq: int = (await cur.fetchone())[0]
            await cur.execute("INSERT INTO journal (session, seq, record) VALUES (%s, %s, %s::json)", (session, seq, text))
            return seq

        result: int = await self._run(append, "cannot append to the journal")
        return result

    async def _append_unfenced(self, session: str, text: str) -> int:
        """The next number and the insert in one statement (its own transaction). Two writers racing for one number:
        the loser's insert fails on the primary key, commits nothing, and is tried again with the next number."""
        import psycopg

        for attempt in range(20):
            async with self._lock:
                if self._conn is None:
                    raise StoreError("the store is closed")
                try:
                    if self._conn.closed:
                        self._conn = await self._connect(self._url)
                    async with self._conn.cursor() as cur:
                        await cur.execute(
                            """INSERT INTO journal (session, seq, record)
                               SELECT %s, coalesce(max(seq), 0) + 1, %s::json FROM journal WHERE session = %s RETURNING seq""",
                            (session, text, session))
                        row = await cur.fetchone()
                        return int(row[0])
                except psycopg.errors.UniqueViolation:
                    if attempt == 19:
                        raise StoreError(f"cannot append to the journal of {session}: numbers taken by other writers") from None
                except psycopg.Error as exc:
                    raise self._error(exc, "cannot append to the journal") from None
        raise AssertionError("unreachable")

    async def journal_counts(self) -> dict[str, int]:
        rows = await self._all("SELECT session, max(seq) FROM journal GROUP BY session", (), "cannot read the journal")
        return {session: int(count) for session, count in rows}

    async def session_handles(self) -> set[str]:
        rows = await self._all("SELECT handle FROM sessions", (), "cannot read the sessions")
        return {handle for (handle,) in rows}

    async def journal(self, session: str, *, after: int = 0) -> list[JournalEntry]:
        rows = await self._all("SELECT session, seq, record::text FROM journal WHERE session = %s AND seq > %s ORDER BY seq",
                               (session, after), "cannot read the journal")
        return [JournalEntry(s, q, json.loads(r)) for s, q, r in rows]
