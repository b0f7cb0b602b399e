"""jupyter_client's kernel manager and client, with every socket to a kernel spoken by ``zmtp`` (bounded reads).

jupyter_client's own extension points carry it: a client's ``*_channel_class`` traits and its
``_create_connected_socket`` (the manager's control socket is made by the same method), and a manager's
``client_class``. Everything else, the launch, the provisioner, restarts and messages' signatures, stays
jupyter_client's. The heartbeat is never connected: liveness is the manager's ``is_alive``.
"""

from __future__ import annotations

import contextlib
import queue
from typing import Any

from jupyter_client.asynchronous.client import AsyncKernelClient
from jupyter_client.manager import AsyncKernelManager
from traitlets import DottedObjectName, Type

from kernelexec.kernel import wire, zmtp


def connect(owner: Any, channel: str, identity: bytes | None = None, *, listen: bool = True) -> zmtp.Connection:
    """``owner``'s (a manager's or a client's: their ConnectionFileMixin) ``channel`` socket, as a ``zmtp.Connection``
    (``listen=False``: a socket nobody reads, whose incoming messages are dropped as they come)."""
    if channel not in zmtp.SOCKET_TYPES:
        raise ValueError(f"kernelexec does not connect a kernel's {channel!r} socket")
    if getattr(owner, "curve_publickey", None) is not None:
        raise ValueError("a kernel whose connection file asks for CURVE encryption is not spoken here")
    return zmtp.Connection(owner._make_url(channel), zmtp.SOCKET_TYPES[channel], identity or b"",  # noqa: SLF001
                           listen=listen)


async def receive(kc: Any, channel: str, timeout: float) -> Any:
    """The next message on ``kc``'s ``channel`` (``iopub``, ``shell``, ``stdin``) within ``timeout`` seconds, like
    ``kc.get_<channel>_msg(timeout=...)`` (raises ``queue.Empty``): on a kernel's own socket (``zmtp``, read with
    bounds) its frames, then ``wire.checked``; a gateway's channels decode their own WebSocket frames."""
    chan = getattr(kc, f"{channel}_channel")
    conn = getattr(chan, "socket", None)
    if not isinstance(conn, zmtp.Connection):  # a gateway's channels: their own client
        return await getattr(kc, f"get_{channel}_msg")(timeout=timeout)
    return await wire.checked(chan.session, await conn.next(timeout))


def zmtp_connections(kc: Any) -> list[zmtp.Connection]:
    """``kc``'s shell, IOPub and stdin connections as made so far (each counts the messages it skipped past its
    bounds, ``Connection.dropped``); none for a gateway's channels, which bound their own frames."""
    found = []
    for name in ("shell", "iopub", "stdin"):
        channel = getattr(kc, f"_{name}_channel", None)
        conn = getattr(channel, "socket", None)
        if isinstance(conn, zmtp.Connection):
            found.append(conn)
    return found


async def drain(kc: Any) -> None:
    """Drop the IOPub and shell messages left over from an interrupted or killed request, one that would not decode
    too (it must not fail the restart it follows); have a stdin socket connected now, before a cell's first input()
    (drop_stdin's replacement: a question sent before it is lost)."""
    _ = kc.stdin_channel
    for channel in (kc.iopub_channel, kc.shell_channel):
        while await channel.msg_ready():
            with contextlib.suppress(Exception):  # taken before it is decoded: dropped all the same
                await channel.get_msg(timeout=0)


class Channel:
    """One channel of jupyter_client's async client over a ``zmtp.Connection`` (its ``socket``)."""

    def __init__(self, socket: zmtp.Connection, session: Any, loop: Any = None) -> None:
        self.socket = socket
        self.session = session

    def start(self) -> None:
        """Nothing to start: the connection is kept up by the event loop from its making."""

    def stop(self) -> None:
        self.socket.close()

    close = stop

    def is_alive(self) -> bool:
        return not self.socket.closed

    async def msg_ready(self) -> bool:
        return self.socket.ready()

    async def get_msg(self, timeout: float | None = None) -> dict[str, Any]:
        """The next message, checked and decoded (``wire.checked``); ``queue.Empty`` after ``timeout`` seconds."""
        return await wire.checked(self.session, await self.socket.next(timeout))

    async def get_msgs(self) -> list[dict[str, Any]]:
        msgs = []
        while self.socket.ready():
            try:
                msgs.append(await self.get_msg(timeout=0))
            except queue.Empty:
                break
        return msgs

    def send(self, msg: dict[str, Any]) -> None:
        self.session.send(self.socket, msg)


class BoundedClient(AsyncKernelClient):
    """jupyter_client's async client, its shell, IOPub, stdin and control channels spoken by ``zmtp``."""

    shell_channel_class = Type(Channel)  # type: ignore[assignment]
    iopub_channel_class = Type(Channel)  # type: ignore[assignment]
    stdin_channel_class = Type(Channel)  # type: ignore[assignment]
    control_channel_class = Type(Channel)  # type: ignore[assignment]

    def _create_connected_socket(self, channel: str, identity: bytes | None = None) -> Any:
        return connect(self, channel, identity)

    def connect_iopub(self, identity: bytes | None = None) -> Any:
        return connect(self, "iopub", identity)  # subscribed to everything on connecting (jupyter_client sets it after)

    def stop_channels(self) -> None:
        """Stop the channels that were made (jupyter_client's would make, and connect, each one to stop it)."""
        for name in ("shell", "iopub", "stdin", "control", "hb"):
            channel = getattr(self, f"_{name}_channel", None)
            if channel is not None and channel.is_alive():
                channel.stop()


class BoundedManager(AsyncKernelManager):
    """jupyter_client's async kernel manager, its control socket and its clients' sockets spoken by ``zmtp``."""

    client_class = DottedObjectName("kernelexec.kernel.channels.BoundedClient")
    client_factory = Type(klass=BoundedClient)  # AsyncKernelManager's own trait defaults to its client, not client_class

    def _create_connected_socket(self, channel: str, identity: bytes | None = None) -> Any:
        # the manager's one socket, control: it sends shutdown and interrupt requests and never reads their replies
        return connect(self, channel, identity, listen=False)
