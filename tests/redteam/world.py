"""The outside world an attacking kernel must not touch, and the ways the test watches it.

Everything here runs in the test (= server) process, on the host, outside every sandbox layer:
canary files under /tmp and /var/tmp watched with inotify (an open, a read or a write of a canary
is seen whatever route the kernel took), loopback listeners (TCP, TCP6, UDP, DNS, pathname and
abstract unix) that must receive nothing, signal counters in this process, and the kernels' own
status read from the host's /proc.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import hashlib
import os
import secrets
import select
import shutil
import signal
import socket
import struct
import tempfile
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# --- inotify -------------------------------------------------------------------------------------
IN_ACCESS, IN_MODIFY, IN_ATTRIB, IN_CLOSE_WRITE = 0x1, 0x2, 0x4, 0x8
IN_CLOSE_NOWRITE, IN_OPEN, IN_MOVED_FROM, IN_MOVED_TO = 0x10, 0x20, 0x40, 0x80
IN_CREATE, IN_DELETE, IN_DELETE_SELF, IN_MOVE_SELF = 0x100, 0x200, 0x400, 0x800
IN_ALL = 0xFFF
IN_CHANGES = IN_MODIFY | IN_ATTRIB | IN_CLOSE_WRITE | IN_MOVED_FROM | IN_MOVED_TO | IN_CREATE | IN_DELETE | IN_DELETE_SELF | IN_MOVE_SELF
_NAMES = {v: k for k, v in globals().items() if k.startswith("IN_") and k not in ("IN_ALL", "IN_CHANGES")}


class Inotify:
    """Watches paths from the host; any access by any process in any namespace shows up."""

    def __init__(self) -> None:
        self.libc = ctypes.CDLL(None, use_errno=True)
        self.fd = self.libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        if self.fd < 0:
            raise OSError(ctypes.get_errno(), "inotify_init1")
        self.watches: dict[int, tuple[str, int]] = {}

    def watch(self, path: Path, mask: int) -> None:
        wd = self.libc.inotify_add_watch(self.fd, os.fsencode(path), mask)
        if wd < 0:
            raise OSError(ctypes.get_errno(), f"inotify_add_watch {path}")
        self.watches[wd] = (str(path), mask)

    def events(self) -> list[str]:
        out = []
        while True:
            try:
                data = os.read(self.fd, 65536)
            except BlockingIOError:
                return out
            offset = 0
            while offset < len(data):
                wd, mask, _cookie, length = struct.unpack_from("iIII", data, offset)
                name = data[offset + 16 : offset + 16 + length].rstrip(b"\0").decode(errors="replace")
                offset += 16 + length
                path = self.watches.get(wd, ("?", 0))[0]
                what = "|".join(n for bit, n in _NAMES.items() if mask & bit) or hex(mask)
                out.append(f"{what} {path}/{name}" if name else f"{what} {path}")

    def close(self) -> None:
        os.close(self.fd)


def restore(path: Path, content: str) -> None:
    """Put a canary back as it was made (a symlink or a directory an attack left in its place goes first)."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    elif os.path.lexists(path):
        path.unlink()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(content)


def digest(path: Path) -> tuple[str, int, int]:
    st = path.stat()
    return hashlib.sha256(path.read_bytes()).hexdigest(), st.st_mode, st.st_mtime_ns


# --- listeners -------------------------------------------------------------------------------------
def _listener(family: int, address: Any) -> socket.socket:
    s = socket.socket(family, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(address)
    s.listen(16)
    s.setblocking(False)
    return s


def _datagram(address: tuple[str, int]) -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(address)
    s.setblocking(False)
    return s


def drain(sock: socket.socket, window: float = 0.0) -> list[str]:
    """What arrived on a listener: accepted connections (with their first bytes) or datagrams."""
    got = []
    while True:
        ready, _, _ = select.select([sock], [], [], window)
        if not ready:
            return got
        window = 0.0
        if sock.type == socket.SOCK_DGRAM:
            data, peer = sock.recvfrom(65536)
            got.append(f"datagram from {peer}: {data[:60]!r}")
            continue
        try:
            conn, peer = sock.accept()
        except BlockingIOError:
            return got
        conn.settimeout(0.2)
        try:
            first = conn.recv(200)
        except OSError:
            first = b""
        conn.close()
        got.append(f"connection from {peer!r}: {first[:60]!r}")


# --- kernels seen from the host ------------------------------------------------------------------
_FLAGS_WITH_VALUE = (b"-X", b"-W", b"--check-hash-based-pycs")


def kernel_script_index(argv: list[bytes]) -> int | None:
    """Where ``kernel_main.py`` is in a kernel's argv: the script a Python interpreter runs, after any
    interpreter flags (``python -s -S -X dev …/kernel_main.py -f …``); None for any other process.

    Not "any element ending in kernel_main.py": the bubblewrap and sandbox_exec.py wrappers carry the
    whole kernel command line in their own argv, and they are not the kernel."""
    if not argv or not os.path.basename(argv[0]).startswith(b"python"):
        return None
    i = 1
    while i < len(argv):
        arg = argv[i]
        if arg.endswith(b"kernel_main.py"):
            return i
        if arg in (b"-c", b"-m", b"-", b"--") or not arg.startswith(b"-"):
            return None  # a command, a module, stdin or another script: not the kernel
        i += 2 if arg in _FLAGS_WITH_VALUE else 1
    return None


def _connection_file(argv: list[bytes], script: int) -> bytes | None:
    rest = argv[script + 1 :]
    for i, arg in enumerate(rest):
        if arg == b"-f" and i + 1 < len(rest):
            return rest[i + 1]
        if arg.startswith(b"--f="):
            return arg[len(b"--f=") :]
    return None


def _ppid(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("PPid:"):
            return int(line.split()[1])
    return 0


def kernel_pids(session_dir: Path, connection_file: Path | None = None, *, every_session: bool = False) -> list[int]:
    """Host pids of the kernel processes of one session (``python [flags] …/kernel_main.py -f
    <session>/kernel[-<slot>].json``): every slot's (the live kernel and a warm spare), or only the one
    whose connection file is ``connection_file``; with ``every_session``, ``session_dir`` is the sessions
    directory and every session's count, also one whose directory is gone. A process forked by a kernel
    (same argv) is not a kernel: only the topmost of a chain counts."""
    wanted = os.fsencode(connection_file) if connection_file is not None else None
    found: dict[int, bytes] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().rstrip(b"\0").split(b"\0")
        except OSError:
            continue
        script = kernel_script_index(argv)
        if script is None:
            continue
        conn = _connection_file(argv, script)
        if conn is None:
            continue
        path = Path(os.fsdecode(conn))
        if (path.parent.parent if every_session else path.parent) != session_dir or not (path.name == "kernel.json" or
                                              (path.name.startswith("kernel-") and path.suffix == ".json")):
            continue
        if wanted is None or conn == wanted:
            found[int(entry)] = conn
    out = []
    for pid in found:
        try:
            if _ppid(pid) in found:
                continue
        except OSError:
            continue
        out.append(pid)
    return sorted(out)


def is_kernel_of(pid: int, session_dir: Path) -> bool:
    """Whether host pid ``pid`` is one of ``session_dir``'s kernels (a positive control for a victim pid)."""
    return pid > 0 and pid in kernel_pids(session_dir)


def process_state(pid: int) -> dict[str, Any]:
    """What a kernel could try to change about itself: ids, capabilities, limits, namespaces, cgroups, nice."""
    status = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("Uid", "Gid", "Groups", "CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb", "NoNewPrivs", "Seccomp",
                   "Seccomp_filters"):
            status[key] = value.split()
    ns = {}
    for name in sorted(os.listdir(f"/proc/{pid}/ns")):
        try:
            ns[name] = os.readlink(f"/proc/{pid}/ns/{name}")
        except OSError:
            pass
    stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return {
        "status": status,
        "limits": Path(f"/proc/{pid}/limits").read_text(),
        "ns": ns,
        "cgroup": Path(f"/proc/{pid}/cgroup").read_text(),
        "nice": stat[16],
        "landlock+seccomp": status.get("Seccomp"),
    }


def plant_in_proc_environ(entry: str) -> tuple[int, bytes]:
    """Put ``entry`` into this process's /proc/self/environ, as if the server had been started with it.

    ``os.environ[...] = ...`` (putenv) never shows there: /proc/<pid>/environ is the block the kernel copied
    at exec, so a secret set later is a secret no kernel could read, and a judge looking for it judges
    nothing. The block cannot grow (moving it, prctl PR_SET_MM, needs CAP_SYS_RESOURCE), so libc's own
    environment is first moved to the heap (setenv of every variable), then the block is rewritten to start
    with ``entry`` (the rest of the old contents, cut to fit, after it). Returns where the block is and
    what it held, for destroy_world to put back. Positive control: the host reads the entry back."""
    fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
    start, end = int(fields[47]), int(fields[48])  # env_start, env_end (fields 50 and 51 of proc(5))
    before = ctypes.string_at(start, end - start)
    assert before == Path("/proc/self/environ").read_bytes(), "env_start/env_end do not hold /proc/self/environ"
    libc = ctypes.CDLL(None, use_errno=True)
    for key, value in os.environ.items():  # libc's environ now points at heap copies, not into the block
        libc.setenv(os.fsencode(key), os.fsencode(value), 1)
    planted = entry.encode() + b"\0"
    assert len(planted) < len(before), "the environment block is too small for the planted secret"
    block = (planted + before)[: len(before) - 1] + b"\0"
    ctypes.memmove(start, block, len(block))
    assert entry.encode() in Path("/proc/self/environ").read_bytes().split(b"\0"), "planted secret not in /proc/self/environ"
    return start, before


# --- the world -------------------------------------------------------------------------------------
@dataclass
class World:
    root: Path
    var_root: Path
    secret_dir: Path
    secret_file: Path
    ro_dir: Path
    ro_canary: Path
    secret: str
    name_token: str
    env_secret: str
    mem_secret: bytes
    tcp: socket.socket
    udp: socket.socket
    unix: socket.socket
    unix_path: Path
    abstract: socket.socket
    abstract_name: str
    tcp6: socket.socket | None = None
    dns_udp: socket.socket | None = None
    dns_tcp: socket.socket | None = None
    dns_stub: socket.socket | None = None
    signals: Counter = field(default_factory=Counter)
    inotify: Inotify | None = None
    ro_state: tuple[str, int, int] | None = None
    secret_state: tuple[str, int, int] | None = None
    ro_content: str = ""
    secret_content: str = ""
    host_interfaces: list[str] = field(default_factory=list)
    hostname: str = ""
    saved_handlers: dict[int, Any] = field(default_factory=dict)
    secret_fd: int = -1  # the secret file, held open by the server (a descriptor pidfd_getfd could steal)
    environ_block: tuple[int, bytes] | None = None  # where /proc/self/environ lives, and what it held before

    @property
    def pid(self) -> int:
        return os.getpid()

    @property
    def listeners(self) -> dict[str, socket.socket]:
        found = {"tcp": self.tcp, "udp": self.udp, "unix": self.unix, "abstract": self.abstract}
        for name in ("tcp6", "dns_udp", "dns_tcp", "dns_stub"):
            if getattr(self, name) is not None:
                found[name] = getattr(self, name)
        return found

    def leak_tokens(self) -> dict[str, str]:
        return {
            "outside secret file's content": self.secret,
            "name of a file in the outside secret directory": self.name_token,
            "server process environment": self.env_secret,
            "server process memory": self.mem_secret.decode(),
        }

    def outside_targets(self, tag: str) -> dict[str, str]:
        """Paths an attack tries to create; none may exist afterwards."""
        return {
            "new": str(self.root / f"created-{tag}"),
            "var_new": str(self.var_root / f"created-{tag}"),
            "ro_new": str(self.ro_dir / f"created-{tag}"),
        }


WORLD_LOCK = Path(tempfile.gettempdir()) / "kernelexec-redteam-world.lock"


@contextmanager
def world_lock() -> Iterator[None]:
    """Held while a world exists: another pytest process's world waits for it (an exclusive ``flock``, let go
    when its process dies, whatever way)."""
    with open(WORLD_LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def make_world() -> World:
    token = secrets.token_hex(8)
    root = Path(tempfile.mkdtemp(prefix="kxrt-"))  # /tmp: hidden from kernels by bubblewrap's private /tmp
    var_root = Path(tempfile.mkdtemp(prefix="kxrt-", dir="/var/tmp"))  # not under /tmp at all
    secret_dir = root / "secret"
    secret_dir.mkdir()
    name_token = f"KXRTNAME{secrets.token_hex(6)}"
    secret = f"KXRTSECRET{secrets.token_hex(12)}"
    secret_file = secret_dir / "secret.txt"
    secret_file.write_text(f"top secret: {secret}\n")
    (secret_dir / f"{name_token}.txt").write_text("listing canary\n")
    ro_dir = root / "ro"  # passed as --read-dirs: readable in standard, never writable
    ro_dir.mkdir()
    ro_canary = ro_dir / "readonly.txt"
    ro_canary.write_text("read-only canary: must never change\n")
    sockdir = root / "sock"
    sockdir.mkdir()
    unix_path = sockdir / "host.sock"
    env_secret = f"KXRTENV{secrets.token_hex(12)}"
    os.environ["KXRT_SERVER_SECRET"] = env_secret  # the server's env; kernels get a scrubbed one
    environ_block = plant_in_proc_environ(f"KXRT_SERVER_SECRET={env_secret}")
    world = World(
        root=root, var_root=var_root, secret_dir=secret_dir, secret_file=secret_file, ro_dir=ro_dir,
        ro_canary=ro_canary, secret=secret, name_token=name_token, env_secret=env_secret,
        mem_secret=f"KXRTMEM{secrets.token_hex(12)}".encode(),
        tcp=_listener(socket.AF_INET, ("127.0.0.1", 0)),
        udp=_datagram(("127.0.0.1", 0)),
        unix=_listener(socket.AF_UNIX, str(unix_path)),
        unix_path=unix_path,
        abstract=_listener(socket.AF_UNIX, f"\0kxrt-{token}"),
        abstract_name=f"kxrt-{token}",
    )
    try:
        world.tcp6 = _listener(socket.AF_INET6, ("::1", 0))
    except OSError:
        pass
    # glibc's resolver falls back to 127.0.0.1:53 when /etc/resolv.conf is hidden: a DNS canary
    try:
        world.dns_udp = _datagram(("127.0.0.1", 53))
        world.dns_tcp = _listener(socket.AF_INET, ("127.0.0.1", 53))
    except OSError:
        pass
    try:  # a stub resolver's address (systemd-resolved's), where nothing listens on this machine
        world.dns_stub = _datagram(("127.0.0.53", 53))
    except OSError:
        pass
    world.environ_block = environ_block
    world.secret_fd = os.open(secret_file, os.O_RDONLY)
    world.host_interfaces = [name for _, name in socket.if_nameindex() if name != "lo"]
    world.hostname = socket.gethostname()
    for sig in (signal.SIGUSR1, signal.SIGUSR2, signal.SIGWINCH, signal.SIGURG):
        world.saved_handlers[sig] = signal.signal(sig, lambda signum, frame: world.signals.update([signal.Signals(signum).name]))
    world.inotify = Inotify()
    for path in (root, secret_dir, sockdir, var_root):
        world.inotify.watch(path, IN_ALL)
    world.inotify.watch(ro_dir, IN_CHANGES)
    world.ro_content, world.secret_content = ro_canary.read_text(), secret_file.read_text()
    world.ro_state = digest(ro_canary)
    world.secret_state = digest(secret_file)
    return world


def destroy_world(world: World) -> None:
    if world.environ_block is not None:
        start, before = world.environ_block
        ctypes.memmove(start, before, len(before))
    if world.secret_fd >= 0:
        os.close(world.secret_fd)
    for sig, handler in world.saved_handlers.items():
        signal.signal(sig, handler)
    for s in world.listeners.values():
        s.close()
    if world.inotify is not None:
        world.inotify.close()
    os.environ.pop("KXRT_SERVER_SECRET", None)
    shutil.rmtree(world.root, ignore_errors=True)
    shutil.rmtree(world.var_root, ignore_errors=True)


def still_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError as exc:
        return exc.errno == errno.EPERM
    return True
