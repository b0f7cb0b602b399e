"""Raising limits, regaining privileges, leaving the cgroup or the namespaces (``setrlimit``,
``prlimit``, ``setuid``, capabilities, ``unshare``, keyrings). Judged from the host: the kernel's /proc
status, limits and namespaces, its cgroup files and the server's own limits unchanged.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from .common import PROFILES, Target, cases, run_case
from .world import World, kernel_pids, process_state

pytestmark = pytest.mark.anyio


LIMITS: dict[str, Any] = {
    "setrlimit-nofile-up": "r = M('resource'); s, h = r.getrlimit(r.RLIMIT_NOFILE); r.setrlimit(r.RLIMIT_NOFILE, (h * 4, h * 4))",
    "setrlimit-data-unlimited": "r = M('resource'); r.setrlimit(r.RLIMIT_DATA, (r.RLIM_INFINITY, r.RLIM_INFINITY))",
    "setrlimit-fsize-unlimited": "r = M('resource'); r.setrlimit(r.RLIMIT_FSIZE, (r.RLIM_INFINITY, r.RLIM_INFINITY))",
    "prlimit-self": "r = M('resource'); r.prlimit(0, r.RLIMIT_NOFILE, (1 << 20, 1 << 20))",
    "prlimit-server": "r = M('resource'); r.prlimit(P['pid'], r.RLIMIT_CORE, (12345, 12345))",
    "ctypes-prlimit64": """
        ct = M('ctypes')
        new = (ct.c_uint64 * 2)(1 << 20, 1 << 20)
        check(libc().syscall(302, 0, 7, new, None), 'prlimit64')
    """,
    "ctypes-setrlimit": """
        ct = M('ctypes')
        check(libc().setrlimit(2, (ct.c_uint64 * 2)(-1, -1)), 'setrlimit DATA')
    """,
    "os.setresuid": "M('os').setresuid(0, 0, 0)",
    "os.setgroups": "M('os').setgroups([0, 1, 2, 3, 4, 6, 10])",
    "os.setgid": "M('os').setgid(0)",
    "capset-all": """
        ct = M('ctypes')
        header = (ct.c_uint32 * 2)(0x20080522, 0)
        data = (ct.c_uint32 * 6)(0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff)
        check(libc().capset(header, data), 'capset')
    """,
    "prctl-ambient-raise-sys_admin": "check(libc().prctl(47, 2, 21, 0, 0), 'PR_CAP_AMBIENT_RAISE')",
    "prctl-clear-no_new_privs": "check(libc().prctl(38, 0, 0, 0, 0), 'PR_SET_NO_NEW_PRIVS 0')",
    "unshare-user-ns": "check(libc().unshare(0x10000000), 'unshare CLONE_NEWUSER')",
    "unshare-mount-ns": "check(libc().unshare(0x00020000), 'unshare CLONE_NEWNS')",
    "setns-pid1-net": """
        fd = M('os').open('/proc/1/ns/net', 0)
        check(libc().setns(fd, 0), 'setns')
    """,
    "nice-minus-20": "os = M('os'); os.setpriority(os.PRIO_PROCESS, 0, -20)",
    "cgroup-move-to-root": "open('/sys/fs/cgroup/pids/cgroup.procs', 'w').write(str(M('os').getpid()))",
    "cgroup-raise-own-limits": """
        refused = []
        handle = P['session_dir'].rstrip('/').rsplit('/', 1)[1]
        where = [line.split(':', 2)[1:] for line in open('/proc/self/cgroup').read().splitlines()]  # (a cgroup ns shows '/')
        where += [['memory', '/kernelexec/' + handle], ['pids', '/kernelexec/' + handle], ['', '/kernelexec/' + handle]]
        for controllers, path in where:  # v1 and v2
            base = '/sys/fs/cgroup/' + (controllers.split(',')[0] + '/' if controllers else '')
            for name, value in (('memory.limit_in_bytes', '-1'), ('memory.max', 'max'), ('pids.max', 'max'),
                                ('memory.memsw.limit_in_bytes', '-1'), ('memory.swap.max', 'max')):
                try:
                    open(base + path.lstrip('/') + '/' + name, 'w').write(value)
                except OSError as e:
                    refused.append(repr(e))
        out = refused
    """,
    "iopl-3": "check(libc().syscall(172, 3), 'iopl')",
    "bpf-map-create": """
        ct = M('ctypes')
        attr = (ct.c_uint32 * 30)(2, 4, 4, 16)
        check(libc().syscall(321, 0, attr, 120), 'bpf')
    """,
    "io_uring_setup": """
        ct = M('ctypes')
        params = (ct.c_uint8 * 120)()
        check(libc().syscall(425, 8, params), 'io_uring_setup')
    """,
    "userfaultfd": "check(libc().syscall(323, 0), 'userfaultfd')",
    "perf_event_open": """
        ct = M('ctypes')
        attr = (ct.c_uint8 * 128)()
        check(libc().syscall(298, attr, 0, -1, -1, 0), 'perf_event_open')
    """,
    "keyctl-join-session": "check(libc().syscall(250, 1, None), 'keyctl JOIN_SESSION_KEYRING')",
    "personality-read-implies-exec": "check(libc().personality(0x0400000), 'personality')",
}


def _live_pids(t: Target, mode: str, *, restarted_ok: bool = False) -> list[int]:
    """The session's live kernel's host pid, as a one-element list. A positive control: no kernel found
    means the /proc comparisons below would compare nothing, so it fails (unless ``restarted_ok``)."""
    kernel = t.h.sessions.get(t.handles[mode]).kernel
    pids = kernel_pids(t.dirs[mode], kernel.connection_file) if kernel is not None else []
    assert restarted_ok or len(pids) == 1, f"the {mode} session's kernel not found in /proc ({pids}): nothing would be judged"
    return pids


_CGROUP_FILES = ("memory.limit_in_bytes", "memory.max", "pids.max", "memory.memsw.limit_in_bytes", "memory.swap.max")


def _cgroup_values(t: Target, mode: str) -> dict[str, str]:
    """The memory and pids limits of the cgroups the session's kernel is in, found from the kernel's own
    /proc/<pid>/cgroup (v1 lines ``n:memory:/path``, v2 ``0::/path``), not from where the product says it
    puts them. A positive control: as root on a machine with a cgroup hierarchy the kernel must be in one
    of kernelexec's cgroups with limits to read, or ``{} == {}`` would judge nothing. Keyed by controller and file,
    not by the cgroup's path: a kernel the attack crashed is replaced by its spare, in a cgroup of its own name
    (``<id>-s``), whose limits must be the same."""
    pids = _live_pids(t, mode, restarted_ok=True)
    if not pids:
        return {}
    values = {}
    for line in Path(f"/proc/{pids[0]}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "kernelexec" not in path:
            continue
        base = Path("/sys/fs/cgroup") if not controllers else Path("/sys/fs/cgroup") / controllers.split(",")[0]
        for name in _CGROUP_FILES:
            f = base / path.lstrip("/") / name
            try:
                values[f"{controllers or 'unified'}/{name}"] = f.read_text()
            except OSError:
                pass
    if os.geteuid() == 0 and any(Path("/sys/fs/cgroup", d).is_dir() for d in ("memory", "pids", "kernelexec")):
        assert values, f"the {mode} kernel (pid {pids[0]}) is in no kernelexec cgroup with limits: nothing to compare"
    return values


@pytest.mark.parametrize(("profile", "name", "code", "modes"), cases(LIMITS))
async def test_limits_and_privileges(world: World, targets: dict[str, Target], profile: str, name: str, code: str, modes: tuple[str, ...]) -> None:
    t = targets[profile]
    pids = {mode: _live_pids(t, mode) for mode in modes}
    before = {mode: process_state(p[0]) for mode, p in pids.items()}
    server_limits = Path("/proc/self/limits").read_text()
    cgroups = {mode: _cgroup_values(t, mode) for mode in modes}
    attacks = await run_case(world, targets, "limits", profile, name, code, modes)
    results = [a.result for a in attacks]
    assert Path("/proc/self/limits").read_text() == server_limits, f"{results}: the server's limits changed"
    for mode in modes:
        assert _cgroup_values(t, mode) == cgroups[mode], f"{results}: the {mode} session's cgroup limits changed"
        if _live_pids(t, mode, restarted_ok=True) == pids[mode]:  # (a kernel the attack crashed was replaced: nothing to compare)
            after = process_state(pids[mode][0])
            assert after == before[mode], f"{results}: the {mode} kernel changed its own limits/privileges/namespaces: {before[mode]} -> {after}"
            assert all(int(x, 16) == 0 for k in ("CapPrm", "CapEff", "CapAmb") for x in after["status"][k]), after
            assert after["status"]["NoNewPrivs"] == ["1"] and after["status"]["Seccomp"] == ["2"]


@pytest.mark.parametrize("profile", PROFILES)
async def test_kernel_process_holds_no_capabilities_not_even_in_its_bounding_set(targets: dict[str, Target], profile: str) -> None:
    """sandbox_exec.drop_capabilities promises an empty bounding set; no-new-privs is what stops a root
    execve from regaining the bounding set today, so this is defence in depth, measured from the host."""
    t = targets[profile]
    for role in ("guard", "os", "b"):
        pids = kernel_pids(t.dirs[role])
        assert pids, f"session {role} has no kernel process in /proc: nothing would be judged"
        for pid in pids:
            status = process_state(pid)["status"]
            assert status["NoNewPrivs"] == ["1"] and status["Seccomp"] == ["2"], status
            caps = {k: status[k][0] for k in ("CapInh", "CapPrm", "CapEff", "CapAmb", "CapBnd")}
            assert all(int(v, 16) == 0 for v in caps.values()), f"kernel pid {pid} of session {role}: {caps}"


# --- what only the cgroup bounds ------------------------------------------------------------------
# The rlimits cover one process's data (RLIMIT_DATA) and files (RLIMIT_FSIZE); seccomp stops new processes.
# Threads get past seccomp (clone with CLONE_THREAD is allowed): bounded by the cgroup's pids.max and, for a
# kernel with its own uid, by RLIMIT_NPROC too (measured: ~60 threads either way; not the cgroup's alone).
# Shared memory that is never mapped (memfd pages written with write(): not data, each memfd under
# RLIMIT_FSIZE) is bounded by the cgroup alone: the one attack that fails with --weaken cgroup. Each attack here runs in a
# server of its own with small limits; judged by what the kernel held, read from the host where it can be.
BOMB_PROCESSES = 64
BOMB_MEMORY_MB = 128  # the cgroup's hard cap is this + 512 MiB (sandbox._cgroups)

THREAD_BOMB = f"""
import threading
threading.stack_size(128 * 1024)  # (small stacks: RLIMIT_DATA counts them, and this is about the count)
stop = threading.Event()
started = 0
for _ in range({BOMB_PROCESSES * 3}):
    try:
        threading.Thread(target=stop.wait, daemon=True).start()
    except RuntimeError:
        break
    started += 1
threads = threading.active_count()  # (with the kernel's own threads)
stop.set()
(started, threads)
"""

MEMFD_BOMB = """
import os
chunk, fds, held = b'x' * (1 << 20), [], 0
for _ in range(4):  # 4 x 230 MiB: each under RLIMIT_FSIZE (256 MiB), 920 MiB in all, past the cgroup's 640
    fd = os.memfd_create('kxrt-bomb')
    fds.append(fd)
    for _ in range(230):
        os.write(fd, chunk)
        held += 1
held
"""


@pytest.fixture(scope="module")
async def small(short_tmp: Path) -> Any:
    from ..support import make_settings, serving

    async with serving(make_settings(short_tmp, profile="standard", memory_mb=BOMB_MEMORY_MB,
                                     max_processes=BOMB_PROCESSES)) as h:
        yield h


async def test_a_thread_bomb_stops_at_the_cgroup_pids_limit(small: Any) -> None:
    s = await small.new_session()
    r = await small.run(THREAD_BOMB, session=s, timeout=60)
    assert r["success"], {k: r[k] for k in ("error", "traceback", "ending", "restart_reason", "stderr")}
    started, threads = r["result"]
    assert threads >= started > 8, r  # positive control: the cell did start threads
    assert threads <= BOMB_PROCESSES, f"the kernel ran {threads} threads, past its cgroup's pids.max {BOMB_PROCESSES}"
    await small.call("close_session", session=s)


async def test_unmapped_shared_memory_stops_at_the_cgroup_memory_limit(small: Any) -> None:
    s = await small.new_session()
    r = await small.run(MEMFD_BOMB, session=s, timeout=120)
    # with the cgroup: the kernel is OOM-killed (and restarted) before the cell ends; 920 MiB held is the escape
    assert not (r["success"] and r["result"] == 920), f"the kernel held 920 MiB of memfd pages past its {BOMB_MEMORY_MB}+512 MiB cgroup"
    assert r["ending"] == "kernel_died" or r["error_type"] in ("OSError", "MemoryError"), r  # stopped, and said so
    await small.call("close_session", session=s)
