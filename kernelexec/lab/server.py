"""The files and routes of ``kernelexec lab``: a read-only view of the sessions' files, and a restart
that goes through the session's kernelexec server.

* ``SessionContents`` shows the sessions' notebooks and ``work``/``outputs`` files, read-only; notebooks
  are served through ``lab_guard.sanitize_notebook``.
* ``RestartHandler`` answers ``POST /api/kernels/<id>/restart`` (``SessionKernelManager.restart_kernel``)
  with a message when no server takes it; ``GoneHandler`` closes the routes kernelexec lab does not serve.

The kernels themselves (attached, never started; the filtered websocket) are ``lab/kernels.py``'s.
"""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path
from typing import Any, cast

from jupyter_server.auth.decorator import authorized
from jupyter_server.base.handlers import APIHandler, JupyterHandler
from jupyter_server.files.handlers import FilesHandler
from jupyter_server.services.contents.largefilemanager import AsyncLargeFileManager
from jupyter_server.utils import url_path_join
from tornado import web
from traitlets import Unicode, default

from kernelexec.lab import guard as lab_guard
from kernelexec.lab.kernels import SessionKernelManager, kernelspec_metadata, live_handles, websockets_of
from kernelexec.layout import SessionDirs, valid_handle


class SessionContents(AsyncLargeFileManager):
    """The sessions' notebooks and work files, read-only; nothing of the server's internals."""

    connections_dir = Unicode("", config=True)
    VISIBLE = ("work", "outputs")

    @default("files_handler_class")
    def _files_handler(self) -> type:
        return FilesHandler  # through get(): the view and its filters apply to /files/ too

    @default("files_handler_params")
    def _files_params(self) -> dict[str, Any]:
        return {"path": self.root_dir}

    def _shown_sessions(self) -> set[str]:
        root = Path(self.root_dir)
        live = set(live_handles(self.connections_dir))
        try:
            dirs = [d for d in root.iterdir() if valid_handle(d.name) and d.is_dir() and not d.is_symlink()]
        except OSError:
            return set()
        # a pooled kernel's session (never handed out) has no journal and no published kernel
        return {d.name for d in dirs if d.name in live or SessionDirs(d).journal.exists()}

    def visible(self, path: str) -> bool:
        parts = [p for p in path.strip("/").split("/") if p]
        if not parts:
            return True
        if any(p in (".", "..") for p in parts) or parts[0] not in self._shown_sessions():
            return False
        root = Path(self.root_dir).resolve()
        session = root / parts[0]
        if len(parts) == 1:
            return True
        notebook = SessionDirs(session).notebook
        if len(parts) == 2 and parts[1] == notebook.name:
            return os.path.realpath(notebook) == str(notebook)
        if parts[1] not in self.VISIBLE:
            return False
        real = Path(os.path.realpath(session.joinpath(*parts[1:])))
        base = Path(os.path.realpath(session / parts[1]))
        return real == base or base in real.parents  # no symlink out of work/ (to kernel.json or the host)

    async def is_hidden(self, path: str) -> bool:
        return not self.visible(path) or await super().is_hidden(path)

    async def file_exists(self, path: str = "") -> bool:
        return self.visible(path) and await super().file_exists(path)

    async def dir_exists(self, path: str) -> bool:
        return self.visible(path) and await super().dir_exists(path)

    async def exists(self, path: str) -> bool:
        return self.visible(path) and await super().exists(path)

    async def get(self, path: str, content: bool = True, type: str | None = None, format: str | None = None,
                  require_hash: bool = False) -> dict[str, Any]:
        if not self.visible(path) or not os.path.lexists(self._get_os_path(path)):
            raise web.HTTPError(404, f"No such file or directory: {path}")
        if content and (type == "directory" or (type is None and os.path.isdir(self._get_os_path(path)))):
            model = await super().get(path, content=False, type="directory", require_hash=require_hash)
            model["content"], model["format"] = await self._listing(path), "json"
        else:
            model = await super().get(path, content=content, type=type, format=format, require_hash=require_hash)
        model["writable"] = False
        if model["type"] == "notebook" and model.get("content") is not None:
            from nbformat import from_dict

            model["content"] = from_dict(lab_guard.sanitize_notebook(model["content"], self._kernelspec(path)))
        elif model["type"] == "file" and path.endswith(".ipynb") and model.get("content") is not None:
            # the same notebook read as a file (/files/, "Open With → Editor", download): sanitized too
            try:
                text = model["content"] if model.get("format") == "text" else base64.b64decode(model["content"]).decode()
                clean = json.dumps(lab_guard.sanitize_notebook(json.loads(text), self._kernelspec(path)), indent=1)
            except (ValueError, TypeError, AttributeError):
                raise web.HTTPError(404, f"{path} is not a notebook kernelexec lab can show") from None
            model["content"] = clean if model.get("format") == "text" else base64.b64encode(clean.encode()).decode()
        return model

    async def _listing(self, path: str) -> list[dict[str, Any]]:
        """A directory's visible entries (Jupyter's own listing would stop at the first hidden one)."""
        try:
            names = sorted(os.listdir(self._get_os_path(path)))
        except OSError:
            return []
        entries = []
        for name in names:
            child = f"{path.strip('/')}/{name}".strip("/")
            if not self.should_list(name) or not self.visible(child):
                continue
            try:
                entries.append(dict(await super().get(child, content=False), writable=False))
            except web.HTTPError:
                continue
        return entries

    def _kernelspec(self, path: str) -> dict[str, str]:
        return kernelspec_metadata(path.strip("/").split("/", 1)[0])

    def _refuse(self, *args: Any, **kwargs: Any) -> Any:
        raise web.HTTPError(403, "read-only: kernelexec lab shows the sessions' notebooks and files; it does not change them")

    save = new = new_untitled = copy = rename = rename_file = delete = delete_file = _refuse
    create_checkpoint = restore_checkpoint = delete_checkpoint = trust_notebook = _refuse

    async def list_checkpoints(self, path: str) -> list[Any]:
        return []


class RestartHandler(APIHandler):
    """``POST /api/kernels/<id>/restart``: the session's kernel restarted through its kernelexec server
    (``SessionKernelManager.restart_kernel``); the kernel model, as Jupyter answers. When no server takes
    it: refused with a message (Jupyter's own handler turns every refusal into a bare 500), and the page
    told that the kernel is idle again, so it stays usable."""

    auth_resource = "kernels"

    @web.authenticated
    @authorized
    async def post(self, kernel_id: str) -> None:
        km = cast(SessionKernelManager, self.kernel_manager)  # lab/app.py configures ServerApp with it
        km.list_kernel_ids()
        if kernel_id not in km:
            raise web.HTTPError(404, f"Kernel does not exist: {kernel_id}")
        try:
            await km.restart_kernel(kernel_id)
        except web.HTTPError as exc:
            message = str(exc.log_message or exc.reason or "refused")
            for conn in websockets_of(kernel_id):
                try:
                    conn.write_stderr(message, {})
                    conn._send_status_message("idle")
                except Exception:  # noqa: BLE001
                    pass
            self.set_status(exc.status_code)
            self.finish(json.dumps({"message": message, "reason": "refused"}))
            return
        self.finish(json.dumps(km.kernel_model(kernel_id), default=str))


class GoneHandler(JupyterHandler):
    """Routes kernelexec lab does not serve (nbconvert renders notebooks as pages in the Lab origin)."""

    def get(self, *args: Any) -> None:
        raise web.HTTPError(404)

    post = get


def add_handlers(web_app: Any, base_url: str) -> None:
    """Ahead of Jupyter's own routes (tornado checks rules added later first)."""
    kid = r"(?P<kernel_id>\w+-\w+-\w+-\w+-\w+)"
    web_app.add_handlers(".*$", [
        (url_path_join(base_url, rf"/api/kernels/{kid}/restart"), RestartHandler),
        (url_path_join(base_url, r"/nbconvert/(.*)"), GoneHandler),
    ])


__all__ = ["GoneHandler", "RestartHandler", "SessionContents", "add_handlers"]
