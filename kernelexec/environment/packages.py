"""Packages on demand: the server installs wheels for a session; the kernel never gets the network.

A session's overlay is ``<session>/packages`` (``SessionDirs.packages``): written only by the
server, read-only to the kernel (it lies outside the kernel's writable parts), on the kernel's
``sys.path`` after the environment's own site-packages, so the environment's packages win. The
installer runs kernelexec's own pip *outside* the sandbox, wheels only for the whole closure
(``wheels.py``: every dependency must be a wheel from the configured index or wheelhouse — a direct
URL, a directory or an sdist anywhere in it is refused before anything is fetched for it, so no
build backend or ``setup.py`` ever runs on the host — and a kernel in another interpreter gets the
wheels for that interpreter's tags and markers without that interpreter being run), into a fresh
staging directory that is then moved into the overlay; a download cache shared by all sessions makes
a second install of the same wheel fast. The kernel then allows the overlay's new top-level modules
(``_kernelexec_packages_added``) and invalidates its import caches, so no restart is needed.

What may be asked for: PEP 508 names with extras and version specifiers only — no URLs, paths,
VCS links, ``@`` direct references, markers, options or shell syntax (``parse_specs``). Cells that
install the usual way (``%pip install``, ``!pip install``, ``pip install`` alone on a line, with
``-q``/``-U``) are served by the same installer (``pip_lines``).
"""

from __future__ import annotations

import functools
import os
import re
import shlex
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio

from kernelexec import tracing
from kernelexec.config import Profile, Settings
from kernelexec.environment import wheels
from kernelexec.environment.pip_commands import Described, Source, Target
from kernelexec.errors import InvalidRequest, KernelexecError

# a name, optional extras, optional comma-separated version specifiers; nothing else
_SPEC = re.compile(
    r"^(?P<name>[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?)"
    r"(?:\[(?P<extras>[A-Za-z0-9._-]+(?:\s*,\s*[A-Za-z0-9._-]+)*)\])?"
    r"(?P<spec>\s*(?:===|==|!=|<=|>=|~=|<|>)\s*[A-Za-z0-9.*+!_-]+(?:\s*,\s*(?:===|==|!=|<=|>=|~=|<|>)\s*[A-Za-z0-9.*+!_-]+)*)?$"
)
# pip takes a requirement that looks like an archive's file name for a local file (and builds an sdist
# it finds); no package name ends like one
_FILE_LIKE = re.compile(r"\.(whl|zip|tar|tgz|tbz|txz|gz|bz2|xz|egg|exe|pyz|py|toml|cfg|txt|in|json|lock)$", re.I)
_PIP_LINE = re.compile(r"^\s*(?:%pip|!\s*pip3?|pip3?|!\s*python3?\s+-m\s+pip|%python\s+-m\s+pip)\s+install(?:\s+(?P<args>.*))?$")
_QUIET_FLAGS = {"-q", "--quiet", "-qq", "-qqq"}
_UPGRADE_FLAGS = {"-U", "--upgrade"}
MAX_SPECS = 50


class InstallError(KernelexecError):
    """An install that was refused or failed: the message says why and what is supported."""


def parse_specs(specs: list[str]) -> list[str]:
    """The specs, validated (see the module docstring); raises InvalidRequest naming the first bad one."""
    if not isinstance(specs, list) or not specs:
        raise InvalidRequest("packages must be a non-empty list of names, e.g. [\"seaborn\", \"tabulate>=0.9\"]")
    if len(specs) > MAX_SPECS:
        raise InvalidRequest(f"at most {MAX_SPECS} packages per install; got {len(specs)}")
    clean = []
    for spec in specs:
        match = _SPEC.match(spec.strip()) if isinstance(spec, str) and len(spec) <= 200 else None
        if match is None or _FILE_LIKE.search(match.group("name")):
            raise InvalidRequest(
                f"{str(spec)[:80]!r} is not a package name with optional extras and version specifiers "
                "(e.g. 'seaborn', 'pandas[excel]>=2.1', 'tabulate==0.9.0'); URLs, paths, file names, VCS links, '@' "
                "references, markers, options and shell syntax are refused")
        clean.append(spec.strip())
    return clean


@dataclass
class PipRequest:
    """What ``pip install`` lines in a cell asked for."""

    specs: list[str] = field(default_factory=list)
    quiet: bool = False
    upgrade: bool = False


def pip_lines(code: str) -> tuple[PipRequest | None, str]:
    """Find ``pip install`` lines in a cell. Returns (what they ask, the code with those lines blanked,
    so line numbers stay). Raises InvalidRequest for a pip line asking for anything unsupported."""
    if "pip" not in code:
        return None, code
    request: PipRequest | None = None
    lines = code.split("\n")
    for number, line in enumerate(lines):
        match = _PIP_LINE.match(line)
        if match is None:
            continue
        request = request or PipRequest()
        try:
            words = shlex.split(match.group("args") or "", comments=False, posix=True)
        except ValueError:
            words = ["<unparsable>"]
        for word in words:
            if word in _QUIET_FLAGS:
                request.quiet = True
            elif word in _UPGRADE_FLAGS:
                request.upgrade = True
            elif word.startswith("-") or any(c in word for c in ";|&`$<>()\\") and not _SPEC.match(word):
                raise InvalidRequest(
                    f"line {number + 1}: {line.strip()[:120]!r}: kernelexec installs packages for the kernel itself "
                    "(the kernel has no network); supported: `pip install NAME[extras]<specifiers> ...` with -q/--quiet "
                    "and -U/--upgrade. Options such as -r, -e, --index-url and URLs or shell syntax are refused")
            else:
                request.specs.append(word)
        if not words:
            raise InvalidRequest(f"line {number + 1}: `pip install` with no package names")
        lines[number] = ""
    if request is None:
        return None, code
    request.specs = parse_specs(request.specs)
    return request, "\n".join(lines)


@dataclass
class Installed:
    name: str
    version: str
    size: int  # bytes in the overlay


@dataclass
class InstallOutcome:
    installed: list[Installed]
    duration_ms: float
    index: str
    already: list[str] = field(default_factory=list)  # asked for, present in the environment already

    def summary(self) -> str:
        if not self.installed:
            return f"nothing new to install ({', '.join(self.already) or 'all present'}) ({self.duration_ms:.0f} ms)"
        items = ", ".join(f"{i.name}-{i.version} ({i.size / 1024:,.0f} KiB)" for i in self.installed)
        return f"installed {items} from {self.index} in {self.duration_ms / 1000:.1f} s"


def index_description(settings: Settings) -> str:
    if settings.index_url:
        return settings.index_url
    if settings.find_links:
        return f"the wheelhouse {settings.find_links}"
    return "pip's configured index"


def check_allowed(settings: Settings, profile: Profile, specs: list[str]) -> None:
    """Raise InstallError when the install policy refuses ``specs``."""
    policy = settings.effective_install_policy(profile)
    if policy == "off":
        raise InstallError(f"installing packages is off in the {profile!r} profile (--install-policy off); "
                           "ask the user to install it into the kernel's environment")
    if policy == "allowlist":
        allowed = {_canonical(n) for n in settings.install_allow}
        refused = [s for s in specs if _canonical(_SPEC.match(s).group("name")) not in allowed]  # type: ignore[union-attr]
        if refused:
            raise InstallError(f"not on the install allowlist (--install-allow): {', '.join(refused)}; "
                               f"allowed: {', '.join(sorted(settings.install_allow)) or 'none'}")


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def cache_dir(settings: Settings) -> Path:
    """The download cache shared by every session of this state directory."""
    return settings.state_dir / "pip-cache"


def source(settings: Settings) -> Source:
    """Where the wheels come from: ``--index-url``/``--find-links``, else pip's configuration of this machine."""
    return Source(index_url=settings.index_url, find_links=str(settings.find_links) if settings.find_links else None,
                         cache_dir=cache_dir(settings), connect_timeout=settings.install_connect_timeout)


def _failure(settings: Settings, specs: list[str], error: wheels.WheelError) -> str:
    """One clear sentence: a refusal or conflict as wheels.py says it; pip's failures from its output."""
    if error.output is None:
        return str(error)
    text = error.output.strip()
    index = index_description(settings)
    if re.search(r"Connection refused|Failed to establish a new connection|Name or service not known|timed out|"
                 r"Could not fetch URL|ConnectTimeout|Max retries exceeded|NewConnectionError", text, re.I):
        return f"the package index {index} could not be reached: {text.splitlines()[-1][:200] if text else ''}"
    if error.missing is not None:
        needed = f" (needed by: {error.needed_by})" if error.needed_by and "was asked for" not in error.needed_by else ""
        return (f"no wheel of {error.missing}{needed} for this Python and platform on {index}: kernelexec installs wheels "
                "only and never builds one, so a package published only as an sdist is refused (its setup.py would run "
                "on the host); pick a version that has a wheel")
    last = [line for line in text.splitlines() if line.strip()][-3:]
    return "pip failed: " + " | ".join(line.strip()[:200] for line in last)


async def install(settings: Settings, specs: list[str], overlay: Path, *, upgrade: bool = False,
                  environment: Described | None = None) -> InstallOutcome:
    """Install ``specs`` (validated) and their whole closure, wheels only, for ``environment``'s interpreter
    (kernelexec's own when None) into ``overlay``; raises InstallError saying why not (see wheels.py).
    ``upgrade``: what is installed replaces the overlay's copies either way (the staging starts empty)."""
    del upgrade  # kept in the signature: the tools and pip lines say it; a fresh install replaces anyway
    with tracing.span("kernelexec.install", **{"kernelexec.install.specs": ", ".join(specs)}) as span:
        try:
            return await _install(settings, specs, overlay, environment)
        except InstallError as exc:
            tracing.error(span, "install_error", str(exc)[:200])
            raise


async def _install(settings: Settings, specs: list[str], overlay: Path, environment: Described | None) -> InstallOutcome:
    started = time.monotonic()
    overlay.mkdir(parents=True, exist_ok=True)
    cache_dir(settings).mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=overlay.parent))
    try:
        job = functools.partial(wheels.install, specs, staging, Target.of(environment), source(settings),
                                timeout=settings.install_timeout, work_parent=overlay.parent)
        try:
            chosen, _ = await anyio.to_thread.run_sync(job)
        except TimeoutError:
            raise InstallError(f"installing {', '.join(specs)} took longer than {settings.install_timeout:g} s "
                               "(--install-timeout); nothing was installed") from None
        except wheels.WheelError as exc:
            raise InstallError(_failure(settings, specs, exc)) from None
        installed = [Installed(wheel.name, wheel.version, 0) for wheel in chosen]
        await anyio.to_thread.run_sync(_merge, staging, overlay)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    for item in installed:
        item.size = _dist_size(overlay, item.name)
    return InstallOutcome(installed, round((time.monotonic() - started) * 1000, 3), index_description(settings))


def _merge(staging: Path, overlay: Path) -> None:
    """Move the staged install into the overlay, replacing what it replaces (an upgrade)."""
    for entry in staging.iterdir():
        if entry.name.startswith(".") or entry.name == "bin":
            continue
        target = overlay / entry.name
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target)
        elif target.exists() or target.is_symlink():
            target.unlink()
        if entry.name.endswith(".dist-info"):  # an older version's metadata of the same project goes
            project = entry.name.split("-")[0].lower()
            for old in overlay.glob("*.dist-info"):
                if old.name.split("-")[0].lower() == project:
                    shutil.rmtree(old, ignore_errors=True)
        os.replace(entry, target)


def _dist_size(overlay: Path, name: str) -> int:
    """Bytes of a distribution's files in the overlay (from its RECORD)."""
    canonical = _canonical(name).replace("-", "_")
    for info in overlay.glob("*.dist-info"):
        if info.name.split("-")[0].lower().replace(".", "_") == canonical:
            total = 0
            try:
                for line in (info / "RECORD").read_text().splitlines():
                    path = line.split(",")[0]
                    try:
                        total += (overlay / path).stat().st_size
                    except OSError:
                        continue
            except OSError:
                return 0
            return total
    return 0


def installed_record(outcome: InstallOutcome, specs: list[str]) -> dict[str, Any]:
    """What the session record keeps of an install (so restores and replay can do it again)."""
    return {"specs": specs, "installed": [{"name": i.name, "version": i.version} for i in outcome.installed]}
