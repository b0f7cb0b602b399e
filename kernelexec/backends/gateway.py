"""Kernels on a Jupyter Kernel Gateway, Enterprise Gateway or Jupyter Server, over REST + WebSocket.

``--kernel-gateway URL [--kernel-gateway-token T]`` makes every session's kernel a kernel of that
server: started with ``POST /api/kernels``, interrupted, restarted and deleted over REST, and driven
over its ``/api/kernels/<id>/channels`` WebSocket. ``GatewayKernel`` plugs into ``Kernel``'s seams;
the request/reply logic (timeouts, interrupt-then-restart, result report) is the local one unchanged,
and so is the stdin channel: a cell's ``input()``/``getpass()`` requests and code mode's calls arrive on the
WebSocket's ``stdin`` queue and their replies go back through ``stdin.send_to_kernel`` (a worker-thread send,
abandoned after its bound), exactly as for a local kernel. The server routes a kernel's stdin messages to
the WebSocket of the session that sent the ``execute_request`` (``allow_stdin`` set on it).

Built on jupyter_server's gateway classes (``GatewayKernelManager``, ``GatewayKernelClient``,
``GatewayClient``), with what a long-lived, multi-session MCP server needs on top:

* **no singleton.** jupyter_server reads its gateway settings from ``GatewayClient.instance()``;
  here every request and WebSocket uses a ``GatewayClient`` built for this URL and token
  (``gateway_http.py``), so two servers in one process do not fight over the singleton.
* **the token on the WebSocket too, and waiting without spinning** (``gateway_channels.py``).
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

import logging
import os
import time
import weakref
from collections.abc import Awaitable, Callable
from typing import Any, cast
from urllib.parse import quote

import anyio

try:
    from jupyter_server.gateway.gateway_client import GatewayClient
    from jupyter_server.gateway.managers import GatewayKernelManager
    from jupyter_server.utils import url_path_join
except ImportError as exc:  # pragma: no cover - depends on the install
    raise ImportError(f"--kernel-gateway needs jupyter_server (pip install 'kernelexec[gateway]'): {exc}") from exc
from traitlets import Any as AnyTrait
from traitlets import DottedObjectName, Type

from kernelexec.backends.gateway_channels import GatewayChannelsClient
from kernelexec.backends.gateway_http import GatewayError, gateway_client, gateway_request
from kernelexec.backends.remote_startup import install_remote_startup, remote_policy, remote_spill_ok, startup_code  # noqa: F401 (re-exported)
from kernelexec.errors import KernelStartError
from kernelexec.kernel.driver import Kernel
from kernelexec.kernel.launch import LaunchSpec
from kernelexec.sandbox.plan import SandboxPlan

logger = logging.getLogger(__name__)

DEFAULT_KERNEL_NAME = "python3"
_ALIVE_EVERY = 1.0  # seconds between REST checks of the kernel's model (the WebSocket reports faster)


# --- the manager -----------------------------------------------------------------------------------
class GatewayManager(GatewayKernelManager):
    """jupyter_server's ``GatewayKernelManager``, with every REST call going to ``gateway`` (not the
    singleton), a liveness check that notices deaths, and no local resources to clean up."""

    kernel_url: str  # jupyter_server's attributes, typed here (pyproject's mypy overrides read the extras as untyped)
    execution_state: str
    gateway = AnyTrait()  # a GatewayClient
    client_class = DottedObjectName("kernelexec.backends.gateway_channels.GatewayChannelsClient")
    client_factory = Type(klass="kernelexec.backends.gateway_channels.GatewayChannelsClient")

    def __init__(self, *, gateway: GatewayClient, note: Any = None, **kwargs: Any) -> None:
        super().__init__(gateway=gateway, **kwargs)
        assert gateway.url is not None  # gateway_client sets it
        self.kernels_url = url_path_join(gateway.url, gateway.kernels_endpoint)
        self.note = note or (lambda text: None)  # writes a line to the session's kernel.log
        self.gone: str | None = None  # why the remote kernel is known dead or replaced
        self.attached = False  # started by attaching to a kernel the gateway already ran (a fleet's)
        self.answered = False  # the kernel answered its kernel_info_request (GatewayKernel.install_startup)
        self._checked = 0.0
        self._clients: weakref.WeakSet[GatewayChannelsClient] = weakref.WeakSet()
        self.reclaim: tuple[str, frozenset[str]] | None = None  # GatewayKernel.reclaim, applied to an attached kernel's client
        # a fleet's session: a store round trip with the lease's token before each destructive request, raising
        # when another replica took the session meanwhile (this one was paused past its lease): session/fleet.py
        self.fence: Callable[[], Awaitable[None]] | None = None

    async def _fenced(self, what: str) -> None:
        if self.fence is not None:
            try:
                await self.fence()
            except Exception as exc:
                said = f"not sent: {what} of remote kernel {self.kernel_id} ({exc})"
                logger.warning("%s", said)
                self.note(said)
                raise

    # The overrides below are async, as in jupyter_server's GatewayKernelManager and jupyter_client's own
    # AsyncKernelManager, where KernelManager declares them sync (and client() as returning a BlockingKernelClient).
    def client(self, **kwargs: Any) -> GatewayChannelsClient:
        kc = super().client(**kwargs)
        kc.on_status = self._on_status
        if self.reclaim is not None and self.attached:  # the same kernel process: its buffered messages replayed to us
            channel, msg_ids = self.reclaim
            kc.session.session = channel
            kc.reclaimed = msg_ids
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
        """A new kernel (``POST /api/kernels``), or with ``attach_to`` the gateway's kernel of that id when it still
        lives (a fleet's session, started by another replica); a new one when the gateway no longer has it."""
        attach_to = kwargs.get("attach_to")
        if attach_to and await self._attach(str(attach_to)):
            return
        name = kwargs.get("kernel_name") or DEFAULT_KERNEL_NAME
        body = {"name": name, "env": dict(kwargs.get("env") or {})}
        self.kernel = await self._request(self.kernels_url, "POST", body)
        self.kernel_id = self.kernel["id"]
        self.kernel_url = url_path_join(self.kernels_url, quote(str(self.kernel_id), safe=""))
        self.gone = None
        self.note(f"started remote kernel {self.kernel_id} ({name}) on {self.gateway.url}")

    async def _attach(self, kernel_id: str) -> bool:
        self.kernel_id = kernel_id
        self.kernel_url = url_path_join(self.kernels_url, quote(kernel_id, safe=""))
        self.kernel = None
        model = await self.refresh_model()
        if model is None or model.get("execution_state") == "dead":
            self.note(f"remote kernel {kernel_id} is gone from {self.gateway.url}: a new one is started")
            self.kernel = None
            return False
        self.attached = True
        self.gone = None
        self.note(f"attached to remote kernel {kernel_id} on {self.gateway.url}")
        return True

    async def shutdown_kernel(self, now: bool = False, restart: bool = False) -> None:
        if self.kernel is None:
            return
        await self._fenced("shutdown")
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
        await self._fenced("restart")
        self.gone = None
        self.kernel = await self._request_patiently(self.kernel_url + "/restart", "POST", {})
        self.note(f"restarted remote kernel {self.kernel_id}")  # Kernel.restart then waits (wait_for_ready reconnects)

    async def interrupt_kernel(self) -> None:
        """``POST /interrupt`` (SIGINT on the remote machine). A refused interrupt is logged, not
        raised: the cell then does not stop within the grace, and ``Kernel`` restarts the kernel."""
        if self.kernel is None:
            return
        await self._fenced("interrupt")
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
            await self.check_model()
        return self.gone is None

    _async_is_alive = is_alive  # jupyter_client's wait_for_ready asks the parent through this name

    async def check_model(self) -> str | None:
        """Why the kernel is gone, by its REST model (``is_alive``, and while its WebSocket handshake waits:
        ``GatewayChannelsClient.connect``): deleted, or given up on after failed restarts (Jupyter Server then drops
        it), or reported dead. None while the gateway has it, or cannot be asked (a moment's outage is no evidence).
        ``gone`` is set, never cleared here: the reader thread may have set it (a restarting status) meanwhile."""
        try:
            model = await self.refresh_model()
        except GatewayError as exc:
            logger.warning("checking remote kernel %s: %s", self.kernel_id, exc)
            return None
        if model is None:
            why = "the gateway no longer knows it (deleted, culled, or its restarts failed)"
        elif model.get("execution_state") == "dead":
            why = "the gateway reports it dead"
        else:
            return None
        self.gone = why
        self.note(f"remote kernel {self.kernel_id}: {why}")
        return why

    async def _async_cleanup_resources(self, restart: bool = False) -> None:
        """No local process, ports or connection file."""

    # sync, as jupyter_server's GatewayKernelManager has it; AsyncKernelManager declares it async
    def cleanup_resources(self, restart: bool = False) -> None:
        """No local process, ports or connection file."""


# --- the kernel -----------------------------------------------------------------------------------


class GatewayKernel(Kernel):
    """A session's kernel on a remote gateway. Isolation is the remote engine's job (its pods or
    machines); the in-kernel guard is installed there as locally."""

    url: str = ""
    token: str | None = None
    kernel_name: str = DEFAULT_KERNEL_NAME
    # no warm spare: the gateway restarts its kernel in place

    def __init__(self, spec: LaunchSpec, *, startup_timeout: float = 60.0, url: str | None = None,
                 token: str | None = None, kernel_name: str | None = None) -> None:
        super().__init__(spec, startup_timeout=startup_timeout)
        self.attach_to: str | None = None  # a fleet's session: the gateway kernel to attach to (session/fleet.py)
        self.fence: Callable[[], Awaitable[None]] | None = None  # a fleet's session: GatewayManager.fence
        # a fleet's takeover: the channels' session id of the replica that stopped mid-cell, and its requests' msg_ids
        # (the gateway replays that connection's buffered messages to a reconnect with the same id: ``collect``)
        self.reclaim: tuple[str, frozenset[str]] | None = None
        self.held_dropped: dict[str, tuple[int, int]] = {}  # msg_id: messages and bytes a takeover did not hold
        # ... and when the first of those requests is past its timeout (wall-clock: its start on the stopped replica
        # + the timeout asked), and whether this connection had to interrupt the kernel for it (``start``)
        self.reclaim_deadline: float | None = None
        self.interrupted_reclaimed = False
        self._starting = False  # in start(): a failed attach lets the kernel go (shutdown)
        self._made: GatewayManager | None = None  # the last manager create_manager made (start: was its kernel lost?)
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

    async def start(self) -> None:
        """Start or attach; attaching to a kernel still running a stopped replica's cell (the gateway answers a new
        connection once the kernel is idle), that cell is interrupted at its own deadline: no replica counted its
        timeout since its own stopped, and the attach would otherwise wait on it however long it runs."""
        self._starting = True
        try:
            if self.attach_to is None or self.reclaim is None or self.reclaim_deadline is None:
                await self._start_replacing_a_lost_one()
                return
            failed: Exception | None = None  # raised as itself, not in the task group's ExceptionGroup
            async with anyio.create_task_group() as watching:
                watching.start_soon(self._interrupt_at, self.attach_to, self.reclaim_deadline)
                try:
                    await super().start()
                except Exception as exc:  # noqa: BLE001 - re-raised below
                    failed = exc
                finally:
                    watching.cancel_scope.cancel()
            if failed is not None:
                raise failed
        finally:
            self._starting = False

    async def _start_replacing_a_lost_one(self) -> None:
        """``Kernel.start``; when the kernel it started was lost before it ever answered (the gateway dropped it,
        reported it dead or restarted it, or its WebSocket closed), a new one, once, within what is left of the one
        start-up timeout: no cell ran there, so nothing is lost. jupyter_client restarts a kernel on the TCP ports it
        first picked, so a kernel whose port another process took before it bound dies at every restart the gateway
        tries (``Address already in use``), and the gateway then drops it (CI at 8c430d5); a new kernel picks new
        ports. A kernel attached to (a fleet's, with variables) is never silently replaced here."""
        deadline = time.monotonic() + self.startup_timeout  # one start-up budget for both
        try:
            await super().start()
        except KernelStartError:
            lost, left = self._made, deadline - time.monotonic()
            if lost is None or lost.attached or lost.answered or not lost.gone or left < 1:
                raise
            replaced = f"remote kernel {lost.kernel_id} was lost before it answered ({lost.gone})"
            logger.warning("%s: starting a new one", replaced)
            budget, self.startup_timeout = self.startup_timeout, left
            try:
                await super().start()
            finally:
                self.startup_timeout = budget
            self.note(f"{replaced}: kernel {self.kernel_id} replaced it")  # the log closed with the lost one

    async def _interrupt_at(self, kernel_id: str, deadline: float) -> None:
        """``POST /interrupt`` to the gateway kernel at ``deadline`` (wall-clock), under this replica's lease."""
        await anyio.sleep(max(0.0, deadline - time.time()))
        try:
            if self.fence is not None:
                await self.fence()
            url = url_path_join(self.gateway.url, self.gateway.kernels_endpoint, quote(kernel_id, safe=""), "interrupt")
            await gateway_request(self.gateway, url, "POST", {})
        except Exception as exc:  # noqa: BLE001 - the lease lost, or the gateway refused: the attach goes on as before
            logger.warning("interrupting remote kernel %s at a taken-over cell's deadline: %s", kernel_id, exc)
            return
        self.interrupted_reclaimed = True
        self.note(f"interrupted remote kernel {kernel_id}: the cell a stopped replica left running was past its timeout")

    async def shutdown(self) -> None:
        """A kernel attached to (a fleet's: another replica's, maybe still busy with that replica's cell past this
        one's start-up timeout) is let go, not deleted, when attaching to it fails: its cell and variables stay."""
        if self._starting and self.attached:
            self.detach()
            return
        await super().shutdown()

    # --- the seams --------------------------------------------------------------------------------
    def create_manager(self) -> GatewayManager:
        manager = GatewayManager(gateway=self.gateway, note=self.note)
        manager.fence = self.fence
        manager.reclaim = self.reclaim
        self._made = manager
        return manager

    def resume_point(self, msg_id: str) -> dict[str, Any] | None:
        """The gateway kernel, this connection's session id and the request: Jupyter Server and Enterprise Gateway
        buffer a kernel's messages while the last WebSocket of a session id is closed and replay them to the next
        connection with that id (``ZMQChannelsHandler.open``, ``MappingKernelManager.get_buffer``), as long as the
        kernel lives and no connection with another id came first."""
        kc, kernel_id = self.kc, self.kernel_id
        if kc is None or kernel_id is None:
            return None
        return {"kernel": kernel_id, "channel": str(kc.session.session), "msg_id": msg_id}

    async def release_reclaimed(self, settle: float = 2.0) -> dict[str, bool]:
        """The reclaimed requests' messages, held since the connection opened, into the channels for ``collect``;
        which of them ended (idle status and reply: a kernel that answered this connection is done with them, and
        their last IOPub may trail its shell reply by a moment, so up to ``settle`` s is given), each with whether
        its beginning came too (``GatewayChannelsClient.whole_reclaimed``)."""
        kc = self.kc
        if kc is None:
            return {}
        wanted = set(kc.reclaimed)
        with anyio.move_on_after(settle):
            while set(kc.whole_reclaimed()) != wanted:
                await anyio.sleep(0.05)
        whole = kc.whole_reclaimed()
        kc.release_reclaimed()
        self.held_dropped = dict(kc.dropped)
        return whole

    def start_kwargs(self) -> dict[str, Any]:
        """What ``POST /api/kernels`` takes: the kernel name, and ``KERNEL_*`` variables of the server's
        environment (Enterprise Gateway reads KERNEL_USERNAME, KERNEL_NAMESPACE, ...). No fds, cwd or
        scrubbed environment: the remote engine launches and isolates its kernels."""
        env = {k: v for k, v in os.environ.items() if k.startswith("KERNEL_")}
        return {"kernel_name": self.kernel_name, "env": env, "attach_to": self.attach_to}

    @property
    def kernel_id(self) -> str | None:
        """The gateway's id of the kernel (what a fleet's store records to attach to it), once started."""
        km = cast("GatewayManager | None", self.km)
        return str(km.kernel_id) if km is not None and km.kernel_id else None

    @property
    def attached(self) -> bool:
        """Whether ``start`` attached to a live kernel (its variables are there) rather than starting one."""
        km = cast("GatewayManager | None", self.km)
        return km is not None and km.attached

    async def install_startup(self) -> None:
        """Run kernelexec's startup code in the remote kernel (a silent execute); fail closed. A kernel attached
        to already runs it (its policy answers): nothing is sent again."""
        cast(GatewayManager, self._manager()).answered = True  # Kernel._wait_ready calls this once the kernel answered
        if self.attached:
            report = await self.evaluate("_kernelexec_policy()", timeout=self.startup_timeout)
            if isinstance(report, dict) and report.get("active"):
                return
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
