"""How a kernel process is started: its command-line flags, environment, directories and fds.

Launching and talking are separate jobs: this module decides *what* process to start
(launch hygiene, the startup script, and where the OS-level layers will plug in); driver.py
drives the running kernel through jupyter_client.
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kernelexec.layout import SLOTS, SessionDirs, startup_file
from kernelexec.sandbox.plan import SandboxPlan

STARTUP_FILE = "kernel_init.py"


def other_slot(slot: str) -> str:
    return SLOTS[(SLOTS.index(slot) + 1) % len(SLOTS)]


def startup_script() -> Path:
    """The file every kernel runs before user code (``kernelexec/startup/kernel_init.py`` in the wheel)."""
    return startup_file(STARTUP_FILE)


def kernel_arguments() -> list[str]:
    """ipykernel flags: our startup file, and history in memory only, no SQLite file (the notebook is our
    history), as nbclient and papermill run a kernel: ``%history -l`` (the last lines) sees the cells before."""
    return [
        f"--IPKernelApp.exec_files={json.dumps([str(startup_script())])}",
        "--HistoryManager.hist_file=:memory:",
        "--IPCompleter.use_jedi=False",
        "--IPKernelApp.trio_loop=False",
        # no '' (the writable working directory) on sys.path while ipykernel starts: kernel_init.py adds it after the guard
        "--InteractiveShellApp.ignore_cwd=True",
        "--Application.log_level=WARN",
    ]


@dataclass
class LaunchSpec:
    """Everything passed to ``AsyncKernelManager.start_kernel`` for one session's kernel."""

    dirs: SessionDirs
    cwd: Path
    policy: dict[str, Any]
    plan: SandboxPlan = field(default_factory=lambda: SandboxPlan(layers=["env"]))
    env_pass: list[str] = field(default_factory=list)
    secrets: dict[str, str] = field(default_factory=dict, repr=False)  # --secret: NAME → value, for the kernel alone

    def environment(self) -> dict[str, str]:
        """A scrubbed environment: only ``env_pass`` from the server, plus the session's own dirs.

        ``start_kernel(env=...)`` replaces the environment, so server secrets never reach user code.
        """
        env = {k: os.environ[k] for k in self.env_pass if k in os.environ}
        env.update(self.secrets)  # the operator's --secret values (config.parse_secret keeps them off the names below)
        env.setdefault("PATH", os.defpath)
        # a user name for getpass.getuser(), which reads these before the password database: the sandbox shows none,
        # and without them it raised KeyError ('getpwuid(): uid not found') where Jupyter answers a name
        env.setdefault("USER", "kernelexec")
        env.setdefault("LOGNAME", env["USER"])
        env.update(
            HOME=str(self.dirs.home),
            TMPDIR=str(self.dirs.tmp),
            IPYTHONDIR=str(self.dirs.ipython),
            MPLCONFIGDIR=str(self.dirs.home / ".matplotlib"),
            MPLBACKEND="module://matplotlib_inline.backend_inline",
            PYTHONDONTWRITEBYTECODE="1",
            PYTHONNOUSERSITE="1",
            PYDEVD_DISABLE_FILE_VALIDATION="1",
            MALLOC_ARENA_MAX="2",
            OPENBLAS_NUM_THREADS="1",
            OMP_NUM_THREADS="1",
            KERNELEXEC_POLICY=json.dumps(self.policy),
        )
        return env

    def start_kwargs(self, log_file: Any) -> dict[str, Any]:
        """Keyword arguments for ``start_kernel``: fds 0/1 to /dev/null (a kernel writing to fd 1
        must never reach the MCP stdio stream), fd 2 to the session's log file, and a lifeline asked for
        (``LIFELINE_WANTED``: the provisioner gives each launch a pipe of its own, ``Lifeline``)."""
        return {
            "extra_arguments": kernel_arguments(),
            "env": {**self.environment(), LIFELINE_ENV: LIFELINE_WANTED},
            "cwd": str(self.cwd),
            "stdin": subprocess.DEVNULL,
            "stdout": subprocess.DEVNULL,
            "stderr": log_file,
        }


LIFELINE_ENV = "KERNELEXEC_LIFELINE"  # the read end's number, for startup/kernel_main.py
LIFELINE_WANTED = "wanted"  # in the launch arguments: the provisioner puts a fresh pipe's read end in its place


class Lifeline:
    """One kernel process's lifeline: a pipe whose read end only that kernel holds and whose write end only
    this server process holds, never written, closed once that kernel is gone (``close``). The kernel reads
    end-of-file exactly when the server is gone, however it went (startup/kernel_main.py then exits).

    One per launch, never shared: a kernel under the server's own uid can open ``/proc/self/fd/<read end>`` for
    writing (a pipe's inode is its maker's; Landlock governs no pipe), and with one pipe for every kernel that
    made it a writer of every kernel's lifeline, keeping all of them alive past the server. Now it keeps only
    itself alive, as closing its own end always could."""

    def __init__(self) -> None:
        self.read, self.write = os.pipe()  # both close-on-exec: only pass_fds hands the read end on

    def launched(self) -> None:
        """The kernel process holds its copy of the read end: the server's goes."""
        self._close("read")

    def close(self) -> None:
        self._close("read")
        self._close("write")

    def _close(self, end: str) -> None:
        fd = getattr(self, end)
        if fd >= 0:
            setattr(self, end, -1)
            os.close(fd)
