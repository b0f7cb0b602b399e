"""The two older tools' own published checks, run against the presets that replace them.

- The safe local Python executor (``run_python(code)`` answering ``{result, logs}``) documented a
  short list of checks; they must pass through ``run_python`` under ``--preset safe-executor``.
- The old Claude Code plugin (``execute_code(code, working_dir)`` answering ``{success, result,
  stdout, stderr, result_file, error}``) documented two examples; they must pass through
  ``execute_code`` under ``--preset plugin``.
"""

from __future__ import annotations

import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from .conftest import Harness, make_settings, serving

pytestmark = pytest.mark.anyio

PRIMES_TO_100 = [2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41, 43, 47, 53, 59, 61, 67, 71, 73, 79, 83, 89, 97]


@pytest.fixture(scope="module")
async def safe(short_tmp: Path) -> AsyncIterator[Harness]:
    async with serving(make_settings(short_tmp, preset="safe-executor")) as h:
        yield h


@pytest.fixture(scope="module")
def project_dir(short_tmp: Path) -> Path:
    """Where the old plugin's user started Claude Code: the plugin preset's working directory."""
    return Path(tempfile.mkdtemp(prefix="proj", dir=short_tmp))


@pytest.fixture(scope="module")
async def plugin(short_tmp: Path, project_dir: Path) -> AsyncIterator[Harness]:
    async with serving(make_settings(short_tmp, preset="plugin", working_dir=project_dir)) as h:
        yield h


async def run_python(h: Harness, code: str) -> dict:
    answer = await h.call("run_python", code=code)
    assert not answer.is_error, answer.content
    return answer.structured_content


# --- the safe executor's checks -------------------------------------------------------------------


async def test_safe_executor_exposes_only_run_python_under_strict(safe: Harness) -> None:
    assert [t.name for t in (await safe.client.list_tools()).tools] == ["run_python"]


async def test_simple_arithmetic(safe: Harness) -> None:
    assert await run_python(safe, "2 + 2") == {"result": 4, "logs": ""}


async def test_variable_assignment_then_use(safe: Harness) -> None:
    assert (await run_python(safe, "x = 10\ny = 32\nx + y"))["result"] == 42


async def test_last_expression_value(safe: Harness) -> None:
    answer = await run_python(safe, "print('computing')\nvalue = 7\nvalue * 6")
    assert answer == {"result": 42, "logs": "computing\n"}


async def test_array_sum(safe: Harness) -> None:
    assert (await run_python(safe, "sum([1, 2, 3, 4, 5])"))["result"] == 15


async def test_primes_up_to_100(safe: Harness) -> None:
    code = (
        "def is_prime(n):\n"
        "    if n < 2:\n"
        "        return False\n"
        "    for d in range(2, int(n ** 0.5) + 1):\n"
        "        if n % d == 0:\n"
        "            return False\n"
        "    return True\n"
        "[n for n in range(1, 101) if is_prime(n)]"
    )
    result = (await run_python(safe, code))["result"]
    assert result == PRIMES_TO_100 and len(result) == 25


async def test_import_os_is_refused_naming_the_import(safe: Harness) -> None:
    answer = await safe.call("run_python", code="import os\nos.listdir('/')")
    assert answer.is_error
    message = answer.content[0].text
    assert "ImportError: Import of os is not allowed" in message.splitlines()[0]


async def test_the_documented_stdlib_modules_still_import(safe: Harness) -> None:
    modules = ["collections", "datetime", "itertools", "math", "queue", "random", "re", "stat", "statistics", "time", "unicodedata"]
    code = "\n".join(f"import {m}" for m in modules) + "\nmath.factorial(5)"
    assert (await run_python(safe, code))["result"] == 120


async def test_no_file_io(safe: Harness) -> None:
    answer = await safe.call("run_python", code="open('notes.txt', 'w').write('x')")
    assert answer.is_error and "not allowed" in answer.content[0].text


# --- the old Claude Code plugin's examples ---------------------------------------------------------


async def test_plugin_preset_exposes_only_execute_code_with_the_old_answer_fields(plugin: Harness) -> None:
    assert [t.name for t in (await plugin.client.list_tools()).tools] == ["execute_code"]
    answer = await plugin.run("1 + 1")
    assert {"success", "result", "stdout", "stderr", "result_file", "error"} <= set(answer)
    assert answer["success"] is True and answer["result"] == 2 and answer["profile"] == "trusted"


async def test_sorting_a_million_random_numbers(plugin: Harness) -> None:
    code = (
        "import random\n"
        "random.seed(42)\n"
        "numbers = [random.random() for _ in range(1_000_000)]\n"
        "ordered = sorted(numbers)\n"
        "print(f'sorted {len(ordered):,} numbers')\n"
        "result = {'count': len(ordered), 'is_sorted': all(a <= b for a, b in zip(ordered, ordered[1:])),\n"
        "          'min_first': ordered[0] == min(numbers), 'max_last': ordered[-1] == max(numbers)}"
    )
    answer = await plugin.run(code, timeout=120)
    assert answer["success"], answer["error"]
    assert answer["stdout"] == "sorted 1,000,000 numbers\n"
    assert answer["result"] == {"count": 1_000_000, "is_sorted": True, "min_first": True, "max_last": True}


async def test_binomial_distribution_bar_chart_saved_as_svg(plugin: Harness, project_dir: Path) -> None:
    code = (
        "import math\n"
        "import matplotlib.pyplot as plt\n"
        "n, p = 20, 0.5\n"
        "ks = list(range(n + 1))\n"
        "probs = [math.comb(n, k) * p ** k * (1 - p) ** (n - k) for k in ks]\n"
        "fig, ax = plt.subplots()\n"
        "ax.bar(ks, probs)\n"
        "ax.set_title(f'Binomial distribution (n={n}, p={p})')\n"
        "fig.savefig('binomial.svg')\n"
        "result = round(sum(probs), 9)"
    )
    answer = await plugin.run(code)
    assert answer["success"], answer["error"]
    assert answer["result"] == 1.0
    saved = project_dir / "binomial.svg"  # the old plugin worked in the directory it was started in
    head = saved.read_text()[:2000]
    assert head.startswith("<?xml") and "<svg" in head
    # the figure also comes back to the model, as Jupyter shows it: a PNG image
    shown = {o["mime_type"]: Path(o["path"]) for o in answer["outputs"]}
    assert set(shown) == {"image/png"}
    assert shown["image/png"].read_bytes().startswith(b"\x89PNG")


async def test_a_big_result_is_spilled_to_result_file(plugin: Harness) -> None:
    answer = await plugin.run("result = list(range(100_000))")
    assert answer["result_file"] and Path(answer["result_file"]).stat().st_size > 100_000
