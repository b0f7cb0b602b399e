"""Every server a test of this directory starts keeps its session store on the worker's PostgreSQL (tests/pg.py: one
cluster a pytest process, started the first time a module here runs), a fresh database each."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from .. import support
from ..pg import Postgres, postgres

__all__ = ["postgres"]  # the session's PostgreSQL, a fixture


@pytest.fixture(scope="module", autouse=True)
def _store_on_postgres(postgres: Postgres) -> Iterator[None]:
    """Autouse and module-scoped, so set up before the module's own shared servers (autouse fixtures of a scope
    come first), and put back after them."""
    before = support.STORE_URL
    support.STORE_URL = lambda: postgres.url(postgres.create_db())
    yield
    support.STORE_URL = before
