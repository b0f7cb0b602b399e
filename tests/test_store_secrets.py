"""The store's password is never shown (issue 31, the host rule): not by ``kernelexec doctor`` (which names the store
and says whether it opens), and not in any log line of a server whose PostgreSQL connection breaks under it — where
the store's errors are logged. Also: a cell whose store write failed is kept (journal.jsonl, fsynced) and imported
into the store by the next start. A real PostgreSQL (tests/pg.py), a real server."""

from __future__ import annotations

import subprocess
import tempfile
import time
from pathlib import Path
from urllib.parse import unquote

import anyio
import psycopg
import pytest

from kernelexec.store import open_store

from .pg import Postgres, postgres
from .support import clean_env, kernelexec_cmd
from .test_restart import serving
from .test_store_journal import answered, file_journal, sources
from .test_tasks import ALICE, Raw

__all__ = ["postgres"]

pytestmark = pytest.mark.anyio


def _secret_in(text: str, secret: str) -> bool:
    return secret in text or unquote(secret) in text


async def test_doctor_names_the_store_and_never_its_password(postgres: Postgres, short_tmp: Path) -> None:
    url = postgres.url(postgres.create_db())
    ok = subprocess.run(kernelexec_cmd("doctor", "--state-dir", str(short_tmp / "d"), "--store", url), env=clean_env(),
                        capture_output=True, text=True, timeout=120)
    shown = ok.stdout + ok.stderr
    assert ok.returncode == 0 and "session store (--store):" in shown and "opens; schema version" in shown, shown
    assert f"postgresql://kx:***@127.0.0.1:{postgres.port}/" in shown
    assert not _secret_in(shown, postgres.password)
    wrong = postgres.url(password="Wr0ng-Passw0rd")
    bad = subprocess.run(kernelexec_cmd("doctor", "--state-dir", str(short_tmp / "d"), "--store", wrong), env=clean_env(),
                         capture_output=True, text=True, timeout=120)
    shown = bad.stdout + bad.stderr
    assert "CANNOT OPEN" in shown and "Traceback" not in shown, shown
    assert "Wr0ng-Passw0rd" not in shown and not _secret_in(shown, postgres.password)
    default = subprocess.run(kernelexec_cmd("doctor", "--state-dir", str(short_tmp / "d")), env=clean_env(),
                             capture_output=True, text=True, timeout=120)
    assert f"sqlite:///{short_tmp / 'd' / 'kernelexec.db'} (the default)" in default.stdout, default.stdout


@pytest.mark.slow
async def test_a_broken_store_connection_logs_no_password_and_loses_no_cell(postgres: Postgres, short_tmp: Path) -> None:
    url = postgres.url(postgres.create_db())
    base = Path(tempfile.mkdtemp(prefix="p", dir=short_tmp))
    state, tokens, log = base / "state", base / "tokens", base / "server.log"
    tokens.write_text(f"{ALICE}\n")
    with serving(state, tokens, log, KERNELEXEC_STORE=url) as (server, proc):
        alice = Raw(server, ALICE)
        handle = (await alice.call("new_session"))["structuredContent"]["session"]
        await answered(alice, await alice.call("execute_code", code="a = 1", session=handle))
        started = await alice.call("execute_code", code="import time\ntime.sleep(3)\nb = 2", session=handle, background=True)
        run_id = started["structuredContent"]["run_id"]
        await anyio.sleep(1)
        with psycopg.connect(postgres.url(), autocommit=True) as admin:  # the server's connection dies under it
            killed = admin.execute("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                                   "WHERE application_name = 'kernelexec'").fetchone()
        assert killed is not None and killed[0] >= 1
        done = await alice.call("get_run", run_id=run_id, wait_s=30)
        assert done.get("isError") is not True and done["structuredContent"]["success"] is True, done
        later = await answered(alice, await alice.call("execute_code", code="c = 3", session=handle))
        assert later.get("isError") is not True, later
        time.sleep(0.5)
    shown = log.read_text(errors="replace")
    # the failure was met, and logged, by whichever user of the store's connection met it first: a cell's record
    # (retried), or the server's lease renewal (a server on PostgreSQL registers under a lease)
    met = ("the session store did not take a cell", "cannot renew the lease")
    assert any(line in shown for line in met), shown[-3000:]
    assert not _secret_in(shown, postgres.password), "the store's password is in the server's log"
    session_dir = state / "sessions" / handle
    assert sources(file_journal(session_dir)) == ["a = 1", "import time\ntime.sleep(3)\nb = 2", "c = 3"]
    with serving(state, tokens, log, KERNELEXEC_STORE=url):  # the next start imports what the store lacked
        pass
    store = await open_store(url, state)
    try:
        assert [e.record for e in await store.journal(handle)] == file_journal(session_dir)
    finally:
        await store.close()
    assert not _secret_in(log.read_text(errors="replace"), postgres.password)
