"""Which interpreter ``--python`` names for a session, and why: no interpreter is run to choose it.

``resolve(settings.python, working_dir)`` turns the setting into an ``Environment``: a Python
executable or a venv/conda prefix given by the flag; or, with ``auto`` (the default), a
``.venv``/``venv`` in the working directory or the project root above it (marked by
``pyproject.toml``, ``setup.py`` or ``.git``), then the server's active ``VIRTUAL_ENV`` /
``CONDA_PREFIX``, else kernelexec's own interpreter. ``auto`` never adopts an environment a kernel
could have written (host.KernelReach). The chosen interpreter is then described by
``interpreter.inspect``.
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
from pathlib import Path

from kernelexec.environment.interpreter import Environment, EnvironmentUnusable, Source, inspect, same_file
from kernelexec.host import KernelReach

logger = logging.getLogger(__name__)

MAX_VERSION = (3, 14)  # newest minor version this release knows; newer ones run with a warning
PROJECT_MARKERS = ("pyproject.toml", "setup.py", ".git")
VENV_NAMES = (".venv", "venv")


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
        if same_file(prefix, own):
            return sys.executable, "own", f"auto: {variable} is kernelexec's own environment"
        _check_adoptable(prefix, python, f"{variable}={value}", reach)
        return str(python), source, f"auto: {variable}={value} of the server's environment"
    where = f" in {working_dir}" if working_dir is not None else ""
    return sys.executable, "own", f"auto: no project .venv{where}, no VIRTUAL_ENV or CONDA_PREFIX: kernelexec's own interpreter"


def resolve(setting: str, working_dir: Path | None, reach: KernelReach | None = None) -> Environment:
    """The environment ``--python`` names for a session working in ``working_dir``; raises EnvironmentUnusable."""
    python, source, reason = choose(setting, working_dir, reach)
    env = inspect(python, source, reason, reach)
    if env.version_info[:2] > MAX_VERSION:
        logger.warning("%s is Python %s, newer than this kernelexec knows (up to %d.%d)", python, env.version, *MAX_VERSION)
    return env


__all__ = ["choose", "find_project_venv", "resolve"]
