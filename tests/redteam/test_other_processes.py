"""Other processes: ``ptrace``, ``process_vm_readv``, ``/proc/<pid>/mem`` of the server, what
``/proc`` shows. Judged by the server's memory secret in no answer and neither the server nor
session B's kernel visible.
"""

from __future__ import annotations

from typing import Any

import pytest

from .common import Target, cases, run_case
from .world import World

pytestmark = pytest.mark.anyio


OTHER_PROCESSES: dict[str, Any] = {
    "ptrace-attach-server": "check(libc().syscall(101, 16, P['pid'], 0, 0), 'PTRACE_ATTACH')",
    "ptrace-attach-pid-1": "check(libc().syscall(101, 16, 1, 0, 0), 'PTRACE_ATTACH 1')",
    "process_vm_readv-server-memory": """
        ct = M('ctypes')
        buf = ct.create_string_buffer(P['mem_len'])
        local = (ct.c_void_p * 2)(ct.addressof(buf), P['mem_len'])
        remote = (ct.c_void_p * 2)(P['mem_addr'], P['mem_len'])
        check(libc().syscall(310, P['pid'], local, 1, remote, 1, 0), 'process_vm_readv')
        out = buf.raw
    """,
    "proc-pid-mem-server": """
        with open(f"/proc/{P['pid']}/mem", 'rb') as f:
            f.seek(P['mem_addr'])
            out = f.read(P['mem_len'])
    """,
    "proc-pid-1-mem": "out = open('/proc/1/mem', 'rb').read(1)",
    "proc-listing": """
        os = M('os')
        seen = {}
        for d in os.listdir('/proc'):
            if d.isdigit():
                try:
                    seen[d] = open('/proc/%s/cmdline' % d, 'rb').read()[:200]
                except OSError as e:
                    seen[d] = repr(e)
        out = {d: c for d, c in seen.items() if c}  # (the host's kernel threads have none: room for the rest)
    """,
    "proc-listing-scandir-cwd-links": """
        os = M('os'); out = {}
        for d in os.listdir('/proc'):
            if d.isdigit():
                try:  # (one process out of reach, the host's init, must not hide the others)
                    out[d] = os.readlink('/proc/%s/cwd' % d)
                except OSError as e:
                    out[d] = type(e).__name__
    """,
    "pidfd_open-server": """
        os = M('os')
        pidfd = os.pidfd_open(P['pid'])
        fd = check(libc().syscall(438, pidfd, P['secret_fd'], 0), 'pidfd_getfd')  # the server's open secret file
        out = os.pread(fd, 4096, 0)
    """,
    "kcmp-server": """
        check(libc().syscall(312, P['pid'], M('os').getpid(), 0, 0, 0), 'kcmp')  # needs ptrace access to the server
        raise AssertionError('ESCAPE: kcmp compared the server with this kernel')
    """,
}


@pytest.mark.parametrize(("profile", "name", "code", "modes"), cases(OTHER_PROCESSES))
async def test_other_processes(world: World, targets: dict[str, Target], profile: str, name: str, code: str, modes: tuple[str, ...]) -> None:
    t = targets[profile]
    for a in await run_case(world, targets, "other-processes", profile, name, code, modes):
        assert not (name.startswith("proc-listing") and a.result.endswith(" [cut]")), f"a listing too long to judge: {a.result}"
        assert "pytest" not in a.result, f"the server process is visible: {a.result}"
        assert t.handles["b"] not in a.result, f"session B's kernel is visible: {a.result}"
