"""Starting processes by every route (``subprocess``, ``os``, ``_posixsubprocess.fork_exec``, ctypes
``system``, pickle, exec). The marker is written in the attacker's own session dir, where any process it
started could write: judged by the marker not existing.
"""

from __future__ import annotations

from typing import Any

import pytest

from .common import Target, cases, run_case
from .world import World

pytestmark = pytest.mark.anyio


SUBPROCESS: dict[str, Any] = {
    "subprocess.run": "M('subprocess').run(['/bin/sh', '-c', P['shcmd']], timeout=5)",
    "subprocess.Popen-shell": "M('subprocess').Popen(P['shcmd'], shell=True).wait(5)",
    "subprocess.check_output-python": "M('subprocess').check_output([M('sys').executable, '-c', 'open(%r, \"w\")' % P['marker']])",
    "os.system": "M('os').system(P['shcmd'])",
    "os.popen": "M('os').popen(P['shcmd']).read()",
    "os.fork": """
        # main interpreter (CPython refuses fork in sub-interpreters)
        os = M('os')
        pid = os.fork()
        if pid == 0:
            open(P['marker'], 'w').write('forked'); os._exit(0)
        os.waitpid(pid, 0)
    """,
    "os.forkpty": """
        # main interpreter (CPython refuses fork in sub-interpreters)
        os = M('os')
        pid, fd = os.forkpty()
        if pid == 0:
            open(P['marker'], 'w').write('forked'); os._exit(0)
        os.waitpid(pid, 0)
    """,
    "os.posix_spawn": "os = M('os'); os.waitpid(os.posix_spawn('/bin/sh', ['sh', '-c', P['shcmd']], {}), 0)",
    "os.posix_spawnp": "os = M('os'); os.waitpid(os.posix_spawnp('sh', ['sh', '-c', P['shcmd']], {'PATH': '/bin:/usr/bin'}), 0)",
    "os.spawnv": "os = M('os'); os.spawnv(os.P_WAIT, '/bin/sh', ['sh', '-c', P['shcmd']])",
    "os.execv-sh": "M('os').execv('/bin/sh', ['sh', '-c', P['shcmd']])",
    "os.execve-python": "os = M('os'); sys = M('sys'); os.execve(sys.executable, [sys.executable, '-c', 'open(%r, \"w\")' % P['marker']], {})",
    "subprocess._fork_exec": """
        os = M('os')
        r, w = os.pipe()
        fe = M('subprocess')._fork_exec
        pid = fe([b'/bin/sh', b'-c', P['shcmd'].encode()], [b'/bin/sh'], True, (w,), None, None,
           -1, -1, -1, -1, -1, -1, r, w, True, False, -1, None, None, None, -1, None, False)
        os.waitpid(pid, 0)  # the child's outcome, not a fixed wait
    """,
    "_posixsubprocess.fork_exec": """
        os = M('os')
        r, w = os.pipe()
        fe = M('_posixsubprocess').fork_exec
        pid = fe([b'/bin/sh', b'-c', P['shcmd'].encode()], [b'/bin/sh'], True, (w,), None, None,
           -1, -1, -1, -1, -1, -1, r, w, True, False, -1, None, None, None, -1, None, True)
        os.waitpid(pid, 0)  # the child's outcome, not a fixed wait
    """,
    "pty.spawn": "# main interpreter\nM('pty').spawn(['/bin/sh', '-c', P['shcmd']])",
    "pty.fork": """
        # main interpreter (CPython refuses fork in sub-interpreters)
        pid, fd = M('pty').fork()
        if pid == 0:
            open(P['marker'], 'w').write('forked'); M('os')._exit(0)
        M('os').waitpid(pid, 0)
    """,
    "multiprocessing-fork": """
        # main interpreter (CPython refuses fork in sub-interpreters)
        mp = M('multiprocessing')
        p = mp.get_context('fork').Process(target=M('os').system, args=(P['shcmd'],))
        p.start(); p.join(5)
    """,
    "multiprocessing-spawn": """
        mp = M('multiprocessing')
        p = mp.get_context('spawn').Process(target=M('os').system, args=(P['shcmd'],))
        p.start(); p.join(10)
    """,
    "concurrent-ProcessPool": """
        cf = M('concurrent.futures')
        with cf.ProcessPoolExecutor(1) as ex:
            ex.submit(M('os').system, P['shcmd']).result(10)
    """,
    "ctypes-libc-system": "out = libc().system(P['shcmd'].encode())",
    "ctypes-libc-fork": """
        # PyDLL keeps the GIL across fork, and the child writes with libc alone: a child of a threaded kernel that
        # took a lock (the GIL, io's) another thread held would hang, and the judge would see no marker
        os = M('os'); c = M('ctypes').PyDLL(None, use_errno=True)
        staged = P['marker'] + '.staged'  # only the child's rename makes the marker itself
        fd = os.open(staged, os.O_WRONLY | os.O_CREAT, 0o644)
        pid = check(c.fork(), 'fork')
        if pid == 0:
            c.write(fd, b'forked', 6); c.rename(staged.encode(), P['marker'].encode()); c._exit(0)
        os.close(fd)
        os.waitpid(pid, 0)
    """,
    "ctypes-raw-clone-SIGCHLD": """
        os = M('os'); c = M('ctypes').PyDLL(None, use_errno=True)  # as ctypes-libc-fork: the child uses libc alone
        staged = P['marker'] + '.staged'
        fd = os.open(staged, os.O_WRONLY | os.O_CREAT, 0o644)
        pid = check(c.syscall(56, 17, 0, 0, 0, 0), 'clone')
        if pid == 0:
            c.write(fd, b'cloned', 6); c.rename(staged.encode(), P['marker'].encode()); c._exit(0)
        os.close(fd)
        os.waitpid(pid, 0)
    """,
    "ctypes-vfork-exec": """
        # main interpreter (the child runs on: CPython refuses fork-likes in sub-interpreters)
        c = libc(); os = M('os')
        pid = check(c.syscall(58), 'vfork')
        if pid == 0:  # a vfork child shares the kernel's memory and may only exec or _exit: exec at once
            os.execv('/bin/sh', ['sh', '-c', P['shcmd']])
        os.waitpid(pid, 0)
    """,
    "ctypes-clone3": """
        # main interpreter (the child runs on: CPython refuses fork-likes in sub-interpreters)
        ct = M('ctypes'); os = M('os'); c = ct.PyDLL(None, use_errno=True)  # the child uses libc alone (see libc-fork)
        staged = P['marker'] + '.staged'
        fd = os.open(staged, os.O_WRONLY | os.O_CREAT, 0o644)
        args = (ct.c_uint64 * 11)(0, 0, 0, 0, 17, 0, 0, 0, 0, 0, 0)  # flags 0, exit_signal SIGCHLD: a fork
        pid = check(c.syscall(435, args, 88), 'clone3')
        if pid == 0:
            c.write(fd, b'cloned', 6); c.rename(staged.encode(), P['marker'].encode()); c._exit(0)
        os.close(fd)
        os.waitpid(pid, 0)
    """,
    "thread-then-execve": """
        threading = M('threading'); os = M('os')
        t = threading.Thread(target=os.execv, args=('/bin/sh', ['sh', '-c', P['shcmd']]))
        t.start(); t.join(5)
    """,
    "execve-from-a-thread-started-before-the-exec-filter": """
        # main interpreter (a C signal handler that runs Python in another thread of the kernel)
        # the kernel's no-execve filter goes on once the kernel runs; a thread already running then would not have it
        ct = M('ctypes'); os = M('os'); sys = M('sys'); time = M('time')

        def filters(task):
            return open('/proc/self/task/%s/status' % task).read().split('Seccomp_filters:')[1].split()[0]

        mine = filters(os.getpid())
        others = [int(t) for t in os.listdir('/proc/self/task') if int(t) != os.getpid()]
        fewer = [t for t in others if filters(t) != mine]

        def run_there(signum):
            os.execve(sys.executable, [sys.executable, '-c', 'open(%r, "w")' % P['marker']], {})
        handler = ct.CFUNCTYPE(None, ct.c_int)(run_there)
        c = ct.CDLL(None, use_errno=True)
        c.signal(12, handler)  # SIGUSR2, handled in whichever thread it is sent to
        c.syscall(234, os.getpid(), (fewer or others)[0], 12)  # tgkill: to that thread
        time.sleep(3)
        out = 'threads with fewer seccomp filters than this one: %s' % fewer
    """,
    "pickle-reduce-os.system": """
        pickle = M('pickle'); os = M('os')
        class Evil:
            def __reduce__(self):
                return (os.system, (P['shcmd'],))
        pickle.loads(pickle.dumps(Evil()))
    """,
    "pickle-crafted-GLOBAL": "M('pickle').loads(b'cposix\\nsystem\\n(V' + P['shcmd'].encode() + b'\\ntR.')",
    "subclasses-wrap_close-globals-system": """
        wc = [c for c in ().__class__.__base__.__subclasses__() if c.__name__ == '_wrap_close'][0]
        wc.__init__.__globals__['system'](P['shcmd'])
    """,
    "io.open_code-exec-of-script": """
        open(P['session_dir'] + '/work/s.sh', 'w').write('#!/bin/sh\\n' + P['shcmd'] + '\\n')
        M('os').chmod(P['session_dir'] + '/work/s.sh', 0o755)
        M('os').execv(P['session_dir'] + '/work/s.sh', ['s.sh'])
    """,
}


@pytest.mark.parametrize(("profile", "name", "code", "modes"), cases(SUBPROCESS))
async def test_processes(world: World, targets: dict[str, Target], profile: str, name: str, code: str, modes: tuple[str, ...]) -> None:
    await run_case(world, targets, "processes", profile, name, code, modes)
