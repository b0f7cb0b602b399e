"""Every server a test of this directory starts keeps its session store on the worker's PostgreSQL (tests/pg.py: a
cluster a pytest process, started the first time a module here runs; test_store_journal's twin brings its module's
own, as that module does), a fresh database each."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from .. import support
from ..pg import Postgres, postgres

__all__ = ["postgres"]  # the session's PostgreSQL, a fixture


@pytest.fixture(scope="session")
def short_tmp() -> Iterator[Path]:
    """This directory's own short base directory: a twin and its module may run on one worker, and their tests' fixed
    subdirectories (a state dir named "tasks", "killed", …) must not meet, as they did not in a pass of their own."""
    path = Path(tempfile.mkdtemp(prefix="kxp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module", autouse=True)
def _store_on_postgres(postgres: Postgres) -> Iterator[None]:
    """Autouse and module-scoped, so set up before the module's own shared servers (autouse fixtures of a scope
    come first), and put back after them."""
    before = support.STORE_URL
    support.STORE_URL = lambda: postgres.url(postgres.create_db())
    yield
    support.STORE_URL = before
