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
    """ipykernel flags: our startup file, and no SQLite history (the notebook is our history)."""
    return [
        f"--IPKernelApp.exec_files={json.dumps([str(startup_script())])}",
        "--HistoryManager.enabled=False",
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
        must never reach the MCP stdio stream), fd 2 to the session's log file, and the lifeline."""
        fd = lifeline()
        return {
            "extra_arguments": kernel_arguments(),
            "env": {**self.environment(), "KERNELEXEC_LIFELINE": str(fd)},
            "cwd": str(self.cwd),
            "stdin": subprocess.DEVNULL,
            "stdout": subprocess.DEVNULL,
            "stderr": log_file,
            "pass_fds": (fd,),
        }


_lifeline: tuple[int, int] | None = None


def lifeline() -> int:
    """The read end of this server process's lifeline pipe, passed to every kernel it launches; the
    write end is never written or closed, so kernels read end-of-file exactly when the server is gone
    (startup/kernel_main.py then exits). Both ends are close-on-exec here: only ``pass_fds`` hands the
    read end on, and no kernel ever holds the write end."""
    global _lifeline
    if _lifeline is None:
        _lifeline = os.pipe()
    return _lifeline[0]
