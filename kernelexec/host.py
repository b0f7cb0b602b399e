"""What the server itself runs and trusts on the host, outside every sandbox.

One rule (SECURITY-NOTES §8): no kernelexec process outside the sandbox executes, imports or trusts
a file from a directory a kernel can write. This module holds both halves of it, so every caller
asks the same question the same way:

* **where kernels reach**: ``KernelReach`` (from the settings) names the directories a kernel may
  write (the work roots and every session's directory) and read; ``writes(path)`` says whether a
  path lies in them, counting the protected names bubblewrap re-binds read-only for every kernel.
  ``check_reach`` refuses, at start, a configuration that puts kernelexec's own state, cache or
  installation, or the user's home, within a kernel's reach.
* **how helpers run**: ``run_python`` starts a Python helper isolated (``-I``: neither the cwd nor
  a script's directory on ``sys.path``, no user site, no ``PYTHON*`` variables) from a fresh, empty
  directory the server made, with ``PATH`` limited to the system's directories; ``system_which``
  finds helper binaries there only.

Protected names (``PROTECTED_NAMES``): what tools outside the sandbox read from a project and
act on — git (``.git/config`` ``core.fsmonitor``, hooks), Claude Code (``.claude/`` hooks,
``.mcp.json``), editors, direnv, shells. Bubblewrap binds each one read-only over a writable work
root (sandbox.py); the missing directories among them get an empty placeholder first, so a kernel
cannot create them either.
"""

from __future__ import annotations

import contextlib
import fnmatch
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from kernelexec.errors import InvalidRequest

if TYPE_CHECKING:
    from kernelexec.config import Settings

SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

# Directories a cell must never create or change in a writable work root: each is read and acted on
# by a program outside the sandbox. Missing ones get an empty placeholder directory (git walks on up past
# an empty .git, editors ignore an empty one; black and Claude Code take any .git for a project's root).
PROTECTED_DIRS = (".git", ".claude", ".vscode", ".idea", ".direnv")
# Files of the same kind: bound read-only where they exist. Where they do not, a placeholder would be
# a file the tool then fails to parse; see docs/security.md for what still guards them.
PROTECTED_FILES = (".gitmodules", ".gitconfig", ".mcp.json", ".envrc", ".bashrc", ".bash_profile", ".bash_login",
                   ".zshrc", ".zshenv", ".zprofile", ".profile")
# The project's environment: auto-detection adopts a .venv in a work root only because of this (environments.py).
PROTECTED_ENVS = (".venv", "venv")
PROTECTED_NAMES = (*PROTECTED_DIRS, *PROTECTED_FILES, *PROTECTED_ENVS)


def _real(path: str | os.PathLike[str]) -> str:
    return os.path.realpath(os.path.expanduser(str(path)))


def inside(path: str | os.PathLike[str], roots: Sequence[str | os.PathLike[str]]) -> bool:
    """Is ``path`` (resolved) one of ``roots`` (resolved) or below one?"""
    real = _real(path)
    for root in roots:
        r = _real(root).rstrip("/") or "/"
        if real == r or real.startswith(r + "/") or r == "/":
            return True
    return False


@dataclass(frozen=True)
class KernelReach:
    """Where kernels of these settings can write and read, beyond the system's read-only files."""

    write_roots: tuple[str, ...]  # work roots and the sessions directory (every session's work/home/tmp/spill)
    read_roots: tuple[str, ...]  # plus --read-dirs
    protected_bound: bool  # bubblewrap binds the protected names read-only for every kernel
    extra_patterns: tuple[str, ...] = ()  # --protect

    @classmethod
    def of(cls, settings: Settings, *, protected_bound: bool) -> KernelReach:
        """``protected_bound``: bubblewrap is in use (sandbox.kernel_reach knows)."""
        work = tuple(_real(p) for p in settings.work_roots)
        for root in work:
            _first_seen(root)
        writes = (*work, _real(settings.sessions_dir))
        bound = protected_bound
        return cls(write_roots=writes, read_roots=(*writes, *(_real(p) for p in settings.read_dirs)),
                   protected_bound=bound, extra_patterns=tuple(settings.protect))

    def writes(self, path: str | os.PathLike[str]) -> bool:
        """Could a kernel have written ``path`` (or a directory on its way)? A protected name at the top
        of a work root is not writable when bubblewrap binds it read-only for every kernel."""
        real = _real(path)
        for root in self.write_roots:
            if not inside(real, [root]):
                continue
            rel = os.path.relpath(real, root)
            first = rel.split("/", 1)[0]
            if first in PROTECTED_ENVS or first in PROTECTED_FILES:
                # bound read-only only where it exists: one that appeared after this process first looked
                # may be a kernel's (nothing can tell who made it), and counts as writable until a restart
                if self.protected_bound and first in _first_seen(root):
                    continue
                return True
            if self.protected_bound and first != "." and (first in PROTECTED_NAMES
                                                          or any(fnmatch.fnmatch(first, p) for p in self.extra_patterns)):
                continue
            return True
        return False

    def reads(self, path: str | os.PathLike[str]) -> bool:
        return inside(path, self.read_roots)


_FIRST_SEEN: dict[str, frozenset[str]] = {}


def _first_seen(root: str) -> frozenset[str]:
    """The protected names bound only where they exist (environments, files) that a work root had when this
    process first looked (at a server's start: preflight asks first)."""
    if root not in _FIRST_SEEN:
        envs = (n for n in PROTECTED_ENVS if os.path.isfile(os.path.join(root, n, "pyvenv.cfg")))
        files = (n for n in PROTECTED_FILES if os.path.isfile(os.path.join(root, n)))
        _FIRST_SEEN[root] = frozenset((*envs, *files))
    return _FIRST_SEEN[root]


def protected_paths(root: Path, patterns: Sequence[str] = ()) -> tuple[list[Path], list[Path]]:
    """(existing protected entries, missing protected directories) at the top of a writable ``root``;
    for a ``.git`` file (a worktree), the git directory it points to is protected too when it lies
    inside ``root``."""
    existing: list[Path] = []
    missing: list[Path] = []
    for name in PROTECTED_NAMES:
        path = root / name
        if os.path.lexists(path):
            existing.append(path)
        elif name in PROTECTED_DIRS:
            missing.append(path)
    if patterns:
        with contextlib.suppress(OSError):
            for entry in os.scandir(root):
                if entry.name not in PROTECTED_NAMES and any(fnmatch.fnmatch(entry.name, p) for p in patterns):
                    existing.append(root / entry.name)
    git = root / ".git"
    if git.is_file() and not git.is_symlink():
        with contextlib.suppress(OSError, UnicodeDecodeError):
            text = git.read_text(encoding="utf-8")[:4096]
            if text.startswith("gitdir:"):
                target = Path(text.split(":", 1)[1].strip())
                target = target if target.is_absolute() else root / target
                if inside(target, [root]) and target.exists():
                    existing.append(Path(_real(target)))
    return existing, missing


def make_placeholders(missing: Sequence[Path]) -> list[Path]:
    """Create the missing protected directories (empty, for bubblewrap to bind read-only over); those
    that could not be made are returned (the caller reports them)."""
    failed = []
    for path in missing:
        try:
            os.mkdir(path, 0o755)
        except FileExistsError:
            continue
        except OSError:
            failed.append(path)
    return failed


def check_reach(settings: Settings, reach: KernelReach) -> None:
    """Refuse, at start, settings that put what the server trusts within a kernel's reach: the state
    directory (other sessions' journals, notebooks, connection keys), the cache (ipykernel overlays),
    kernelexec's own installation when nothing can re-bind it read-only, or the user's home (dotfiles,
    credentials). Raises InvalidRequest saying what to do."""
    if settings.kernel_gateway or settings.kernel_spec:
        return  # kernels run elsewhere; nothing here is within their reach
    home = _real(os.path.expanduser("~"))
    roots = [(_real(p), "--work-roots/--working-dir") for p in settings.work_roots] + [
        (_real(p), "--read-dirs") for p in settings.read_dirs]
    own = [(_real(settings.state_dir), "kernelexec's state directory (--state-dir)"),
           (_real(settings.cache_dir), "kernelexec's cache (--cache-dir)")]
    if settings.shared_dir is not None:  # every session's directory, of every replica
        own.append((_real(settings.shared_dir), "the fleet's shared directory (--shared-dir)"))
    if settings.state_key_file is not None:  # the keys that seal every replica's request state
        own.append((_real(settings.state_key_file), "the fleet's request-state keys (--state-key-file)"))
    for root, flag in roots:
        if root == "/" or inside(home, [root]):
            raise InvalidRequest(
                f"{flag} {root} is your home directory or contains it: every kernel could read and change your dotfiles "
                "and credentials. Start kernelexec in a project directory (cd your-project && kernelexec serve "
                "--working-dir .), or name one with --working-dir")
        for path, what in own:
            if inside(path, [root]) or inside(root, [path]):
                raise InvalidRequest(
                    f"{flag} {root} and {what} {path} overlap: kernels could read other sessions' secrets and forge "
                    "their records. Move one of them (e.g. --state-dir ~/.local/state/kernelexec, "
                    "--cache-dir ~/.cache/kernelexec, or a --working-dir outside them)")
    if not reach.protected_bound and settings.sandbox != "off":
        for path in {sys.prefix, *(p for p in sys.path if p.endswith(("site-packages", "dist-packages")))}:
            if reach.writes(path):
                raise InvalidRequest(
                    f"kernelexec's own installation ({path}) lies in a directory kernels may write, and without "
                    "bubblewrap nothing can keep it read-only for them: install kernelexec outside the working "
                    "directory (pipx, uv tool, or a venv elsewhere), or install bubblewrap")


# --- running helpers ---------------------------------------------------------------------------------
def helper_env(extra: dict[str, str] | None = None, *, keep_path: bool = False) -> dict[str, str]:
    """The environment of a host-side helper: no PYTHON* or KERNELEXEC_* variables, PATH the system's."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "KERNELEXEC_"))}
    if not keep_path:
        env["PATH"] = SYSTEM_PATH
    env.update(extra or {})
    return env


@contextlib.contextmanager
def empty_directory() -> Iterator[str]:
    """A fresh, empty directory of the server's own, for a helper's cwd; removed afterwards."""
    path = tempfile.mkdtemp(prefix="kernelexec-helper-")
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def python_argv(args: Sequence[str], python: str | None = None) -> list[str]:
    """``python -I args``: the one way a host-side helper interpreter is started."""
    return [python or sys.executable, "-I", *args]


def run_python(args: Sequence[str], *, python: str | None = None, timeout: float,
               env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run a Python helper isolated, from an empty directory; raises subprocess.TimeoutExpired, OSError."""
    with empty_directory() as cwd:
        return subprocess.run(python_argv(args, python), capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL, cwd=cwd, env=env if env is not None else helper_env())


def system_which(name: str) -> str | None:
    """A helper binary from the system's directories only (never a PATH entry a kernel could write)."""
    return shutil.which(name, path=SYSTEM_PATH)


__all__ = ["KernelReach", "check_reach", "run_python", "python_argv", "system_which", "PROTECTED_NAMES"]

