"""The twins are what this directory says they are: each of them every test of its module in tests/ but those marked
``own_store``, and the servers their tests start on PostgreSQL."""

from __future__ import annotations

import importlib
from pathlib import Path

from .. import support
from . import own_store


def test_a_server_a_test_here_starts_keeps_its_store_on_postgresql(tmp_path: Path) -> None:
    settings = support.make_settings(tmp_path)
    assert settings.store is not None and settings.store.get_secret_value().startswith("postgresql://")
    assert support.store_env()["KERNELEXEC_STORE"].startswith("postgresql://")


def test_a_test_here_has_a_short_tmp_of_its_own(short_tmp: Path) -> None:
    """Not the one of tests/conftest.py, which the twins' modules use on the same worker."""
    assert short_tmp.name.startswith("kxp"), short_tmp


def test_each_twin_holds_every_test_and_fixture_of_its_module() -> None:
    twins = [p.stem for p in Path(__file__).parent.glob("test_*.py") if p.stem != "test_twins"]
    assert len(twins) == 7, twins
    for stem in twins:
        source, twin = (vars(importlib.import_module(name)) for name in (f"tests.{stem}", f"tests.on_postgres.{stem}"))
        tests = {name for name, value in source.items() if name.startswith("test") and not own_store(value)}
        assert tests and tests <= set(twin), (stem, tests - set(twin))
        assert not {name for name, value in twin.items() if name.startswith("test") and own_store(value)}, stem
        fixtures = {name for name, value in source.items() if type(value).__name__ == "FixtureFunctionDefinition"}
        assert fixtures <= set(twin), (stem, fixtures - set(twin))
