"""The OS layers around each kernel: the plan for one session on this machine.

``plan_for()`` turns a profile and a session into a ``SandboxPlan`` from what the machine offers
(``probe.available``): the command prefix (the SIGINT shim and bubblewrap), the JSON the pre-exec
wrapper (``startup/sandbox_exec.py``) applies before exec'ing the kernel, and the names of the layers
in force. The provisioner (provisioner.py) applies the plan to every launch: live sessions, restarts
and replay alike.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kernelexec.config import Profile, Settings
from kernelexec.host import make_placeholders, protected_paths, python_argv
from kernelexec.layout import IPC_SUBDIR, IPYTHON_SUBDIR, kernel_writable, startup_file
from kernelexec.sandbox.probe import (
    CGROUP_ROOT,
    Features,
    available,
    interpreter_files,
    interpreter_world_readable,
    own_protected_paths,
    system_read_paths,
)

if TYPE_CHECKING:
    from kernelexec.environment.interpreter import Environment

logger = logging.getLogger(__name__)

# Never loaded in guarded kernels: sub-interpreters escape audit hooks (3.11/3.12 _xxsubinterpreters, 3.13
# _interpreters, their channels and queues; CPython's test modules _testcapi.run_in_subinterp and
# _testinternalcapi.create_interpreter, which also hand out raw C-API and memory access, as does 3.13's
# _testexternalinspection / 3.14's _remote_debugging for other processes); the debugger is not needed.
GUARD_BLOCKED_MODULES = [
    "_xxsubinterpreters", "_interpreters", "_xxinterpchannels", "_interpchannels", "_xxinterpqueues", "_interpqueues",
    "_testcapi", "_testinternalcapi", "_testlimitedcapi", "_testexternalinspection", "_remote_debugging", "debugpy",
]

KERNEL_UID_BASE = 1_000_000_000  # far above ordinary users and the usual subuid ranges


def kernel_uid(key: str) -> int:
    """A stable unprivileged uid per session (derived from its handle)."""
    import hashlib

    return KERNEL_UID_BASE + int(hashlib.sha256(key.encode()).hexdigest()[:8], 16) % 100_000_000


def _inside(path: str, roots: list[str]) -> bool:
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


NETWORK_READ_PATHS = ["/etc/resolv.conf", "/etc/hosts", "/etc/nsswitch.conf", "/etc/ssl", "/etc/ca-certificates",
                      "/usr/share/ca-certificates", "/etc/gai.conf", "/etc/services", "/etc/protocols"]


@dataclass
class SandboxPlan:
    """Everything needed to launch one session's kernel inside its layers."""

    layers: list[str]
    prefix: list[str] = field(default_factory=list)  # shim + bwrap, before the wrapper
    wrapper: dict[str, Any] = field(default_factory=dict)  # KERNELEXEC_SANDBOX for sandbox_exec.py
    kernel_options: dict[str, Any] = field(default_factory=dict)  # KERNELEXEC_KERNEL for kernel_main.py
    uid: int | None = None  # the kernel's own unprivileged uid (root servers with bubblewrap)
    owned: list[str] = field(default_factory=list)  # directories handed to that uid before launch
    traversable: list[str] = field(default_factory=list)  # server-owned directories it must be able to enter
    cgroup_dirs: list[str] = field(default_factory=list)
    cgroup_limits: dict[str, str] = field(default_factory=dict)
    degraded: list[str] = field(default_factory=list)
    python: str = ""  # the kernel's interpreter (environments.Environment.python); empty: kernelexec's own

    def wrap(self, kernel_cmd: list[str]) -> list[str]:
        """``sh`` shim (joins the cgroups, ignores SIGINT so an interrupt reaches only the kernel),
        then bubblewrap if planned, then the pre-exec wrapper, then the kernel."""
        joins = "".join(f"echo $$ > {shlex.quote(str(Path(d) / 'cgroup.procs'))} && " for d in self.cgroup_dirs)
        shim = ["/bin/sh", "-c", f'{joins}trap "" INT && exec "$@"', "sh"]
        return [*shim, *self.prefix, *python_argv(["-S", str(startup_file("sandbox_exec.py")), "--", *kernel_cmd])]

    def for_slot(self, slot: str) -> SandboxPlan:
        """The plan for a kernel in one of its session's slots (see launch.SLOTS): the first slot uses
        the session's cgroups, another slot (a warm spare) its own next to them."""
        if not slot or slot == "k" or not self.cgroup_dirs:
            return self
        joins = [f"{d}-{slot}" for d in self.cgroup_dirs]
        return dataclasses.replace(self, cgroup_dirs=joins)

    def hand_over(self, connection_file: Path) -> None:
        """Give the kernel's uid its writable directories and its connection file (called as root)."""
        if self.uid is None:
            return
        for d in self.traversable:
            os.chmod(d, 0o711 if d == self.traversable[0] else 0o755)
        for top in self.owned:
            if os.lstat(top).st_uid != self.uid:
                # first hand-over to this uid: no kernel of it runs yet, so nothing moves under the walk
                _chown_tree(top, self.uid)
            # Otherwise everything below was made by this uid's kernels: nothing to walk. (A warm spare
            # is launched while the session's live kernel runs, and a walk as root under its feet is a
            # symlink/FIFO race; _chown_tree is safe against both anyway.)
            # enterable by the launcher (root without CAP_DAC_OVERRIDE) on its way to the kernel's uid
            os.chmod(top, 0o711)
        if connection_file.exists():
            os.chown(connection_file, self.uid, self.uid)

    def create_cgroups(self) -> None:
        for d in self.cgroup_dirs:
            path = Path(d)
            if (CGROUP_ROOT / "cgroup.controllers").exists():  # v2: let the children use memory and pids
                for parent in (CGROUP_ROOT, path.parent):
                    parent.mkdir(exist_ok=True)
                    try:
                        (parent / "cgroup.subtree_control").write_text("+memory +pids")
                    except OSError:
                        logger.warning("cannot enable memory/pids controllers under %s", parent)
            path.mkdir(parents=True, exist_ok=True)
            memsw = path / SWAP_LIMITS[1]
            if SWAP_LIMITS[1] in self.cgroup_limits and memsw.exists():  # v1: a reused cgroup's smaller memory+swap
                with contextlib.suppress(OSError):                       # limit would refuse a larger memory limit
                    memsw.write_text("-1")
            for name, value in self.cgroup_limits.items():
                target = path / name
                if not target.exists():
                    continue
                try:
                    target.write_text(value)
                except OSError:
                    if name not in SWAP_LIMITS:
                        raise
                    logger.warning("cannot limit swap in %s", path)  # the memory cap itself holds

    def remove_cgroups(self) -> None:
        for d in self.cgroup_dirs:
            try:
                os.rmdir(d)
            except OSError:
                pass  # still has processes (a restart in progress) or already gone


_WALK_DEPTH = 64


def _chown_tree(top: str, uid: int) -> None:
    """chown ``top`` and what is under it to ``uid`` without following symlinks or opening anything but
    directories (O_NOFOLLOW | O_DIRECTORY | O_NONBLOCK, relative to the parent's fd): a directory
    swapped for a symlink or a FIFO mid-walk is skipped, never followed or blocked on. At most
    ``_WALK_DEPTH`` levels, so the open fds stay bounded."""
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC

    def walk(dir_fd: int, depth: int) -> None:
        with os.scandir(dir_fd) as entries:
            names = [(e.name, e.is_dir(follow_symlinks=False)) for e in entries]
        for name, is_dir in names:
            with contextlib.suppress(FileNotFoundError):
                os.chown(name, uid, uid, dir_fd=dir_fd, follow_symlinks=False)
            if is_dir and depth < _WALK_DEPTH:
                try:
                    child = os.open(name, flags, dir_fd=dir_fd)
                except OSError:  # gone, or no longer a directory (ELOOP, ENOTDIR)
                    continue
                try:
                    walk(child, depth + 1)
                finally:
                    os.close(child)

    fd = os.open(top, flags)
    try:
        os.fchown(fd, uid, uid)
        walk(fd, 1)
    finally:
        os.close(fd)


def network_allowed(settings: Settings, profile: Profile) -> bool:
    return settings.network if settings.network is not None else profile == "trusted"



def plan_for(settings: Settings, profile: Profile, *, session_dir: Path, rw: list[Path], ro: list[Path], cwd: Path, key: str,
             environment: Environment | None = None) -> SandboxPlan:
    """The layers for one session's kernel under ``profile`` on this machine, in ``environment``
    (default: kernelexec's own interpreter). The environment is readable and never writable: where it
    lies inside a writable directory (a project's .venv), bubblewrap binds it read-only over that."""
    env_read = list(environment.read_paths) if environment is not None else []
    protected = environment.protected_paths() if environment is not None else own_protected_paths()
    protected = sorted({*protected, str(startup_file("kernel_init.py").parent)})
    if environment is not None and environment.overlay:
        env_read.append(environment.overlay)
    python = environment.python if environment is not None else ""
    plan = _plan_for(settings, profile, session_dir=session_dir, rw=rw, ro=ro, cwd=cwd, key=key,
                     env_read=env_read, protected=protected, python=python)
    plan.python = python
    writable = [*map(str, kernel_writable(session_dir)), *map(str, rw)]
    plan.kernel_options.update(writable=writable, protected=protected)
    if environment is not None:
        plan.kernel_options["site_dirs"] = list(environment.site_packages)
        if environment.overlay:
            plan.kernel_options["overlay"] = environment.overlay
    return plan


def _plan_for(settings: Settings, profile: Profile, *, session_dir: Path, rw: list[Path], ro: list[Path], cwd: Path, key: str,
              env_read: list[str], protected: list[str], python: str) -> SandboxPlan:
    """The layers, one step each, in the order the wrapper and the kernel receive them."""
    if settings.sandbox == "off":
        return _unsandboxed(profile)
    f = available(settings)
    guarded = profile != "trusted"
    network = network_allowed(settings, profile)
    plan = SandboxPlan(layers=["env", "rlimits"])
    plan.wrapper["rlimits"] = _rlimits(settings, f)
    if f.root and f.bwrap and not rw and settings.kernel_uids and interpreter_world_readable(tuple(env_read)):
        _give_own_uid(plan, settings, f, session_dir, key)
    if f.root:
        plan.wrapper["drop_caps"] = True
        plan.layers.append("no-capabilities")
    read_paths = sorted({*system_read_paths(), *(p for p in env_read if os.path.exists(p))}) + [str(session_dir), *map(str, ro)] \
        + (NETWORK_READ_PATHS if network else [])
    write_paths = [*map(str, kernel_writable(session_dir)), *map(str, rw)]
    # the environment inside a writable directory: bound read-only again on top of that directory
    env_shadowed = [p for p in protected if _inside(os.path.realpath(p), [os.path.realpath(w) for w in write_paths])]
    shadowed, guarded_names = _protect_names(plan, settings, f, rw, env_shadowed)
    ipc_dir = str(session_dir / IPC_SUBDIR)
    _add_landlock(plan, f, read_paths, write_paths, ipc_dir, network=network, guarded=guarded, python=python)
    _add_seccomp(plan, f, network=network, guarded=guarded)
    if not network:
        plan.kernel_options["no_iopub_pipe"] = True
    if f.bwrap:
        plan.prefix = [f.bwrap, *_bwrap_args(f, read_paths, [*write_paths, ipc_dir], cwd, network, plan.uid, shadowed), "--"]
        plan.layers.append("bubblewrap")
        if not network:
            plan.layers.append("netns")
    else:
        _without_bubblewrap(plan, f, network=network, guarded_names=guarded_names, env_shadowed=env_shadowed)
    if f.cgroup and (settings.memory_mb or settings.max_processes):
        plan.cgroup_dirs, plan.cgroup_limits = _cgroups(f.cgroup, key, settings)
        plan.layers.append(f"cgroup-{f.cgroup}")
    if guarded:
        # ctypes stays importable for libraries (pandas needs it); the guard refuses its calls and
        # the import by user code, and the OS layers hold if a cell reaches it anyway
        plan.kernel_options["block_modules"] = GUARD_BLOCKED_MODULES
        plan.layers.append("guard")
    return plan


def _unsandboxed(profile: Profile) -> SandboxPlan:
    """``--sandbox off``: the environment, and the in-kernel guard unless the profile is trusted."""
    plan = SandboxPlan(layers=["env"], degraded=["sandbox disabled (--sandbox off)"])
    if profile != "trusted":
        plan.kernel_options["block_modules"] = GUARD_BLOCKED_MODULES
        plan.layers.append("guard")
    return plan


def _rlimits(settings: Settings, f: Features) -> dict[str, int]:
    """The resource limits the wrapper sets (a root server's RLIMIT_NPROC only with the kernel's own uid)."""
    mb = 1024 * 1024
    rlimits = {"nofile": settings.max_open_files, "fsize": settings.max_file_mb * mb, "core": 0}
    if settings.memory_mb:
        rlimits["data"] = settings.memory_mb * mb
    if settings.cpu_seconds:
        rlimits["cpu"] = int(settings.cpu_seconds)
    if not f.root and settings.max_processes:
        rlimits["nproc"] = settings.max_processes
    return rlimits


def _give_own_uid(plan: SandboxPlan, settings: Settings, f: Features, session_dir: Path, key: str) -> None:
    """The kernel's own uid: root-specific powers gone for good, DAC between sessions, RLIMIT_NPROC enforced.
    Only with bubblewrap (the interpreter may live under a 0700 /root that the mount namespace
    re-exposes) and only when no shared --work-roots must stay writable (the caller checks both)."""
    plan.uid = kernel_uid(key)
    plan.wrapper["uid"] = plan.uid
    plan.owned = [str(session_dir / IPC_SUBDIR), *map(str, kernel_writable(session_dir))]
    ipython = session_dir / IPYTHON_SUBDIR
    plan.traversable = [str(session_dir), str(ipython), *(str(p) for p in ipython.rglob("*") if p.is_dir())]
    if settings.max_processes:
        # RLIMIT_NPROC counts the whole uid, which a warm spare shares with the live kernel; where
        # each slot has a pids cgroup, that is the per-kernel cap and this is the backstop for both
        shared = 2 if settings.restart_spares and f.cgroup else 1
        plan.wrapper["rlimits"]["nproc"] = settings.max_processes * shared
    plan.layers.append(f"uid-{plan.uid}")


def _protect_names(plan: SandboxPlan, settings: Settings, f: Features, rw: list[Path],
                   env_shadowed: list[str]) -> tuple[list[str], list[str]]:
    """(paths bound read-only again inside the writable ones, the protected names in writable roots).

    What tools outside the sandbox read from a writable project (.git, .claude, .venv, ...; host.py) is
    read-only too, the missing directories among them made first (empty) so a kernel cannot create them."""
    shadowed = list(env_shadowed)
    guarded_names: list[str] = []
    for root in rw:
        existing, missing = protected_paths(Path(root), settings.protect)
        if f.bwrap:
            unmade = make_placeholders(missing)
            existing += [m for m in missing if m not in unmade]
            if unmade:
                plan.degraded.append(f"could not create the placeholders {', '.join(map(str, unmade[:3]))}: kernels may create them")
        guarded_names += [str(p) for p in [*existing, *missing]]
        shadowed += [str(p) for p in existing if str(p) not in shadowed]
    plan.kernel_options["protected_names"] = guarded_names
    return shadowed, guarded_names


def _add_landlock(plan: SandboxPlan, f: Features, read_paths: list[str], write_paths: list[str], ipc_dir: str, *,
                  network: bool, guarded: bool, python: str) -> None:
    if not f.landlock_abi:
        plan.degraded.append("Landlock not available: no kernel-enforced file access limits outside bubblewrap")
        return
    plan.wrapper["landlock"] = {"abi": f.landlock_abi, "ro": read_paths, "rw": write_paths, "sock": [ipc_dir],
                                "deny_tcp": not network}
    if guarded:  # no subprocesses: the interpreter is the only file the kernel may execute
        plan.wrapper["landlock"]["exec"] = interpreter_files(python)
    elif f.bwrap:  # `!cmd` needs a pty: the mount namespace's own devpts instance, never the host's terminals
        plan.wrapper["landlock"]["dev"] = ["/dev/ptmx", "/dev/pts"]
    plan.layers.append(f"landlock-abi{f.landlock_abi}")


def _add_seccomp(plan: SandboxPlan, f: Features, *, network: bool, guarded: bool) -> None:
    if not f.seccomp:
        plan.degraded.append("seccomp not available: process creation and raw sockets are stopped only by the in-kernel guard")
        return
    plan.wrapper["seccomp"] = {"deny_fork": guarded, "sockets": "all" if network else "unix+tcp"}
    plan.kernel_options["deny_exec"] = guarded
    plan.layers.append("seccomp")


def _without_bubblewrap(plan: SandboxPlan, f: Features, *, network: bool, guarded_names: list[str],
                        env_shadowed: list[str]) -> None:
    """What is lost without bubblewrap, said in ``degraded``; a network namespace of the wrapper's own if it can."""
    plan.degraded.append("bubblewrap not available: other kernels' sockets and host paths stay visible (Landlock ABI < 8 cannot hide unix sockets)")
    if guarded_names:
        plan.degraded.append("bubblewrap not available: .git, .claude, .vscode and the other protected names in writable "
                             "directories stay writable at the OS level (Landlock only adds rights); the in-kernel "
                             "guard refuses writes to them in strict/standard, nothing does in trusted")
    if env_shadowed:
        plan.degraded.append(f"the kernel's Python environment ({', '.join(env_shadowed[:3])}) lies inside a writable "
                             "directory and without bubblewrap stays writable to cells (Landlock only adds rights); "
                             "the in-kernel guard refuses such writes in strict/standard")
    if not network and f.netns:
        plan.wrapper["netns"] = True
        plan.layers.append("netns")


def _bwrap_args(f: Features, read_paths: list[str], write_paths: list[str], cwd: Path, network: bool,
                uid: int | None = None, read_again: list[str] | None = None) -> list[str]:
    args = ["--die-with-parent", "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
            "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "--cap-drop", "ALL"]
    if f.root:
        # keep only CAP_SETPCAP (and SETUID/SETGID to become the kernel's uid), so the pre-exec wrapper
        # can empty the bounding set and then lose them too
        args += ["--cap-add", "CAP_SETPCAP"]
        if uid is not None:
            args += ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
    if not network:
        args.append("--unshare-net")
    if not f.root:
        args.append("--unshare-user")
    # bwrap makes the parents of bind targets 0700; the kernel's own uid must be able to walk them
    # (e.g. /root for an interpreter under /root/.pyenv)
    targets = [p for p in [*read_paths, *write_paths] if not p.startswith(("/proc", "/dev"))]
    parents = sorted({str(a) for p in targets for a in Path(p).parents if str(a) != "/"}, key=lambda d: d.count("/"))
    for d in parents:
        args += ["--perms", "0755", "--dir", d]
    for p in read_paths:
        if p.startswith(("/proc", "/dev")):
            continue
        args += ["--ro-bind", p, p]
    for p in write_paths:
        if os.path.isdir(p):
            args += ["--bind", p, p]
    for p in read_again or ():  # after the writable binds, so these stay read-only inside them
        if os.path.exists(p):
            args += ["--ro-bind", p, p]
    args += ["--chdir", str(cwd)]
    return args


# No swap past the memory cap (v2, v1): a kernel at its cap would otherwise page out to the host's swap and slow
# every other process instead of being OOM-killed. Present only where the kernel accounts swap: written when there.
SWAP_LIMITS = ("memory.swap.max", "memory.memsw.limit_in_bytes")


def _cgroups(kind: str, key: str, settings: Settings) -> tuple[list[str], dict[str, str]]:
    mb = 1024 * 1024
    limits: dict[str, str] = {}
    # the rlimit gives a friendly MemoryError first; the cgroup is the hard cap (OOM kill, reported)
    hard = (settings.memory_mb + 512) * mb if settings.memory_mb else 0
    if kind == "v2":
        if hard:
            limits["memory.max"] = str(hard)
            limits[SWAP_LIMITS[0]] = "0"  # the cap is the kernel's whole memory: past it an OOM kill, not the host's swap
        if settings.max_processes:
            limits["pids.max"] = str(settings.max_processes)
        return [str(CGROUP_ROOT / "kernelexec" / key)], limits
    dirs = []
    if hard:
        dirs.append(str(CGROUP_ROOT / "memory" / "kernelexec" / key))
        limits["memory.limit_in_bytes"] = str(hard)
        limits[SWAP_LIMITS[1]] = str(hard)  # memory + swap, after the memory limit (it may not be below it)
    if settings.max_processes:
        dirs.append(str(CGROUP_ROOT / "pids" / "kernelexec" / key))
        limits["pids.max"] = str(settings.max_processes)
    return dirs, limits


def describe_layers(layers: list[str]) -> str:
    """Layers as one line for people; the per-session uid becomes "own uid"."""
    return " + ".join("own uid" if layer.startswith("uid-") else layer for layer in layers)
