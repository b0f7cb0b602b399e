"""execute_code and friends through a real in-memory MCP client against real kernels."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import anyio
import pytest

from .conftest import Harness

pytestmark = pytest.mark.anyio


async def test_variables_persist_between_calls(harness: Harness) -> None:
    first = await harness.run("counter = 41")
    second = await harness.run("counter += 1\ncounter")
    assert second["result"] == 42
    assert first["session"] == second["session"]
    assert second["execution_count"] == first["execution_count"] + 1


async def test_result_variable_wins_over_last_expression(harness: Harness) -> None:
    r = await harness.run("result = {'a': [1, 2]}\n'ignored'")
    assert r["result"] == {"a": [1, 2]}


async def test_last_expression_is_the_result_when_result_is_not_bound(harness: Harness) -> None:
    await harness.run("result = 'old'")
    r = await harness.run("3 * 7")
    assert r["result"] == 21


async def test_rebinding_result_to_an_equal_small_int_still_counts(harness: Harness) -> None:
    await harness.run("result = 5")
    r = await harness.run("result = 5\n99")
    assert r["result"] == 5


async def test_result_is_repr_when_not_json(harness: Harness) -> None:
    r = await harness.run("result = {1, 2}")
    assert r["result"] == "{1, 2}"
    r = await harness.run("float('nan')")
    assert r["result"] == "nan"


async def test_a_numpy_scalar_result_is_its_number(harness: Harness) -> None:
    """``df.b.sum()`` is an np.int64, which JSON does not know (np.float64 is a float): it was the string
    "np.int64(6)". A numpy scalar is the number (or bool) it holds; what JSON has no word for stays a repr."""
    r = await harness.run("import numpy as np\nresult = [np.int64(6), np.bool_(True), np.float32(0.5), np.uint8(255)]")
    assert r["result"] == [6, True, 0.5, 255], r["result"]
    r = await harness.run("np.int64(6)")
    assert r["result"] == 6 and r["success"], r
    r = await harness.run("np.datetime64('2026-01-02')")
    assert r["result"] == "np.datetime64('2026-01-02')", r["result"]
    r = await harness.run("np.complex128(1+2j)")
    assert r["result"] == "np.complex128(1+2j)", r["result"]


async def test_no_result_when_cell_ends_in_a_statement(harness: Harness) -> None:
    r = await harness.run("print('x')")
    assert r["result"] is None
    assert r["success"] is True


async def test_stdout_and_stderr_are_kept_apart(harness: Harness) -> None:
    r = await harness.run("import sys\nprint('out')\nprint('err', file=sys.stderr)")
    assert r["stdout"] == "out\n"
    assert r["stderr"] == "err\n"


async def test_error_is_one_line_with_type_and_clean_traceback(harness: Harness) -> None:
    r = await harness.run("def f():\n    return 1/0\nf()")
    assert r["success"] is False
    assert r["error"] == "ZeroDivisionError: division by zero"
    assert r["error_type"] == "ZeroDivisionError"
    assert any("return 1/0" in line for line in r["traceback"])
    assert not any("\x1b[" in line for line in r["traceback"])


async def test_syntax_error_is_reported(harness: Harness) -> None:
    r = await harness.run("def broken(:\n  pass")
    assert r["success"] is False
    assert r["error_type"] == "SyntaxError"


async def test_state_survives_an_error(harness: Harness) -> None:
    await harness.run("kept = 'yes'")
    await harness.run("raise ValueError('boom')")
    r = await harness.run("kept")
    assert r["result"] == "yes"


async def test_matplotlib_gives_one_png_image_as_jupyter_does(harness: Harness) -> None:
    result = await harness.client.call_tool(
        "execute_code",
        {"code": "import matplotlib.pyplot as plt\nfig, ax = plt.subplots()\nax.plot([1, 3, 2])\nfig"},
    )
    s = result.structured_content
    mimes = sorted(o["mime_type"] for o in s["outputs"])
    assert mimes == ["image/png"]  # the figure shown once (not its repr and the flush), PNG only
    images = [c for c in result.content if c.type == "image"]
    assert len(images) == 1 and images[0].mime_type == "image/png"
    assert base64.b64decode(images[0].data).startswith(b"\x89PNG")
    assert not [c for c in result.content if c.type in ("resource", "resource_link")]
    for out in s["outputs"]:
        assert Path(out["path"]).stat().st_size == out["size"]
    assert "base64" not in json.dumps(s) and "iVBOR" not in json.dumps(s)


async def test_html_output_is_an_embedded_resource_readable_by_uri(harness: Harness) -> None:
    result = await harness.client.call_tool(
        "execute_code", {"code": "from IPython.display import HTML, display\ndisplay(HTML('<b>bold</b>'))"}
    )
    html = [o for o in result.structured_content["outputs"] if o["mime_type"] == "text/html"]
    assert len(html) == 1
    read = await harness.client.read_resource(html[0]["uri"])
    assert read.contents[0].text == "<b>bold</b>"


async def test_long_result_spills_to_result_file(harness: Harness) -> None:
    r = await harness.run("result = 'x' * 12000")
    assert r["result_file"]
    assert len(r["result"]) < 6000
    whole = Path(r["result_file"]).read_text()
    assert whole == json.dumps("x" * 12000)


async def test_long_stdout_is_cut_head_and_tail_with_the_whole_in_a_file(harness: Harness) -> None:
    r = await harness.run("for i in range(20000):\n    print(f'line {i}')")
    assert "line 0\n" in r["stdout"] and "line 19999" in r["stdout"]
    assert "characters cut" in r["stdout"]
    assert Path(r["stdout_file"]).read_text().count("\n") == 20000


async def test_two_sessions_do_not_share_variables(harness: Harness) -> None:
    a = await harness.new_session()
    b = await harness.new_session()
    await harness.run("secret = 'a'", session=a)
    r = await harness.run("secret", session=b)
    assert r["success"] is False and r["error_type"] == "NameError"
    assert (await harness.run("secret", session=a))["result"] == "a"


async def test_unknown_session_is_a_clear_tool_error(harness: Harness) -> None:
    result = await harness.call("execute_code", code="1", session="no-such-session-handle")
    assert result.is_error
    assert "unknown session" in result.content[0].text


async def test_closed_session_cannot_be_used(harness: Harness) -> None:
    s = await harness.new_session()
    closed = await harness.call("close_session", session=s)
    assert closed.structured_content["status"] == "closed"
    result = await harness.call("execute_code", code="1", session=s)
    assert result.is_error and "unknown session" in result.content[0].text


async def test_timeout_interrupts_and_session_stays_usable(harness: Harness) -> None:
    s = await harness.new_session()
    await harness.run("before = 1", session=s)
    r = await harness.run("import time\ntime.sleep(60)", session=s, timeout=1)
    assert r["timed_out"] is True and r["ending"] == "interrupted"
    assert r["success"] is False and r["error_type"] == "KeyboardInterrupt"
    assert (await harness.run("before + 1", session=s))["result"] == 2


async def test_kernel_death_is_reported_and_next_call_works(harness: Harness) -> None:
    s = await harness.new_session()
    r = await harness.run("import os\nos._exit(3)", session=s, timeout=30)
    assert r["ending"] == "kernel_died" and r["timed_out"] is False
    assert "exit code 3" in r["restart_reason"], r
    assert (await harness.run("1 + 1", session=s))["result"] == 2


async def test_list_variables_shows_type_repr_and_shape(harness: Harness) -> None:
    s = await harness.new_session()
    await harness.run("import numpy as np\narr = np.zeros((2, 3))\nname = 'x' * 500\nitems = [1, 2, 3]", session=s)
    result = await harness.call("list_variables", session=s)
    found = {v["name"]: v for v in result.structured_content["variables"]}
    assert set(found) == {"arr", "name", "items"}
    assert found["arr"]["shape"] == [2, 3] and found["arr"]["type"] == "numpy.ndarray"
    assert found["items"]["length"] == 3
    assert len(found["name"]["repr"]) <= 200


async def test_restart_session_clears_state(harness: Harness) -> None:
    s = await harness.new_session()
    await harness.run("gone = 1", session=s)
    info = await harness.call("restart_session", session=s)
    assert info.structured_content["status"] == "restarted"
    r = await harness.run("gone", session=s)
    assert r["error_type"] == "NameError"


async def test_run_python_answers_result_and_logs(harness: Harness) -> None:
    result = await harness.call("run_python", code="print('hi')\nresult = 2 + 3")
    assert not result.is_error
    assert result.structured_content == {"result": 5, "logs": "hi\n"}


async def test_run_python_errors_are_tool_errors_naming_the_exception(harness: Harness) -> None:
    result = await harness.call("run_python", code="int('x')")
    assert result.is_error
    assert "ValueError: invalid literal for int()" in result.content[0].text.splitlines()[0]


async def test_every_answer_names_its_session_and_notebook(harness: Harness) -> None:
    r = await harness.run("1")
    assert r["session"] and r["notebook"].endswith("notebook.ipynb")
    assert r["profile"] == "standard"


async def test_tools_have_schemas_and_annotations(harness: Harness) -> None:
    tools = {t.name: t for t in (await harness.client.list_tools()).tools}
    assert set(tools) == {"execute_code", "run_python", "list_variables", "new_session", "restart_session",
                          "close_session", "fork_session", "get_run", "send_input", "interrupt", "install_packages"}
    execute = tools["execute_code"]
    assert {"code", "working_dir", "session", "timeout", "background"} <= set(execute.input_schema["properties"])
    assert "success" in execute.output_schema["properties"]
    assert execute.annotations.read_only_hint is False
    assert tools["list_variables"].annotations.read_only_hint is True
    for tool in tools.values():
        assert tool.description


async def test_calls_to_one_session_run_one_at_a_time_in_arrival_order(harness: Harness) -> None:
    s = await harness.new_session()
    await harness.run("order = []", session=s)
    results: list[int] = []

    async def call(i: int) -> None:
        r = await harness.run(f"import time\ntime.sleep(0.05)\norder.append({i})\nlen(order)", session=s)
        results.append(r["result"])

    async with anyio.create_task_group() as tg:
        for i in range(6):
            tg.start_soon(call, i)
            await anyio.sleep(0.01)  # arrival order 0..5
    assert (await harness.run("order", session=s))["result"] == list(range(6))
    assert sorted(results) == list(range(1, 7))  # never two cells at once: each saw its own length


async def test_different_sessions_run_in_parallel(harness: Harness) -> None:
    a = await harness.new_session()
    b = await harness.new_session()
    started = await harness.run("import time\nwhile True:\n    time.sleep(0.05)", session=a, background=True)
    # b answers while a is still busy: were sessions serialised, b would wait behind a forever
    assert (await harness.run("7", session=b))["result"] == 7
    still = await harness.call("get_run", run_id=started["run_id"], wait_s=0)
    assert still.structured_content["ending"] == "running"
    await harness.call("interrupt", session=a)
    done = await harness.call("get_run", run_id=started["run_id"], wait_s=30)
    assert done.structured_content["error_type"] == "KeyboardInterrupt"
