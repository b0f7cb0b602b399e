"""The ipykernel a kernel gets in an environment without one, and what a session needs before it starts.

An environment without ipykernel is never modified: ``ensure_overlay`` builds ipykernel and its
dependencies once per interpreter version into kernelexec's cache (``wheels.install``: wheels only,
with the pip configuration of this machine), and the kernel's entry point appends that directory to
``sys.path`` after the environment's own site-packages, so the project's packages win. A
distribution of the environment that ipykernel cannot live with (an old pyzmq) is refused with both
names. ``prepare`` (resolve, then settle ipykernel) and ``explain`` (``kernelexec doctor``'s lines)
combine this with ``discovery.resolve``.
"""

from __future__ import annotations

import contextlib
import glob
import logging
import os
import shlex
import shutil
import tempfile
import threading
from dataclasses import replace
from pathlib import Path

from kernelexec.environment import wheels
from kernelexec.environment.discovery import resolve
from kernelexec.environment.interpreter import Environment, EnvironmentUnusable
from kernelexec.environment.pip_commands import Source, Target
from kernelexec.host import KernelReach

logger = logging.getLogger(__name__)

IPYKERNEL_REQUIREMENT = "ipykernel>=6.29,<8"
IPYKERNEL_MIN = (6, 29)
BUILD_TIMEOUT = 600.0


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
        wheels.install([IPYKERNEL_REQUIREMENT], tmp, Target.of(env), Source(), timeout=BUILD_TIMEOUT,
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
        compiled = env.has_bytecode(name)
        note = " (no bytecode: every kernel compiles it from source on import; reinstall with pip, or uv's " \
               "--compile-bytecode)" if compiled is False else ""
        lines.append(f"  {name:<36} {env.version_of(name) or 'not installed'}{note}")
    return lines


__all__ = ["ensure_overlay", "explain", "prepare"]
