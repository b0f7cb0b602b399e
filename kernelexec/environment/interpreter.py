"""Which Python a session's kernel runs in, and the ipykernel it gets there without touching it.

``resolve(settings.python, working_dir)`` turns the ``--python`` setting into an ``Environment``:
a Python executable or a venv/conda prefix given by the flag; or, with ``auto`` (the default), a
``.venv``/``venv`` in the working directory or the project root above it (marked by
``pyproject.toml``, ``setup.py`` or ``.git``), then the server's active ``VIRTUAL_ENV`` /
``CONDA_PREFIX``, else kernelexec's own interpreter. ``auto`` never adopts an environment a kernel
could have written (host.KernelReach). The environment is described without running it on the host
(SECURITY-NOTES §8): its base interpreter, a real installation outside every kernel-writable
directory, answers once, isolated (``-I -S``), for the environment's prefix; its distributions and
``.pth`` lines are read as files. A path that does not exist, is not Python or is older than 3.10 is
refused with an ``EnvironmentUnusable`` naming it.

An environment without ipykernel is never modified: ``ensure_overlay`` builds ipykernel and its
dependencies once per interpreter version into kernelexec's cache (``pip install --target``,
wheels only, with the pip configuration of this machine), and the kernel's entry point appends
that directory to ``sys.path`` after the environment's own site-packages, so the project's
packages win. A distribution of the environment that ipykernel cannot live with (an old pyzmq)
is refused with both names.
"""

from __future__ import annotations

import contextlib
import functools
import glob
import json
import logging
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from kernelexec.environment import wheels
from kernelexec.errors import KernelexecError
from kernelexec.host import KernelReach, run_python

logger = logging.getLogger(__name__)

MIN_VERSION = (3, 10)
MAX_VERSION = (3, 14)  # newest minor version this release knows; newer ones run with a warning
IPYKERNEL_REQUIREMENT = "ipykernel>=6.29,<8"
IPYKERNEL_MIN = (6, 29)
PROJECT_MARKERS = ("pyproject.toml", "setup.py", ".git")
VENV_NAMES = (".venv", "venv")
INSPECT_TIMEOUT = float(os.environ.get("KERNELEXEC_INSPECT_TIMEOUT") or 30.0)  # seconds an interpreter has to describe itself
BUILD_TIMEOUT = 600.0

Source = str  # "flag", "project .venv", "VIRTUAL_ENV", "conda", "own"


class EnvironmentUnusable(KernelexecError):
    """The chosen interpreter cannot run kernels (missing, not Python, too old, no ipykernel obtainable)."""


# Runs in the environment's BASE interpreter (never the environment's own bin/python, never with
# ``site``), isolated, from an empty directory: the base is a real installation outside every directory
# a kernel can write. argv: the environment's prefix ("" for the interpreter itself) and "1" when its
# pyvenv.cfg includes the system site-packages. Python 2 and 3.0+ syntax until the version check.
_INSPECT = r"""
import sys
if sys.version_info < (3, 10):
    sys.stdout.write('{"old": "%d.%d.%d"}' % tuple(sys.version_info[:3]))
    sys.exit(0)
import json, os, platform, site, sysconfig
venv, system_site = sys.argv[1], sys.argv[2] == "1"
base = sysconfig.get_paths()
if venv:
    scheme = "venv" if "venv" in sysconfig.get_scheme_names() else "posix_prefix"
    own = sysconfig.get_paths(scheme=scheme, vars={"base": venv, "platbase": venv, "installed_base": venv,
                                                  "installed_platbase": venv})
    sitedirs = [own["purelib"], own["platlib"]] + (site.getsitepackages() if system_site else [])
else:
    own = base
    sitedirs = site.getsitepackages()
libc = platform.libc_ver(sys.executable)
info = {
    "executable": sys.executable, "prefix": venv or sys.prefix, "base_prefix": sys.base_prefix,
    "exec_prefix": venv or sys.exec_prefix, "base_exec_prefix": sys.base_exec_prefix,
    "version": platform.python_version(), "version_info": list(sys.version_info[:3]),
    "implementation": sys.implementation.name, "cache_tag": sys.implementation.cache_tag,
    "abiflags": getattr(sys, "abiflags", ""), "machine": platform.machine(), "libc": [libc[0], libc[1]],
    "stdlib": base.get("stdlib"), "platstdlib": base.get("platstdlib"),
    "purelib": own.get("purelib"), "platlib": own.get("platlib"), "sitedirs": sitedirs,
    "markers": {"python_version": "%d.%d" % sys.version_info[:2], "python_full_version": platform.python_version(),
                "implementation_name": sys.implementation.name, "os_name": os.name, "sys_platform": sys.platform,
                "platform_machine": platform.machine(), "platform_system": platform.system(),
                "platform_python_implementation": platform.python_implementation(),
                "platform_release": platform.release(), "platform_version": platform.version(),
                "implementation_version": platform.python_version()},
}
sys.stdout.write(json.dumps(info))
"""


@dataclass(frozen=True)
class Environment:
    """The interpreter a kernel runs in, as that interpreter describes itself."""

    python: str  # the executable the kernel is started with (a venv's bin/python as found, not its target)
    prefix: str
    base_prefix: str
    version: str  # "3.12.1"
    version_info: tuple[int, ...]
    tag: str  # "cp312" (with ABI flags, e.g. "cp313t"): the overlay's name
    machine: str
    site_packages: tuple[str, ...]
    read_paths: tuple[str, ...]  # what the interpreter reads: prefixes, stdlib, every sys.path entry
    sys_path: tuple[str, ...]
    source: Source
    reason: str
    distributions: tuple[tuple[str, str], ...] = ()  # (normalised name, version) installed in the environment
    markers: tuple[tuple[str, str], ...] = ()
    libc: tuple[str, str] = ("", "")
    own: bool = False
    overlay: str | None = None  # the ipykernel overlay directory, once ensure_overlay found or built it

    @property
    def key(self) -> tuple[str, str]:
        """Two sessions with the same key run the same interpreter with the same packages."""
        return (os.path.realpath(self.python), os.path.realpath(self.prefix))

    def version_of(self, name: str) -> str | None:
        return dict(self.distributions).get(_norm(name))

    @property
    def has_ipykernel(self) -> bool:
        return self.version_of("ipykernel") is not None

    def summary(self) -> dict[str, Any]:
        """What an answer, the notebook and ``doctor`` say about it."""
        return {"python": self.python, "version": self.version, "source": self.source, "prefix": self.prefix,
                "ipykernel": "kernelexec overlay" if self.overlay else "environment's own"}

    def describe(self) -> str:
        return f"Python {self.version} at {self.python} ({self.source})"

    def protected_paths(self) -> list[str]:
        """Paths a cell must never write: what the next kernel reads before its guard is installed (other
        ``sys.path`` entries a cell could write, an editable install's ``src/``, are added only after it)."""
        paths = {self.prefix, *self.site_packages}
        if self.overlay:
            paths.add(self.overlay)
        return sorted(p for p in paths if p and os.path.exists(p))


def _norm(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def project_modules(env: Environment, working_dir: Path | None) -> list[str]:
    """Top-level modules a project environment holds (its site-packages and the paths its .pth files add)
    and the project's own code in ``working_dir`` (and its ``src/``): the standard profile lets a
    kernel in the user's chosen environment import them."""
    stdlib = {env.base_prefix, env.prefix}
    places = [*env.site_packages, *(p for p in env.sys_path if os.path.isdir(p) and "site-packages" not in p
                                   and not any(p.startswith(os.path.join(b, "lib")) for b in stdlib))]
    if working_dir is not None:
        places += [str(working_dir), str(Path(working_dir) / "src")]
    names: set[str] = set()
    for place in places:
        try:
            entries = list(os.scandir(place))
        except OSError:
            continue
        for entry in entries[:5000]:
            name = entry.name
            if name.startswith((".", "_")) or name.endswith((".dist-info", ".egg-info", ".pth", ".data")):
                continue
            if entry.is_dir():
                if name.isidentifier():
                    names.add(name)
            elif name.endswith((".py", ".so")) or ".cpython-" in name:
                stem = name.split(".")[0]
                if stem.isidentifier():
                    names.add(stem)
    return sorted(names)


# --- finding the interpreter -------------------------------------------------------------------------
def _python_in(prefix: Path) -> Path | None:
    for name in ("bin/python3", "bin/python", "python.exe"):
        candidate = prefix / name
        if candidate.exists():
            return candidate
    return None


def _marks_project(path: Path) -> bool:
    """A project marker; an empty .git directory is kernelexec's own placeholder (host.PROTECTED_DIRS), not a repository."""
    if path.name == ".git" and path.is_dir() and not path.is_symlink():
        try:
            return any(os.scandir(path))
        except OSError:
            return False
    return path.exists()


def find_project_venv(working_dir: Path | None) -> tuple[Path, str] | None:
    """A ``.venv``/``venv`` in ``working_dir``, else in the project root above it; (prefix, why)."""
    if working_dir is None:
        return None
    working_dir = Path(working_dir)
    places = [working_dir]
    for d in [working_dir, *working_dir.parents]:
        if any(_marks_project(d / m) for m in PROJECT_MARKERS):
            if d != working_dir:
                places.append(d)
            break
    for place in places:
        for name in VENV_NAMES:
            prefix = place / name
            if (prefix / "pyvenv.cfg").is_file() and _python_in(prefix) is not None:
                where = "the working directory" if place == working_dir else f"the project root {place}"
                return prefix, f"{name} in {where}"
    return None


def _same(a: str | os.PathLike[str], b: str | os.PathLike[str]) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def _check_adoptable(prefix: Path, python: Path, why: str, reach: KernelReach | None) -> None:
    """Auto-detection adopts an environment only when no kernel can have written it: its pyvenv.cfg and
    its interpreter's real path outside every kernel-writable directory (a .venv at the top of a work
    root counts as outside when bubblewrap binds it read-only for every kernel)."""
    if reach is None:
        return
    cfg = prefix / "pyvenv.cfg"
    for path in (cfg, Path(os.path.realpath(python))):
        if reach.writes(path):
            raise EnvironmentUnusable(
                f"auto: {why} ({prefix}) lies where kernels can write ({path}), so it may not be the project's own; "
                f"name it yourself if you trust it: --python {prefix}")


def choose(setting: str, working_dir: Path | None, reach: KernelReach | None = None) -> tuple[str, Source, str]:
    """(interpreter path, source, why) for a ``--python`` setting; no interpreter is run here. With
    ``reach``, ``auto`` refuses an environment a kernel could have written (``_check_adoptable``)."""
    setting = (setting or "auto").strip()
    if setting != "auto":
        path = Path(os.path.expanduser(setting))
        if not path.is_absolute() and os.sep not in setting and not path.exists():
            found = shutil.which(setting)
            if found is None:
                raise EnvironmentUnusable(f"--python {setting!r}: no such file, and no {setting!r} on PATH")
            path = Path(found)
        if not path.exists():
            raise EnvironmentUnusable(f"--python {setting}: no such file or directory")
        if path.is_dir():
            python = _python_in(path)
            if python is None:
                raise EnvironmentUnusable(f"--python {setting}: a directory without bin/python3 or bin/python "
                                          "(give a Python executable, or a venv/conda prefix)")
            return str(python), "flag", f"--python {setting} (a prefix directory)"
        if not os.access(path, os.X_OK):
            raise EnvironmentUnusable(f"--python {setting}: not an executable file")
        return str(path), "flag", f"--python {setting}"
    project = find_project_venv(working_dir)
    if project is not None:
        prefix, why = project
        python = _python_in(prefix)
        assert python is not None  # find_project_venv checked
        _check_adoptable(prefix, python, why, reach)
        return str(python), "project .venv", f"auto: {why}"
    own = sys.prefix
    for variable, source in (("VIRTUAL_ENV", "VIRTUAL_ENV"), ("CONDA_PREFIX", "conda")):
        value = os.environ.get(variable)
        if not value:
            continue
        prefix = Path(value)
        python = _python_in(prefix)
        if python is None:
            logger.warning("%s=%s has no bin/python; ignored", variable, value)
            continue
        if _same(prefix, own):
            return sys.executable, "own", f"auto: {variable} is kernelexec's own environment"
        _check_adoptable(prefix, python, f"{variable}={value}", reach)
        return str(python), source, f"auto: {variable}={value} of the server's environment"
    where = f" in {working_dir}" if working_dir is not None else ""
    return sys.executable, "own", f"auto: no project .venv{where}, no VIRTUAL_ENV or CONDA_PREFIX: kernelexec's own interpreter"


_CFG_MAX = 64 * 1024


def read_pyvenv_cfg(prefix: Path) -> dict[str, str]:
    """A venv's pyvenv.cfg as data (``key = value`` lines; bounded); {} when absent or unreadable."""
    try:
        with open(prefix / "pyvenv.cfg", encoding="utf-8", errors="replace") as f:
            text = f.read(_CFG_MAX)
    except OSError:
        return {}
    out = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            out[key.strip().lower()] = value.strip()
    return out


def venv_prefix(python: str) -> Path | None:
    """The venv an interpreter path belongs to, found as Python itself finds it (a pyvenv.cfg beside the
    executable or one directory up), by reading files only."""
    exe = Path(os.path.abspath(python))
    for place in (exe.parent, exe.parent.parent):
        if (place / "pyvenv.cfg").is_file():
            return place
    return None


def base_interpreter(python: str, reach: KernelReach | None) -> tuple[str, Path | None, dict[str, str]]:
    """(the interpreter the host may run to describe ``python``, its venv prefix, its pyvenv.cfg).

    The host never runs a venv's own ``bin/python`` (its pyvenv.cfg picks the standard library the
    interpreter imports at start-up) nor any file a kernel could write: a venv is described by its base
    interpreter — the real path of its python when that lies outside the venv (the usual symlink), else
    the ``python3.X``/``python3`` in its pyvenv.cfg's ``home`` — run isolated, with the venv's prefix as
    an argument. Raises EnvironmentUnusable when that interpreter lies where kernels can write."""
    prefix = venv_prefix(python)
    cfg = read_pyvenv_cfg(prefix) if prefix is not None else {}
    real = os.path.realpath(python)
    candidates = [real]
    if prefix is not None:
        if _inside_dir(real, prefix):
            candidates = []
        home = cfg.get("home", "")
        version = (cfg.get("version_info") or cfg.get("version") or "").split(".")
        names = ([f"python{version[0]}.{version[1]}"] if len(version) >= 2 else []) + ["python3", "python"]
        if home and os.path.isabs(home):
            candidates += [os.path.realpath(os.path.join(home, n)) for n in names if os.path.isfile(os.path.join(home, n))]
    for candidate in candidates:
        if prefix is not None and _inside_dir(candidate, prefix):
            continue
        if reach is not None and reach.writes(candidate):
            raise EnvironmentUnusable(f"{python}: its interpreter {candidate} lies where kernels can write; kernelexec "
                                      "never runs such a file on the host (choose a Python installed outside the "
                                      "working directory with --python)")
        if os.access(candidate, os.X_OK) and os.path.isfile(candidate):
            return candidate, prefix, cfg
    if prefix is not None:
        raise EnvironmentUnusable(f"{python}: a venv whose base interpreter cannot be found (pyvenv.cfg home = "
                                  f"{cfg.get('home', 'missing')!r}); kernelexec never runs a venv's own copy on the host")
    raise EnvironmentUnusable(f"{python} cannot be run: not an executable file")


def _inside_dir(path: str, directory: Path) -> bool:
    d = os.path.realpath(directory)
    return path == d or path.startswith(d.rstrip("/") + "/")


@functools.lru_cache(maxsize=64)
def _inspect(base: str, prefix: str, system_site: bool, stamp: tuple[int, ...]) -> dict[str, Any]:  # noqa: ARG001 - stamp keys the cache
    """The base interpreter's answer about itself and the environment at ``prefix`` (see ``_INSPECT``)."""
    try:
        proc = run_python(["-S", "-c", _INSPECT, prefix, "1" if system_site else "0"], python=base, timeout=INSPECT_TIMEOUT)
    except subprocess.TimeoutExpired:
        raise EnvironmentUnusable(f"{base} did not answer within {INSPECT_TIMEOUT:.0f} s: is it a Python interpreter?") from None
    except OSError as exc:
        raise EnvironmentUnusable(f"{base} cannot be run: {exc.strerror or exc}") from None
    try:
        info = json.loads(proc.stdout)
        if not isinstance(info, dict):
            raise ValueError
    except ValueError:
        detail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or [f"exit status {proc.returncode}"]
        raise EnvironmentUnusable(f"{base} is not a Python interpreter kernelexec can use ({detail[0][:200]})") from None
    if "old" in info:
        raise EnvironmentUnusable(f"{base} is Python {info['old']}; kernels need Python "
                                  f"{MIN_VERSION[0]}.{MIN_VERSION[1]} or newer")
    return info


def _stamp(python: str) -> tuple[int, ...]:
    """Re-inspect when the interpreter or its environment's site-packages changed."""
    out = []
    for p in (python, os.path.realpath(python)):
        with contextlib.suppress(OSError):
            out.append(os.stat(p).st_mtime_ns)
    prefix = Path(python).parent.parent
    for sp in glob.glob(str(prefix / "lib" / "python3*" / "site-packages")):
        with contextlib.suppress(OSError):
            out.append(os.stat(sp).st_mtime_ns)
    return tuple(out)


def _distributions(site_dirs: list[str]) -> dict[str, str]:
    """Installed distributions (normalised name → version), read from their metadata files: data only."""
    from importlib import metadata

    found: dict[str, str] = {}
    for dist in metadata.distributions(path=site_dirs):
        try:
            name = dist.metadata["Name"]
            version = dist.version
        except Exception:  # noqa: BLE001 - a broken dist-info is not ours to judge
            continue
        if isinstance(name, str) and name and _norm(name) not in found:
            found[_norm(name)] = str(version)
    return found


def _pth_paths(site_dirs: list[str]) -> list[str]:
    """The plain directory lines of the site dirs' .pth files (``import`` lines are code: skipped), as
    ``site`` would add them in the kernel: only to list the project's modules, never to widen reads."""
    out: list[str] = []
    for sitedir in site_dirs:
        for pth in sorted(glob.glob(os.path.join(glob.escape(sitedir), "*.pth")))[:200]:
            try:
                with open(pth, encoding="utf-8", errors="replace") as f:
                    lines = f.read(_CFG_MAX).splitlines()
            except OSError:
                continue
            for line in lines:
                line = line.strip()
                if not line or line.startswith(("#", "import ", "import\t")):
                    continue
                path = os.path.normpath(os.path.join(sitedir, line))
                if os.path.isdir(path) and path not in out:
                    out.append(path)
    return out


def inspect(python: str, source: Source, reason: str, reach: KernelReach | None = None) -> Environment:
    """Describe ``python``'s environment without running it: its base interpreter answers (isolated),
    the rest is read from files. What the kernel may read stays within the environment's prefix and
    the base installation (no path a .pth or pyvenv.cfg names widens it)."""
    base, prefix, cfg = base_interpreter(python, reach)
    system_site = cfg.get("include-system-site-packages", "").lower() == "true"
    info = _inspect(base, str(prefix) if prefix is not None else "", system_site, _stamp(python))
    version_info = tuple(int(x) for x in info["version_info"])
    impl = {"cpython": "cp", "pypy": "pp"}.get(info["implementation"], info["implementation"][:2])
    tag = f"{impl}{version_info[0]}{version_info[1]}{info.get('abiflags') or ''}"
    site_packages = tuple(dict.fromkeys(p for p in [*info["sitedirs"], info["purelib"], info["platlib"]]
                                        if p and os.path.isdir(p)))
    bounds = [p for p in (info["prefix"], info["base_prefix"], info["base_exec_prefix"]) if p]
    read = {info["prefix"], info["base_prefix"], info["exec_prefix"], info["base_exec_prefix"],
            info["stdlib"], info["platstdlib"], *site_packages, os.path.dirname(base)}
    read = {p for p in read if p and any(_inside_dir(os.path.realpath(p), Path(b)) for b in bounds)}
    stdlib = [p for p in (info["stdlib"], info["platstdlib"]) if p]
    lib_dynload = [os.path.join(p, "lib-dynload") for p in stdlib]
    sys_path = [*stdlib, *lib_dynload, *site_packages, *_pth_paths(list(site_packages))]
    own = _same(python, sys.executable) or (_same(info["prefix"], sys.prefix) and source == "own")
    return Environment(
        python=python, prefix=info["prefix"], base_prefix=info["base_prefix"], version=info["version"],
        version_info=version_info, tag=tag, machine=info["machine"], site_packages=site_packages,
        read_paths=tuple(sorted(p for p in read if os.path.exists(p))),
        sys_path=tuple(dict.fromkeys(p for p in sys_path if os.path.isabs(p) and os.path.isdir(p))), source=source,
        reason=reason, distributions=tuple(sorted(_distributions(list(site_packages)).items())),
        markers=tuple(sorted(info["markers"].items())), libc=tuple(info.get("libc") or ("", "")), own=own,
    )


def resolve(setting: str, working_dir: Path | None, reach: KernelReach | None = None) -> Environment:
    """The environment ``--python`` names for a session working in ``working_dir``; raises EnvironmentUnusable."""
    python, source, reason = choose(setting, working_dir, reach)
    env = inspect(python, source, reason, reach)
    if env.version_info[:2] > MAX_VERSION:
        logger.warning("%s is Python %s, newer than this kernelexec knows (up to %d.%d)", python, env.version, *MAX_VERSION)
    return env


# --- the ipykernel overlay ----------------------------------------------------------------------------
def overlay_path(env: Environment, cache_dir: Path) -> Path:
    return Path(cache_dir) / "overlays" / f"{env.tag}-{env.machine}"


def overlay_ready(path: Path) -> bool:
    return (path / "ipykernel" / "kernelapp.py").is_file() and bool(glob.glob(str(path / "ipykernel-*.dist-info")))


def build_command(env: Environment, target: Path) -> list[str]:
    """What ``_build`` does, as a command a user can run by hand: kernelexec's own pip (``python -I -m
    kernelexec.environment.wheels``) choosing wheels only for the environment's interpreter from its version, tag,
    machine and glibc — that interpreter is never run — into ``target``, never into the environment."""
    return wheels.command_line([IPYKERNEL_REQUIREMENT], target, env)


_build_locks: dict[str, threading.Lock] = {}
_build_locks_lock = threading.Lock()


def ensure_overlay(env: Environment, cache_dir: Path, *, build: bool = True) -> Environment:
    """``env`` with its ipykernel settled: its own (new enough), or the overlay (built once if missing)."""
    own_version = env.version_of("ipykernel")
    if own_version is not None:
        if _version_tuple(own_version) < IPYKERNEL_MIN:
            raise EnvironmentUnusable(
                f"{env.python} has ipykernel {own_version}, and kernelexec needs {IPYKERNEL_REQUIREMENT}: it would be "
                f"used before kernelexec's own copy. Upgrade it there ({shlex.quote(env.python)} -m pip install "
                f"'{IPYKERNEL_REQUIREMENT}'), or choose another --python")
        return env
    path = overlay_path(env, cache_dir)
    with _build_locks_lock:
        lock = _build_locks.setdefault(str(path), threading.Lock())
    with lock:
        if not overlay_ready(path):
            if not build:
                raise EnvironmentUnusable(f"{env.describe()} has no ipykernel and kernelexec's overlay for it is not built; "
                                          f"run: {shlex.join(build_command(env, path))}")
            _build(env, path)
    env = replace(env, overlay=str(path))
    check_compatible(env)
    return env


def _build(env: Environment, path: Path) -> None:
    """The overlay: ipykernel's closure, wheels only, for ``env``'s tags and markers (``wheels.install``:
    direct references and sdists refused, nothing built, the interpreter not run), then moved into place."""
    logger.warning("%s has no ipykernel: building kernelexec's overlay for %s in %s (once)", env.python, env.tag, path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}-", dir=path.parent))
    try:
        wheels.install([IPYKERNEL_REQUIREMENT], tmp, wheels.Target.of(env), wheels.Source(), timeout=BUILD_TIMEOUT,
                       work_parent=path.parent)
    except TimeoutError:
        shutil.rmtree(tmp, ignore_errors=True)
        raise EnvironmentUnusable(f"building the ipykernel overlay took longer than {BUILD_TIMEOUT:.0f} s; run it "
                                  f"yourself: {shlex.join(build_command(env, path))}") from None
    except wheels.WheelError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise EnvironmentUnusable(
            f"{env.describe()} has no ipykernel, and kernelexec could not fetch one for it: {str(exc)[:600]}. The "
            f"environment itself is never changed; once that is fixed (a package index reachable?) run: "
            f"{shlex.join(build_command(env, path))}") from None
    if not overlay_ready(tmp):
        shutil.rmtree(tmp, ignore_errors=True)
        raise EnvironmentUnusable(f"{env.describe()}: the ipykernel overlay kernelexec built has no ipykernel/kernelapp.py; "
                                  f"run: {shlex.join(build_command(env, path))}")
    with contextlib.suppress(OSError):
        shutil.rmtree(path)  # a partial copy someone left
    os.rename(tmp, path)
    os.chmod(path, 0o755)


def _version_tuple(text: str) -> tuple[int, ...]:
    out = []
    for part in text.split("."):
        digits = "".join(ch for ch in part if ch.isdigit())
        if not digits:
            break
        out.append(int(digits))
        if not part.isdigit():
            break
    return tuple(out)


def overlay_requirements(overlay: Path) -> list[tuple[str, str, str]]:
    """(distribution, its version, one requirement string) for every distribution in the overlay."""
    from importlib import metadata

    out = []
    for dist in metadata.distributions(path=[str(overlay)]):
        for req in dist.requires or ():
            out.append((dist.metadata["Name"], dist.version, req))
    return out


def conflicts(env: Environment) -> list[str]:
    """Distributions of the environment that shadow one the overlay needs, at a version it cannot use."""
    if not env.overlay:
        return []
    from packaging.requirements import InvalidRequirement, Requirement
    from packaging.version import InvalidVersion, Version

    markers = dict(env.markers) | {"extra": ""}
    found = []
    for dist, version, text in overlay_requirements(Path(env.overlay)):
        try:
            req = Requirement(text)
        except InvalidRequirement:
            continue
        if req.marker is not None and not req.marker.evaluate(markers):
            continue
        have = env.version_of(req.name)
        if have is None or not req.specifier:
            continue
        try:
            ok = req.specifier.contains(Version(have), prereleases=True)
        except InvalidVersion:
            continue
        if not ok:
            found.append(f"{req.name} {have} (in {env.prefix}), but {dist} {version} needs {req.name}{req.specifier}")
    return sorted(set(found))


def check_compatible(env: Environment) -> None:
    """Refuse an environment whose own packages break the overlay's ipykernel, naming both."""
    problems = conflicts(env)
    if problems:
        raise EnvironmentUnusable(
            f"{env.describe()} cannot run kernelexec's ipykernel: it has " + "; ".join(problems)
            + ". Its own copy is used first and kernelexec never changes the environment: upgrade it there "
            f"({shlex.quote(env.python)} -m pip install ...), or choose another --python")


def prepare(setting: str, working_dir: Path | None, cache_dir: Path, *, build: bool = True,
            reach: KernelReach | None = None) -> Environment:
    """Resolve and settle ipykernel: what a session's kernel needs before it can start."""
    return ensure_overlay(resolve(setting, working_dir, reach), cache_dir, build=build)


def explain(setting: str, working_dir: Path | None, cache_dir: Path, reach: KernelReach | None = None) -> list[str]:
    """``kernelexec doctor``'s lines: what was chosen and why, and how ipykernel is provided."""
    lines = [f"  setting                              --python {setting or 'auto'}"]
    try:
        env = resolve(setting, working_dir, reach)
    except EnvironmentUnusable as exc:
        return [*lines, f"  REFUSED: {exc}"]
    lines += [f"  interpreter                          {env.python}",
              f"  version                              Python {env.version} ({env.tag})",
              f"  prefix                               {env.prefix}",
              f"  chosen because                       {env.reason}",
              f"  site-packages (read-only in kernels) {', '.join(env.site_packages) or 'none'}"]
    if env.has_ipykernel:
        lines.append(f"  ipykernel                            the environment's own ({env.version_of('ipykernel')})")
    else:
        path = overlay_path(env, cache_dir)
        state = "built" if overlay_ready(path) else "not built yet: built on first use (needs the package index once)"
        lines.append(f"  ipykernel                            kernelexec's overlay {path} ({state})")
    for name in ("numpy", "pandas", "matplotlib"):
        lines.append(f"  {name:<36} {env.version_of(name) or 'not installed'}")
    return lines


__all__ = ["Environment", "EnvironmentUnusable", "resolve", "prepare", "ensure_overlay", "explain"]
