"""Long cells the way clients wait: a foreground call yields instead of cutting, and a
working call sends a heartbeat. Real kernels, real clients: in memory, stdio and streamable HTTP."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client

from .conftest import make_settings, serving
from .support import http_server, stdio_params

pytestmark = pytest.mark.anyio


async def test_a_cell_longer_than_yield_after_answers_running_and_goes_on_to_its_answer(short_tmp: Path) -> None:
    async with serving(make_settings(short_tmp, yield_after=2, pool_size=0, restart_spares=0)) as h:
        started = time.monotonic()
        first = await h.client.call_tool("execute_code", {"code": "import time\nprint('begun', flush=True)\ntime.sleep(5)\n"
                                                                  "print('done')\n6 * 7"})
        took = time.monotonic() - started
        assert not first.is_error, first.content
        s: Any = first.structured_content
        assert s["ending"] == "running" and s["run_id"] and took < 4.5, (s, took)
        assert "get_run" in first.content[0].text and "nothing was cut" in first.content[0].text
        done: Any = (await h.client.call_tool("get_run", {"run_id": s["run_id"], "wait_s": 30})).structured_content
        assert done["ending"] == "completed" and done["result"] == 42 and "done" in done["stdout"], done
        # a short cell still answers in one call, and the session is the same
        quick: Any = (await h.client.call_tool("execute_code", {"code": "time.sleep(0.1)\n'quick'"})).structured_content
        assert quick["ending"] == "completed" and quick["result"] == "quick", quick


async def test_a_cell_still_ends_at_its_timeout_after_yielding(short_tmp: Path) -> None:
    async with serving(make_settings(short_tmp, yield_after=1, pool_size=0, restart_spares=0)) as h:
        first: Any = (await h.client.call_tool("execute_code", {"code": "import time\ntime.sleep(60)", "timeout": 3})).structured_content
        assert first["ending"] == "running", first
        done: Any = (await h.client.call_tool("get_run", {"run_id": first["run_id"], "wait_s": 30})).structured_content
        assert done["ending"] in ("interrupted", "timeout"), done


async def test_run_python_never_yields(short_tmp: Path) -> None:
    async with serving(make_settings(short_tmp, yield_after=1, pool_size=0, restart_spares=0, preset="safe-executor")) as h:
        r: Any = await h.client.call_tool("run_python", {"code": "x = 0\nfor i in range(3_000_000):\n    x += i\nx"})
        assert not r.is_error and set(r.structured_content) == {"result", "logs"}, r


async def _progress_of_a_silent_cell(client: Client, seconds: int) -> list[tuple[float, str | None]]:
    seen: list[tuple[float, str | None]] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        seen.append((progress, message))

    r = await client.call_tool("execute_code", {"code": f"import time\ntime.sleep({seconds})\n'slept'"}, progress_callback=on_progress)
    assert not r.is_error and r.structured_content["result"] == "slept", r  # type: ignore[index]
    return seen


async def test_a_line_printed_before_a_long_silence_reaches_the_client_during_the_silence(short_tmp: Path) -> None:
    """Progress goes out at most every half second; a line held back by that goes out once the half second
    has passed, not with the next output, which a working cell may not print for minutes. (The second line comes
    0.1 s after the first, always within the first's half second.)"""
    async with serving(make_settings(short_tmp, pool_size=0, restart_spares=0)) as h:
        await h.client.call_tool("execute_code", {"code": "import time"})  # the kernel started: the lines come at once
        seen: list[tuple[float, str | None]] = []

        async def on_progress(progress: float, total: float | None, message: str | None) -> None:
            seen.append((time.monotonic(), message))

        code = "print('loading', flush=True)\ntime.sleep(0.1)\nprint('the model', flush=True)\ntime.sleep(4)\n'loaded'"
        r = await h.client.call_tool("execute_code", {"code": code}, progress_callback=on_progress)
        ended = time.monotonic()
        assert r.structured_content["result"] == "loaded", r  # type: ignore[index]
        told = [at for at, message in seen if message and "the model" in message]
        assert told and told[0] < ended - 2, (seen, ended)


@pytest.mark.slow
async def test_a_silent_25_s_cell_sends_heartbeats_over_streamable_http(short_tmp: Path) -> None:
    with http_server(short_tmp / "hb", "--pool-size", "0", "--restart-spares", "0", "--yield-after", "0") as url:
        async with Client(url) as client:
            seen = await _progress_of_a_silent_cell(client, 25)
    beats = [m for _, m in seen if m and m.startswith("still running")]
    assert len(beats) >= 2, seen


@pytest.mark.slow
async def test_at_the_defaults_a_75_s_cell_yields_within_50_s_over_stdio_and_completes(short_tmp: Path) -> None:
    """The default --yield-after (40 s) and --default-timeout (900 s): the cell is never cut."""
    params = stdio_params(short_tmp / "s75", "--pool-size", "0", "--restart-spares", "0")
    async with Client(params) as client:  # type: ignore[arg-type]
        started = time.monotonic()
        first: Any = await client.call_tool("execute_code", {"code": "import time\ntime.sleep(75)\n'finished'"})
        took = time.monotonic() - started
        assert first.structured_content["ending"] == "running" and took < 50, (first.structured_content, took)
        with anyio.fail_after(120):
            while True:
                done: Any = (await client.call_tool("get_run", {"run_id": first.structured_content["run_id"], "wait_s": 30})).structured_content
                if done["ending"] != "running":
                    break
        assert done["ending"] == "completed" and done["result"] == "finished", done
