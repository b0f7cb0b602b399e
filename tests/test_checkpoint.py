"""State that outlives its kernel (issue 32): checkpoints written inside the kernel, restored inside the
next one after any death, and only the cells that made what could not be saved run again.

Real kernels behind the real MCP server; every death is a real one (SIGKILL from outside, ``os._exit``
in a cell, a timeout's restart)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import anyio
import pytest

from .support import Harness, make_settings, serving

pytestmark = pytest.mark.anyio


async def settled(h: Harness, s: str) -> dict[str, Any]:
    """Wait for the background save of the last cell (the next cell would wait for it too)."""
    status = (await h.run("_kernelexec_checkpoint_status()._repr_json_()", session=s))["result"]
    return status  # type: ignore[no-any-return]


def pid_of(h: Harness, s: str) -> int:
    kernel = h.sessions.sessions[s].kernel
    assert kernel is not None and kernel.km is not None
    return int(kernel.km.provisioner.process.pid)  # type: ignore[union-attr]


async def test_sigkill_then_the_next_call_finds_the_variables(harness: Harness) -> None:
    s = await harness.new_session()
    await harness.run("import math\nx = 41\ndata = {'a': [1, 2, 3]}\nclass P:\n    pass\n", session=s)
    await harness.run("data['a'].append(4)\nx += 1", session=s)  # an in-place change: saved too
    status = await settled(harness, s)
    assert {"x", "data", "math"} <= set(status["saved"]), status
    assert "P" in status["unsaved"]
    os.kill(pid_of(harness, s), signal.SIGKILL)
    await anyio.sleep(0.5)
    r = await harness.run("result = (x, data, math.pi > 3, P.__name__)", session=s)
    assert r["result"] == [42, {"a": [1, 2, 3, 4]}, True, "P"], r
    restored = r["restored"]
    assert {"x", "data", "math"} <= set(restored["restored"]), restored
    assert [c["cell"] for c in restored["reran"]] == [1] and restored["reran"][0]["for_names"] == ["P"], restored
    assert "restored" in (r["restart_reason"] or "") and "re-ran cell 1 for P" in r["restart_reason"], r


async def test_os_exit_in_a_cell(harness: Harness) -> None:
    s = await harness.new_session()
    await harness.run("big = list(range(100_000))\ny = 'kept'", session=s)
    await settled(harness, s)
    dead = await harness.client.call_tool("execute_code", {"code": "import os\nos._exit(3)", "session": s})
    assert dead.structured_content["ending"] == "kernel_died"
    r = await harness.run("result = (len(big), y)", session=s)
    assert r["result"] == [100_000, "kept"], r
    assert r["restored"]["reran"] == [], r["restored"]


async def test_timeout_restart_then_restore(short_tmp: Path) -> None:
    async with serving(make_settings(short_tmp, interrupt_grace=1.0)) as h:
        s = await h.new_session()
        await h.run("z = [1, 2]", session=s)
        await settled(h, s)
        stuck = await h.client.call_tool("execute_code", {"code": "import time, signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\n"
                                                                   "time.sleep(60)", "session": s, "timeout": 2})
        assert stuck.structured_content["ending"] == "restarted", stuck.structured_content
        r = await h.run("result = z", session=s)
        assert r["result"] == [1, 2], r


async def test_only_the_cell_that_made_an_unpicklable_object_runs_again(harness: Harness) -> None:
    s = await harness.new_session()
    await harness.run("counter = 0\nseed = [5, 6, 7]", session=s)  # cell 1
    await harness.run("counter += 1\ngen = (v * 2 for v in seed)\nruns_of_cell_2 = counter", session=s)  # cell 2
    await harness.run("other = sum(seed)\ncounter += 10", session=s)  # cell 3
    await harness.run("fh = open('notes.txt', 'w')", session=s)  # cell 4
    status = await settled(harness, s)
    assert {"gen", "fh"} <= set(status["unsaved"]), status
    os.kill(pid_of(harness, s), signal.SIGKILL)
    await anyio.sleep(0.5)
    r = await harness.run("result = (next(gen), other, counter, fh.closed)", session=s)
    reran = {c["cell"]: c["for_names"] for c in r["restored"]["reran"]}
    assert reran == {2: ["gen"], 4: ["fh"]}, r["restored"]
    # cell 2 ran again (gen is back) but counter keeps the checkpoint's value, not cell 2's rerun of it
    assert r["result"] == [10, 18, 11, False], r
    assert "re-ran cell 2 for gen" in r["restart_reason"]


async def test_lost_when_no_cell_can_make_it_again(harness: Harness) -> None:
    s = await harness.new_session()
    await harness.run("import threading\nglobals()['ghost'] = threading.Lock()\nkeep = 1", session=s)
    status = await settled(harness, s)
    assert "ghost" in status["unsaved"]  # no recorded cell binds it by name
    os.kill(pid_of(harness, s), signal.SIGKILL)
    await anyio.sleep(0.5)
    r = await harness.run("result = keep", session=s)
    assert r["result"] == 1
    assert r["restored"]["lost"] == ["ghost"] and "lost: ghost" in r["restart_reason"], r["restored"]


async def test_over_the_cap_names_what_it_left_out(short_tmp: Path) -> None:
    async with serving(make_settings(short_tmp, checkpoint_mb=1)) as h:
        s = await h.new_session()
        await h.run("small = 'x' * 1000\nhuge = b'y' * 3_000_000", session=s)
        status = await settled(h, s)
        assert "small" in status["saved"]
        assert "huge" in status["unsaved"] and "cap" in status["unsaved"]["huge"], status
        assert status["bytes"] <= 1_000_000


async def test_plain_restart_drops_the_checkpoint_restore_brings_it_back(harness: Harness) -> None:
    s = await harness.new_session()
    await harness.run("kept = 7", session=s)
    await settled(harness, s)
    info = await harness.call("restart_session", session=s, restore=True)
    assert info.structured_content["restored"]["restored"] == ["kept"], info.structured_content
    assert (await harness.run("result = kept", session=s))["result"] == 7
    await harness.call("restart_session", session=s)
    r = await harness.client.call_tool("execute_code", {"code": "kept", "session": s})
    assert r.structured_content["error_type"] == "NameError"


async def test_x_equals_1_writes_nothing_when_nothing_changed(harness: Harness) -> None:
    s = await harness.new_session()
    await harness.run("x = 1", session=s)
    await settled(harness, s)
    manifest = harness.settings.sessions_dir / s / "checkpoint" / "manifest.json"
    before = manifest.stat().st_mtime_ns
    time.sleep(0.05)
    await harness.run("print('hello')", session=s)
    await settled(harness, s)
    assert manifest.stat().st_mtime_ns == before
