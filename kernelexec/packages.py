"""Packages on demand: the server installs wheels for a session; the kernel never gets the network.

A session's overlay is ``<session>/packages`` (``SessionDirs.packages``): written only by the
server, read-only to the kernel (it lies outside the kernel's writable parts), on the kernel's
``sys.path`` after the environment's own site-packages, so the environment's packages win. The
installer runs pip *outside* the sandbox with ``--only-binary :all:`` — a wheel is unpacked, never
built, so no ``setup.py`` of a package ever runs on the host — into a fresh staging directory that
is then moved into the overlay; a download cache shared by all sessions makes a second install of
the same wheel fast. The kernel then allows the overlay's new top-level modules
(``_kernelexec_packages_added``) and invalidates its import caches, so no restart is needed.

What may be asked for: PEP 508 names with extras and version specifiers only — no URLs, paths,
VCS links, ``@`` direct references, markers, options or shell syntax (``parse_specs``). Cells that
install the usual way (``%pip install``, ``!pip install``, ``pip install`` alone on a line, with
``-q``/``-U``) are served by the same installer (``pip_lines``).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio

from .config import Profile, Settings
from .errors import InvalidRequest, KernelexecError

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


def pip_command(settings: Settings, specs: list[str], target: Path, *, upgrade: bool, python: str | None = None) -> list[str]:
    """kernelexec's own pip; for a kernel in another interpreter, run as that interpreter (``pip --python``),
    so the wheels chosen are the ones that interpreter can import."""
    cmd = [sys.executable, "-m", "pip", *(["--python", python] if python and python != sys.executable else []),
           "install", "--target", str(target), "--only-binary", ":all:",
           "--no-input", "--disable-pip-version-check", "--no-warn-script-location", "--progress-bar", "off",
           "--no-compile", "--cache-dir", str(cache_dir(settings)), "--timeout", str(settings.install_connect_timeout),
           "--retries", "0", "--report", str(target / ".report.json")]
    if settings.index_url:
        cmd += ["--index-url", settings.index_url]
    if settings.find_links:
        cmd += ["--find-links", str(settings.find_links)]
        if not settings.index_url:
            cmd += ["--no-index"]
    if upgrade:
        cmd += ["--upgrade"]
    return [*cmd, "--", *specs]


def _pip_env() -> dict[str, str]:
    """pip's environment: the user's pip configuration stays (their index), the kernel's does not exist here."""
    keep = ("PATH", "HOME", "LANG", "LC_ALL", "SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "HTTPS_PROXY", "HTTP_PROXY",
            "NO_PROXY", "https_proxy", "http_proxy", "no_proxy", "PIP_CONFIG_FILE", "XDG_CONFIG_HOME")
    env = {k: v for k, v in os.environ.items() if k in keep or (k.startswith("PIP_") and k not in
                                                                  ("PIP_TARGET", "PIP_PREFIX", "PIP_USER", "PIP_NO_BINARY"))}
    env["PIP_ONLY_BINARY"] = ":all:"
    env["PYTHONNOUSERSITE"] = "1"
    return env


def _failure(settings: Settings, specs: list[str], output: str) -> str:
    """One clear sentence from pip's output."""
    text = output.strip()
    index = index_description(settings)
    if re.search(r"No matching distribution found|Could not find a version that satisfies", text):
        return (f"no wheel of {', '.join(specs)} for this Python and platform on {index}: kernelexec installs wheels only "
                "and never builds one, so a package published only as an sdist is refused (its setup.py would run on "
                "the host); pick a version that has a wheel")
    if re.search(r"Connection refused|Failed to establish a new connection|Name or service not known|timed out|"
                 r"Could not fetch URL|ConnectTimeout|Max retries exceeded|NewConnectionError", text, re.I):
        return f"the package index {index} could not be reached: {text.splitlines()[-1][:200] if text else ''}"
    last = [line for line in text.splitlines() if line.strip()][-3:]
    return "pip failed: " + " | ".join(line.strip()[:200] for line in last)


async def install(settings: Settings, specs: list[str], overlay: Path, *, upgrade: bool = False,
                  python: str | None = None) -> InstallOutcome:
    """Install ``specs`` (validated) into ``overlay``; raises InstallError with pip's reason."""
    started = time.monotonic()
    overlay.mkdir(parents=True, exist_ok=True)
    cache_dir(settings).mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=overlay.parent))
    empty = Path(tempfile.mkdtemp(prefix=".pip-cwd-", dir=overlay.parent))
    try:
        cmd = pip_command(settings, specs, staging, upgrade=upgrade, python=python)
        try:
            with anyio.fail_after(settings.install_timeout):
                # in an empty directory of its own: nothing a kernel wrote can be taken for a local project or archive
                done = await anyio.run_process(cmd, env=_pip_env(), check=False, stdin=None, cwd=str(empty))
        except TimeoutError:
            raise InstallError(f"installing {', '.join(specs)} took longer than {settings.install_timeout:g} s "
                               "(--install-timeout); nothing was installed") from None
        output = (done.stdout or b"").decode(errors="replace") + (done.stderr or b"").decode(errors="replace")
        if done.returncode != 0:
            raise InstallError(_failure(settings, specs, output))
        installed = _report(staging)
        await anyio.to_thread.run_sync(_merge, staging, overlay)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        shutil.rmtree(empty, ignore_errors=True)
    for item in installed:
        item.size = _dist_size(overlay, item.name)
    return InstallOutcome(installed, round((time.monotonic() - started) * 1000, 3), index_description(settings))


def _report(staging: Path) -> list[Installed]:
    try:
        report = json.loads((staging / ".report.json").read_text())
    except (OSError, ValueError):
        return []
    found = []
    for item in report.get("install", []) if isinstance(report, dict) else []:
        meta = item.get("metadata", {}) if isinstance(item, dict) else {}
        if isinstance(meta.get("name"), str):
            found.append(Installed(meta["name"], str(meta.get("version", "?")), 0))
    return found


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
