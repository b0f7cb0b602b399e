"""The red-team fixtures, one of each for the whole package: the outside world the attacks must not
touch (``world``) and the attacked servers (``targets``: one per profile, each with its attacker and
victim sessions), started once and shared by every module here, as one module shared them before.
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from .. import support
from .common import OUTCOMES, PROFILES, Target, open_sessions, start_target
from .world import World, destroy_world, make_world, world_lock

# Under ``--weaken`` the attacks that succeed run with a layer missing, as root on the test machine: these few
# would then reach beyond this test run (other people's processes, the host's init, mounts, the test's own
# cgroup), so a weakened run leaves them out, and says so in its summary. The plain run has them all.
HOST_HAZARDS = {
    "kill-minus-1": "signals every process the kernel's uid may signal",
    "kill-pid-1-in-namespace": "signals the host's init",
    "ptrace-attach-pid-1": "would stop the host's init",
    "ptrace-attach-server": "stops the test process itself (the server) for good",
    "umount-private-tmp": "would unmount the host's /tmp",
    "mount-host-root": "would mount the host's disk",
    "cgroup-raise-own-limits": "would raise the limits of the cgroup the server runs in",
    "proc-sys-hostname": "would rename the host (no UTS namespace without bubblewrap)",
    "sethostname": "would rename the host (no UTS namespace without bubblewrap)",
    "killpg-server-group": "signals the test runner's whole process group",
}
_LEFT_OUT: list[str] = []

def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not support.WEAKEN:
        return
    keep, drop = [], []
    for item in items:
        (drop if any(f"-{name}]" in item.nodeid for name in HOST_HAZARDS) else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep
        _LEFT_OUT.extend(item.nodeid for item in drop)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if _LEFT_OUT:
        terminalreporter.write_line(f"--weaken {support.WEAKEN}: {len(_LEFT_OUT)} red-team tests left out, unsafe for the "
                                    f"host with a layer removed: {', '.join(sorted(HOST_HAZARDS))}")


@pytest.fixture(scope="package")
def world() -> Iterator[World]:
    """One world on the machine at a time (a lock every pytest process takes): its DNS canary is the one
    127.0.0.1:53, and its judges look at the whole host (its hostname, its processes), where another run's attacks
    (.ci/run's weakened red team, beside the main pass) would be judged as this run's."""
    with world_lock():
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
