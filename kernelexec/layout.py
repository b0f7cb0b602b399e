"""The one owner of a session directory's layout: what is where under ``<state dir>/sessions/<handle>/``,
and which parts the kernel may write. Everything else (journal, notebook, session.json, connection
files, rendered outputs/) is the server's.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from kernelexec.errors import InvalidRequest

SLOTS = ("k", "s")  # a session's kernel slots: "k" first, "s" for a warm spare while "k" is live, and so on

# The only parts of a session directory its kernel may write. Everything else there (journal,
# notebook, session.json, kernel.json, rendered outputs/) is the server's, written with the server's
# privileges: a kernel able to plant a symlink there could make the server write anywhere.
# ipc/ holds the kernel's sockets: the kernel may only create sockets there (no symlinks, no
# removals), or it could point the server's reconnecting zmq client at any host socket.
# checkpoint/ holds the kernel's pickled variables (startup/checkpoint.py): data only the session's own kernels load.
KERNEL_SUBDIRS = ("work", "home", "tmp", "spill", "checkpoint")
IPC_SUBDIR = "ipc"
# IPYTHONDIR is server-made and read-only to the kernel: IPython runs profile startup files before
# our exec_files, so a writable one would let a cell disarm the next restarted kernel.
IPYTHON_SUBDIR = "ipython"


def startup_file(name: str) -> Path:
    """A file of the in-kernel code (``startup/`` in the checkout, ``kernelexec/startup`` in the wheel):
    the one way anything finds it (the launcher, the kernel argv, the inline startup for remote kernels)."""
    return Path(str(resources.files("kernelexec.startup").joinpath(name)))


def kernel_writable(session_dir: Path) -> list[Path]:
    return [session_dir / sub for sub in KERNEL_SUBDIRS]


MAX_IPC_PREFIX = 90  # unix socket paths hold 107 bytes; "-<n>" goes after a slot's prefix


def check_socket_room(session_root: Path) -> None:
    """Raise InvalidRequest when a session directory is too long for its kernel's unix socket paths."""
    prefix = session_root / IPC_SUBDIR / SLOTS[0]
    if len(str(prefix)) > MAX_IPC_PREFIX:
        raise InvalidRequest(
            f"the session directory {session_root} is too long for unix socket paths (107 bytes at most): "
            f"pass a shorter --state-dir (KERNELEXEC_STATE_DIR), e.g. ~/.kernelexec or /var/tmp/kernelexec-$USER")


_HANDLE_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_")


def valid_handle(handle: str) -> bool:
    """A session handle as the server mints them: also the name of its directory under ``sessions/``."""
    return 8 <= len(handle) <= 64 and set(handle) <= _HANDLE_CHARS


@dataclass
class SessionDirs:
    """A session's private directory tree. Everything the session owns lives under ``root``."""

    root: Path

    @property
    def work(self) -> Path:
        return self.root / "work"

    @property
    def home(self) -> Path:
        return self.root / "home"

    @property
    def tmp(self) -> Path:
        return self.root / "tmp"

    @property
    def outputs(self) -> Path:
        return self.root / "outputs"

    @property
    def spill(self) -> Path:
        """Where the kernel itself writes what its caps cut (long results, stream floods)."""
        return self.root / "spill"

    @property
    def checkpoint(self) -> Path:
        """The kernel's checkpoint (manifest.json and one pickle per variable): kernel-written, loaded only
        inside a kernel of this session or its fork; the server copies it (fork) but never reads it."""
        return self.root / "checkpoint"

    @property
    def ipc(self) -> Path:
        return self.root / IPC_SUBDIR

    @property
    def ipython(self) -> Path:
        return self.root / IPYTHON_SUBDIR

    def ipython_profile_dirs(self) -> list[Path]:
        """Made by the server so IPython needs to write nothing there (the kernel cannot)."""
        profile = self.ipython / "profile_default"
        return [profile / d for d in ("startup", "security", "log", "pid")]

    @property
    def connection_file(self) -> Path:
        return self.connection_file_for(SLOTS[0])

    @property
    def ipc_prefix(self) -> Path:
        return self.ipc_prefix_for(SLOTS[0])

    def connection_file_for(self, slot: str) -> Path:
        """A session runs at most two kernels at once (the live one and its warm spare), each in a slot."""
        return self.root / ("kernel.json" if slot == SLOTS[0] else f"kernel-{slot}.json")

    def ipc_prefix_for(self, slot: str) -> Path:
        return self.ipc / slot

    @property
    def log(self) -> Path:
        return self.root / "kernel.log"

    @property
    def notebook(self) -> Path:
        return self.root / "notebook.ipynb"

    @property
    def journal(self) -> Path:
        return self.root / "journal.jsonl"

    @property
    def packages(self) -> Path:
        """The session's package overlay: written only by the server, read-only to the kernel."""
        return self.root / "packages"

    @property
    def meta(self) -> Path:
        """``session.json``: who owns the session, its working directory, whether it was closed."""
        return self.root / "session.json"

    def create(self) -> None:
        for d in (self.root, self.outputs, self.ipc, *kernel_writable(self.root), *self.ipython_profile_dirs()):
            d.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.packages.mkdir(mode=0o755, exist_ok=True)  # readable by a kernel under its own uid, never writable
        check_socket_room(self.root)
