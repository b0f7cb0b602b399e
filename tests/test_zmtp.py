"""The server's end of a kernel's sockets (``kernel.zmtp``), against libzmq's own sockets as a kernel binds them."""

from __future__ import annotations

import asyncio
import contextlib
import queue
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import zmq
import zmq.asyncio

from kernelexec.kernel import zmtp

pytestmark = pytest.mark.anyio


@pytest.fixture
def ctx() -> Iterator[zmq.asyncio.Context]:
    context = zmq.asyncio.Context()
    yield context
    context.destroy(linger=0)


@pytest.fixture
def address(short_tmp: Path) -> str:
    return f"ipc://{short_tmp}/k-1"


@pytest.fixture
async def router(ctx: zmq.asyncio.Context, address: str) -> AsyncIterator[zmq.asyncio.Socket]:
    sock = ctx.socket(zmq.ROUTER)
    sock.bind(address)
    yield sock
    sock.close(linger=0)


async def received(sock: zmq.asyncio.Socket, timeout: float = 5.0) -> list[bytes]:
    return await asyncio.wait_for(sock.recv_multipart(), timeout)


async def test_a_dealer_and_a_router_talk_both_ways_and_the_router_knows_its_identity(router: zmq.asyncio.Socket,
                                                                                          address: str) -> None:
    conn = zmtp.Connection(address, b"DEALER", b"session-1")
    try:
        conn.send_multipart([b"<IDS|MSG>", memoryview(b"x" * 300), b""])  # short, long and empty frames
        assert await received(router) == [b"session-1", b"<IDS|MSG>", b"x" * 300, b""]
        await router.send_multipart([b"session-1", b"a", b"b" * 70_000])
        assert await conn.next(5) == [b"a", b"b" * 70_000]
        with pytest.raises(queue.Empty):
            await conn.next(0.05)
    finally:
        conn.close()


async def test_a_sub_subscribes_to_everything_and_hears_the_pub(ctx: zmq.asyncio.Context, address: str) -> None:
    pub = ctx.socket(zmq.XPUB)  # ipykernel's IOPub: it learns of the subscription, then sends
    pub.bind(address)
    conn = zmtp.Connection(address, b"SUB")
    try:
        assert await received(pub) == [b"\x01"]
        await pub.send_multipart([b"kernel.1.status", b"<IDS|MSG>", b"body"])
        assert await conn.next(5) == [b"kernel.1.status", b"<IDS|MSG>", b"body"]
    finally:
        conn.close()
        pub.close(linger=0)


async def test_what_is_sent_before_the_kernel_binds_waits_and_a_kernel_restarted_in_place_is_reconnected(
        ctx: zmq.asyncio.Context, address: str) -> None:
    conn = zmtp.Connection(address, b"DEALER", b"me")
    try:
        conn.send_multipart([b"early"])
        await asyncio.sleep(0.3)  # refused meanwhile, tried again
        first = ctx.socket(zmq.ROUTER)
        first.bind(address)
        assert await received(first) == [b"me", b"early"]
        first.close(linger=0)  # the kernel dies; a new one binds the same address
        await asyncio.sleep(0.2)
        second = ctx.socket(zmq.ROUTER)
        second.bind(address)
        try:
            for _ in range(50):  # until the connection is back: what is written to a dead one is lost, as with zmq
                conn.send_multipart([b"again"])
                try:
                    assert await received(second, 0.1) == [b"me", b"again"]
                    break
                except TimeoutError:
                    continue
            else:
                pytest.fail("never reconnected to the kernel restarted in place")
        finally:
            second.close(linger=0)
    finally:
        conn.close()
    with pytest.raises(zmtp.Again):
        conn.send_multipart([b"after close"])


async def test_a_message_past_a_bound_is_skipped_unheld_and_the_next_one_arrives(
        router: zmq.asyncio.Socket, address: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(zmtp, "MAX_FRAME_BYTES", 1000)
    monkeypatch.setattr(zmtp, "MAX_MESSAGE_BYTES", 3000)
    conn = zmtp.Connection(address, b"DEALER", b"me")
    try:
        conn.send_multipart([b"hello"])
        await received(router)
        big = b"z" * (1 << 20)  # one frame over the frame bound, read over many reads of the socket
        await router.send_multipart([b"me", b"head", big, b"tail"])
        await router.send_multipart([b"me", *[b"y" * 900] * 4])  # each frame under, the message over
        await router.send_multipart([b"me", *[b"w"] * (zmtp.MAX_FRAMES + 1)])  # too many frames
        await router.send_multipart([b"me", b"ok", b"v" * 900])
        assert await conn.next(5) == [b"ok", b"v" * 900]
        assert conn.dropped == 3
        assert (conn.take_dropped(), conn.take_dropped()) == (3, 0)  # each told once (a cell's answer says them)
        assert not conn.ready()
    finally:
        conn.close()


async def test_a_reader_that_falls_behind_stops_reading_until_it_takes(
        ctx: zmq.asyncio.Context, address: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(zmtp, "QUEUE_BYTES", 100_000)
    pub = ctx.socket(zmq.XPUB)
    pub.bind(address)
    conn = zmtp.Connection(address, b"SUB")
    try:
        await received(pub)
        for i in range(2000):  # 20 MB the server does not take
            await pub.send_multipart([b"%d" % i, b"p" * 10_000])
        await asyncio.sleep(0.5)
        held = sum(size for _, size in conn._messages)  # noqa: SLF001 - what it holds
        assert held < 100_000 + 300_000, held  # the bound, and what one read of the socket had already brought
        while conn.take() is not None:
            pass
        kept = 0
        while True:  # it reads again: what the PUB kept for it (past its high-water mark the PUB dropped)
            try:
                await conn.next(0.5)
                kept += 1
            except queue.Empty:
                break
        assert kept > 0
        await pub.send_multipart([b"after", b"drained"])
        assert (await conn.next(5))[0] == b"after"
    finally:
        conn.close()
        pub.close(linger=0)


async def test_a_peer_that_does_not_speak_zmtp_is_dropped_and_tried_again(short_tmp: Path, address: str,
                                                                          ctx: zmq.asyncio.Context) -> None:
    path = address.removeprefix("ipc://")
    accepted = 0

    async def garbage(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal accepted
        accepted += 1
        writer.write(b"HTTP/1.1 200 OK\r\n\r\n" + bytes(100))
        await reader.read()  # until the client drops it
        writer.close()

    server = await asyncio.start_unix_server(garbage, path)
    conn = zmtp.Connection(address, b"DEALER", b"me")
    try:
        await asyncio.sleep(0.5)
        assert accepted >= 2  # dropped, and tried again
        server.close()
        await server.wait_closed()
        Path(path).unlink(missing_ok=True)
        router = ctx.socket(zmq.ROUTER)
        router.bind(address)
        conn.send_multipart([b"now"])
        assert (await received(router))[-1] == b"now"
        router.close(linger=0)
    finally:
        conn.close()


async def test_a_socket_nobody_reads_drops_what_comes(router: zmq.asyncio.Socket, address: str) -> None:
    """A manager's control socket only sends (shutdown, interrupt): what a kernel sends to it is never held."""
    conn = zmtp.Connection(address, b"DEALER", b"manager", listen=False)
    try:
        conn.send_multipart([b"shutdown_request"])
        assert await received(router) == [b"manager", b"shutdown_request"]
        for _ in range(100):
            await router.send_multipart([b"manager", b"r" * 100_000])
        await router.send_multipart([b"manager", b"last"])
        await asyncio.sleep(0.5)
        assert not conn.ready() and not conn._messages  # noqa: SLF001 - what it holds
    finally:
        conn.close()


async def test_a_flood_of_empty_frames_leaves_the_event_loop_its_turns(address: str) -> None:
    """A kernel writes raw bytes to its socket: 200,000 empty one-frame messages in one write. One read of the socket
    is 256 KiB, 131,072 of them, ~0.5 s of parsing in one go while every other session waited. At most
    ``FRAMES_PER_TURN`` frames are parsed between two turns of the loop; what they hold is counted at what it costs
    (``MESSAGE_COST``), not at their empty bytes."""
    async def kernel(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(_ready(b"ROUTER") + b"\x00\x00" * 200_000)
        await writer.drain()
        await reader.read()

    server = await asyncio.start_unix_server(kernel, address.removeprefix("ipc://"))
    conn = zmtp.Connection(address, b"DEALER", b"me")
    try:
        most, seen = 0, 0
        deadline = time.monotonic() + 120
        while seen < 200_000 and time.monotonic() < deadline:  # one turn of the loop per step: what came in it
            await asyncio.sleep(0)
            came = 0
            while conn.take() is not None:
                came += 1
            most, seen = max(most, came), seen + came
        assert seen == 200_000
        assert most <= 3_000, most  # a turn may hold two slices of ``FRAMES_PER_TURN`` (a read, a backlog turn)
        conn._arrived([b""], 0)  # noqa: SLF001 - an empty message is held at what its objects cost
        assert conn._queued == zmtp.MESSAGE_COST + zmtp.FRAME_COST  # noqa: SLF001
    finally:
        conn.close()
        server.close()


async def test_what_waits_for_a_kernel_that_never_answers_is_bounded_in_bytes(short_tmp: Path, address: str) -> None:
    """A kernel that binds its socket and never greets: what is sent meanwhile waits, up to ``PENDING_BYTES`` (a fork's
    relay sends 8 MiB buffers: a thousand of them would be 8 GB), and a bounded send then says the kernel is stalled."""
    silent = await asyncio.start_unix_server(lambda reader, writer: None, address.removeprefix("ipc://"))
    conn = zmtp.Connection(address, b"DEALER", b"me")
    try:
        chunk = bytes(8 << 20)
        sent = 0
        with pytest.raises(zmtp.Again):
            for _ in range(100):
                conn.send_multipart([b"relay", chunk])
                sent += 1
        assert sent * len(chunk) <= zmtp.PENDING_BYTES + len(chunk)
        assert not conn.writable() and not await conn.wait_writable(0.2)
    finally:
        conn.close()
        silent.close()


def _ready(socket_type: bytes) -> bytes:
    """A peer's greeting and READY, as raw bytes (the kernel is free to write anything to its own socket)."""
    return zmtp.GREETING + zmtp._command(b"READY", zmtp._property(b"Socket-Type", socket_type))  # noqa: SLF001


async def test_closing_a_connection_in_its_handshake_closes_its_socket(address: str) -> None:
    """A kernel that accepts and does not greet yet: ``close`` dropped only an open connection, so this one stayed
    up, and when the peer greeted after the ``close`` it came alive on the closed ``Connection``, holding up to
    ``QUEUE_BYTES`` of what the peer sent, which nobody would ever take."""
    ends: list[bytes] = []
    accepted, closed = asyncio.Event(), asyncio.Event()

    async def late(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.set()
        await closed.wait()
        with contextlib.suppress(OSError):
            writer.write(_ready(b"ROUTER") + b"".join(bytes(p) for p in zmtp.encode([b"x" * 100_000])) * 10)
            await writer.drain()
        with contextlib.suppress(OSError):
            await reader.read()  # our greeting, then EOF (or a reset) once the connection is dropped
        ends.append(b"end")
        writer.close()

    server = await asyncio.start_unix_server(late, address.removeprefix("ipc://"))
    conn = zmtp.Connection(address, b"DEALER", b"me")
    try:
        await asyncio.wait_for(accepted.wait(), 5)
        await asyncio.sleep(0.1)
        conn.close()
        closed.set()
        await asyncio.sleep(0.5)
        assert conn._wire is None and not conn._messages, conn._queued  # noqa: SLF001 - what it holds
        assert ends, "the connection stayed open after close()"
    finally:
        conn.close()
        server.close()


async def test_a_closed_connection_whose_peer_never_reads_lets_go_after_its_linger(address: str) -> None:
    """``close`` flushes what was written for ``linger`` ms, as zmq does (jupyter_client sets 1000), then drops it: a
    kernel that lives on and never reads (a replay's second client is closed, the session's kernel stays) held the
    closed connection open, its socket and its written bytes, for as long as it lived."""
    async def deaf(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(_ready(b"ROUTER"))
        await asyncio.sleep(30)  # never reads

    server = await asyncio.start_unix_server(deaf, address.removeprefix("ipc://"))
    conn = zmtp.Connection(address, b"DEALER", b"me")
    try:
        for _ in range(100):
            if conn._wire is not None:  # noqa: SLF001
                break
            await asyncio.sleep(0.02)
        assert conn._wire is not None  # noqa: SLF001
        lost = asyncio.Event()
        conn._lost = lambda wire: lost.set()  # type: ignore[method-assign]  # its connection_lost
        for _ in range(40):
            conn.send_multipart([b"x" * 1_000_000])
        conn.linger = 200
        conn.close()
        await asyncio.wait_for(lost.wait(), 2)  # its socket closed, what it held let go
    finally:
        conn.close()
        server.close()


async def test_taking_a_full_queue_in_a_loop_leaves_the_event_loop_its_turns(address: str) -> None:
    """The queue is bounded in bytes (``QUEUE_BYTES``), not in messages as libzmq's high-water mark (1,000) bounded
    it: a cell that floods its IOPub faster than the server decodes, then hangs, leaves ~100,000 small signed messages
    on a connection that outlives the restart in place, and the loops that take what waits after it (jupyter_client's
    ``wait_for_ready``, ``channels.drain``; ``Channel.get_msgs``) took them all in one go, since ``next`` never waited
    for a message that was there: ~3.5 s of decoding in which no other session ran. Each ``next`` lets the loop have
    a turn."""
    count = 20_000

    async def flood(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(_ready(b"PUB") + b"\0\0" * count)  # empty one-frame messages
        await reader.read()

    server = await asyncio.start_unix_server(flood, address.removeprefix("ipc://"))
    conn = zmtp.Connection(address, b"SUB")
    turns = 0

    async def other_session() -> None:
        nonlocal turns
        while True:
            await asyncio.sleep(0)
            turns += 1

    try:
        for _ in range(200):
            if len(conn._messages) == count:  # noqa: SLF001 - what it holds
                break
            await asyncio.sleep(0.02)
        assert len(conn._messages) == count  # noqa: SLF001
        other = asyncio.create_task(other_session())
        await asyncio.sleep(0)
        turns = 0
        for _ in range(count):
            await conn.next(0)
        other.cancel()
        assert turns >= count // 2, turns  # one turn of the loop per message taken (none: all in one go)
    finally:
        conn.close()
        server.close()


async def test_closing_ends_a_wait_for_a_message_even_one_without_a_timeout(router: zmq.asyncio.Socket, address: str) -> None:
    conn = zmtp.Connection(address, b"DEALER", b"me")
    waiting = asyncio.ensure_future(conn.next(None))
    await asyncio.sleep(0.1)
    conn.close()
    with pytest.raises(queue.Empty):
        await asyncio.wait_for(waiting, 5)


async def test_draining_after_a_restart_drops_a_message_that_does_not_decode(router: zmq.asyncio.Socket,
                                                                              address: str) -> None:
    """What waits on shell when a restart drains it may be anything the old kernel sent: one that does not decode is
    dropped with the rest, and the restart goes on (it raised out of the restart before)."""
    from types import SimpleNamespace

    from jupyter_client.session import Session

    from kernelexec.kernel import channels, wire

    session = wire.harden(Session(key=b"k"))
    shell = channels.Channel(zmtp.Connection(address, b"DEALER", b"me"), session)
    try:
        shell.socket.send_multipart([b"hello"])
        await received(router)
        await router.send_multipart([b"me", b"not a message"])
        session.send(zmq.Socket.shadow(router.underlying), "status", {"execution_state": "idle"}, ident=[b"me"])
        while len(shell.socket._messages) < 2:  # noqa: SLF001 - both wait
            await asyncio.sleep(0.01)
        kc = SimpleNamespace(stdin_channel=None, iopub_channel=shell, shell_channel=shell)
        await channels.drain(kc)
        assert not shell.socket.ready()
    finally:
        shell.stop()
