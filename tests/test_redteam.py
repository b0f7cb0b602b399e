"""Red team: escape attempts through ``execute_code``, judged by their side effects. (TALLY BELOW)"""

from __future__ import annotations

import asyncio
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
from .redteam.runner import attack_cell
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

    def b_pid(self) -> int:
        pids = kernel_pids(self.dirs["b"])
        return pids[0] if pids else -1

    def leak_tokens(self) -> dict[str, str]:
        return {
            "session B's secret file": self.b_file_secret,
            "session B's variable": self.b_var_secret,
            "session B's HMAC key": self.b_key,
        }


async def start_target(world: World, base: Path, profile: str) -> Target:
    settings = make_settings(base, profile=profile, read_dirs=[world.ro_dir])
    h, cm = await start_harness(settings)
    t = Target(profile=profile, h=h, cm=cm, state_dir=settings.state_dir)
    async def open_session(role: str) -> None:
        handle = await h.new_session()
        r = await h.run("1", session=handle)
        t.handles[role] = handle
        t.dirs[role] = Path(r["notebook"]).parent

    async with anyio.create_task_group() as tg:  # kernels start in parallel
        for role in ("guard", "os", "b"):
            tg.start_soon(open_session, role)
    t.b_file_secret = f"KXRTBFILE{secrets.token_hex(12)}"
    t.b_var_secret = f"KXRTBVAR{secrets.token_hex(12)}"
    t.b_file = t.dirs["b"] / "work" / "b-secret.txt"
    t.b_file.write_text(f"session B's file: {t.b_file_secret}\n")  # as if B had written it
    r = await h.run(f"bsecret = {t.b_var_secret!r}", session=t.handles["b"])
    assert r["success"], r
    conn = json.loads((t.dirs["b"] / "kernel.json").read_text())
    t.b_key = conn["key"]
    assert conn["transport"] == "ipc"
    t.b_sockets = {name[: -len("_port")]: f"{conn['ip']}-{conn[name]}" for name in conn if name.endswith("_port")}
    return t


@pytest.fixture(scope="module")
def world() -> Iterator[World]:
    w = make_world()
    yield w
    destroy_world(w)


@pytest.fixture(scope="module")
async def targets(world: World, short_tmp: Path) -> AsyncIterator[dict[str, Target]]:
    started: dict[str, Target] = {}
    try:
        for profile in PROFILES:
            started[profile] = await start_target(world, short_tmp, profile)
        yield started
    finally:
        for t in reversed(list(started.values())):
            await t.h.client.__aexit__(None, None, None)
            await t.cm.__aexit__(None, None, None)
        dump = os.environ.get("KXRT_REDTEAM_TALLY")
        if dump:
            Path(dump).write_text(json.dumps(OUTCOMES, indent=1))


# --- one attack and its judgement -----------------------------------------------------------------
def params_for(world: World, t: Target, mode: str, tag: str) -> dict[str, Any]:
    me = t.dirs[mode]
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


async def attack(world: World, t: Target, mode: str, payload: str, tag: str, *, category: str, name: str,
                 extra: dict[str, Any] | None = None) -> Attack:
    world.inotify.events()  # forget our own earlier reads
    params = params_for(world, t, mode, tag) | (extra or {})
    answer = await t.h.run(attack_cell(textwrap.dedent(payload), params, mode), session=t.handles[mode], timeout=30)
    result = answer.get("result")
    result = result if isinstance(result, str) else json.dumps(answer.get("result"))
    if not answer.get("success"):
        result = f"cell failed: {answer.get('error')} ending={answer.get('ending')} {answer.get('restart_reason') or ''}"
    if mode == "os" and result.startswith("DISARM FAILED"):
        pytest.skip(f"os mode needs the guard switched off first, and that no longer works (good): {result}")
    OUTCOMES.append({"category": category, "profile": t.profile, "mode": mode, "payload": name, "result": result[:300]})
    return Attack(answer=answer, result=result, params=params)


async def assert_untouched(world: World, t: Target, a: Attack) -> None:
    """The side effects every attempt is judged on, whatever it tried."""
    problems = []
    text = json.dumps(a.answer)
    for what, token in (world.leak_tokens() | t.leak_tokens()).items():
        if token and token in text:
            problems.append(f"LEAK: {what} appears in the answer")
    await anyio.sleep(0.01)  # let a signal handler run
    events = world.inotify.events()
    if events:
        problems.append(f"outside files were touched: {events}")
    for key in ("new", "var_new", "ro_new", "state_new"):
        made = glob.glob(glob.escape(a.params[key]) + "*")
        if made:
            problems.append(f"created outside: {made}")
            for path in made:
                shutil.rmtree(path, ignore_errors=True) if os.path.isdir(path) and not os.path.islink(path) else os.unlink(path)
    if digest(world.ro_canary) != world.ro_state:
        problems.append("the read-only canary changed")
    if digest(world.secret_file) != world.secret_state:
        problems.append("the secret file changed")
    world.inotify.events()  # our own digests
    for name, sock in world.listeners.items():
        got = drain(sock)
        if got:
            problems.append(f"the {name} listener received: {got}")
    if world.signals:
        problems.append(f"the server process received signals: {dict(world.signals)}")
        world.signals.clear()
    if socket.gethostname() != world.hostname:
        problems.append(f"the host's hostname changed to {socket.gethostname()!r}")
    for key in ("marker", "b_marker"):
        if os.path.lexists(a.params[key]):
            problems.append(f"a spawned/foreign process ran: {a.params[key]} exists")
            os.unlink(a.params[key])
    if a.params["b_pid"] > 0 and not still_alive(a.params["b_pid"]):
        problems.append("session B's kernel was killed")
    if "AssertionError" in a.result:
        problems.append("the payload saw its own attack succeed (AssertionError/ESCAPE in its result)")
    assert not problems, f"{a.result}\n" + "\n".join(problems)


def cases(table: dict[str, str | tuple[str, dict[str, Any]]]) -> list[Any]:
    """pytest params: profile x mode x payload; a payload may carry options (modes, marks)."""
    out = []
    for name, spec in table.items():
        code, opts = (spec, {}) if isinstance(spec, str) else spec
        for profile in opts.get("profiles", PROFILES):
            for mode in opts.get("modes", MODES):
                marks = opts.get("marks", {}).get((profile, mode), ()) or opts.get("marks", {}).get(mode, ())
                out.append(pytest.param(profile, mode, name, code, id=f"{profile}-{mode}-{name}", marks=marks))
    return out


async def run_case(world: World, targets: dict[str, Target], category: str, profile: str, mode: str, name: str,
                   code: str) -> Attack:
    t = targets[profile]
    tag = f"{name}-{profile}-{mode}-{secrets.token_hex(3)}"
    a = await attack(world, t, mode, code, tag, category=category, name=name)
    await assert_untouched(world, t, a)
    return a


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


@pytest.mark.parametrize(("profile", "mode", "name", "code"), cases(FILE_READS))
async def test_read_outside(world: World, targets: dict[str, Target], profile: str, mode: str, name: str, code: str) -> None:
    await run_case(world, targets, "files-read", profile, mode, name, code)


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


@pytest.mark.parametrize(("profile", "mode", "name", "code"), cases(FILE_WRITES))
async def test_write_outside(world: World, targets: dict[str, Target], profile: str, mode: str, name: str, code: str) -> None:
    await run_case(world, targets, "files-write", profile, mode, name, code)
