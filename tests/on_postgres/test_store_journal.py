"""tests/test_store_journal.py, every server's session store on PostgreSQL (tests/on_postgres/__init__.py says why)."""

from . import twin

twin(globals(), "test_store_journal")
