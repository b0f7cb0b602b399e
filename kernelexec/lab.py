"""``kernelexec lab``: JupyterLab (or a bare Jupyter Server) with the live session kernels attached.

A separate process from ``kernelexec serve``: it finds the kernels through the shared state dir,
where each session publishes its connection file (``connections.py``), and hands that directory to
Jupyter Server as ``external_connection_dir``. Jupyter attaches to each kernel without owning it:
code run from a notebook or console there shares the MCP session's variables. Listens on 127.0.0.1
only, behind a token. Needs ``pip install 'kernelexec[lab]'``.

What Jupyter can do to an attached kernel: run code, inspect, complete, interrupt (sent as an
``interrupt_request`` message by ``AttachedKernelManager``, since Jupyter holds no process to
signal). It cannot restart it (use ``restart_session``); shutting it down there only detaches it.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import secrets
import socket
import sys
from pathlib import Path
from typing import Any

from jupyter_server.services.kernels.kernelmanager import ServerKernelManager

from . import connections
from .config import Settings
from .terminal import safe


class AttachedKernelManager(ServerKernelManager):
    """Jupyter's kernel manager, taught what to do with a kernel it attached to but does not own."""

    async def interrupt_kernel(self) -> None:  # type: ignore[override]
        if self.owns_kernel:
            await super().interrupt_kernel()
            return
        # no process to signal from here: ask the kernel itself (ipykernel then sends itself SIGINT)
        self._connect_control_socket()
        self.session.send(self._control_socket, self.session.msg("interrupt_request", content={}))

    async def restart_kernel(self, now: bool = False, newports: bool = False, **kw: Any) -> None:  # type: ignore[override]
        if self.owns_kernel:
            await super().restart_kernel(now=now, newports=newports, **kw)
            return
        raise RuntimeError("this kernel belongs to a kernelexec session: restart it with the restart_session tool")


def _free_port(start: int = 8888, tries: int = 50) -> int:
    for port in range(start, start + tries):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _watch(app: Any, directory: Path) -> None:
    """Every second: drop entries of dead kernels, and print each session as Jupyter attaches it."""
    strikes: dict[str, int] = {}
    shown: set[str] = set()
    while True:
        connections.prune(directory, strikes)
        km = app.kernel_manager
        km.list_kernel_ids()  # makes Jupyter pick up new connection files now
        for kernel_id, path in list(km.kernel_id_to_connection_file.items()):
            if kernel_id not in shown:
                shown.add(kernel_id)
                print(safe(f"attached session {Path(path).stem.split('.')[0]} as kernel {kernel_id}"), flush=True)
        await asyncio.sleep(1.0)


def lab_command(settings: Settings, *, port: int | None, open_browser: bool) -> int:
    """Run Jupyter until interrupted. Prints the URL (with its token) first, then each attached session."""
    from jupyter_server.serverapp import ServerApp

    directory = connections.connections_dir(settings.state_dir)
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    settings.sessions_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    try:
        has_lab = importlib.util.find_spec("jupyterlab") is not None
    except (ImportError, ValueError):  # a broken or blocked install
        has_lab = False
    port = port or _free_port()
    token = os.environ.get("JUPYTER_TOKEN") or secrets.token_hex(24)
    argv = [
        "--ServerApp.ip=127.0.0.1",
        f"--ServerApp.port={port}",
        "--ServerApp.port_retries=0",
        f"--IdentityProvider.token={token}",
        f"--ServerApp.open_browser={open_browser}",
        f"--ServerApp.root_dir={settings.sessions_dir}",
        "--ServerApp.allow_external_kernels=True",
        f"--ServerApp.external_connection_dir={directory}",
        f"--AsyncMappingKernelManager.kernel_manager_class={AttachedKernelManager.__module__}.{AttachedKernelManager.__qualname__}",
    ]
    if has_lab:
        argv.append("--ServerApp.default_url=/lab")
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        argv.append("--allow-root")
    app = ServerApp.instance()
    app.initialize(argv=argv)
    what = "JupyterLab" if has_lab else "Jupyter Server (API only: pip install 'kernelexec[lab]' for JupyterLab)"
    print(safe(f"kernelexec lab: {what} at http://127.0.0.1:{port}{'/lab' if has_lab else '/api/kernels'}?token={token}"), flush=True)
    print(safe(f"kernelexec lab: session kernels from {directory}; notebooks under {settings.sessions_dir}"), flush=True)
    app.io_loop.add_callback(_watch, app, directory)
    app.start()
    return 0


__all__ = ["AttachedKernelManager", "lab_command"]

if __name__ == "__main__":  # pragma: no cover
    sys.exit("use: kernelexec lab")
