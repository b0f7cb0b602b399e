"""A gateway kernel's channels over its ``/api/kernels/<id>/channels`` WebSocket.

jupyter_server's ``GatewayKernelClient``, for one gateway and a long-lived server: the token on the
WebSocket too (jupyter_server's client sends it only on REST calls); channel queues that wake on
arrival instead of polling with ``sleep(0)``, and offer ``msg_ready()`` like jupyter_client's; a
closed WebSocket or a ``restarting``/``dead`` status marks the connection lost, so the manager's
``is_alive()`` reports the death. ``gateway.GatewayManager`` makes these clients.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import socket
import struct
import threading
import time
from functools import partial
from typing import Any, Protocol, cast
from urllib.parse import quote

import anyio
import numpy as np
from jupyter_client.asynchronous.client import AsyncKernelClient

try:
    from jupyter_server.gateway.gateway_client import GatewayClient
    from jupyter_server.gateway.managers import ChannelQueue, GatewayKernelClient
    from jupyter_server.utils import url_path_join
except ImportError as exc:  # pragma: no cover - depends on the install
    raise ImportError(f"--kernel-gateway needs jupyter_server (pip install 'kernelexec[gateway]'): {exc}") from exc

from kernelexec.backends.gateway_http import GatewayError, failure_hint
from kernelexec.kernel import wire

# What a takeover holds of the reclaimed requests' messages until it collects them: the gateway replays all it kept
# for the stopped replica's connection at once, and a hostile cell (it holds the session key) can send any amount
# past the kernel's own output cap (Jupyter Server's IOPub rate limit counts streams only, and may be off). Room for
# what a collected cell keeps of its two streams (``collector.Caps``: a little over the kernel's 1,000,000-character
# cap each) and a few plots; past it only the messages that end a request are held (``_ENDS``, once each), the rest
# dropped and counted: the collected answer says so (``Session.collect_orphans``).
HOLD_CAP = 8 * 1024 * 1024
# How often the gateway is asked whether it still has a kernel while the WebSocket handshake waits on the kernel's
# first answer (``connect``): a kernel answers within a few seconds of its launch even on a loaded 2-core machine
HANDSHAKE_CHECK = 5.0
_ENDS = {("iopub", "status"), ("iopub", "execute_result"), ("iopub", "error"), ("shell", "execute_reply")}


class _MadeByManager(Protocol):
    """What a client reads of the ``gateway.GatewayManager`` that made it (not imported: it imports this module)."""

    gateway: GatewayClient

    async def check_model(self) -> str | None: ...


def _frame(payload: bytes, key: bytes) -> memoryview:
    """A final binary WebSocket frame of ``payload`` masked with the 4-byte ``key`` (RFC 6455 5.2), built in one
    buffer and masked in place with numpy. websocket-client's own took 0.2-0.4 s per 8 MiB, holding the GIL on the
    event loop (a pure-Python XOR, then copies of the whole frame for each partial send); a fork's relay sends 25
    of them for 200 MB. A view: the socket's partial sends slice it without copying."""
    n = len(payload)
    if n < 126:
        head = struct.pack("!BB", 0x82, 0x80 | n)
    elif n < 1 << 16:
        head = struct.pack("!BBH", 0x82, 0x80 | 126, n)
    else:
        head = struct.pack("!BBQ", 0x82, 0x80 | 127, n)
    start = len(head) + 4
    out = bytearray(start + n)
    out[:len(head)], out[len(head):start], out[start:] = head, key, payload
    words = n // 4
    view = np.frombuffer(out, dtype=np.uint32, count=words, offset=start)
    np.bitwise_xor(view, np.frombuffer(key, dtype=np.uint32)[0], out=view)
    for i in range(words * 4, n):
        out[start + i] ^= key[i % 4]
    return memoryview(out)


def _binary_frame(payload: bytes) -> Any:
    """A frame for ``WebSocket.send_frame`` that formats itself with ``_frame``, its key fresh per frame from the
    socket's ``get_mask_key`` (a kernel's bytes never choose what the wire carries)."""
    import websocket

    class Frame(websocket.ABNF):
        def format(self) -> Any:
            key = self.get_mask_key(4)
            return _frame(payload, key.encode() if isinstance(key, str) else key)

    return Frame(fin=1, opcode=websocket.ABNF.OPCODE_BINARY, data=payload)


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
        """Name the channel in the message (the server otherwise assumes shell), then send it: as text, or with
        its ``buffers`` as a binary frame (Jupyter's binary WebSocket layout, ``wire.binary_message``). On a
        closed WebSocket the message is dropped and the connection marked lost: the caller's wait
        then ends through is_alive(), like a kernel that died, instead of an exception mid-request."""
        import websocket

        try:
            buffers = msg.get("buffers")
            if buffers:  # binary buffers (a fork's relay): one binary frame, the buffers never encoded
                body = {k: v for k, v in msg.items() if k != "buffers"}
                frame = wire.binary_message({**body, "channel": self.channel_name}, buffers,
                                            default=ChannelQueue.serialize_datetime)
                self.channel_socket.send_frame(_binary_frame(frame))
            else:
                super().send({**msg, "channel": self.channel_name})
        except (websocket.WebSocketException, OSError) as exc:
            self.log.warning("gateway WebSocket send failed on %s: %r", self.channel_name, exc)
            self._on_lost()


def _shut(sock: Any) -> None:
    """Shut a websocket-client socket's connection, from any thread: wakes a read blocked on it (close() alone would
    not). The plain socket's shutdown, not TLS's: SSLSocket.shutdown unwraps under a worker's read."""
    raw = sock.sock
    if raw is not None:
        with contextlib.suppress(OSError):
            socket.socket.shutdown(raw, socket.SHUT_RDWR)


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
        # a fleet's takeover (GatewayManager.client): requests another replica sent, whose messages are held apart
        # from the start (wait_for_ready's and install_startup's reads would drop them) until ``release_reclaimed``
        self.reclaimed: frozenset[str] = frozenset()
        self._held: list[tuple[str, dict[str, Any]]] = []
        self._held_bytes = 0
        self._held_ends: set[tuple[str, str, str, str]] = set()  # past HOLD_CAP: each request's ends, once
        self.dropped: dict[str, tuple[int, int]] = {}  # msg_id: messages and bytes not held (past HOLD_CAP)
        self._holding = threading.Lock()

    @property
    def gateway(self) -> GatewayClient:
        return cast(_MadeByManager, self.parent).gateway  # GatewayManager.client made this client

    # jupyter_server declares it async; ours is synchronous on purpose (see the class docstring)
    def start_channels(self, shell: bool = True, iopub: bool = True, stdin: bool = True, hb: bool = True,
                       control: bool = True) -> None:
        self._channels_stopped = False

    async def connect(self) -> None:
        """Open the WebSocket (again, if it was lost) and start the reader thread.

        Jupyter Server completes the handshake only once the kernel answers the ``kernel_info_request`` it sends
        then, and a kernel that dies at its launch and at every restart the gateway tries is dropped while the
        handshake still waits: it then waited out the whole ``connect_timeout`` (40 s) on a kernel that no longer
        existed (CI at 8c430d5; tests/test_gateway.py's ``dies-twice``). So while the one handshake waits (bounded
        by ``connect_timeout`` as before), the gateway is asked every ``HANDSHAKE_CHECK`` s whether it still has the
        kernel, and when it does not, the handshake's socket is shut and the wait ends there (``GatewayKernel`` may
        start a new one). The handshake is never abandoned and made again while the kernel lives: Jupyter Server
        counts an abandoned one as a disconnect without a connect, and with its count below zero it no longer
        buffers the kernel's messages for the next connection (what a fleet's takeover collects) nor culls it."""
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

        # websocket-client checks UTF-8 byte by byte in Python without wsaccel: ~1 s per MB, which made a fork's
        # 4 MiB checkpoint piece take 5 s; wire.loads decodes (replacing what is not UTF-8)
        sock = websocket.WebSocket(sslopt=sslopt, enable_multithread=True, skip_utf8_validation=True)
        sock.settimeout(gateway.connect_timeout)
        gone: list[str] = []
        failed: Exception | None = None
        async with anyio.create_task_group() as watching:
            watching.start_soon(self._shut_if_gone, sock, gone)
            try:
                # abandoned when cancelled (Kernel.start's deadline): its socket is shut so that it ends at once
                await anyio.to_thread.run_sync(partial(sock.connect, url, header=header), abandon_on_cancel=True)
            except anyio.get_cancelled_exc_class():
                _shut(sock)
                raise
            except (OSError, ValueError, websocket.WebSocketException) as exc:  # ValueError: a TLS socket shut mid-read
                failed = exc
            watching.cancel_scope.cancel()
        where = f"gateway WebSocket {url.split('?')[0]} failed"
        if gone:
            if failed is None:  # made in the same instant the kernel was found gone
                sock.shutdown()
            raise GatewayError(f"{where}: remote kernel {self.kernel_id} {gone[0]} while its handshake waited", 404) from failed
        if failed is not None:
            raise GatewayError(f"{where}: {failed}{failure_hint(getattr(failed, 'status_code', None))}") from failed
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

    async def _shut_if_gone(self, sock: Any, gone: list[str]) -> None:
        """While ``connect``'s handshake waits: every ``HANDSHAKE_CHECK`` s, ask the gateway for the kernel; once it
        is gone, say why in ``gone`` and shut the handshake's socket (again until the handshake ends: its TCP
        connection may not be made yet)."""
        while not gone:
            await anyio.sleep(HANDSHAKE_CHECK)
            try:
                why = await cast(_MadeByManager, self.parent).check_model()
            except Exception as exc:  # noqa: BLE001 - a garbled answer is no evidence of death: asked again later
                self.log.warning("checking remote kernel %s during its handshake: %r", self.kernel_id, exc)
                continue
            if why:
                gone.append(why)
        while True:
            _shut(sock)
            await anyio.sleep(0.2)

    async def wait_for_ready(self, timeout: float | None = None) -> None:
        await self.connect()
        await AsyncKernelClient.wait_for_ready(self, timeout=timeout)

    def _route_responses(self, sock: Any, queues: dict[str, _Channel]) -> None:
        """The reader thread: each message to its channel's queue until the WebSocket closes."""
        import websocket

        try:
            while True:
                opcode, raw = sock.recv_data()  # bytes, never decoded here: wire.loads does it, replacing bad UTF-8
                if opcode == websocket.ABNF.OPCODE_BINARY and raw:  # a message with binary buffers
                    msg = wire.loads_binary(raw)
                    if msg.get("msg_type") != "comm_msg":  # widgets' and others': not ours; a fork's relay is a comm
                        continue
                elif opcode != websocket.ABNF.OPCODE_TEXT or not raw:  # closed
                    break
                else:
                    msg = wire.loads(raw)  # untrusted: cleaned at the door, like local kernels' messages
                channel = queues.get(msg.get("channel", ""))
                if channel is None:
                    continue
                if self.reclaimed and self._hold(channel.channel_name, msg, len(raw)):
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

    def _hold(self, name: str, msg: dict[str, Any], size: int) -> bool:
        """True if ``msg`` (``size`` bytes on the wire) belongs to a reclaimed request: held, or past HOLD_CAP
        dropped and counted unless it is one of the request's ends not held yet."""
        parent = msg.get("parent_header")
        msg_id = parent.get("msg_id") if isinstance(parent, dict) else None
        if msg_id not in self.reclaimed:
            return False
        with self._holding:
            if not self.reclaimed:  # released meanwhile: to its channel, in order after the held ones
                return False
            if self._held_bytes + size > HOLD_CAP:
                state = str((msg.get("content") or {}).get("execution_state")) if msg.get("msg_type") == "status" else ""
                end = (str(msg_id), name, str(msg.get("msg_type")), state)
                if (name, end[2]) not in _ENDS or state not in ("", "busy", "idle") or end in self._held_ends:
                    count, total = self.dropped.get(str(msg_id), (0, 0))
                    self.dropped[str(msg_id)] = (count + 1, total + size)
                    return True
                self._held_ends.add(end)
            self._held.append((name, msg))
            self._held_bytes += size
        return True

    def whole_reclaimed(self) -> dict[str, bool]:
        """The reclaimed requests whose end (idle status and shell reply) is held, each with whether its beginning
        (the busy status) is too: without it, what the cell printed before was delivered to the connection that
        stopped."""
        with self._holding:
            states = {(m["parent_header"]["msg_id"], (m.get("content") or {}).get("execution_state"))
                      for name, m in self._held if name == "iopub" and m.get("msg_type") == "status"}
            replied = {m["parent_header"]["msg_id"] for name, m in self._held if name == "shell"}
        return {msg_id: (msg_id, "busy") in states for msg_id, state in states if state == "idle" and msg_id in replied}

    def release_reclaimed(self) -> None:
        """The held messages into their channels, in the order they came; later ones go there directly."""
        with self._holding:
            held, self._held, self.reclaimed = self._held, [], frozenset()
            self._held_bytes, self._held_ends = 0, set()
            queues = self._channel_queues
            for name, msg in held:
                channel = queues.get(name)
                if channel is not None:
                    channel.put_nowait(msg)

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


__all__ = ["GatewayChannelsClient"]
