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
from .world import World, destroy_world, make_world

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

# The red-team tests that pass with the sandbox off (``--weaken off``) by their nature, each reviewed, with
# its reason (a nodeid prefix; both profiles unless the profile is named). Every other red-team test claims
# that a layer stops its attack, so with every layer gone it must fail: under ``--weaken off`` a test that
# passes and is not named here ends the run with exit status 7 (.ci/run asserts 1), a judge that judges nothing.
SANDBOX_INDEPENDENT: dict[str, str] = {
    "tests/redteam/test_world.py::":
        "unit tests of the judge's own /proc argv parsing (world.py), no kernel involved",
    "tests/redteam/test_files_read.py::test_read_outside[standard-proc-1-environ]": "MACHINE",
    "tests/redteam/test_files_read.py::test_read_outside[strict-proc-1-environ]": "MACHINE",
    "tests/redteam/test_other_processes.py::test_other_processes[standard-proc-pid-1-mem]": "MACHINE",
    "tests/redteam/test_other_processes.py::test_other_processes[strict-proc-pid-1-mem]": "MACHINE",
    "tests/redteam/test_files_read.py::test_read_outside[standard-dev-mem]": "MACHINE",
    "tests/redteam/test_files_read.py::test_read_outside[strict-dev-mem]": "MACHINE",
    "tests/redteam/test_files_read.py::test_read_outside[standard-dev-raw-disk]": "MACHINE",
    "tests/redteam/test_files_read.py::test_read_outside[strict-dev-raw-disk]": "MACHINE",
    "tests/redteam/test_network.py::test_network[standard-dns-getaddrinfo]": "RESOLVER",
    "tests/redteam/test_network.py::test_network[strict-dns-getaddrinfo]": "RESOLVER",
    "tests/redteam/test_network.py::test_network[standard-dns-gethostbyname]": "RESOLVER",
    "tests/redteam/test_network.py::test_network[strict-dns-gethostbyname]": "RESOLVER",
    "tests/redteam/test_signals.py::test_signals[standard-killpg-own-group]": "OWN_GROUP",
    "tests/redteam/test_signals.py::test_signals[strict-killpg-own-group]": "OWN_GROUP",
    "tests/redteam/test_server_deputy.py::test_server_reconnects_through_planted_ipc_symlinks":
        "the server's own client (libzmq, on the host) reconnecting through symlinks a kernel planted in its ipc/ "
        "directory: the server's behaviour, which no kernel-side layer is meant to stop (its sockets stay writable)",
}
_REASONS = {
    "MACHINE": "the host's pid 1, /dev/mem and the raw disk are out of reach even of root on the test VM (Firecracker "
               "init, no /dev/mem, EPERM on /dev/vda), so nothing here can show the layer; the same attack on a "
               "process the sandbox must hide, the server, is judged by its -server twin",
    "RESOLVER": "the query goes to the host's resolver (/etc/resolv.conf), which the test cannot watch, and a name no "
                "server knows fails alike with the network and without: judged on resolving only; the same reach is "
                "judged by dns-query-resolvers, whose queries include the world's DNS canary (127.0.0.1:53)",
    "OWN_GROUP": "killpg(0) reaches only the kernel's own process group, which the launcher makes (a new session per "
                 "kernel): the server's behaviour, not a sandbox layer; killpg of the server's group is judged apart",
}
SANDBOX_INDEPENDENT = {k: _REASONS.get(v, v) for k, v in SANDBOX_INDEPENDENT.items()}
WEAKENED_PASS_STATUS = 7
_PASSED_WEAKENED: list[str] = []


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if support.WEAKEN == "off" and report.when == "call" and report.passed:
        if not any(report.nodeid.startswith(p) for p in SANDBOX_INDEPENDENT):
            _PASSED_WEAKENED.append(report.nodeid)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if _PASSED_WEAKENED:
        session.exitstatus = WEAKENED_PASS_STATUS


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
    if _PASSED_WEAKENED:
        terminalreporter.write_line(
            f"--weaken off: {len(_PASSED_WEAKENED)} red-team test(s) passed with the sandbox off and are not named in "
            f"tests/redteam/conftest.py SANDBOX_INDEPENDENT (exit status {WEAKENED_PASS_STATUS}): their judges judge "
            "nothing:\n  " + "\n  ".join(_PASSED_WEAKENED), red=True)
    if _LEFT_OUT:
        terminalreporter.write_line(f"--weaken {support.WEAKEN}: {len(_LEFT_OUT)} red-team tests left out, unsafe for the "
                                    f"host with a layer removed: {', '.join(sorted(HOST_HAZARDS))}")


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
