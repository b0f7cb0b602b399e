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

import anyio
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


# values JSON does not know, as the old tool's server answered them: its MCP SDK wrote {result, logs} with pydantic's
# JSON, ``fallback=str`` (a set as an array, an object as its str()), each in place; a numpy scalar stays its number
REPORTED: list[tuple[str, Any]] = [
    ("{3, 1, 2}", [1, 2, 3]),
    ("S1 = {1, 2, 3}\nS2 = {2, 3, 4}\nS4 = S1.intersection(S2)", [2, 3]),
    ("{x % 3 for x in range(7)}", [0, 1, 2]),
    ("from collections import deque\ndeque([1, 2])", [1, 2]),
    ("{'k': {4}, 'n': [(5, {6})]}", {"k": [4], "n": [[5, [6]]]}),
    ("class Eq:\n    def __str__(self):\n        return 'a == b'\nresult = Eq()", "a == b"),  # smolagents' non-standard comparison
    ("class Eq:\n    def __str__(self):\n        return 'x'\n[Eq(), 1]", ["x", 1]),
    ("import datetime\ndatetime.date(2024, 1, 2)", "2024-01-02"),
    ("import datetime\n[datetime.datetime(2024, 1, 2, 3, 4, 5), datetime.time(6, 7)]", ["2024-01-02T03:04:05", "06:07:00"]),
]


@pytest.mark.parametrize(("code", "expected"), REPORTED, ids=[c.replace("\n", "⏎")[:40] for c, _ in REPORTED])
async def test_a_value_json_does_not_know_is_reported_as_the_old_server_did(safe: Harness, code: str, expected: Any) -> None:
    assert (await run_python(safe, code))["result"] == expected


def test_the_reported_values_are_what_the_old_server_answered() -> None:
    """The cases above against the old tool's engine and its server's encoding (pydantic_core, which the MCP SDK uses)."""
    executor_module = pytest.importorskip("smolagents.local_python_executor")
    import pydantic_core

    differ = []
    for code, expected in REPORTED:
        executor = executor_module.LocalPythonExecutor(additional_authorized_imports=[])
        executor.send_tools({})
        answered = json.loads(pydantic_core.to_json({"result": executor(code).output}, fallback=str))["result"]
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


# --- the old executor's tools cannot be rebound --------------------------------------------------

ERASE = "InterpreterError: Cannot assign to name '{}': doing this would erase the existing tool!"

# each rebinds (or would delete) a name the old executor held as a tool: by syntax (refused before anything of the
# cell runs) or around it, at run time (undone when the cell ends, and the cell fails)
AROUND: list[tuple[str, str]] = [
    ("print = '3'", ERASE.format("print")),
    ("n = 1\nprint += 'x'", ERASE.format("print")),
    ("print: str = '3'", ERASE.format("print")),
    ("a, (b, print) = 1, (2, 3)", ERASE.format("print")),
    ("for print in ['3']:\n    pass", ERASE.format("print")),
    ("class Ctx:\n    def __enter__(self):\n        return 1\n    def __exit__(self, *exc):\n        return False\nwith Ctx() as len:\n    pass", ERASE.format("len")),
    ("import math as sum", ERASE.format("sum")),
    ("from functools import reduce as max", ERASE.format("max")),
    ("def print(*args):\n    pass", ERASE.format("print")),
    ("class range:\n    pass", ERASE.format("range")),
    ("(sorted := 3)", ERASE.format("sorted")),
    ("[abs for abs in [1]]", ERASE.format("abs")),
    ("def f():\n    global print\n    print = 3\nf()", ERASE.format("print")),
    ("try:\n    1 / 0\nexcept ZeroDivisionError as str:\n    pass", ERASE.format("str")),
    ("match [1]:\n    case [*list]:\n        pass", ERASE.format("list")),
    ("del print", "InterpreterError: Cannot delete name 'print': name is not defined"),
    ("log = []", ERASE.format("log")),  # not a builtin here, but a tool of the old executor
    # around the syntax: a namespace written as a dict, or code the check never saw
    ("globals()['print'] = '3'", ERASE.format("print")),
    ("vars()['len'] = len\nvars()['len'] = 3", ERASE.format("len")),
    ("exec(\"print = '3'\")", ERASE.format("print")),
    ("__builtins__.print = None if hasattr(__builtins__, 'print') else __builtins__.__setitem__('print', None)", ERASE.format("print")),
]


@pytest.mark.parametrize(("code", "error"), AROUND, ids=[c.replace("\n", "⏎")[:40] for c, _ in AROUND])
async def test_a_cell_cannot_rebind_a_tool_and_later_cells_still_have_it(safe: Harness, code: str, error: str) -> None:
    refused = await safe.call("run_python", code=code)
    assert refused.is_error, (code, refused.structured_content)
    text = refused.content[0].text
    assert text.splitlines()[0].endswith(error), text
    after = await run_python(safe, "print('still here', len([1, 2]), max(1, 2))\nsorted([2, 1])")
    assert after == {"result": [1, 2], "logs": "still here 2 2\n"}, after
    assert (await run_python(safe, "'log' in globals(), 'print' in globals()"))["result"] == [False, False]


# where CPython's own reading is right, and nothing of the old executor's is erased
ALLOWED = [
    ("from math import sqrt, floor\nfloor(sqrt(17))", 4),  # no builtin of those names here: the import erases nothing
    ("def twice(print):\n    return print * 2\ntwice(4)", 8),  # a parameter is the function's own
    ("(lambda len: len + 1)(1)", 2),
    ("printed = 1\nprinter = printed + 1", 2),
    ("import collections.abc\ncollections.abc.__name__", "collections.abc"),
    # a star import names nothing to refuse (the old executor took it): it binds the module's names, and a protected
    # builtin it would cover (math's pow) is given back at once, with no error
    ("from math import *\nfloor(1.5)", 1),
    ("from math import *\npow(2, 3, 5)", 3),
    ("try:\n    from statistics import *\nexcept ImportError:\n    pass\nmedian([3, 1, 2])", 2),
    ("from math import *", None),
]


@pytest.mark.parametrize(("code", "expected"), ALLOWED, ids=[c.replace("\n", "⏎")[:40] for c, _ in ALLOWED])
async def test_names_that_erase_no_tool_stay_allowed(safe: Harness, code: str, expected: Any) -> None:
    assert (await run_python(safe, code))["result"] == expected


async def test_a_star_import_leaves_the_builtins_to_later_cells(safe: Harness) -> None:
    await run_python(safe, "from math import *")
    assert await run_python(safe, "pow(2, 3, 5), sqrt(16)") == {"result": [3, 4.0], "logs": ""}


async def test_maths_tools_need_no_import_as_in_the_old_executor(safe: Harness) -> None:
    """The old executor's math tools (sqrt, floor, atan2…) were there without an import; they are here too, and an
    import of another function by one of their names still binds it (statistics' mean as sqrt)."""
    assert (await run_python(safe, "sqrt(16), floor(2.5), round(atan2(1, 1) * 4, 5)"))["result"] == [4.0, 2, 3.14159]
    assert (await run_python(safe, "from statistics import mean as sqrt\nsqrt([1, 3])"))["result"] == 2


def test_the_old_executor_has_its_maths_tools_without_an_import() -> None:
    executor_module = pytest.importorskip("smolagents.local_python_executor")
    executor = executor_module.LocalPythonExecutor(additional_authorized_imports=[])
    executor.send_tools({})
    assert executor("sqrt(16), floor(2.5), round(atan2(1, 1) * 4, 5)").output == (4.0, 2, 3.14159)


async def test_maths_tools_come_with_run_python_and_are_kept(harness: Harness) -> None:
    """A session that never ran run_python keeps Python's builtins as they are (a notebook's missing import fails as
    in Jupyter); its first run_python cell gives the tools, and a cell replacing one in the builtins is refused."""
    session = await harness.new_session()
    assert (await harness.run("import builtins\nresult = hasattr(builtins, 'sqrt')", session=session))["result"] is False
    assert (await harness.call("run_python", code="sqrt(4)", session=session)).structured_content["result"] == 2.0
    refused = await harness.call("run_python", code="import builtins\nbuiltins.sqrt = abs", session=session)
    assert refused.is_error and refused.content[0].text.splitlines()[0].endswith(ERASE.format("sqrt"))
    assert (await harness.call("run_python", code="sqrt(9)", session=session)).structured_content["result"] == 3.0


async def test_execute_code_may_rebind_any_name(harness: Harness) -> None:
    """The rule is run_python's, the old tool's: execute_code runs Python as Python."""
    session = await harness.new_session()
    assert (await harness.run("log = [1]\nresult = log", session=session))["result"] == [1]
    ran = await harness.call("run_python", code="log.append(2)\nlog", session=session)  # reading it is not rebinding it
    assert ran.structured_content["result"] == [1, 2]
    refused = await harness.call("run_python", code="log = 3", session=session)
    assert refused.is_error and refused.content[0].text.splitlines()[0].endswith(ERASE.format("log"))
    assert (await harness.run("result = log", session=session))["result"] == [1, 2]  # the refused cell changed nothing


async def test_a_builtin_replaced_through_the_builtins_module_is_put_back(harness: Harness) -> None:
    """standard imports ``builtins``: its attributes are the tools themselves."""
    session = await harness.new_session()
    refused = await harness.call("run_python", code="import builtins\nbuiltins.len = lambda x: 0", session=session)
    assert refused.is_error and refused.content[0].text.splitlines()[0].endswith(ERASE.format("len"))
    assert (await harness.call("run_python", code="len([1, 2, 3])", session=session)).structured_content["result"] == 3


REFUSED_IMPORTS = ["import os", "from os import path", "import os.path", "from subprocess import run"]


@pytest.mark.parametrize("code", REFUSED_IMPORTS)
async def test_a_refused_import_is_said_in_the_old_executors_words(safe: Harness, code: str) -> None:
    """What a check written for the old tool looks for ("Import of os is not allowed", "Import from os is not
    allowed") is in the answer, before the profile and what it allows."""
    executor_module = pytest.importorskip("smolagents.local_python_executor")
    executor = executor_module.LocalPythonExecutor(additional_authorized_imports=[])
    executor.send_tools({})
    with pytest.raises(executor_module.InterpreterError) as raised:
        executor(code)
    old_words = str(raised.value).split("InterpreterError: ", 1)[-1].split(" is not allowed")[0] + " is not allowed"
    answer = await safe.call("run_python", code=code)
    assert answer.is_error and old_words in answer.content[0].text.splitlines()[0], (old_words, answer.content[0].text)


HOSTILE_RESULTS = [
    "class X:\n    def __str__(self):\n        raise SystemExit('bye')\nX()",
    "class X:\n    def __str__(self):\n        raise SystemExit('bye')\n[X()]",
    "import datetime\nclass D(datetime.date):\n    def isoformat(self):\n        raise LookupError('iso')\nD(2024, 1, 2)",
]


@pytest.mark.parametrize("code", HOSTILE_RESULTS, ids=["str-exits", "str-exits-in-list", "isoformat-raises"])
async def test_a_result_whose_own_code_misbehaves_is_reported_and_ends_nothing(safe: Harness, code: str) -> None:
    """A value's ``__str__`` or ``isoformat`` is the cell's code running in the report: whatever it raises (SystemExit
    ended the kernel), the answer comes with the value's repr."""
    answer = await safe.call("run_python", code=code)
    assert not answer.is_error, answer.content[0].text
    assert (await run_python(safe, "1 + 1"))["result"] == 2  # the same kernel, alive


async def test_execute_code_reports_a_value_whose_repr_exits(harness: Harness) -> None:
    session = await harness.new_session()
    answer = await harness.run("class Y:\n    def __repr__(self):\n        raise SystemExit('bye')\nresult = Y()", session=session)
    assert answer["success"] and "unrepresentable" in str(answer["result"]), answer
    assert (await harness.run("result = 6 * 7", session=session))["result"] == 42


def test_the_protected_names_are_the_old_executors_tools() -> None:
    executor_module = pytest.importorskip("smolagents.local_python_executor")
    from startup.protected import PROTECTED

    assert set(PROTECTED) == set(executor_module.BASE_PYTHON_TOOLS)


def test_the_old_executor_refuses_what_the_cases_above_say_it_does() -> None:
    """The error text is the old tool's own, for the forms it refused (it let others through, where a name it held
    kept its tool; here CPython would let them erase the builtin, so they are refused too)."""
    executor_module = pytest.importorskip("smolagents.local_python_executor")
    for code in ("print = '3'", "print: str = '3'", "for print in ['3']:\n    pass", "[abs for abs in [1]]", "del print"):
        executor = executor_module.LocalPythonExecutor(additional_authorized_imports=[])
        executor.send_tools({})
        with pytest.raises(executor_module.InterpreterError) as raised:
            executor(code)
        expected = dict(AROUND)[code].split(": ", 1)[1]
        assert expected in str(raised.value), (code, str(raised.value))


async def test_a_builtin_replaced_between_cells_by_a_thread_is_put_back(harness: Harness) -> None:
    """The cell ends before its thread rebinds: the next run_python cell finds the builtin as the kernel booted."""
    session = await harness.new_session()
    planted = await harness.call("run_python", session=session,
                                 code="import builtins, threading\nthreading.Timer(0.3, setattr, (builtins, 'divmod', lambda a, b: 'planted')).start()")
    assert not planted.is_error, planted.content
    # control: the thread did rebind it (waited for, not slept on: its 0.3 s timer may fire late on a busy machine;
    # execute_code cells put nothing back, so they can look)
    with anyio.fail_after(30):
        while (await harness.run("result = divmod(7, 2)", session=session))["result"] != "planted":
            await anyio.sleep(0.1)
    assert (await harness.call("run_python", code="divmod(7, 2)", session=session)).structured_content["result"] == [3, 1]
    assert (await harness.run("result = divmod(7, 2)", session=session))["result"] == [3, 1]
