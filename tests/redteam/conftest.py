"""The red-team fixtures, one of each for the whole package: the outside world the attacks must not
touch (``world``) and the attacked servers (``targets``: one per profile, each with its attacker and
victim sessions), started once and shared by every module here, as one module shared them before.
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import anyio
import pytest

from .common import OUTCOMES, PROFILES, Target, open_sessions, start_target
from .world import World, destroy_world, make_world


@pytest.fixture(scope="package")
def world() -> Iterator[World]:
    w = make_world()
    yield w
    destroy_world(w)
    dump = os.environ.get("KXRT_REDTEAM_TALLY")
    if dump:
        Path(dump).write_text(json.dumps(OUTCOMES, indent=1))


@pytest.fixture(scope="package")
async def targets(world: World, short_tmp: Path) -> AsyncIterator[dict[str, Target]]:
    started: dict[str, Target] = {}
    try:
        for profile in PROFILES:  # servers one after the other (each owns a task group), kernels all at once
            started[profile] = await start_target(world, short_tmp, profile)
        async with anyio.create_task_group() as tg:
            for t in started.values():
                tg.start_soon(open_sessions, t)
        yield started
    finally:
        for t in reversed(list(started.values())):
            await t.h.client.__aexit__(None, None, None)
            await t.cm.__aexit__(None, None, None)
