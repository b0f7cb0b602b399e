"""What this machine offers for kernel isolation, probed once per process, and what an interpreter reads.

``probe()`` tries each layer for real (Landlock ABI, seccomp, bubblewrap, network namespaces,
cgroups, root); ``available(settings)`` is that less the layers the configuration turns off. The
read-path helpers list what a sandboxed kernel's interpreter needs to read and execute.
``plan.py`` turns these into one session's ``SandboxPlan``.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import stat
import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

from kernelexec.config import Settings
from kernelexec.host import KernelReach, run_python, system_which
from kernelexec.layout import startup_file

CGROUP_ROOT = Path("/sys/fs/cgroup")


@dataclass(frozen=True)
class Features:
    """What this machine can do for kernel isolation."""

    root: bool
    landlock_abi: int
    seccomp: bool
    bwrap: str | None
    netns: bool
    cgroup: str | None  # "v1", "v2" or None

    def as_rows(self) -> list[tuple[str, str]]:
        return [
            ("running as root", "yes" if self.root else "no"),
            ("Landlock", f"ABI {self.landlock_abi}" if self.landlock_abi else "not available"),
            ("seccomp (libseccomp)", "yes" if self.seccomp else "not available"),
            ("bubblewrap (mount/pid namespaces)", self.bwrap or "not installed or not usable"),
            ("network namespace", "yes" if self.netns else "not available"),
            ("cgroups (memory, pids)", self.cgroup or "not writable"),
        ]


@functools.lru_cache(maxsize=1)
def probe() -> Features:
    """Probe once per process; each check is a real attempt, not a guess from versions."""
    root = os.geteuid() == 0
    check = run_python(["-S", "-c", "import sys; sys.path.insert(0, sys.argv[1]); import sandbox_exec as s; print(s.landlock_abi())",
                        str(startup_file("sandbox_exec.py").parent)], timeout=30)
    abi = int(check.stdout.strip() or 0) if check.returncode == 0 else 0
    try:
        import ctypes

        ctypes.CDLL("libseccomp.so.2")
        seccomp = True
    except OSError:
        seccomp = False
    bwrap = system_which("bwrap")
    if bwrap:
        args = [bwrap, "--ro-bind", "/", "/", "--unshare-net", "--unshare-pid", "--proc", "/proc", "--dev", "/dev"]
        if not root:
            args.append("--unshare-user")
        if subprocess.run([*args, "/bin/true"], capture_output=True, timeout=30).returncode != 0:
            bwrap = None
    unshare = system_which("unshare")
    netns = root and unshare is not None and subprocess.run([unshare, "-n", "true"], capture_output=True, timeout=30).returncode == 0
    return Features(root=root, landlock_abi=abi, seccomp=seccomp, bwrap=bwrap, netns=netns or bool(bwrap), cgroup=_cgroup_kind(root))


def kernel_reach(settings: Settings) -> KernelReach:
    """Where this configuration's kernels can write and read (host.KernelReach), with whether bubblewrap
    keeps the protected names read-only for every one of them."""
    bound = settings.sandbox != "off" and available(settings).bwrap is not None
    return KernelReach.of(settings, protected_bound=bound)


def available(settings: Settings) -> Features:
    """What this machine supports, less the layers the configuration turns off."""
    f = probe()
    off = set(settings.disable_layers)
    return dataclasses.replace(
        f,
        landlock_abi=0 if "landlock" in off else f.landlock_abi,
        seccomp=f.seccomp and "seccomp" not in off,
        bwrap=None if "bubblewrap" in off else f.bwrap,
        netns=f.netns and "netns" not in off and ("bubblewrap" not in off or f.root),
        cgroup=None if "cgroup" in off else f.cgroup,
    )


def _cgroup_kind(root: bool) -> str | None:
    if (CGROUP_ROOT / "cgroup.controllers").exists():
        return "v2" if os.access(CGROUP_ROOT, os.W_OK) else None
    if root and os.access(CGROUP_ROOT / "memory", os.W_OK) and os.access(CGROUP_ROOT / "pids", os.W_OK):
        return "v1"
    return None


def system_read_paths() -> list[str]:
    """Read-only for every kernel: the interpreter, its libraries, and the few system files they read."""
    paths = {sys.prefix, sys.base_prefix, sys.exec_prefix, sysconfig.get_paths()["stdlib"],
             str(startup_file("kernel_init.py").parent)}
    paths.update(p for p in sys.path if p.endswith(("site-packages", "dist-packages")))
    paths.update(
        ["/usr", "/lib", "/lib64", "/bin", "/etc/ld.so.cache", "/etc/localtime", "/etc/fonts", "/etc/mime.types",
         "/etc/matplotlibrc", "/sys/devices/system/cpu", "/dev/null", "/dev/zero", "/dev/urandom", "/dev/random",
         "/proc/cpuinfo", "/proc/meminfo", "/proc/self"]
    )
    return sorted(p for p in paths if p and os.path.exists(p))


def interpreter_files(python: str | None = None) -> list[str]:
    """What execve() of the kernel's Python needs to execute: the binary and the ELF loader (and the
    pre-exec wrapper's Python, kernelexec's own)."""
    import glob

    found = {sys.executable, os.path.realpath(sys.executable)}
    if python:
        found.update(_link_chain(python))
    for pattern in ("/lib64/ld-linux*.so*", "/lib/ld-linux*.so*", "/lib/*-linux-gnu/ld-linux*.so*",
                    "/usr/lib64/ld-linux*.so*", "/usr/lib/*-linux-gnu/ld-linux*.so*", "/lib/ld-musl*.so*"):
        for path in glob.glob(pattern):
            found.update({path, os.path.realpath(path)})
    return sorted(found)


def _link_chain(path: str) -> list[str]:
    """A path and every symlink on the way to its target (a venv's python -> python3.12 -> /usr/bin/...)."""
    out = [path]
    seen = 0
    while os.path.islink(path) and seen < 16:
        target = os.readlink(path)
        path = os.path.normpath(os.path.join(os.path.dirname(path), target))
        out.append(path)
        seen += 1
    out.append(os.path.realpath(path))
    return out


@functools.lru_cache(maxsize=32)
def interpreter_world_readable(extra: tuple[str, ...] = ()) -> bool:
    """Can another uid run our interpreter (and the kernel's, ``extra``)? Bind mounts keep their own
    modes (a 0700 venv stays 0700)."""
    paths = {sys.prefix, sys.base_prefix, sys.exec_prefix, str(startup_file("kernel_init.py").parent)}
    paths.update(p for p in sys.path if p.endswith(("site-packages", "dist-packages")) and os.path.isdir(p))
    paths.update(interpreter_files())
    paths.update(extra)
    for p in paths:
        try:
            mode = os.stat(p).st_mode
        except OSError:
            continue
        need = 0o005 if stat.S_ISDIR(mode) else 0o004
        if mode & need != need:
            return False
    return True


def own_protected_paths() -> list[str]:
    """kernelexec's own environment as ``Environment.protected_paths`` would list it."""
    paths = {sys.prefix, *(p for p in sys.path if p.endswith(("site-packages", "dist-packages")))}
    return sorted(p for p in paths if os.path.isdir(p))


__all__ = ["Features", "available", "kernel_reach", "probe"]
