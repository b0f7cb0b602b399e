"""The session, run, task and record tests again, with every server's session store on a real PostgreSQL 15.

Both stores are the product (SQLite built in, PostgreSQL for a fleet), so the tests whose subject is what a store
keeps run on both in every full run. Each module here is one of ``tests/`` collected a second time (``twin``);
this directory's conftest.py gives its servers a PostgreSQL database each. Being modules of their own, they are
units of their own to pytest-xdist, so .ci/run's main pass spreads them over its workers beside everything else,
instead of in a second pass after it. ``pytest --store postgres`` runs every other module on PostgreSQL too.
"""

from __future__ import annotations

import importlib
from typing import Any


def twin(namespace: dict[str, Any], source: str) -> None:
    """Everything ``tests/<source>.py`` defines (its tests, fixtures and ``pytestmark``), defined again in the module
    whose ``namespace`` this is, so that pytest collects it there too. Not ``import *``: that skips ``_names`` and
    follows ``__all__``, which would leave fixtures behind."""
    module = importlib.import_module(f"tests.{source}")
    namespace.update({name: value for name, value in vars(module).items() if not name.startswith("__") and not own_store(value)})


def own_store(value: Any) -> bool:
    """A test marked ``own_store``: it picks its stores itself (a parameter over both), or touches none, so that its
    twin would only repeat it."""
    return any(mark.name == "own_store" for mark in getattr(value, "pytestmark", ()))
