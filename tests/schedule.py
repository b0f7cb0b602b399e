"""How ``pytest -n N --dist loadscope`` (.ci/run's main pass) hands the tests to its workers: in units, the longest
first. A plugin of tests/conftest.py.

A unit is what one worker runs whole (``worker_unit``). The order is each unit's seconds in an earlier main pass
(``tests/unit_seconds.json``; a unit not in it counts a second a test): ordered by their count of tests alone, as
xdist's loadscope does, units of a few long tests (the 75 s cell, the 50-SIGKILL journal) could start last and run on
after the other workers were done. ``pytest -n 5 --dist loadscope --unit-seconds tests/unit_seconds.json`` measures
them again: each unit's setup, call and teardown time summed, as the workers report it.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pytest

UNIT_SECONDS = Path(__file__).with_name("unit_seconds.json")
# The red team comes first whatever its length: .ci/run's weakened red team, beside the main pass, waits for its
# world (tests/redteam/world.py world_lock)
FIRST = "tests/redteam"


def worker_unit(nodeid: str) -> str:
    """The unit one pytest-xdist worker runs whole: a module, so that its shared server (``harness`` and the
    module-scoped fixtures like it) starts once and its tests never overlap one another; the red team as one
    unit, since its ``world`` and ``targets`` are package-scoped (and the world's DNS canary, 127.0.0.1:53,
    can be bound by one process only)."""
    path = nodeid.split("::", 1)[0]
    return "tests/redteam" if path.startswith("tests/redteam/") else path


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--unit-seconds", metavar="PATH", default=None,
                     help="write each unit's seconds in this run to PATH (JSON), for tests/unit_seconds.json")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The units in the order the workers should take them, each unit's tests kept together and in their order."""
    seconds: dict[str, float] = json.loads(UNIT_SECONDS.read_text()) if UNIT_SECONDS.exists() else {}
    counts = Counter(worker_unit(item.nodeid) for item in items)

    def rank(item: pytest.Item) -> tuple[bool, float, str]:
        unit = worker_unit(item.nodeid)
        return unit != FIRST, -seconds.get(unit, counts[unit]), unit

    items.sort(key=rank)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``-n N --dist loadscope`` hands out ``worker_unit`` units whole (xdist's own loadscope would split a module's
    test classes apart and the red team into its modules), in the collection's order (above)."""
    if config.getoption("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    config.option.loadscopereorder = False  # the collection's order, not xdist's by count alone

    class WholeScopes(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return worker_unit(nodeid)

    return WholeScopes(config, log)


_spent: defaultdict[str, float] = defaultdict(float)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _spent[worker_unit(report.nodeid)] += report.duration


def pytest_sessionfinish(session: pytest.Session) -> None:
    path = session.config.getoption("--unit-seconds")
    if path and not hasattr(session.config, "workerinput"):  # the controller (or a run without -n): every report
        ranked = dict(sorted(((unit, round(s, 1)) for unit, s in _spent.items()), key=lambda kv: -kv[1]))
        Path(path).write_text(json.dumps(ranked, indent=0) + "\n")
