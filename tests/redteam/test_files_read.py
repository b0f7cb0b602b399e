"""Reading files outside the session: the secret under /tmp, by every route (``/proc``, symlinks,
``dir_fd``, hard links, sqlite ``ATTACH``, mmap, ctypes, mount/chroot). Judged by inotify on the
secret (any open or read by any process), the secret in no answer, nothing created outside.
"""

from __future__ import annotations

from typing import Any

import pytest

from .common import Target, cases, run_case
from .world import World

pytestmark = pytest.mark.anyio


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
    "proc-1-root": """
        res = {}
        for pid in (1, P['pid']):  # the host's init (out of reach even of root on some VMs), and the server
            try:
                res[pid] = open('/proc/%d/root' % pid + P['secret']).read()
            except OSError as e:
                res[pid] = repr(e)
        out = res
    """,
    "proc-self-cwd-dotdot": "out = open('/proc/self/cwd/' + '../' * 12 + P['secret'].lstrip('/')).read()",
    "dotdot-from-session": "out = open(P['session_dir'] + '/work/' + '../' * 12 + P['secret'].lstrip('/')).read()",
    "proc-ppid-environ": "os = M('os'); out = open(f'/proc/{os.getppid()}/environ', 'rb').read()",
    "proc-1-environ": "out = open('/proc/1/environ', 'rb').read()",
    "proc-server-environ": "out = open(f\"/proc/{P['pid']}/environ\", 'rb').read()",
    "proc-server-cmdline+cwd": """
        os = M('os'); got = {}
        for what, read in (('cmdline', lambda: open(f"/proc/{P['pid']}/cmdline", 'rb').read()),
                           ('cwd', lambda: os.listdir(f"/proc/{P['pid']}/cwd"))):
            try:
                got[what] = read()
            except OSError as e:
                got[what] = repr(e)
        out = got
        if not all(isinstance(v, str) for v in got.values()):  # the server's command line or its directory
            raise AssertionError('ESCAPE: read the server process: %r' % (got,))
    """,
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
        root = check(c.open_by_handle_at(-100, handle, 0), 'open_by_handle_at')  # the host's / by its handle
        os = M('os')
        out = os.read(os.open(P['secret'].lstrip('/'), os.O_RDONLY, dir_fd=root), 4096)
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
        try:  # an O_PATH open is no read (Landlock does not govern it): only a mount namespace hides the path
            os.open(P['secret'], os.O_PATH)  # (kept open: the inventory below must not find it)
        except OSError:
            pass
        fds, read_only = {}, set()
        for fd in os.listdir('/proc/self/fd'):
            try:
                fds[fd] = os.readlink('/proc/self/fd/' + fd)
                flags = [line for line in open('/proc/self/fdinfo/' + fd).read().splitlines() if line.startswith('flags:')]
                if flags and int(flags[0].split()[1], 8) & os.O_ACCMODE == os.O_RDONLY:
                    read_only.add(fd)
            except OSError as e:
                fds[fd] = repr(e)
        # the interpreter's own trees, opened read-only, are no leak: a kernel that drew a figure (every warm kernel
        # does, at start) holds its fonts open, matplotlib caching them
        own = tuple(p.rstrip('/') + '/' for p in P['interpreter_trees'])
        outside = {k: v for k, v in fds.items() if v.startswith('/') and not v.startswith((P['session_dir'], '/dev/', '/proc/'))
                   and not (k in read_only and v.startswith(own))}
        assert not outside, outside
        out = outside
    """,
}


@pytest.mark.parametrize(("profile", "name", "code", "modes"), cases(FILE_READS))
async def test_read_outside(world: World, targets: dict[str, Target], profile: str, name: str, code: str, modes: tuple[str, ...]) -> None:
    await run_case(world, targets, "files-read", profile, name, code, modes)
