"""``run_python`` answers what the old safe executor (smolagents' LocalPythonExecutor) answered.

Its result is the value of the cell's last statement: an expression's value, an assignment's
right-hand side (``a, b = 1, 2`` gives the tuple), an augmented assignment's new value, a ``def``'s
function; for a trailing ``if`` or ``for`` the last non-None value a statement inside produced;
``while``, ``with``, ``try``, ``import`` give None. The value is computed by the real kernel (an AST
transform on the last statement, startup/runtime.py), only for ``run_python``: ``execute_code``
keeps its own rule (a variable named ``result``, else the last expression). The cases are our own,
written in the shapes of the old tool's.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from .conftest import Harness, make_settings, serving

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
async def safe(short_tmp: Path) -> AsyncIterator[Harness]:
    """One safe-executor server (run_python only, strict) for every case here."""
    async with serving(make_settings(short_tmp, preset="safe-executor")) as h:
        yield h


async def run_python(h: Harness, code: str, **arguments: Any) -> dict[str, Any]:
    answer = await h.call("run_python", code=code, **arguments)
    assert not answer.is_error, answer.content
    return answer.structured_content


CASES: list[tuple[str, Any]] = [
    ("x = 3", 3),
    ("a, b = 1, 2", [1, 2]),  # the right-hand side, a tuple (JSON: a list)
    ("first, *rest = [1, 2, 3]", [1, 2, 3]),
    ("p = q = 5", 5),
    ("n = 10\nn += 5", 15),
    ("s = 'ab'\ns *= 2", "abab"),
    ("d = {'k': 1}\nd['k'] += 41", 42),
    ("class Box:\n    pass\nbox = Box()\nbox.n = 1\nbox.n += 2", 3),
    ("count: int = 7", 7),
    ("declared: int", None),
    ("total = 0\nfor i in range(5):\n    total += i", 10),
    ("for i in range(3):\n    sq = i * i\n    print(sq)", 4),  # print's None does not erase sq
    ("for i in range(10):\n    if i % 2 == 0:\n        evens = i", 8),
    ("for i in range(5):\n    last = i\n    if i == 2:\n        break", 2),
    ("for i in []:\n    never = i", None),
    # as the old executor: an if's branch left by break/continue hands nothing on; a for keeps what it had
    ("for i in range(5):\n    if i == 2:\n        found = i\n        break", None),
    ("for i in range(4):\n    if i % 2:\n        odd = i\n        continue\n    even = i", 2),
    ("for i in range(3):\n    for j in range(3):\n        if j == 1:\n            break\n        inner = (i, j)", [2, 0]),
    ("t = 0\nfor i in range(3):\n    if i:\n        if i == 2:\n            t = -1\n            break\n        t += i", 1),
    ("v = 5\nif v > 3:\n    label = 'big'\nelse:\n    label = 'small'", "big"),
    ("v = 1\nif v > 3:\n    label = 'big'\nelif v > 0:\n    label = 'some'", "some"),
    ("v = 1\nif v > 3:\n    label = 'big'\nelif v > 2:\n    label = 'some'\nelse:\n    label = 'few'\n    print(label)", "few"),
    ("if False:\n    z = 1", None),
    ("k = 0\nwhile k < 3:\n    k += 1", None),
    ("try:\n    q = 1 / 1\nexcept ZeroDivisionError:\n    q = 0", None),
    ("class Ctx:\n    def __enter__(self):\n        return 1\n    def __exit__(self, *exc):\n        return False\n"
     "with Ctx() as c:\n    inside = c + 1", None),
    ("result = [1, 2, 3]\nlen(result)", 3),  # the last expression wins over a variable named result
    ("result = 5\nprint(result)", None),
    ("import math", None),
    ("import math\nmath.factorial(5)", 120),
    ("2 + 2", 4),
    ("1 + 1;", 2),
    ("words = ['a', 'b']\n', '.join(words)", "a, b"),
    ("nums = [3, 1, 2]\nnums.sort()", None),
    ("sorted([3, 1, 2])", [1, 2, 3]),
    ("(w := 4)", 4),
    ("pass", None),
    ("gone = None", None),
    ("tmp = 1\ndel tmp", None),
    ("x1 = 1\nx2 = 2", 2),
    ("eleven = 11  # eleven\n# done", 11),
    ("f'{3 * 3}'", "9"),
    ("{'a': 1, 'b': [1, 2]}", {"a": 1, "b": [1, 2]}),
]


@pytest.mark.parametrize(("code", "expected"), CASES, ids=[c.replace("\n", "⏎")[:40] for c, _ in CASES])
async def test_the_result_is_the_last_statements_value(safe: Harness, code: str, expected: Any) -> None:
    assert (await run_python(safe, code))["result"] == expected


# the old executor refuses these (starred unpacking, :=); run_python answers as Python does
UNSUPPORTED_BY_THE_OLD_EXECUTOR = {"first, *rest = [1, 2, 3]", "(w := 4)"}


def test_the_cases_are_what_the_old_executor_answers() -> None:
    """The expectations above, checked against the old tool's engine itself when it is installed
    (``pip install 'kernelexec[bench]'``): smolagents' LocalPythonExecutor as the old server used it."""
    executor_module = pytest.importorskip("smolagents.local_python_executor")
    differ = []
    for code, expected in CASES:
        if code in UNSUPPORTED_BY_THE_OLD_EXECUTOR:
            continue
        executor = executor_module.LocalPythonExecutor(additional_authorized_imports=[])
        executor.send_tools({})
        output = executor(code).output
        try:
            answered = json.loads(json.dumps(output))
        except (TypeError, ValueError):
            answered = repr(output)
        if answered != expected:
            differ.append((code, answered, expected))
    assert differ == []


async def test_a_def_answers_its_function_and_a_class_its_class(safe: Harness) -> None:
    assert re.fullmatch(r"<function double at 0x[0-9a-f]+>",
                        (await run_python(safe, "def double(x):\n    return 2 * x"))["result"])
    assert (await run_python(safe, "class Point:\n    pass"))["result"] == "<class '__main__.Point'>"
    assert (await run_python(safe, "double(21)"))["result"] == 42  # the def ran as written


async def test_logs_and_state_are_unchanged_by_the_rule(safe: Harness) -> None:
    answer = await run_python(safe, "print('computing')\nanswer = 6 * 7")
    assert answer == {"result": 42, "logs": "computing\n"}
    assert (await run_python(safe, "answer"))["result"] == 42


async def test_errors_stay_tool_errors_at_the_users_line(safe: Harness) -> None:
    failed = await safe.call("run_python", code="ok = 1\nbad = 1 / 0")
    assert failed.is_error
    text = failed.content[0].text
    assert "ZeroDivisionError: division by zero" in text.splitlines()[0] and "----> 2 bad = 1 / 0" in text


async def test_no_out_is_added_to_the_notebook(safe: Harness) -> None:
    """The transform notes values without making the last statement a displayed expression."""
    await run_python(safe, "marker_x = 1\nmarker_x += 1")
    await run_python(safe, "def marker_f():\n    pass")
    session = await safe.sessions.default()
    cells = json.loads(Path(session.dirs.notebook).read_text())["cells"]
    tail = [c for c in cells if c["cell_type"] == "code"][-2:]
    assert ["marker_x += 1" in "".join(tail[0]["source"]), "marker_f" in "".join(tail[1]["source"])] == [True, True]
    assert all(o["output_type"] != "execute_result" for c in tail for o in c["outputs"])


async def test_execute_code_keeps_its_own_rule_in_the_same_session(harness: Harness) -> None:
    """The default preset serves both tools on one kernel: each call gets its own tool's rule."""
    session = await harness.new_session()
    assert (await harness.run("result = [1, 2, 3]\nlen(result)", session=session))["result"] == [1, 2, 3]
    assert (await harness.run("x = 3", session=session))["result"] is None
    ran = await harness.call("run_python", code="result = [1, 2, 3]\nlen(result)", session=session)
    assert ran.structured_content["result"] == 3
    ran = await harness.call("run_python", code="x = 3", session=session)
    assert ran.structured_content["result"] == 3
    assert (await harness.run("y = 4", session=session))["result"] is None  # the rule does not stick
    assert (await harness.run("x + y", session=session))["result"] == 7
