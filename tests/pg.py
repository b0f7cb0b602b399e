"""A real PostgreSQL 15 for the tests (tests/test_store.py, tests/test_restart.py): initdb and pg_ctl from
Debian's package, run as ``nobody`` when the tests run as root (PostgreSQL refuses root), a data directory in a
temporary directory that user owns, a unix socket there and 127.0.0.1 on a free port, password (scram) auth
over TCP. Started once per test session, stopped (immediate) and removed at its end."""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from .support import free_port

PG_BIN = Path(os.environ.get("KERNELEXEC_TEST_PG_BIN", "/usr/lib/postgresql/15/bin"))
PG_USER = "kx"


# --- a real PostgreSQL for the session ------------------------------------------------------------------
@dataclass
class Postgres:
    host: str
    port: int
    password: str

    def url(self, db: str = "postgres", password: str | None = None) -> str:
        return f"postgresql://{PG_USER}:{password or self.password}@{self.host}:{self.port}/{db}"

    def create_db(self) -> str:
        import psycopg

        name = "t_" + secrets.token_hex(6)
        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {name}")
        return name


def _as_postgres_user(cmd: list[str]) -> list[str]:
    """PostgreSQL refuses to run as root: as root, run it as ``nobody``."""
    return ["runuser", "-u", "nobody", "--", *cmd] if os.geteuid() == 0 else cmd


@pytest.fixture(scope="session")
def postgres() -> Iterator[Postgres]:
    with running_postgres() as pg:
        yield pg


@contextmanager
def running_postgres(*, fsync: bool = False) -> Iterator[Postgres]:
    """The server itself (the fixture's, and benchmarks/store.py's: there with ``fsync=True``, as deployed)."""
    if not (PG_BIN / "initdb").exists():
        pytest.fail(f"PostgreSQL 15's server binaries are not at {PG_BIN} (Debian: apt-get install postgresql-15; "
                    "or set KERNELEXEC_TEST_PG_BIN)")
    base = Path(tempfile.mkdtemp(prefix="kxpg"))
    password = "pw-" + secrets.token_hex(8) + "@:/?"  # URL-special characters: the URL carries it encoded
    data, log, pwfile = base / "data", base / "log", base / "pw"
    pwfile.write_text(password + "\n")
    if os.geteuid() == 0:
        shutil.chown(base, "nobody")
        shutil.chown(pwfile, "nobody")
    base.chmod(0o700)
    port = free_port()
    try:
        subprocess.run(_as_postgres_user([str(PG_BIN / "initdb"), "-D", str(data), "-U", PG_USER, "-E", "UTF8", "--no-sync",
                                          "--auth-local=trust", "--auth-host=scram-sha-256", f"--pwfile={pwfile}"]),
                       check=True, capture_output=True, timeout=120)
        subprocess.run(_as_postgres_user([str(PG_BIN / "pg_ctl"), "-D", str(data), "-l", str(log), "-w", "-t", "60", "-o",
                                          f"-k {base} -c listen_addresses=127.0.0.1 -p {port} -c fsync={'on' if fsync else 'off'}", "start"]),
                       check=True, capture_output=True, timeout=90)
    except subprocess.CalledProcessError as exc:
        tail = log.read_text()[-2000:] if log.exists() else ""
        shutil.rmtree(base, ignore_errors=True)
        pytest.fail(f"PostgreSQL did not start: {exc.stderr.decode(errors='replace')[-2000:]}\n{tail}")
    from urllib.parse import quote

    try:
        yield Postgres("127.0.0.1", port, quote(password, safe=""))
    finally:
        subprocess.run(_as_postgres_user([str(PG_BIN / "pg_ctl"), "-D", str(data), "-m", "immediate", "-w", "stop"]),
                       capture_output=True, timeout=60)
        shutil.rmtree(base, ignore_errors=True)
