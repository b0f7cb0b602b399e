"""The server's end of a kernel's sockets, spoken in ZMTP 3.0 by the event loop, with bounds on what it holds.

libzmq receives a whole multipart message into memory before the application sees a frame of it, and
``ZMQ_MAXMSGSIZE`` bounds one frame, not their number: a cell that reaches its kernel's own sockets sends one message
of many frames, each pointing at one buffer (``copy=False``), and the server allocates all of them
(tests/test_hostile_kernel.py: +1 GB for 16 frames). Here the bytes are read as they come: a frame over
``MAX_FRAME_BYTES``, or a message over ``MAX_MESSAGE_BYTES`` or ``MAX_FRAMES``, is skipped to its end without being
held (counted in ``Connection.dropped``), and past ``QUEUE_BYTES`` of unread messages a connection stops reading
until they are taken (the kernel's side then waits, or its PUB drops, as at zmq's high-water mark).

The protocol is ZMTP 3.0 with the NULL mechanism (rfc.zeromq.org/spec/23), which libzmq 4 speaks with any peer
that offers it: a 64-byte greeting each way, a READY command naming the socket types, then frames. A connection is
kept up as libzmq keeps a connected socket: refused or lost, it is tried again every ``RECONNECT_S`` (a kernel
restarted in place binds the same addresses), and what is sent meanwhile waits for it (``PENDING_MAX`` messages,
``PENDING_BYTES``).
Only the kinds jupyter_client connects are spoken: DEALER (shell, stdin, control) and SUB (IOPub).
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import struct
from collections import deque
from collections.abc import Iterable, Sequence
from typing import Any

from kernelexec.kernel.wire import MAX_BUFFERS, MAX_PART_BYTES

MAX_FRAME_BYTES = MAX_PART_BYTES  # one part: more is refused by wire.loads anyway, so never held
MAX_MESSAGE_BYTES = MAX_PART_BYTES + 16 * 1024 * 1024  # one message: its largest part and room for its buffers
MAX_FRAMES = 16 + MAX_BUFFERS  # identities, the delimiter, the signature, four JSON parts, the buffers
MAX_COMMAND_BYTES = 64 * 1024  # READY, PING: a few properties
QUEUE_BYTES = 16 * 1024 * 1024  # unread messages one connection holds before it stops reading (one larger still comes whole)
# What a held message costs in objects besides its bytes (its list, tuple, each frame's bytes object): a flood of
# empty messages is counted at what it holds, not at nothing
MESSAGE_COST, FRAME_COST = 128, 64
# Frames parsed in one turn of the event loop: a read of the socket (256 KiB) of empty frames is 131,072 of them,
# ~0.5 s of parsing; past this many the rest waits for the loop's next turn, the socket unread meanwhile
FRAMES_PER_TURN = 1000
PENDING_MAX = 1000  # messages sent while a connection is down (zmq's default high-water mark)
PENDING_BYTES = 64 * 1024 * 1024  # and their bytes (a fork's relay sends 8 MiB buffers)
WRITE_HIGH = 16 * 1024 * 1024  # bytes the loop buffers for a kernel before a send waits (``Connection.writable``)
RECONNECT_S = 0.1  # libzmq's default reconnect interval

SOCKET_TYPES = {"shell": b"DEALER", "stdin": b"DEALER", "control": b"DEALER", "iopub": b"SUB"}
_PEERS = {b"DEALER": {b"ROUTER", b"DEALER", b"REP"}, b"SUB": {b"PUB", b"XPUB"}}
_MORE, _LONG, _COMMAND = 1, 2, 4
_GREETING_BYTES = 64
GREETING = b"\xff" + bytes(8) + b"\x7f" + bytes([3, 0]) + b"NULL".ljust(20, b"\0") + b"\0" + bytes(31)


class Again(Exception):
    """A send that cannot be queued now (zmq's ``EAGAIN``): the connection is down and ``PENDING_MAX`` messages (or
    ``PENDING_BYTES``) wait, or it is closed."""


class ProtocolError(Exception):
    """The peer broke ZMTP: the connection is dropped (and tried again, as libzmq would)."""


def _head(size: int, flags: int) -> bytes:
    return struct.pack("!BQ", flags | _LONG, size) if size > 255 else struct.pack("!BB", flags, size)


def _command(name: bytes, body: bytes = b"") -> bytes:
    payload = bytes([len(name)]) + name + body
    return _head(len(payload), _COMMAND) + payload


def _property(name: bytes, value: bytes) -> bytes:
    return bytes([len(name)]) + name + struct.pack("!I", len(value)) + value


def _properties(body: bytes) -> dict[bytes, bytes]:
    found, at = {}, 0
    while at < len(body):
        n = body[at]
        name, at = body[at + 1:at + 1 + n], at + 1 + n
        if at + 4 > len(body):
            raise ProtocolError("a READY property cut short")
        (size,) = struct.unpack_from("!I", body, at)
        found[name.lower()], at = body[at + 4:at + 4 + size], at + 4 + size
    if at != len(body):
        raise ProtocolError("a READY property cut short")
    return found


def encode(frames: Iterable[bytes | memoryview]) -> list[bytes | memoryview]:
    """``frames`` as one ZMTP message: each frame's head before it, MORE on all but the last."""
    parts = [bytes(f) if not isinstance(f, (bytes, memoryview)) else f for f in frames]
    out: list[bytes | memoryview] = []
    for i, part in enumerate(parts):
        out += [_head(memoryview(part).nbytes, _MORE if i < len(parts) - 1 else 0), part]
    return out


class _Wire(asyncio.Protocol):
    """One open ZMTP connection's bytes: the handshake, then frames, read with the module's bounds."""

    def __init__(self, owner: Connection) -> None:
        self.owner = owner
        self.transport: asyncio.Transport | None = None
        self.lost: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.buf = bytearray()
        self.state = "greeting"  # then "ready" (its READY awaited), then "open"
        self.frames: list[bytes] = []  # the message being read
        self.size = 0
        self.skipping = False  # the message being read is over a bound: its frames are dropped to its end
        self.skip = 0  # bytes of the frame being dropped still to come
        self.skip_last = False  # the frame being dropped ends its message
        self.write_paused = False
        self.backlog = False  # bytes read and not yet parsed (``FRAMES_PER_TURN``): the socket is not read meanwhile

    # --- asyncio.Protocol ----------------------------------------------------------------
    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        transport.set_write_buffer_limits(high=WRITE_HIGH)
        transport.write(GREETING)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.lost.done():
            self.lost.set_result(None)
        self.owner._lost(self)  # noqa: SLF001 - its own wire

    def pause_writing(self) -> None:
        self.write_paused = True

    def resume_writing(self) -> None:
        self.write_paused = False
        self.owner._wake_writers()  # noqa: SLF001

    def data_received(self, data: bytes) -> None:
        view = memoryview(data)
        if self.skip:
            n = min(self.skip, len(view))
            self.skip -= n
            view = view[n:]
            if not self.skip and self.skip_last:
                self.skipping = False
        if view:
            self.buf += view
            self._turn()

    def _turn(self) -> None:
        """Parse up to ``FRAMES_PER_TURN`` frames; if more bytes wait, read nothing more until the next turn parsed them."""
        try:
            done = self._parse()
        except ProtocolError:
            self.abort()
            return
        if self.transport is None or self.transport.is_closing():
            return
        if not done:
            if not self.backlog:
                self.backlog = True
                self.transport.pause_reading()
            asyncio.get_running_loop().call_soon(self._turn)
        elif self.backlog:
            self.backlog = False
            if self.owner._reading:  # noqa: SLF001 - unless its reader has too much unread
                self.transport.resume_reading()

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()

    # --- the protocol ----------------------------------------------------------------------
    def _parse(self) -> bool:
        """Parse what was read, up to ``FRAMES_PER_TURN`` frames: True when all of it was (or waits for more bytes)."""
        buf, pos, budget = self.buf, 0, FRAMES_PER_TURN
        try:
            while True:
                avail = len(buf) - pos
                if self.state == "greeting":
                    if avail < _GREETING_BYTES:
                        return True
                    self._greeting(bytes(buf[pos:pos + _GREETING_BYTES]))
                    pos += _GREETING_BYTES
                    continue
                if avail < 2:
                    return True
                if budget == 0:
                    return False
                budget -= 1
                flags = buf[pos]
                if flags & ~(_MORE | _LONG | _COMMAND):
                    raise ProtocolError(f"a frame with flags {flags:#x}")
                if flags & _LONG:
                    if avail < 9:
                        return True
                    (size,), head = struct.unpack_from("!Q", buf, pos + 1), 9
                else:
                    size, head = buf[pos + 1], 2
                if flags & _COMMAND:
                    if size > MAX_COMMAND_BYTES:
                        raise ProtocolError(f"a command of {size:,} bytes")
                    if avail < head + size:
                        return True
                    self._command(bytes(buf[pos + head:pos + head + size]))
                    pos += head + size
                    continue
                if self.state != "open":
                    raise ProtocolError("a message before the handshake's end")
                if not self.skipping and (size > MAX_FRAME_BYTES or len(self.frames) >= MAX_FRAMES
                                          or self.size + size > MAX_MESSAGE_BYTES):
                    self.skipping, self.frames, self.size = True, [], 0
                    self.owner.dropped += 1
                if self.skipping:
                    take = min(size, avail - head)
                    pos += head + take
                    if take < size:  # the rest of this frame is dropped as it comes (data_received)
                        self.skip, self.skip_last = size - take, not flags & _MORE
                        return True
                    if not flags & _MORE:
                        self.skipping = False
                    continue
                if avail < head + size:
                    return True
                self.frames.append(bytes(memoryview(buf)[pos + head:pos + head + size]))  # one copy, not two
                self.size += size
                pos += head + size
                if not flags & _MORE:
                    frames, size, self.frames, self.size = self.frames, self.size, [], 0
                    self.owner._arrived(frames, size)  # noqa: SLF001
        finally:
            del buf[:pos]

    def _greeting(self, greeting: bytes) -> None:
        if greeting[0] != 0xFF or not greeting[9] & 1 or greeting[10] < 3:
            raise ProtocolError("the peer does not speak ZMTP 3")
        mechanism = greeting[12:32].rstrip(b"\0")
        if mechanism != b"NULL":
            raise ProtocolError(f"the peer asks for the {mechanism!r} mechanism")
        ours = _property(b"Socket-Type", self.owner.socket_type)
        if self.owner.socket_type == b"DEALER":
            ours += _property(b"Identity", self.owner.identity)
        assert self.transport is not None
        self.transport.write(_command(b"READY", ours))
        self.state = "ready"

    def _command(self, body: bytes) -> None:
        if not body or len(body) < 1 + body[0]:
            raise ProtocolError("an empty command")
        name, rest = body[1:1 + body[0]], body[1 + body[0]:]
        if name == b"READY" and self.state == "ready":
            peer = _properties(rest).get(b"socket-type", b"")
            if peer not in _PEERS[self.owner.socket_type]:
                raise ProtocolError(f"a {self.owner.socket_type.decode()} cannot talk to a {peer!r}")
            self.state = "open"
            self.owner._opened(self)  # noqa: SLF001
        elif name == b"PING" and len(rest) >= 2 and self.transport is not None:
            if not self.write_paused:  # a peer that pings and never reads gets no more answers (libzmq's are optional)
                self.transport.write(_command(b"PONG", rest[2:]))
        elif name == b"ERROR" or self.state != "open":
            raise ProtocolError(f"the peer sent {name!r}")

    def write(self, frames: Iterable[bytes | memoryview]) -> None:
        assert self.transport is not None
        self.transport.writelines(encode(frames))


class Connection:
    """One of a kernel's sockets, as the server's end of it: like a connected zmq socket of ``socket_type`` (DEALER or
    SUB) at ``url`` (``ipc://path`` or ``tcp://host:port``), kept up by the running event loop until ``close``.
    ``send_multipart`` is what jupyter_client's ``Session.send`` calls; ``next`` and ``take`` hand over whole messages
    (their frames, not yet checked: ``wire.deserialize``)."""

    def __init__(self, url: str, socket_type: bytes, identity: bytes = b"", *, listen: bool = True) -> None:
        """``listen=False``: what the peer sends is read and dropped (a manager's control socket, which only sends)."""
        if socket_type not in _PEERS:
            raise ValueError(f"a {socket_type!r} socket is not spoken here")
        self.url, self.socket_type, self.identity = url, socket_type, identity
        self.linger = 1000  # ms: jupyter_client sets it on a zmq socket; ``close`` flushes what was written this long
        self.dropped = 0  # messages over a bound, skipped unread
        self._told = 0  # of them, those ``take_dropped`` returned already
        self.listen = listen
        self.closed = False
        self._messages: deque[tuple[list[bytes], int]] = deque()
        self._queued = 0  # bytes in ``_messages``
        self._pending: deque[list[bytes]] = deque()  # sent while down
        self._pending_bytes = 0
        self._waiters: set[asyncio.Future[None]] = set()  # for a message
        self._writers: set[asyncio.Future[None]] = set()  # for room to write
        self._wire: _Wire | None = None  # open, handshake done
        self._link: _Wire | None = None  # the connection made, in whatever state (``close`` drops it too)
        self._reading = True
        self._loop = asyncio.get_running_loop()
        self._task = self._loop.create_task(self._keep_up())

    def __repr__(self) -> str:
        return f"<zmtp.Connection {self.socket_type.decode()} {self.url}{' closed' if self.closed else ''}>"

    # --- the connection ---------------------------------------------------------------------
    async def _connect(self) -> _Wire:
        scheme, _, where = self.url.partition("://")
        if scheme == "ipc":
            _, wire = await self._loop.create_unix_connection(lambda: _Wire(self), where)
        elif scheme == "tcp":
            host, _, port = where.rpartition(":")
            _, wire = await self._loop.create_connection(lambda: _Wire(self), host.strip("[]"), int(port))
        else:
            raise ValueError(f"a kernel's {scheme!r} address is not spoken here: {self.url}")
        return wire

    async def _keep_up(self) -> None:
        while not self.closed:
            try:
                wire = await self._connect()
            except OSError:
                await asyncio.sleep(RECONNECT_S)
                continue
            if self.closed:
                wire.abort()
                return
            self._link = wire
            await wire.lost
            if not self.closed:
                await asyncio.sleep(RECONNECT_S)

    def _opened(self, wire: _Wire) -> None:
        if self.closed:  # its handshake ended after ``close``
            wire.abort()
            return
        self._wire = wire
        if self.socket_type == b"SUB":
            wire.write([b"\x01"])  # subscribed to every topic (ZMTP 3.0's form, which libzmq 4 reads from any peer)
        while self._pending:
            wire.write(self._pending.popleft())
        self._pending_bytes = 0
        self._reading = True  # a new connection reads until it has too much again
        self._wake_writers()

    def _lost(self, wire: _Wire) -> None:
        if self._wire is wire:
            self._wire = None

    def _arrived(self, frames: list[bytes], size: int) -> None:
        if not self.listen:
            return
        cost = size + MESSAGE_COST + FRAME_COST * len(frames)
        self._messages.append((frames, cost))
        self._queued += cost
        if self._queued > QUEUE_BYTES and self._wire is not None and self._wire.transport is not None:
            self._wire.transport.pause_reading()
            self._reading = False
        for waiter in self._waiters:
            if not waiter.done():
                waiter.set_result(None)

    # --- receiving ------------------------------------------------------------------------------
    def take_dropped(self) -> int:
        """Messages skipped past the bounds since the last call: each is told once (in a cell's answer), whenever
        it came, also between two cells."""
        count, self._told = self.dropped - self._told, self.dropped
        return count

    def ready(self) -> bool:
        """A whole message waits."""
        return bool(self._messages)

    def take(self) -> list[bytes] | None:
        """The next message's frames, or None when none waits (never waits)."""
        if not self._messages:
            return None
        frames, size = self._messages.popleft()
        self._queued -= size
        if not self._reading and self._queued <= QUEUE_BYTES // 2 and self._wire is not None:
            assert self._wire.transport is not None
            self._reading = True
            if not self._wire.backlog:  # else its next turn resumes reading
                self._wire.transport.resume_reading()
        return frames

    async def next(self, timeout: float | None = None) -> list[bytes]:
        """The next message's frames, waiting up to ``timeout`` seconds (None: for ever); ``queue.Empty`` after that.
        The loop has a turn first, even when one waits: what waits is bounded in bytes, not in messages (libzmq's
        high-water mark held 1,000), and a loop that takes a full queue of small messages (~100,000, seconds of
        decoding: jupyter_client's ``wait_for_ready`` and ``channels.drain`` after a restart in place) must not hold
        the loop while it does."""
        await asyncio.sleep(0)
        frames = self.take()
        if frames is None:
            if not await wait_any([self], timeout):
                raise queue.Empty
            frames = self.take()
            if frames is None:
                raise queue.Empty
        return frames

    # --- sending ----------------------------------------------------------------------------------
    def writable(self) -> bool:
        """A send is taken now: written (the loop's buffer below ``WRITE_HIGH``) or queued for the connection."""
        if self.closed:
            return False
        if self._wire is not None:
            return not self._wire.write_paused
        return len(self._pending) < PENDING_MAX and self._pending_bytes < PENDING_BYTES

    def send_multipart(self, frames: Sequence[bytes | memoryview], flags: int = 0, copy: bool = True,
                       track: bool = False) -> None:
        """Send one message, never waiting (``Session.send`` calls this): written, or queued while the connection is
        down; ``Again`` when ``PENDING_MAX`` messages (``PENDING_BYTES``) wait already, or it is closed (zmq raises too)."""
        if self.closed:
            raise Again(f"{self!r}")
        if self._wire is not None:
            self._wire.write(frames)
        elif len(self._pending) < PENDING_MAX and self._pending_bytes < PENDING_BYTES:
            copied = [bytes(f) for f in frames]  # the caller's buffers may change before it is up
            self._pending.append(copied)
            self._pending_bytes += sum(len(f) for f in copied)
        else:
            raise Again(f"{len(self._pending)} messages ({self._pending_bytes:,} bytes) wait for {self.url}")

    async def wait_writable(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for ``writable``; its answer."""
        if self.writable() or self.closed:
            return self.writable()
        fut = self._loop.create_future()
        self._writers.add(fut)
        try:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(fut, timeout)
        finally:
            self._writers.discard(fut)
        return self.writable()

    def _wake_writers(self) -> None:
        for fut in self._writers:
            if not fut.done():
                fut.set_result(None)

    # --- the end ----------------------------------------------------------------------------------
    def close(self, linger: int | None = None) -> None:
        """Stop keeping the connection up; what was written is flushed by the loop for ``linger`` ms (the socket's
        ``linger`` when None; 0: dropped at once; negative: for as long as it takes), as zmq's ``close``."""
        if self.closed:
            return
        self.closed = True
        if self._loop.is_closed():  # at exit (a manager's ``__del__``): the loop closed its sockets with it
            return
        self._task.cancel()
        wire, self._wire = self._wire, None
        link, self._link = self._link, None
        linger = self.linger if linger is None else linger
        if wire is not None and wire.transport is not None:
            if linger == 0:
                wire.transport.abort()
            else:
                wire.transport.close()  # flushed, for ``linger`` ms (zmq's: a peer that never reads keeps nothing)
                if linger > 0:
                    self._loop.call_later(linger / 1000, wire.transport.abort)
        if link is not None and link is not wire:  # still in its handshake: nothing of ours to flush
            link.abort()
        self._pending.clear()
        self._pending_bytes = 0
        self._wake_writers()
        for waiter in self._waiters:  # a wait for a message ends (``queue.Empty``), even one without a timeout
            if not waiter.done():
                waiter.set_result(None)


async def wait_any(connections: Sequence[Connection], timeout: float | None) -> Connection | None:
    """The first of ``connections`` that has a message, waiting up to ``timeout`` seconds; None after that. One future
    and one timer on the loop, whatever the number of connections."""
    for conn in connections:
        if conn.ready():
            return conn
    loop = asyncio.get_running_loop()
    fut: asyncio.Future[None] = loop.create_future()
    for conn in connections:
        conn._waiters.add(fut)  # noqa: SLF001 - the module's own
    timer = None if timeout is None else loop.call_later(max(timeout, 0), _settle, fut)
    try:
        await fut
    finally:
        if timer is not None:
            timer.cancel()
        for conn in connections:
            conn._waiters.discard(fut)  # noqa: SLF001
    return next((conn for conn in connections if conn.ready()), None)


def _settle(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)
