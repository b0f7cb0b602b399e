"""What the session store adds to ``execute_code("x=1")``: SQLite (the default) and PostgreSQL on loopback, each
against the same server recording in files only (the previous release's behaviour: journal.jsonl fsynced, then the
notebook; no run records).

    python -m benchmarks --only store [--quick]

One in-memory server per backend, one session, one kernel; samples alternate between the store on and the store
off (the session's Recorder without its store sink, the manager without its store: files only, the journal line
fsynced), so drift on the machine hits both alike. PostgreSQL is a real PostgreSQL 15 started for the run
(tests/pg.py, fsync on as deployed, 127.0.0.1 over TCP with a password); the row is skipped without its binaries.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import call, in_memory, log, make_settings
from benchmarks.stats import Measurement

MS = "ms"
OFF = "store: x=1 execute_code, files only (store off)"


async def _alternate(plan: Any, base: Path, url: str | None) -> tuple[list[float], list[float]]:
    on_s: list[float] = []
    off_s: list[float] = []
    settings = make_settings(Path(tempfile.mkdtemp(prefix="st", dir=base)), **({"store": url} if url else {}))
    async with in_memory(settings) as (client, sessions):
        handle = (await call(client, "execute_code", code="x = 1"))["session"]
        session = sessions.sessions[handle]
        store, sink = sessions.store, session.recorder.sink
        assert store is not None and sink is not None

        def use_store(on: bool) -> None:
            sessions.store = store if on else None
            session.recorder.sink = sink if on else None

        for _ in range(plan.warmup):
            for on in (True, False):
                use_store(on)
                await call(client, "execute_code", code="x=1")
        for i in range(plan.calls * 2):
            on = i % 2 == 0
            use_store(on)
            t0 = time.perf_counter()
            r = await call(client, "execute_code", code="x=1")
            (on_s if on else off_s).append((time.perf_counter() - t0) * 1000)
            assert r["success"], r
        use_store(True)
        stored = len(await store.journal(handle))
        assert stored >= plan.calls, stored  # the store's samples did write the journal
    return on_s, off_s


async def bench_store(plan: Any, base: Path, out: list[Measurement]) -> None:
    log(f"[store] x=1 execute_code in memory, SQLite store vs files only ({plan.calls} calls each, alternating)")
    on_s, off_s = await _alternate(plan, base, None)
    out.append(Measurement(OFF + ", SQLite's run", MS, off_s, note="journal.jsonl fsynced + notebook, no run records"))
    out.append(Measurement("store: x=1 execute_code, SQLite (kernelexec.db)", MS, on_s, baseline=OFF + ", SQLite's run",
                           note="journal in the store (WAL, synchronous=FULL), run records; journal.jsonl not fsynced"))
    from tests.pg import PG_BIN, running_postgres

    if not (PG_BIN / "initdb").exists():
        log(f"[store] PostgreSQL skipped: no server binaries at {PG_BIN}")
        return
    log(f"[store] x=1 execute_code in memory, PostgreSQL 15 on 127.0.0.1 vs files only ({plan.calls} calls each)")
    with running_postgres(fsync=True) as pg:
        on_s, off_s = await _alternate(plan, base, pg.url(pg.create_db()))
    out.append(Measurement(OFF + ", PostgreSQL's run", MS, off_s))
    out.append(Measurement("store: x=1 execute_code, PostgreSQL loopback", MS, on_s, baseline=OFF + ", PostgreSQL's run",
                           note="psycopg 3 async, TCP 127.0.0.1, fsync on"))
