"""Kernels on a Jupyter Kernel Gateway, Enterprise Gateway or Jupyter Server, over REST + WebSocket.

``--kernel-gateway URL [--kernel-gateway-token T]`` makes every session's kernel a kernel of that
server: started with ``POST /api/kernels``, interrupted, restarted and deleted over REST, and driven
over its ``/api/kernels/<id>/channels`` WebSocket. ``GatewayKernel`` plugs into ``Kernel``'s seams;
the request/reply logic (timeouts, interrupt-then-restart, result report) is the local one unchanged.

Built on jupyter_server's gateway classes (``GatewayKernelManager``, ``GatewayKernelClient``,
``GatewayClient``), with what a long-lived, multi-session MCP server needs on top:

* **no singleton.** jupyter_server reads its gateway settings from ``GatewayClient.instance()``;
  here every request and WebSocket uses a ``GatewayClient`` built for this URL and token, so two
  servers in one process do not fight over the singleton (and ``JUPYTER_GATEWAY_*`` variables still
  supply the other options: headers, TLS client certificates, ``validate_cert``, timeouts).
* **the token on the WebSocket too** (jupyter_server's client sends it only on REST calls).
* **waiting without spinning**: jupyter_server's channel queues poll with ``sleep(0)``; these wake
  on arrival, and offer ``msg_ready()`` like jupyter_client's channels.
* **deaths seen**: a kernel that dies is restarted by the gateway itself, without our startup code.
  The ``restarting``/``dead`` status the server then sends on IOPub, a closed WebSocket, or a 404
  for the kernel make ``is_alive()`` false, so ``Kernel`` reports the death and restarts it properly
  (a 404 on restart: ``Kernel`` falls back to a new kernel). DELETE and restart are tried again while
  the gateway answers 500 (it does while restarting a dead kernel); a refused interrupt is logged and
  ``Kernel``'s restart after the grace takes over.

The remote machine does not have kernelexec's files, so ``install_startup`` sends them: one silent
execute carrying the policy and the source of ``startup/guard.py``, ``startup/runtime.py`` and
``startup/kernel_init.py``, which the remote kernel writes to ``<its temp dir>/kernelexec-<handle>.startup/``
and runs exactly as a local kernel runs them through ``exec_files`` (same builtins, same guard, same
fail-closed ``os._exit``). Paths in the policy are the remote kernel's: its session directory is
``<its temp dir>/kernelexec-<handle>``, and files the kernel itself spills live there.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import queue
import threading
import time
import weakref
from functools import partial
from typing import Any, cast
from urllib.parse import quote

import anyio
from jupyter_client.asynchronous.client import AsyncKernelClient

try:
    from jupyter_server.gateway.gateway_client import GatewayClient, RetryableHTTPClient
    from jupyter_server.gateway.managers import ChannelQueue, GatewayKernelClient, GatewayKernelManager
    from jupyter_server.utils import url_path_join
except ImportError as exc:  # pragma: no cover - depends on the install
    raise ImportError(f"--kernel-gateway needs jupyter_server (pip install 'kernelexec[gateway]'): {exc}") from exc
from tornado.escape import json_decode
from tornado.httpclient import HTTPClientError
from traitlets import Any as AnyTrait
from traitlets import DottedObjectName, Type

from . import wire
from .config import Settings
from .errors import KernelStartError
from .kernel import Kernel
from .launch import LaunchSpec
from .remote_startup import install_remote_startup, remote_policy, remote_spill_ok, startup_code  # noqa: F401 (re-exported)
from .sandbox import SandboxPlan

logger = logging.getLogger(__name__)

DEFAULT_KERNEL_NAME = "python3"
_ALIVE_EVERY = 1.0  # seconds between REST checks of the kernel's model (the WebSocket reports faster)

# --- the gateway's settings, per URL and token (never the process-wide singleton) ------------------
_clients: dict[tuple[str, str], GatewayClient] = {}
_clients_lock = threading.Lock()


def gateway_client(url: str, token: str | None) -> GatewayClient:
    """The ``GatewayClient`` (settings, auth header, cookies) for one gateway. One per URL and token,
    shared by that gateway's kernels; ``GatewayClient.instance()`` is left alone."""
    key = (url.rstrip("/"), token or "")
    with _clients_lock:
        client = _clients.get(key)
        if client is None:
            ws_url = os.environ.get(GatewayClient.ws_url_env) or "ws" + key[0][4:]  # http(s)://… → ws(s)://…
            client = GatewayClient(url=key[0], ws_url=ws_url, auth_token=key[1])
            _clients[key] = client
        return client


class GatewayError(RuntimeError):
    """The gateway refused or failed a request (the message says which and what to check)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


def _hint(status: int | None) -> str:
    if status in (401, 403):
        return " (check --kernel-gateway-token)"
    if status == 404:
        return " (no such kernel or kernel name; check --kernel-gateway and the gateway's kernelspecs)"
    if status in (None, 599):
        return " (is the gateway running and reachable?)"
    return ""


async def gateway_request(gateway: GatewayClient, url: str, method: str, body: Any = None) -> Any:
    """One REST call with ``gateway``'s headers, TLS options and timeouts; returns the decoded JSON
    body (None for an empty one). Raises ``GatewayError``."""
    headers = {"Content-Type": "application/json"} if body is not None else {}
    kwargs = gateway.load_connection_args(method=method, headers=headers)
    if body is not None:
        kwargs["body"] = json.dumps(body)
    try:
        response = await RetryableHTTPClient().fetch(url, **kwargs)
    except HTTPClientError as exc:
        reason = exc.message
        if exc.response is not None and exc.response.body:
            with contextlib.suppress(ValueError, UnicodeDecodeError):
                payload = json.loads(exc.response.body)
                reason = payload.get("message") or payload.get("reason") or reason
        raise GatewayError(f"gateway {method} {url} failed: {exc.code} {reason}{_hint(exc.code)}", exc.code) from exc
    except OSError as exc:
        raise GatewayError(f"gateway {method} {url} failed: {exc}{_hint(None)}") from exc
    if gateway.accept_cookies:
        gateway.update_cookies(response.headers)
    return json_decode(response.body) if response.body else None


# --- channels --------------------------------------------------------------------------------------
class _Channel(ChannelQueue):
    """One channel's queue, fed by the WebSocket reader thread; async waits wake on arrival."""

    def __init__(self, name: str, socket: Any, log: logging.Logger, loop: asyncio.AbstractEventLoop,
                 on_lost: Any) -> None:
        super().__init__(name, socket, log)
        self._loop = loop
        self._arrived = asyncio.Event()
        self._on_lost = on_lost

    def _put(self, item: Any) -> None:  # runs in the reader thread, under the queue's mutex
        super()._put(item)
        self.wake()

    def wake(self) -> None:
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody is waiting any more
            self._loop.call_soon_threadsafe(self._arrived.set)

    async def _async_get(self, timeout: float | None = None) -> Any:
        deadline = time.monotonic() + (float("inf") if timeout is None else max(timeout, 0))
        while True:
            self._arrived.clear()
            try:
                return self.get(block=False)
            except queue.Empty:
                pass
            remaining = deadline - time.monotonic()
            if remaining <= 0 or self.response_router_finished and remaining == float("inf"):
                raise queue.Empty
            # a closed WebSocket delivers nothing more: wait out the timeout like an idle channel,
            # and let the manager's is_alive() report the loss (so Kernel restarts it)
            with anyio.move_on_after(min(remaining, 3600)):
                await self._arrived.wait()

    async def get_msg(self, block: bool = True, timeout: float | None = None) -> dict[str, Any]:
        msg = await self._async_get(timeout=timeout if block else 0)
        self.task_done()
        return msg

    async def msg_ready(self) -> bool:
        return not self.empty()

    def send(self, msg: dict[str, Any]) -> None:
        """Name the channel in the message (the server otherwise assumes shell), then send it. On a
        closed WebSocket the message is dropped and the connection marked lost: the caller's wait
        then ends through is_alive(), like a kernel that died, instead of an exception mid-request."""
        import websocket

        try:
            super().send({**msg, "channel": self.channel_name})
        except (websocket.WebSocketException, OSError) as exc:
            self.log.warning("gateway WebSocket send failed on %s: %r", self.channel_name, exc)
            self._on_lost()


class GatewayChannelsClient(GatewayKernelClient):
    """jupyter_server's ``GatewayKernelClient``, for one gateway and a long-lived server.

    ``start_channels()`` is synchronous like jupyter_client's (``Kernel`` calls it so); the
    WebSocket opens in ``wait_for_ready()``, off the event loop, and opens again there if it was lost.
    """

    # jupyter_server's attributes, typed here (pyproject's mypy overrides read the extras as untyped)
    channel_socket: Any  # a websocket.WebSocket, or None
    response_router: threading.Thread | None

    def __init__(self, kernel_id: str, **kwargs: Any) -> None:
        super().__init__(kernel_id, **kwargs)
        self.on_status: Any = None  # callable(state) for restarting/dead statuses the server sends
        self.lost = False  # the WebSocket closed while we did not ask for it

    @property
    def gateway(self) -> GatewayClient:
        return cast("GatewayManager", self.parent).gateway  # GatewayManager.client made this client

    # jupyter_server declares it async; ours is synchronous on purpose (see the class docstring)
    def start_channels(self, shell: bool = True, iopub: bool = True, stdin: bool = True, hb: bool = True,
                       control: bool = True) -> None:
        self._channels_stopped = False

    async def connect(self) -> None:
        """Open the WebSocket (again, if it was lost) and start the reader thread."""
        if self.channel_socket is not None and not self.lost:
            return
        self._close_socket()
        gateway = self.gateway
        assert gateway.ws_url is not None  # gateway_client sets it
        url = url_path_join(gateway.ws_url, gateway.kernels_endpoint, quote(self.kernel_id, safe=""), "channels")
        url += f"?session_id={quote(self.session.session)}"
        args = gateway.load_connection_args()
        header = [f"{k}: {v}" for k, v in (args.get("headers") or {}).items()]
        sslopt: dict[str, Any] = {k: v for k, v in {"ca_certs": gateway.ca_certs, "certfile": gateway.client_cert,
                                     "keyfile": gateway.client_key}.items() if v}
        if not gateway.validate_cert:
            import ssl

            sslopt.update(cert_reqs=ssl.CERT_NONE, check_hostname=False)
        import websocket

        try:
            sock = await anyio.to_thread.run_sync(partial(
                websocket.create_connection, url, timeout=gateway.connect_timeout, header=header,
                sslopt=sslopt, enable_multithread=True,
            ))
        except (OSError, websocket.WebSocketException) as exc:
            raise GatewayError(f"gateway WebSocket {url.split('?')[0]} failed: {exc}{_hint(getattr(exc, 'status_code', None))}") from exc
        sock.settimeout(None)  # the reader blocks until a message or close, however long the kernel idles
        loop = asyncio.get_running_loop()
        self.channel_socket = sock
        self.lost = False
        self._channel_queues = {}
        for name in ("shell", "iopub", "stdin", "hb", "control"):
            channel = _Channel(name, sock, self.log, loop, partial(self._lose, sock))
            setattr(self, f"_{name}_channel", channel)
            self._channel_queues[name] = channel
        self.response_router = threading.Thread(target=self._route_responses, args=(sock, self._channel_queues),
                                                name=f"gateway-ws-{self.kernel_id[:8]}", daemon=True)
        self.response_router.start()

    async def wait_for_ready(self, timeout: float | None = None) -> None:
        await self.connect()
        await AsyncKernelClient.wait_for_ready(self, timeout=timeout)

    def _route_responses(self, sock: Any, queues: dict[str, _Channel]) -> None:
        """The reader thread: each message to its channel's queue until the WebSocket closes."""
        import websocket

        try:
            while True:
                raw = sock.recv()
                if not raw:
                    break
                if isinstance(raw, bytes):  # a message with binary buffers (widgets): not ours
                    continue
                msg = wire.loads(raw)  # untrusted: cleaned at the door, like local kernels' messages
                channel = queues.get(msg.get("channel", ""))
                if channel is None:
                    continue
                if channel.channel_name == "iopub" and msg.get("msg_type") == "status" and not msg.get("parent_header"):
                    state = msg.get("content", {}).get("execution_state")
                    if state in ("restarting", "dead") and self.on_status is not None:
                        self.on_status(state)
                channel.put_nowait(msg)
        except (websocket.WebSocketException, OSError, ValueError) as exc:
            if not self._channels_stopped:
                self.log.warning("gateway WebSocket of kernel %s closed: %r", self.kernel_id, exc)
        finally:
            self._lose(sock)
            for channel in queues.values():
                channel.response_router_finished = True
                channel.wake()

    def _lose(self, sock: Any) -> None:
        if sock is self.channel_socket and not self._channels_stopped:
            self.lost = True

    def _close_socket(self) -> None:
        sock, router = self.channel_socket, self.response_router
        self.channel_socket = None
        if sock is not None:
            with contextlib.suppress(Exception):
                sock.abort()  # wakes the reader thread at once
            with contextlib.suppress(Exception):
                sock.close(timeout=0.5)
        if router is not None and router is not threading.current_thread():
            router.join(timeout=5)
        self.response_router = None
        for name in ("shell", "iopub", "stdin", "hb", "control"):
            setattr(self, f"_{name}_channel", None)

    def stop_channels(self) -> None:
        self._channels_stopped = True
        self._close_socket()
        self._channel_queues = {}

    @property
    def channels_running(self) -> bool:
        return self.channel_socket is not None and not self.lost


# --- the manager -----------------------------------------------------------------------------------
class GatewayManager(GatewayKernelManager):
    """jupyter_server's ``GatewayKernelManager``, with every REST call going to ``gateway`` (not the
    singleton), a liveness check that notices deaths, and no local resources to clean up."""

    kernel_url: str  # jupyter_server's attributes, typed here (pyproject's mypy overrides read the extras as untyped)
    execution_state: str
    gateway = AnyTrait()  # a GatewayClient
    client_class = DottedObjectName("kernelexec.gateway.GatewayChannelsClient")
    client_factory = Type(klass="kernelexec.gateway.GatewayChannelsClient")

    def __init__(self, *, gateway: GatewayClient, note: Any = None, **kwargs: Any) -> None:
        super().__init__(gateway=gateway, **kwargs)
        assert gateway.url is not None  # gateway_client sets it
        self.kernels_url = url_path_join(gateway.url, gateway.kernels_endpoint)
        self.note = note or (lambda text: None)  # writes a line to the session's kernel.log
        self.gone: str | None = None  # why the remote kernel is known dead or replaced
        self._checked = 0.0
        self._clients: weakref.WeakSet[GatewayChannelsClient] = weakref.WeakSet()

    # The overrides below are async, as in jupyter_server's GatewayKernelManager and jupyter_client's own
    # AsyncKernelManager, where KernelManager declares them sync (and client() as returning a BlockingKernelClient).
    def client(self, **kwargs: Any) -> GatewayChannelsClient:
        kc = super().client(**kwargs)
        kc.on_status = self._on_status
        self._clients.add(kc)
        return kc

    def _on_status(self, state: str) -> None:  # the reader thread
        if state == "restarting":
            self.gone = "the gateway found it dead and restarted it"
        else:
            self.gone = "the gateway found it dead and could not restart it"
        self.note(f"remote kernel {self.kernel_id}: {self.gone}")

    async def _request(self, url: str, method: str, body: Any = None) -> Any:
        return await gateway_request(self.gateway, url, method, body)

    async def _request_patiently(self, url: str, method: str, body: Any = None, patience: float = 15.0) -> Any:
        """For DELETE and restart: a gateway answers 500 while it is itself restarting a kernel that
        died, so those are tried again for a while before giving up."""
        deadline = time.monotonic() + patience
        while True:
            try:
                return await self._request(url, method, body)
            except GatewayError as exc:
                if exc.status is None or exc.status < 500 or exc.status == 599 or time.monotonic() > deadline:
                    raise
                logger.info("gateway %s %s answered %s; trying again", method, url, exc.status)
            await anyio.sleep(0.5)

    async def refresh_model(self, model: dict[str, Any] | None = None) -> dict[str, Any] | None:
        if model is None:
            try:
                model = await self._request(self.kernel_url, "GET")
            except GatewayError as exc:
                if exc.status != 404:
                    raise
                model = None
        self.kernel = model
        if model:
            self.execution_state = model.get("execution_state", self.execution_state)
        return model

    async def start_kernel(self, **kwargs: Any) -> None:
        name = kwargs.get("kernel_name") or DEFAULT_KERNEL_NAME
        body = {"name": name, "env": dict(kwargs.get("env") or {})}
        self.kernel = await self._request(self.kernels_url, "POST", body)
        self.kernel_id = self.kernel["id"]
        self.kernel_url = url_path_join(self.kernels_url, quote(str(self.kernel_id), safe=""))
        self.gone = None
        self.note(f"started remote kernel {self.kernel_id} ({name}) on {self.gateway.url}")

    async def shutdown_kernel(self, now: bool = False, restart: bool = False) -> None:
        if self.kernel is None:
            return
        try:
            await self._request_patiently(self.kernel_url, "DELETE")
        except GatewayError as exc:
            if exc.status != 404:
                raise
        self.note(f"deleted remote kernel {self.kernel_id}")
        self.kernel = None

    async def restart_kernel(self, now: bool = False, **kwargs: Any) -> None:
        if self.kernel is None:
            raise GatewayError(f"the gateway no longer has kernel {self.kernel_id} to restart", 404)
        self.gone = None
        self.kernel = await self._request_patiently(self.kernel_url + "/restart", "POST", {})
        self.note(f"restarted remote kernel {self.kernel_id}")  # Kernel.restart then waits (wait_for_ready reconnects)

    async def interrupt_kernel(self) -> None:
        """``POST /interrupt`` (SIGINT on the remote machine). A refused interrupt is logged, not
        raised: the cell then does not stop within the grace, and ``Kernel`` restarts the kernel."""
        if self.kernel is None:
            return
        try:
            await self._request(self.kernel_url + "/interrupt", "POST", {})
        except GatewayError as exc:
            logger.warning("interrupting remote kernel %s: %s", self.kernel_id, exc)
            self.note(f"interrupt of remote kernel {self.kernel_id} failed: {exc}")
            return
        self.note(f"interrupted remote kernel {self.kernel_id}")

    async def is_alive(self) -> bool:
        """False once the kernel is deleted, reported dead or restarted by the gateway (without our
        startup code), or its WebSocket is lost. The REST model is checked at most once a second."""
        if self.kernel is None or self.gone:
            return False
        if any(kc.lost and not kc._channels_stopped for kc in list(self._clients)):
            self.gone = "its WebSocket connection to the gateway was lost"
            self.note(f"remote kernel {self.kernel_id}: {self.gone}")
            return False
        now = time.monotonic()
        if now - self._checked >= _ALIVE_EVERY:
            self._checked = now
            try:
                model = await self.refresh_model()
            except GatewayError as exc:
                logger.warning("checking remote kernel %s: %s", self.kernel_id, exc)
                return True  # the gateway is unreachable for a moment: not evidence of death
            if model is None:
                self.gone = "the gateway no longer knows it (deleted or culled)"
            elif model.get("execution_state") == "dead":
                self.gone = "the gateway reports it dead"
            if self.gone:
                self.note(f"remote kernel {self.kernel_id}: {self.gone}")
                return False
        return True

    _async_is_alive = is_alive  # jupyter_client's wait_for_ready asks the parent through this name

    async def _async_cleanup_resources(self, restart: bool = False) -> None:
        """No local process, ports or connection file."""

    # sync, as jupyter_server's GatewayKernelManager has it; AsyncKernelManager declares it async
    def cleanup_resources(self, restart: bool = False) -> None:
        """No local process, ports or connection file."""


# --- the kernel -----------------------------------------------------------------------------------
_bound: dict[tuple[type, str, str | None], type[GatewayKernel]] = {}


class GatewayKernel(Kernel):
    """A session's kernel on a remote gateway. Isolation is the remote engine's job (its pods or
    machines); the in-kernel guard is installed there as locally."""

    answers_stdin = False  # input() is not served through the gateway's websocket yet

    url: str = ""
    token: str | None = None
    kernel_name: str = DEFAULT_KERNEL_NAME
    supports_spares = False  # the gateway restarts its kernel in place

    @classmethod
    def for_settings(cls, settings: Settings) -> type[GatewayKernel]:
        """This class bound to ``--kernel-gateway`` / ``--kernel-gateway-token`` (what
        ``sessions.kernel_class`` hands out)."""
        if not settings.kernel_gateway:
            raise ValueError("no --kernel-gateway configured")
        key = (cls, settings.kernel_gateway, settings.kernel_gateway_token)
        with _clients_lock:
            bound = _bound.get(key)
            if bound is None:
                bound = _bound[key] = type(cls.__name__, (cls,), {
                    "url": settings.kernel_gateway, "token": settings.kernel_gateway_token,
                    "__module__": cls.__module__, "__qualname__": cls.__qualname__,
                })
        return bound

    def __init__(self, spec: LaunchSpec, *, startup_timeout: float = 60.0, url: str | None = None,
                 token: str | None = None, kernel_name: str | None = None) -> None:
        super().__init__(spec, startup_timeout=startup_timeout)
        self.url = url or self.url
        self.token = token if token is not None else self.token
        self.kernel_name = kernel_name or self.kernel_name
        if not self.url:
            raise KernelStartError("GatewayKernel needs a gateway URL (--kernel-gateway)", "")
        guarded = spec.policy.get("profile") != "trusted"
        # the local OS layers (plan_for) do not apply to a kernel on another machine
        spec.plan = SandboxPlan(layers=["remote-gateway", "guard"] if guarded else ["remote-gateway"])
        self.gateway = gateway_client(self.url, self.token)

    def spill_path_ok(self, path: Any) -> bool:
        return remote_spill_ok(path, self.spec.dirs.root.name)

    # --- the seams --------------------------------------------------------------------------------
    def create_manager(self) -> GatewayManager:
        return GatewayManager(gateway=self.gateway, note=self.note)

    def start_kwargs(self) -> dict[str, Any]:
        """What ``POST /api/kernels`` takes: the kernel name, and ``KERNEL_*`` variables of the server's
        environment (Enterprise Gateway reads KERNEL_USERNAME, KERNEL_NAMESPACE, ...). No fds, cwd or
        scrubbed environment: the remote engine launches and isolates its kernels."""
        env = {k: v for k, v in os.environ.items() if k.startswith("KERNEL_")}
        return {"kernel_name": self.kernel_name, "env": env}

    async def install_startup(self) -> None:
        """Run kernelexec's startup code in the remote kernel (a silent execute); fail closed."""
        await install_remote_startup(self)
        self.note(f"installed kernelexec's startup code in remote kernel {self._manager().kernel_id}")

    # --- no local process -----------------------------------------------------------------------------
    def exit_code(self) -> int | None:
        return None

    def exit_status(self) -> str:
        """The gateway does not report exit codes; say what is known."""
        km = cast("GatewayManager | None", self.km)  # create_manager made it
        why = km.gone if km is not None else None
        return f"on the gateway {self.url}: {why or 'exit status not reported'}"

    def log_tail(self, limit: int = 2000) -> str:
        """The session's ``kernel.log`` holds the gateway events (the kernel's own stderr stays on the
        gateway, in its log)."""
        tail = super().log_tail(limit)
        return tail or f"(no local log: the kernel runs on the gateway {self.url}; its stderr is in the gateway's log)"
