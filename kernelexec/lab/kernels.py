"""The kernel side of ``kernelexec lab``: session kernels attached under stable ids, never started.

* ``SessionKernelManager`` attaches every kernel published in ``<state dir>/connections/`` under the id
  ``uuid5(handle)`` (the same across ``kernelexec lab`` restarts) and the kernel name
  ``kernelexec-<handle>``; when the session's kernel is replaced (``restart_session``, a warm spare taking
  over) it tells the connected browsers (a ``restarting`` status: JupyterLab reconnects to the same id and
  says the kernel restarted). It starts, restarts and shuts down no kernel: starting is refused, a
  shutdown only detaches (the next scan attaches the kernel again).
* ``SessionSpecManager`` offers one kernelspec per live session, ``kernelexec session <handle>``; its argv
  only exits, and nothing here would run it.
* ``SessionsManager`` maps a Jupyter session (a notebook or console) to a live session kernel: a
  session's notebook to its own kernel, anything else to the kernelspec it names; never a new kernel.
* ``FilteringConnection`` is the kernel websocket with ``lab_guard.outgoing`` applied to every message.

``lab/app.py`` configures Jupyter Server with these classes; the files and extra routes are ``lab/server.py``'s.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from jupyter_client.kernelspec import KernelSpec, KernelSpecManager, NoSuchKernel
from jupyter_client.session import Session
from jupyter_server.services.kernels.connection.channels import ZMQChannelsWebsocketConnection
from jupyter_server.services.kernels.kernelmanager import AsyncMappingKernelManager, ServerKernelManager
from jupyter_server.services.sessions.sessionmanager import KernelName, SessionManager
from tornado import web
from traitlets import Unicode, default

from kernelexec.lab import guard as lab_guard
from kernelexec.layout import valid_handle
from kernelexec.session import connections

_ID_NAMESPACE = uuid.UUID("6f3c1a52-8d0e-5b7a-9c41-2e6d7f0a9b13")
SPEC_PREFIX = "kernelexec-"
_REFUSE = "import sys; sys.exit('kernelexec lab attaches to session kernels; it never starts one')"
NO_START = ("kernelexec lab does not start kernels: it attaches to the live kernels of kernelexec sessions. "
            "Pick a 'kernelexec session …' kernel (Launcher, Kernel menu, or Running panel → New Console for Kernel).")
RESTART_WAIT = 30.0  # seconds a restart from Lab waits for the kernelexec server to restart the session's kernel
RESTART_REFUSED = ("no kernelexec server restarted session {handle}'s kernel within 30 s (is `kernelexec serve` running "
                   "on this state dir?); the kernel was not restarted. Ask the agent to call restart_session "
                   "(Lab stays attached: the kernel keeps its id).")


def kernel_id_for(handle: str) -> str:
    """The Jupyter kernel id of a session's kernel: the same in every ``kernelexec lab`` run."""
    return str(uuid.uuid5(_ID_NAMESPACE, handle))


def spec_name(handle: str) -> str:
    return SPEC_PREFIX + handle


def handle_of_spec(name: str | None) -> str | None:
    if name and name.startswith(SPEC_PREFIX) and valid_handle(name[len(SPEC_PREFIX):]):
        return name[len(SPEC_PREFIX):]
    return None


def display_name(handle: str) -> str:
    return f"kernelexec session {handle}"


def kernelspec_metadata(handle: str) -> dict[str, str]:
    return {"name": spec_name(handle), "display_name": display_name(handle), "language": "python"}


def live_handles(directory: str) -> dict[str, Path]:
    """The sessions whose kernel is published in ``directory`` (``<state dir>/connections``): handle → its file."""
    return {h: p for h, p in connections.live(Path(directory)).items() if valid_handle(h)} if directory else {}


def _identity(info: dict[str, Any]) -> tuple[Any, ...]:
    return tuple(info.get(k) for k in ("transport", "ip", "key", "shell_port", "iopub_port", "stdin_port",
                                        "control_port", "hb_port", "signature_scheme"))


class AttachedKernelManager(ServerKernelManager):
    """Jupyter's kernel manager, taught what to do with a kernel it attached to but does not own."""

    async def interrupt_kernel(self) -> None:
        if self.owns_kernel:
            await super().interrupt_kernel()
            return
        # no process to signal from here: ask the kernel itself (ipykernel then sends itself SIGINT)
        self._connect_control_socket()
        self.session.send(self._control_socket, self.session.msg("interrupt_request", content={}))

    async def restart_kernel(self, now: bool = False, newports: bool = False, **kw: Any) -> None:
        if self.owns_kernel:
            await super().restart_kernel(now=now, newports=newports, **kw)
            return
        raise web.HTTPError(409, "this kernel belongs to a kernelexec session: restart it with the restart_session tool")


def websockets_of(kernel_id: str) -> list[ZMQChannelsWebsocketConnection]:
    """The browsers' open websockets on one kernel."""
    return [c for c in list(ZMQChannelsWebsocketConnection._open_sockets) if c.kernel_id == kernel_id]


class SessionKernelManager(AsyncMappingKernelManager):
    """The live session kernels, attached under stable ids; never starts, restarts or stops one."""

    default_kernel_name: str  # jupyter_client's trait, typed here (pyproject's mypy overrides read jupyter_server as untyped)
    connections_dir = Unicode("", config=True, help="kernelexec's <state dir>/connections")

    @default("allowed_message_types")
    def _default_allowed(self) -> list[str]:
        return list(lab_guard.INCOMING)

    @default("kernel_manager_class")
    def _default_km_class(self) -> str:
        return f"{AttachedKernelManager.__module__}.{AttachedKernelManager.__qualname__}"

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.handles: dict[str, str] = {}  # kernel id → session handle
        self._identities: dict[str, tuple[Any, ...]] = {}
        self._watchers: dict[str, Any] = {}
        self.events: list[tuple[str, str, str]] = []  # (event, handle, kernel id) for the console log
        self._syncing = False

    # -- attaching -------------------------------------------------------------------------------
    def __bool__(self) -> bool:  # traitlets asks ``if self.parent``: that must not scan (len() would)
        return True

    def list_kernel_ids(self) -> list[str]:
        if not self._syncing:
            self._syncing = True
            try:
                self.sync()
            finally:
                self._syncing = False
        return list(self._kernels.keys())

    def sync(self) -> None:
        live = live_handles(self.connections_dir)
        wanted = {kernel_id_for(h): (h, p) for h, p in live.items()}
        for kernel_id in [k for k in self.handles if k not in wanted]:
            self._detach(kernel_id)
        for kernel_id, (handle, entry) in wanted.items():
            try:
                info = json.loads(entry.read_text())
            except (OSError, ValueError):
                continue
            if not isinstance(info, dict) or "key" not in info:
                continue
            identity = _identity(info)
            if kernel_id not in self._kernels:
                self._attach(kernel_id, handle, info, identity)
                self.events.append(("attached", handle, kernel_id))
            elif self._identities.get(kernel_id) != identity:  # a new kernel for the session (a warm spare took over)
                self._detach(kernel_id, keep_handle=True)
                self._attach(kernel_id, handle, info, identity)
                self.events.append(("replaced", handle, kernel_id))
                self.tell_restarted(kernel_id)
        if self.default_kernel_name not in [spec_name(h) for h in live]:
            self.default_kernel_name = spec_name(next(iter(live))) if live else "kernelexec"

    def _attach(self, kernel_id: str, handle: str, info: dict[str, Any], identity: tuple[Any, ...]) -> None:
        from jupyter_server._tz import utcnow

        km = self.kernel_manager_factory(parent=self, log=self.log, owns_kernel=False)
        km.load_connection_info(info)
        km.kernel_id = kernel_id
        km.kernel_name = spec_name(handle)
        km.last_activity = utcnow()
        km.execution_state = "idle"
        km.ready.set_result(None)
        self._kernels[kernel_id] = km
        self._kernel_connections.setdefault(kernel_id, 0)
        self._kernel_ports[kernel_id] = km.ports
        self.handles[kernel_id] = handle
        self._identities[kernel_id] = identity
        self._watch(kernel_id, km)

    def _detach(self, kernel_id: str, keep_handle: bool = False) -> None:
        watcher = self._watchers.pop(kernel_id, None)
        if watcher is not None and not watcher.closed():
            watcher.close()
        km = self._kernels.pop(kernel_id, None)
        if km is not None:
            try:
                km._close_control_socket()
            except Exception:  # noqa: BLE001 - best effort; never touch the kernel's own files
                pass
        self._identities.pop(kernel_id, None)
        self._kernel_ports.pop(kernel_id, None)
        if not keep_handle:
            handle = self.handles.pop(kernel_id, None)
            self._kernel_connections.pop(kernel_id, None)
            if handle is not None:
                self.events.append(("detached", handle, kernel_id))
            for conn in websockets_of(kernel_id):
                conn.websocket_handler.close()

    def _watch(self, kernel_id: str, km: Any) -> None:
        """Follow the kernel's iopub: its execution state, and its Jupyter session id, which is new in
        every kernel process, so a change means the session's kernel was restarted under the same
        connection file (a plain ``restart_session``)."""
        session = Session(key=km.session.key, signature_scheme=km.session.signature_scheme)
        stream = km.connect_iopub()
        seen: dict[str, str] = {}

        def on_message(msg_list: list[bytes]) -> None:
            from jupyter_server._tz import utcnow

            try:
                _, fed = session.feed_identities(msg_list)
                msg = session.deserialize(fed, content=False)  # a flood costs a header parse each
                header = msg["header"]
                kernel_session = str(header.get("session"))
                content = json.loads(msg["content"]) if header.get("msg_type") == "status" else None
            except Exception:  # noqa: BLE001 - a hostile kernel's garbage
                return
            km.last_activity = utcnow()
            if isinstance(content, dict):
                state = content.get("execution_state")
                if state in ("busy", "idle", "starting"):
                    km.execution_state = "idle" if state == "starting" else state
            previous = seen.get("session")
            seen["session"] = kernel_session
            if previous is not None and previous != kernel_session:
                self.events.append(("restarted", self.handles.get(kernel_id, "?"), kernel_id))
                self.tell_restarted(kernel_id)

        stream.on_recv(on_message)
        self._watchers[kernel_id] = stream

    def tell_restarted(self, kernel_id: str) -> None:
        """Tell every browser on this kernel that it restarted: JupyterLab then reconnects (to the
        same id, now the session's new kernel) and says so."""
        for conn in websockets_of(kernel_id):
            try:
                conn._send_status_message("restarting")
            except Exception:  # noqa: BLE001 - a closing websocket
                pass

    # -- what Jupyter may not do to a session kernel -----------------------------------------------
    async def start_kernel(self, *, kernel_name: str | None = None, **kwargs: Any) -> str:
        raise web.HTTPError(403, NO_START)

    async def restart_kernel(self, kernel_id: str, now: bool = False) -> None:
        """Restart through the session: ask the kernelexec server holding it (a request file it picks up
        within a second) and wait until the session's new kernel is here under the same id. No server
        taking it within ``RESTART_WAIT``: refused with a message (Lab stays on the old kernel)."""
        self._check_kernel_id(kernel_id)
        handle = self.handles.get(kernel_id, "?")
        directory = Path(self.connections_dir)
        connections.take_restart_done(directory, handle)  # an answer to an older request, never collected
        connections.request_restart(directory, handle)
        deadline = time.monotonic() + RESTART_WAIT
        while time.monotonic() < deadline:
            await asyncio.sleep(0.25)
            outcome = connections.take_restart_done(directory, handle)
            if outcome is None:
                continue
            if outcome != "ok":
                raise web.HTTPError(409, f"session {handle}: {outcome}")
            self.sync()  # a warm spare took over: its connection info
            self.tell_restarted(kernel_id)  # in place: same connection info, a new kernel behind it
            return
        connections.cancel_restart_request(directory, handle)
        raise web.HTTPError(409, RESTART_REFUSED.format(handle=handle))

    async def shutdown_kernel(self, kernel_id: str, now: bool = False, restart: bool = False) -> None:
        """Detach only: the kernel is the session's, and the next scan attaches it again."""
        self._check_kernel_id(kernel_id)
        self._detach(kernel_id)

    async def _async_shutdown_kernel(self, kernel_id: str, now: bool | None = False, restart: bool | None = False) -> None:
        if kernel_id in self._kernels:
            self._detach(kernel_id)

    def start_buffering(self, kernel_id: str, session_key: str, channels: dict[str, Any]) -> None:
        """No replay buffer: its zmq streams could outlive the kernel they were connected to (a warm spare
        taking over keeps the socket names), so a reconnecting browser always gets fresh ones."""
        for stream in channels.values():
            if stream is not None and not stream.closed():
                stream.close()


class SessionSpecManager(KernelSpecManager):
    """One kernelspec per live session kernel, ``kernelexec session <handle>``; nothing else."""

    connections_dir = Unicode("", config=True)
    resource_dir = Unicode("", config=True, help="an empty directory: no logo, no kernel.js")

    def find_kernel_specs(self) -> dict[str, str]:
        return {spec_name(h): self.resource_dir for h in live_handles(self.connections_dir)}

    def get_kernel_spec(self, kernel_name: str) -> KernelSpec:
        handle = handle_of_spec(kernel_name)
        if handle is None or handle not in live_handles(self.connections_dir):
            raise NoSuchKernel(kernel_name)
        return KernelSpec(
            argv=[sys.executable, "-I", "-c", _REFUSE, "{connection_file}"],
            display_name=display_name(handle), language="python", resource_dir=self.resource_dir,
            metadata={"kernelexec": {"session": handle, "attach_only": True}},
        )

    def get_all_specs(self) -> dict[str, dict[str, Any]]:
        return {name: {"resource_dir": self.resource_dir, "spec": self.get_kernel_spec(name).to_dict()}
                for name in self.find_kernel_specs()}


class Refused(Exception):
    """Raised through Jupyter's sessions handler, which answers any error with a 500 carrying str(error)
    (JupyterLab shows it in its "Error Starting Kernel" dialog)."""


class SessionsManager(SessionManager):
    """Jupyter sessions (open notebooks and consoles) on session kernels only."""

    def kernel_for(self, path: str | None, type: str | None, kernel_name: str | None, kernel_id: str | None) -> str:
        km = self.kernel_manager
        km.list_kernel_ids()
        if kernel_id and kernel_id in km:
            return kernel_id
        handle = None
        if type == "notebook" and path:  # a session's notebook (or one in its work files): that session's kernel
            first = path.strip("/").split("/", 1)[0]
            if valid_handle(first) and (Path(self.contents_manager.root_dir) / first).is_dir():
                handle = first
        if handle is None:
            handle = handle_of_spec(kernel_name)
        if handle is None and kernel_id:
            handle = next((h.name for h in Path(self.contents_manager.root_dir).iterdir()
                           if valid_handle(h.name) and kernel_id_for(h.name) == kernel_id), None)
        if handle is None:
            raise Refused(NO_START)
        if kernel_id_for(handle) not in km:
            raise Refused(f"kernelexec session {handle} has no live kernel, so there is nothing to attach to "
                                     "(kernelexec lab never starts one). Its next call over MCP revives it; then reopen.")
        return kernel_id_for(handle)

    async def create_session(self, path: str | None = None, name: Any = None, type: str | None = None,
                             kernel_name: KernelName | None = None, kernel_id: str | None = None) -> dict[str, Any]:
        kernel_id = self.kernel_for(path, type, kernel_name, kernel_id)
        return await super().create_session(path=path, name=name, type=type, kernel_name=kernel_name, kernel_id=kernel_id)

    async def start_kernel_for_session(self, session_id: str, path: str | None, name: Any, type: str | None,
                                       kernel_name: str | None, kernel_id: str | None = None) -> str:
        return self.kernel_for(path, type, kernel_name, kernel_id)


class FilteringConnection(ZMQChannelsWebsocketConnection):
    """The kernel websocket, with every kernel message passed through ``lab_guard.outgoing``."""

    def connect(self) -> Any:
        """Also tell the page the kernel's state once connected: after a reconnect (the session's kernel
        was restarted) JupyterLab would show "Unknown" until the next cell."""
        connected = super().connect()

        def tell(_: Any, tries: int = 0) -> None:
            state = getattr(self.kernel_manager, "execution_state", None)
            if state in ("idle", "busy") and self.channels:
                try:
                    self._send_status_message(state)
                except Exception:  # noqa: BLE001 - closed meanwhile
                    return
                # Busy when the page connects: the idle that ends it may come before this connection's
                # own iopub socket is subscribed, and the page would show Busy until the next cell. The
                # watcher's socket, connected long before, sees it: tell the page again until then.
                if state == "busy" and tries < 30:
                    from tornado.ioloop import IOLoop

                    IOLoop.current().call_later(1.0, tell, None, tries + 1)

        if connected is not None:
            connected.add_done_callback(tell)
        return connected

    def handle_outgoing_message(self, stream: Any, outgoing_msg: list[Any]) -> None:
        if isinstance(stream, str):
            stream = self.channels[stream]
        channel = getattr(stream, "channel", None)
        try:
            _, fed = self.session.feed_identities(outgoing_msg)
            msg = self.session.deserialize(fed)  # checks the signature
        except Exception:  # noqa: BLE001
            self.log.warning("kernelexec lab: dropped a malformed message from kernel %s", self.kernel_id)
            return
        safe = lab_guard.outgoing(channel, msg)
        if safe is None:
            return
        parts = [self.session.pack(safe[k]) for k in ("header", "parent_header", "metadata", "content")]
        self._on_error(channel, safe, parts)
        if self._limit_rate(channel, safe, parts):
            return
        if self.subprotocol == "v1.kernel.websocket.jupyter.org":
            parts[3] = self.session.pack(safe["content"])
            self._on_zmq_reply(stream, parts)
        else:
            self._on_zmq_reply(stream, safe)


__all__ = ["AttachedKernelManager", "FilteringConnection", "SessionKernelManager", "SessionSpecManager", "SessionsManager",
           "display_name", "kernel_id_for", "spec_name"]
