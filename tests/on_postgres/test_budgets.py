"""tests/test_budgets.py, every server's session store on PostgreSQL (tests/on_postgres/__init__.py says why)."""

from . import twin

twin(globals(), "test_budgets")
