"""What a Python environment is, described without running it on the host.

``inspect(python, source, reason)`` turns an interpreter path into an ``Environment``. The environment is
described without running it on the host (SECURITY-NOTES §8): its base interpreter, a real
installation outside every kernel-writable directory, answers once, isolated (``-I -S``), for the
environment's prefix; its distributions and ``.pth`` lines are read as files. A path that does not
exist, is not Python or is older than 3.10 is refused with an ``EnvironmentUnusable`` naming it.

Which interpreter ``--python`` names is ``discovery.py``'s job; the ipykernel a kernel gets in an
environment without one is ``overlay.py``'s.
"""

from __future__ import annotations

import contextlib
import functools
import glob
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kernelexec.errors import KernelexecError
from kernelexec.host import KernelReach, run_python

MIN_VERSION = (3, 10)
INSPECT_TIMEOUT = float(os.environ.get("KERNELEXEC_INSPECT_TIMEOUT") or 30.0)  # seconds an interpreter has to describe itself

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

    def has_bytecode(self, package: str) -> bool | None:
        """Whether ``package``'s ``__init__`` has a ``.pyc`` for this interpreter (None: not found). Kernels never
        write bytecode, so a package without it is compiled from source by every kernel that imports it."""
        implementation = "pypy" if self.tag.startswith("pp") else "cpython"
        cache_tag = f"{implementation}-{self.version_info[0]}{self.version_info[1]}"
        for site in self.site_packages:
            init = Path(site, package, "__init__.py")
            if init.is_file():
                return Path(site, package, "__pycache__", f"__init__.{cache_tag}.pyc").is_file()
        return None

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


def same_file(a: str | os.PathLike[str], b: str | os.PathLike[str]) -> bool:
    """Whether two paths name one file (False when either is missing)."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


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
    """Installed distributions (normalised name → version), read from their metadata files: data only. Read
    again only when a site dir changed (an install adds or removes a ``*.dist-info`` entry, which changes its
    directory's mtime): parsing every METADATA file took 0.3–0.9 s, paid by each ``new_session``."""
    stamp = []
    for sitedir in site_dirs:
        try:
            stamp.append(os.stat(sitedir).st_mtime_ns)
        except OSError:
            stamp.append(-1)
    return dict(_read_distributions(tuple(site_dirs), tuple(stamp)))


@functools.lru_cache(maxsize=64)
def _read_distributions(site_dirs: tuple[str, ...], stamp: tuple[int, ...]) -> tuple[tuple[str, str], ...]:  # noqa: ARG001 - stamp keys the cache
    from email.parser import HeaderParser
    from importlib import metadata

    headers = HeaderParser()
    found: dict[str, str] = {}
    for dist in metadata.distributions(path=list(site_dirs)):
        try:  # the headers only, once: ``dist.metadata`` parsed the whole file (long descriptions) for each field
            fields = headers.parsestr(dist.read_text("METADATA") or dist.read_text("PKG-INFO") or "", headersonly=True)
            name, version = fields["Name"], fields["Version"]
        except Exception:  # noqa: BLE001 - a broken dist-info is not ours to judge
            continue
        if isinstance(name, str) and name and _norm(name) not in found:
            found[_norm(name)] = str(version)
    return tuple(found.items())


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
    own = same_file(python, sys.executable) or (same_file(info["prefix"], sys.prefix) and source == "own")
    return Environment(
        python=python, prefix=info["prefix"], base_prefix=info["base_prefix"], version=info["version"],
        version_info=version_info, tag=tag, machine=info["machine"], site_packages=site_packages,
        read_paths=tuple(sorted(p for p in read if os.path.exists(p))),
        sys_path=tuple(dict.fromkeys(p for p in sys_path if os.path.isabs(p) and os.path.isdir(p))), source=source,
        reason=reason, distributions=tuple(sorted(_distributions(list(site_packages)).items())),
        markers=tuple(sorted(info["markers"].items())), libc=tuple(info.get("libc") or ("", "")), own=own,
    )


__all__ = ["Environment", "EnvironmentUnusable", "inspect", "project_modules"]
