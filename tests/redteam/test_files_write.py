"""Writing files outside the session: creating files under /tmp, /var/tmp, the state directory and
a ``--read-dirs`` directory, changing the read-only canary (hard links, renames, xattrs, mkfifo).
Judged by inotify, the canary's digest and nothing created outside.
"""

from __future__ import annotations

from typing import Any

import pytest

from .common import Target, cases, run_case
from .world import World

pytestmark = pytest.mark.anyio


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
