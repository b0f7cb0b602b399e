"""``kernelexec lab``: JupyterLab (or a bare Jupyter Server) with the live session kernels attached.

A separate process from ``kernelexec serve``: it finds the kernels through the shared state dir,
where each session publishes its connection file (``connections.py``). Jupyter attaches to each kernel
without owning it, under an id derived from the session handle (``lab/kernels.kernel_id_for``), so code
run from a notebook or console there shares the MCP session's variables and a restored Lab tab finds
its kernel again. Listens on 127.0.0.1 only, behind a token. Needs ``pip install 'kernelexec[lab]'``.

The page is built so that a session's kernel can never run script in the Lab origin (``lab_guard``):
kernel messages are filtered at the websocket (plain renderings only, no comms), notebooks are served
sanitized and read-only, there are no terminals, no other server extensions, no nbconvert pages, and
no kernel is ever started here (no kernelspec this server offers starts one). What Jupyter can do to an
attached kernel: run code, inspect, complete, interrupt (sent as an ``interrupt_request`` message).
Restarting goes through the session (its server restarts it and says so); shutting it down only detaches it.
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

from kernelexec.config import Settings
from kernelexec.lab.kernels import (
    AttachedKernelManager,
    FilteringConnection,
    SessionKernelManager,
    SessionsManager,
    SessionSpecManager,
)
from kernelexec.lab.server import SessionContents, add_handlers
from kernelexec.session import connections
from kernelexec.terminal import safe

# Lab plugins that render or run active content, or reach the host; the server side already withholds
# what they would show, so this is a second layer (and a quieter page).
DISABLED_PLUGINS = [
    "@jupyterlab/javascript-extension", "@jupyterlab/htmlviewer-extension", "@jupyterlab/markdownviewer-extension",
    "@jupyterlab/pdf-extension", "@jupyterlab/vega5-extension", "@jupyterlab/mermaid-extension",
    "@jupyterlab/terminal-extension", "@jupyterlab/debugger-extension", "@jupyterlab/extensionmanager-extension",
    "@jupyterlab/lsp-extension", "@jupyter-widgets/jupyterlab-manager",
]


def _qual(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


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
    """Every second: drop entries of dead kernels, attach new ones, and print what changed."""
    strikes: dict[str, int] = {}
    km = app.kernel_manager
    while True:
        connections.prune(directory, strikes)
        km.list_kernel_ids()
        events, km.events[:] = list(km.events), []
        for event, handle, kernel_id in events:
            if event == "attached":
                print(safe(f"attached session {handle} as kernel {kernel_id}"), flush=True)
            elif event in ("replaced", "restarted"):
                print(safe(f"session {handle} has a new kernel (restart_session); still kernel {kernel_id}"), flush=True)
            else:
                print(safe(f"detached session {handle} (kernel {kernel_id})"), flush=True)
        await asyncio.sleep(1.0)


class _LabServerApp:  # built lazily: importing jupyter_server's ServerApp is slow
    @staticmethod
    def make() -> Any:
        from jupyter_server.serverapp import ServerApp

        class KernelexecServerApp(ServerApp):
            def find_server_extensions(self) -> None:
                """JupyterLab only: no terminals, language servers or other extensions found in config dirs."""
                found = {}
                try:
                    from jupyter_server.extension.config import ExtensionConfigManager

                    found = ExtensionConfigManager(read_config_path=self.config_file_paths).get_jpserver_extensions()
                except Exception:  # noqa: BLE001
                    pass
                wanted = {name: False for name in found}
                if importlib.util.find_spec("jupyterlab") is not None:
                    wanted["jupyterlab"] = True
                self.config.ServerApp.jpserver_extensions = wanted
                self.jpserver_extensions = wanted

        return KernelexecServerApp.instance()


def _content_security_policy(app: Any, port: int) -> str:
    """Scripts only from Lab's own bundles (and the one inline script of its page, by hash): a second
    layer under the websocket filter, so that even HTML that slipped through could run no script."""
    import base64
    import hashlib
    import re

    sources = [f"http://{host}:{port}{path}" for host in ("127.0.0.1", "localhost")
               for path in (f"{app.base_url}static/", f"{app.base_url}lab/extensions/")]
    try:
        from jupyterlab.labapp import LabApp

        page = (Path(LabApp().app_dir) / "static" / "index.html").read_text()
        for body in re.findall(r"<script>(.*?)</script>", page, flags=re.S):
            sources.append("'sha256-" + base64.b64encode(hashlib.sha256(body.encode()).digest()).decode() + "'")
    except Exception:  # noqa: BLE001 - without the hash the token just stays in the address bar
        pass
    return "; ".join([
        # Lab's own bundles need eval; inline script and event handlers stay blocked
        "default-src 'self'", "script-src " + " ".join(sources) + " 'unsafe-eval'", "style-src 'self' 'unsafe-inline'",
        "img-src 'self' data: blob:", "font-src 'self' data:", "connect-src 'self'", "worker-src 'self' blob:",
        "frame-src 'self' blob:", "object-src 'none'", "base-uri 'self'", "form-action 'self'", "frame-ancestors 'self'",
    ])


def _page_config_hook(handler: Any, page_config: dict[str, Any]) -> dict[str, Any]:
    disabled = page_config.get("disabledExtensions")
    if isinstance(disabled, dict):
        disabled.update({name: True for name in DISABLED_PLUGINS})
    else:
        page_config["disabledExtensions"] = sorted(set(disabled or []) | set(DISABLED_PLUGINS))
    page_config["terminalsAvailable"] = False
    return page_config


def lab_command(settings: Settings, *, port: int | None, open_browser: bool) -> int:
    """Run Jupyter until interrupted. Prints the URL (with its token) first, then each attached session."""
    directory = connections.connections_dir(settings.state_dir)
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    settings.sessions_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    lab_dir = settings.state_dir / "lab"  # Lab's own workspaces and settings, not ~/.jupyter/lab
    for d in (lab_dir, lab_dir / "workspaces", lab_dir / "user-settings", lab_dir / "kernelspec"):
        d.mkdir(mode=0o700, parents=True, exist_ok=True)
    notify = lab_dir / "user-settings" / "@jupyterlab" / "apputils-extension" / "notification.jupyterlab-settings"
    if not notify.exists():  # no prompt to fetch Jupyter news from the internet (the user can still turn it on)
        notify.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        notify.write_text('{"fetchNews": "false", "checkForUpdates": false}\n')
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
        "--ServerApp.terminals_enabled=False",
        "--ServerApp.allow_external_kernels=False",  # SessionKernelManager attaches them itself, under stable ids
        f"--ServerApp.kernel_manager_class={_qual(SessionKernelManager)}",
        f"--ServerApp.kernel_spec_manager_class={_qual(SessionSpecManager)}",
        f"--ServerApp.session_manager_class={_qual(SessionsManager)}",
        f"--ServerApp.contents_manager_class={_qual(SessionContents)}",
        f"--ServerApp.kernel_websocket_connection_class={_qual(FilteringConnection)}",
        f"--SessionKernelManager.connections_dir={directory}",
        f"--SessionSpecManager.connections_dir={directory}",
        f"--SessionSpecManager.resource_dir={lab_dir / 'kernelspec'}",
        f"--SessionContents.connections_dir={directory}",
        "--SessionContents.allow_hidden=False",
        "--NotebookNotary.db_file=:memory:",  # nothing on disk is trusted; served notebooks are sanitized anyway
        f"--NotebookNotary.secret={secrets.token_hex(32)}",
    ]
    if has_lab:
        argv += [
            "--ServerApp.default_url=/lab",
            f"--LabApp.workspaces_dir={lab_dir / 'workspaces'}",
            f"--LabApp.user_settings_dir={lab_dir / 'user-settings'}",
            "--LabApp.extension_manager=readonly",
            "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
        ]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        argv.append("--allow-root")
    app = _LabServerApp.make()
    app.initialize(argv=argv)
    app.web_app.settings["page_config_hook"] = _page_config_hook
    app.web_app.settings.setdefault("headers", {})["Content-Security-Policy"] = _content_security_policy(app, port)
    add_handlers(app.web_app, app.base_url)
    what = "JupyterLab" if has_lab else "Jupyter Server (API only: pip install 'kernelexec[lab]' for JupyterLab)"
    print(safe(f"kernelexec lab: {what} at http://127.0.0.1:{port}{'/lab' if has_lab else '/api/kernels'}?token={token}"), flush=True)
    print(safe(f"kernelexec lab: session kernels from {directory}; notebooks under {settings.sessions_dir}"), flush=True)
    app.io_loop.add_callback(_watch, app, directory)
    app.start()
    return 0


__all__ = ["AttachedKernelManager", "lab_command"]

if __name__ == "__main__":  # pragma: no cover
    sys.exit("use: kernelexec lab")
