"""The warm pool: new sessions get an already started, sandboxed kernel; it refills; no sharing."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import pytest

from .conftest import Harness, make_settings, serving

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
async def pooled(short_tmp: Path) -> AsyncIterator[Harness]:
    async with serving(make_settings(short_tmp, pool_size=2)) as h:
        yield h


async def pool_full(h: Harness, size: int) -> list[str]:
    with anyio.fail_after(60):
        while len(h.sessions.pool) < size:
            await anyio.sleep(0.1)
    return [s.handle for s in h.sessions.pool]


async def test_a_new_session_gets_a_pooled_kernel_and_the_pool_refills(pooled: Harness) -> None:
    ready = await pool_full(pooled, 2)
    pooled_kernel = pooled.sessions.pool[0].kernel
    handle = await pooled.new_session()
    assert handle == ready[0]
    assert pooled.sessions.sessions[handle].kernel is pooled_kernel  # no new kernel was started for it
    refilled = await pool_full(pooled, 2)
    assert handle not in refilled
    r = await pooled.run("x = 5\nx * 2", session=handle)
    assert r["result"] == 10


async def test_pooled_kernels_run_inside_their_sandbox(pooled: Harness) -> None:
    await pool_full(pooled, 2)
    handle = await pooled.new_session()
    r = await pooled.run("import subprocess", session=handle)
    assert r["error_type"] == "ImportError"
    assert "guard" in r["layers"] and "rlimits" in r["layers"]


async def test_concurrent_sessions_never_share_a_kernel(pooled: Harness) -> None:
    await pool_full(pooled, 2)
    handles: list[str] = []

    async def open_one() -> None:
        handles.append(await pooled.new_session())

    async with anyio.create_task_group() as tg:
        for _ in range(5):
            tg.start_soon(open_one)
    assert len(set(handles)) == 5
    kernels = {id(pooled.sessions.sessions[h].kernel) for h in handles}
    pids = {pooled.sessions.sessions[h].kernel.km.provisioner.process.pid for h in handles}
    assert len(kernels) == 5 and len(pids) == 5
    for i, h in enumerate(handles):
        await pooled.run(f"mine = {i}", session=h)
    for i, h in enumerate(handles):
        assert (await pooled.run("mine", session=h))["result"] == i
        await pooled.call("close_session", session=h)


async def test_the_default_session_comes_from_the_pool(pooled: Harness) -> None:
    ready = await pool_full(pooled, 2)
    r = await pooled.run("1")
    assert r["session"] in ready and r["session"] == pooled.sessions.default_handle
