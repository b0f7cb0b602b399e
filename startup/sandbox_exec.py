"""Pre-exec wrapper: apply the OS layers to this process, then exec the kernel. Stdlib + ctypes only.

Usage: ``python sandbox_exec.py -- <kernel command...>`` with the plan in ``KERNELEXEC_SANDBOX``
(JSON; removed from the environment before exec). rlimits, no-new-privs, dropped capabilities,
Landlock domains and seccomp filters all survive ``execve``, so every layer is in force before the
kernel's first thread exists and the kernel's Python never loads ctypes for them.

Any failure exits with status 71 and a message on stderr (the session's kernel.log): a kernel
never starts with fewer layers than the server announced.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import resource
import sys

# --- syscall numbers (x86_64 / aarch64) -------------------------------------------------------
_ARCH = os.uname().machine
_SYS = {
    "x86_64": {"landlock_create_ruleset": 444, "landlock_add_rule": 445, "landlock_restrict_self": 446, "unshare": 272},
    "aarch64": {"landlock_create_ruleset": 444, "landlock_add_rule": 445, "landlock_restrict_self": 446, "unshare": 97},
}.get(_ARCH, {})

PR_SET_NO_NEW_PRIVS = 38
PR_CAPBSET_DROP = 24
PR_CAPBSET_READ = 23
PR_SET_PDEATHSIG = 1
CLONE_NEWNET = 0x40000000

libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long


def fail(message: str) -> None:
    sys.stderr.write(f"kernelexec sandbox: {message}\n")
    sys.stderr.flush()
    os._exit(71)


def check(result: int, what: str) -> int:
    if result < 0:
        fail(f"{what} failed: {os.strerror(ctypes.get_errno())}")
    return result


# --- rlimits -------------------------------------------------------------------------------------
_RLIMITS = {
    "data": resource.RLIMIT_DATA,
    "as": resource.RLIMIT_AS,
    "nofile": resource.RLIMIT_NOFILE,
    "fsize": resource.RLIMIT_FSIZE,
    "core": resource.RLIMIT_CORE,
    "cpu": resource.RLIMIT_CPU,
    "nproc": resource.RLIMIT_NPROC,
}


def set_rlimits(limits: dict[str, int]) -> None:
    for name, value in limits.items():
        resource.setrlimit(_RLIMITS[name], (value, value))


# --- capabilities ----------------------------------------------------------------------------
class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def drop_capabilities() -> None:
    """Empty the bounding set and the effective/permitted/inheritable sets (root stays uid 0, powerless)."""
    drop_bounding_set()
    header = _CapHeader(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3
    data = (_CapData * 2)()
    check(libc.capset(ctypes.byref(header), data), "capset")


def become(uid: int) -> None:
    """Switch to the session's own unprivileged uid/gid (no supplementary groups); root's
    capabilities go with it. Needs CAP_SETUID/CAP_SETGID, which bubblewrap keeps for this."""
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)


def drop_bounding_set() -> None:
    for cap in range(64):
        if libc.prctl(PR_CAPBSET_READ, cap, 0, 0, 0) != 1:
            continue  # not in the bounding set (or no such capability): bubblewrap may have dropped it already
        if libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) < 0:
            if ctypes.get_errno() == errno.EPERM:
                break  # no CAP_SETPCAP (bubblewrap dropped it): the empty sets below plus no-new-privs suffice
            fail(f"dropping capability {cap}: {os.strerror(ctypes.get_errno())}")


def no_new_privs() -> None:
    check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "PR_SET_NO_NEW_PRIVS")


# --- Landlock ------------------------------------------------------------------------------------
FS_EXECUTE, FS_WRITE_FILE, FS_READ_FILE, FS_READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
FS_REMOVE_DIR, FS_REMOVE_FILE, FS_MAKE_CHAR, FS_MAKE_DIR = 1 << 4, 1 << 5, 1 << 6, 1 << 7
FS_MAKE_REG, FS_MAKE_SOCK, FS_MAKE_FIFO, FS_MAKE_BLOCK, FS_MAKE_SYM = 1 << 8, 1 << 9, 1 << 10, 1 << 11, 1 << 12
FS_REFER, FS_TRUNCATE, FS_IOCTL_DEV = 1 << 13, 1 << 14, 1 << 15
NET_BIND_TCP, NET_CONNECT_TCP = 1 << 0, 1 << 1
SCOPE_ABSTRACT_UNIX_SOCKET, SCOPE_SIGNAL = 1 << 0, 1 << 1
RULE_PATH_BENEATH = 1


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64), ("scoped", ctypes.c_uint64)]


class _PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def landlock_abi() -> int:
    nr = _SYS.get("landlock_create_ruleset")
    if nr is None:
        return 0
    abi = libc.syscall(nr, None, ctypes.c_size_t(0), ctypes.c_uint32(1))
    return max(int(abi), 0)


def apply_landlock(rules: dict[str, list[str]], abi: int) -> None:
    """Read-only ``ro`` paths, read-write ``rw`` paths, nothing else; no TCP; own signals/abstract sockets only."""
    read = FS_EXECUTE | FS_READ_FILE | FS_READ_DIR
    write = (FS_WRITE_FILE | FS_REMOVE_DIR | FS_REMOVE_FILE | FS_MAKE_DIR | FS_MAKE_REG | FS_MAKE_SOCK
             | FS_MAKE_FIFO | FS_MAKE_SYM)
    handled = read | write | FS_MAKE_CHAR | FS_MAKE_BLOCK
    if abi >= 2:
        handled |= FS_REFER
        write |= FS_REFER
    if abi >= 3:
        handled |= FS_TRUNCATE
        write |= FS_TRUNCATE
    if abi >= 5:
        handled |= FS_IOCTL_DEV
    attr = _RulesetAttr(handled, 0, 0)
    size = 8
    if abi >= 4 and rules.get("deny_tcp", True):
        attr.handled_access_net = NET_BIND_TCP | NET_CONNECT_TCP
        size = 16
    if abi >= 6:
        attr.scoped = SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL
        size = 24
    ruleset = check(libc.syscall(_SYS["landlock_create_ruleset"], ctypes.byref(attr), ctypes.c_size_t(size), ctypes.c_uint32(0)), "landlock_create_ruleset")
    # Executing files is a separate right: where "exec" is given, only those files (the interpreter)
    # may be executed, so a cell cannot execve() a shell even though the box would still hold it.
    exec_only = rules.get("exec")
    if exec_only is not None:
        read &= ~FS_EXECUTE
    grants = [(read, rules.get("ro", [])), (read | write, rules.get("rw", [])),
              (FS_READ_FILE | FS_READ_DIR | FS_MAKE_SOCK, rules.get("sock", [])),
              (FS_READ_FILE | FS_WRITE_FILE | FS_READ_DIR | FS_IOCTL_DEV, rules.get("dev", []))]  # terminals: a pty's ioctls
    if exec_only is not None:
        grants.append((FS_EXECUTE | FS_READ_FILE, exec_only))
    for access, paths in grants:
        for path in paths:
            try:
                fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            except OSError:
                continue  # a path absent on this machine grants nothing
            allowed = access
            if not os.path.isdir(path):
                allowed &= FS_EXECUTE | FS_READ_FILE | FS_WRITE_FILE | FS_TRUNCATE | FS_IOCTL_DEV
            rule = _PathBeneath(allowed & handled, fd)
            check(libc.syscall(_SYS["landlock_add_rule"], ruleset, RULE_PATH_BENEATH, ctypes.byref(rule), ctypes.c_uint32(0)), f"landlock_add_rule {path}")
            os.close(fd)
    check(libc.syscall(_SYS["landlock_restrict_self"], ruleset, ctypes.c_uint32(0)), "landlock_restrict_self")
    os.close(ruleset)


# --- seccomp (libseccomp through ctypes) -----------------------------------------------------------
SCMP_ACT_ALLOW = 0x7FFF0000
SCMP_FLTATR_CTL_TSYNC = 4
SCMP_CMP_NE, SCMP_CMP_LT, SCMP_CMP_LE, SCMP_CMP_EQ, SCMP_CMP_GE, SCMP_CMP_GT, SCMP_CMP_MASKED_EQ = 1, 2, 3, 4, 5, 6, 7
CLONE_THREAD = 0x00010000
AF_UNIX, AF_INET, AF_INET6 = 1, 2, 10
MSG_FASTOPEN, IPPROTO_TCP, TCP_FASTOPEN_CONNECT = 0x20000000, 6, 30
PRIVILEGED = [
    "setrlimit", "ptrace", "process_vm_readv", "process_vm_writev", "mount", "umount2", "pivot_root", "chroot",
    "unshare", "setns", "bpf", "perf_event_open", "init_module", "finit_module", "delete_module", "kexec_load",
    "kexec_file_load", "keyctl", "add_key", "request_key", "userfaultfd", "io_uring_setup", "io_uring_enter",
    "io_uring_register", "setuid", "setgid", "setreuid", "setregid", "setresuid", "setresgid", "setgroups",
    "capset", "mknod", "mknodat", "reboot", "swapon", "swapoff", "syslog", "acct", "settimeofday", "clock_settime",
    "quotactl", "open_by_handle_at", "name_to_handle_at", "fanotify_init", "mount_setattr", "fsopen", "fsmount",
    "move_mount", "open_tree", "pidfd_getfd", "kcmp", "personality", "vhangup", "lookup_dcookie",
]


class _ArgCmp(ctypes.Structure):
    _fields_ = [("arg", ctypes.c_uint), ("op", ctypes.c_int), ("datum_a", ctypes.c_uint64), ("datum_b", ctypes.c_uint64)]


def deny_exec() -> None:
    """A second filter, installed by the kernel's entry point once it is running: no more execve."""
    apply_seccomp(False, "all", only=["execve", "execveat"])


def apply_seccomp(deny_fork: bool, sockets: str, only: list[str] | None = None) -> None:
    """Deny privileged syscalls; optionally process creation; ``sockets``: "all" | "unix+tcp" | "unix"."""
    lib = ctypes.CDLL("libseccomp.so.2", use_errno=True)
    lib.seccomp_init.restype = ctypes.c_void_p
    lib.seccomp_syscall_resolve_name.restype = ctypes.c_int
    ctx = lib.seccomp_init(ctypes.c_uint32(SCMP_ACT_ALLOW))
    if not ctx:
        fail("seccomp_init failed")
    ctx = ctypes.c_void_p(ctx)
    # every thread of the process, not only the caller: the kernel's no-execve filter goes on once the kernel runs, and
    # a thread already running without it would run anything a signal handler or a callback made it run
    rc = lib.seccomp_attr_set(ctx, SCMP_FLTATR_CTL_TSYNC, ctypes.c_uint32(1))
    if rc < 0:
        fail(f"seccomp thread sync: {os.strerror(-rc)}")

    def deny(name: str, err: int = errno.EPERM, *cmps: tuple[int, int, int, int]) -> None:
        nr = lib.seccomp_syscall_resolve_name(name.encode())
        if nr < 0:
            return  # not on this architecture
        array = (_ArgCmp * max(len(cmps), 1))(*[_ArgCmp(*c) for c in cmps])
        rc = lib.seccomp_rule_add_array(ctx, ctypes.c_uint32(0x00050000 | err), nr, ctypes.c_uint(len(cmps)), array)
        if rc < 0:
            fail(f"seccomp rule for {name}: {os.strerror(-rc)}")

    for name in (only if only is not None else PRIVILEGED):
        deny(name)
    if only is not None:
        deny_fork, sockets = False, "all"
    if only is None:
        deny("prlimit64", errno.EPERM, (2, SCMP_CMP_NE, 0, 0))  # reading limits is fine, setting is not
    if deny_fork:
        deny("fork")
        deny("vfork")
        deny("clone3", errno.ENOSYS)  # glibc then falls back to clone(), where threads are allowed
        deny("clone", errno.EPERM, (0, SCMP_CMP_MASKED_EQ, CLONE_THREAD, 0))
    if sockets != "all":
        deny("socket", errno.EACCES, (0, SCMP_CMP_GT, AF_INET6, 0))
        for family in (0, 3, 4, 5, 6, 7, 8, 9):
            deny("socket", errno.EACCES, (0, SCMP_CMP_EQ, family, 0))
        inet_allowed = sockets == "unix+tcp"
        for family in (AF_INET, AF_INET6):
            if inet_allowed:
                # stream only: libzmq needs socket(AF_INET, SOCK_STREAM) not to fail; Landlock and the
                # network namespace stop connect/bind. Datagram, raw and packet sockets are refused.
                for kind in (2, 3, 4, 5, 10):
                    deny("socket", errno.EACCES, (0, SCMP_CMP_EQ, family, 0), (1, SCMP_CMP_MASKED_EQ, 0xF, kind))
            else:
                deny("socket", errno.EACCES, (0, SCMP_CMP_EQ, family, 0))
        deny("socketpair", errno.EACCES, (0, SCMP_CMP_NE, AF_UNIX, 0))
        # No outgoing connections at all: the kernel only binds (the server connects to it). This also
        # covers what Landlock cannot: pathname unix sockets (host daemons, other kernels) and TCP Fast
        # Open, which connects from sendto()/sendmsg() or after TCP_FASTOPEN_CONNECT.
        deny("connect", errno.EACCES)
        deny("sendto", errno.EACCES, (3, SCMP_CMP_MASKED_EQ, MSG_FASTOPEN, MSG_FASTOPEN))
        deny("sendmsg", errno.EACCES, (2, SCMP_CMP_MASKED_EQ, MSG_FASTOPEN, MSG_FASTOPEN))
        deny("setsockopt", errno.EACCES, (1, SCMP_CMP_EQ, IPPROTO_TCP, 0), (2, SCMP_CMP_EQ, TCP_FASTOPEN_CONNECT, 0))
    rc = lib.seccomp_load(ctx)
    if rc < 0:
        fail(f"seccomp_load: {os.strerror(-rc)}")
    lib.seccomp_release(ctx)


# --- network namespace ------------------------------------------------------------------------------
def new_network_namespace() -> None:
    check(libc.syscall(_SYS["unshare"], CLONE_NEWNET), "unshare(CLONE_NEWNET)")


def main() -> None:
    try:
        split = sys.argv.index("--")
    except ValueError:
        fail("usage: sandbox_exec.py -- command ...")
    command = sys.argv[split + 1 :]
    plan = json.loads(os.environ.pop("KERNELEXEC_SANDBOX", "{}"))
    try:
        if plan.get("netns"):
            new_network_namespace()
        if plan.get("rlimits"):
            set_rlimits(plan["rlimits"])
        if plan.get("uid") is not None:
            drop_bounding_set()
            become(int(plan["uid"]))
        if plan.get("drop_caps"):
            drop_capabilities()
        no_new_privs()
        if plan.get("landlock"):
            apply_landlock(plan["landlock"], int(plan["landlock"].get("abi", landlock_abi())))
        if plan.get("seccomp"):
            apply_seccomp(bool(plan["seccomp"].get("deny_fork")), plan["seccomp"].get("sockets", "all"))
    except SystemExit:
        raise
    except BaseException as exc:
        fail(f"{type(exc).__name__}: {exc}")
    os.execv(command[0], command)


if __name__ == "__main__":
    main()
