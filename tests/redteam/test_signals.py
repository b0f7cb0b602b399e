"""Signals to the server (= this test process in the in-memory harness), its process group and
everyone else. Judged by the signal counters in this process and session B's kernel staying alive.
"""

from __future__ import annotations

from typing import Any

import pytest

from .common import Target, cases, run_case
from .world import World

pytestmark = pytest.mark.anyio


SIGNALS: dict[str, Any] = {
    "kill-SIGUSR1": "M('os').kill(P['pid'], M('signal').SIGUSR1)",
    "kill-0-probe": "M('os').kill(P['pid'], 0); raise AssertionError('ESCAPE: the server pid is visible')",
    "killpg-server-group": "M('os').killpg(P['pgid'], M('signal').SIGUSR2)",
    "killpg-own-group": "M('os').killpg(0, M('signal').SIGWINCH)",
    "kill-minus-1": "M('os').kill(-1, M('signal').SIGWINCH)",
    "pidfd_send_signal": "os = M('os'); M('signal').pidfd_send_signal(os.pidfd_open(P['pid']), M('signal').SIGUSR1)",
    "ctypes-kill": "check(libc().kill(P['pid'], 10), 'kill')",
    "ctypes-tgkill": "check(libc().syscall(234, P['pid'], P['pid'], 10), 'tgkill')",
    "ctypes-rt_sigqueueinfo": """
        ct = M('ctypes')
        info = (ct.c_int * 32)(10, 0, -1)
        check(libc().syscall(129, P['pid'], 10, info), 'rt_sigqueueinfo')
    """,
    "fcntl-F_SETOWN-sigio": """
        fcntl = M('fcntl'); socket = M('socket'); os = M('os')
        a, b = socket.socketpair()
        fcntl.fcntl(a, 10, 10)                  # F_SETSIG SIGUSR1
        fcntl.fcntl(a, fcntl.F_SETOWN, P['pid'])
        fcntl.fcntl(a, fcntl.F_SETFL, fcntl.fcntl(a, fcntl.F_GETFL) | os.O_ASYNC)
        b.send(b'x')
    """,
    "kill-pid-1-in-namespace": "M('os').kill(1, M('signal').SIGWINCH)",
}


@pytest.mark.parametrize(("profile", "name", "code", "modes"), cases(SIGNALS))
async def test_signals(world: World, targets: dict[str, Target], profile: str, name: str, code: str, modes: tuple[str, ...]) -> None:
    await run_case(world, targets, "signals", profile, name, code, modes)
