"""No cell sets the server's pace: whatever a kernel sends on its stdin channel, and however it stops reading
the replies, the server's event loop keeps serving every other session, and the cell ends by its own timeout
with a small answer and a small journal line. Written as the attacks, judged from outside (a real MCP client,
real kernels)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import pytest
from mcp import Client
from mcp_types import ElicitResult

from kernelexec.server.build import build_server
from kernelexec.session.manager import SessionManager

from .conftest import make_settings, until

pytestmark = pytest.mark.anyio


async def decline(context: Any, params: Any) -> ElicitResult:
    """A human who declines every question at once (the fastest a question can be answered), but for the one
    asked after the attack ("again?"), answered "yes"."""
    if "again?" in params.message:
        return ElicitResult(action="accept", content={"answer": "yes"})
    return ElicitResult(action="decline")


# input_requests sent straight on the kernel's stdin socket with its own session key, never reading a reply
FREEZER = """\
k = get_ipython().kernel
parent, ident = k.get_parent('shell'), k._parent_ident['shell']
open('flooding', 'w').close()
while True:
    k.session.send(k.stdin_socket, 'input_request', {'prompt': 'x', 'password': False}, parent=parent, ident=ident)
"""

# input() asked in a loop, every answer declined (EOFError), forever; a thread keeps the server's IOPub loop awake
# (messages parented elsewhere, dropped by the server) so each question follows the last within a millisecond
DECLINED_FLOOD = """\
import threading, time
k = get_ipython().kernel
running = True
def wake():
    while running:
        k.session.send(k.iopub_socket, 'stream', {'name': 'stdout', 'text': ''}, parent={'msg_id': 'elsewhere'})
        time.sleep(0.0005)
threading.Thread(target=wake, daemon=True).start()
open('flooding', 'w').close()
n = 0
try:
    while True:
        try:
            input('q? ')
        except EOFError:
            n += 1
finally:
    running = False
"""


async def _attack_while_timing_another_session(code: str, timeout: float, short_tmp: Path) -> tuple[dict, list[float], float, Path]:
    """Run ``code`` in one session while another session's ``x = 1`` calls are timed; returns the attacking
    call's structured answer (plus its whole answer's size), the other session's latencies, the attacking
    call's duration, and the attacking session's journal."""
    settings = make_settings(short_tmp, pool_size=0, restart_spares=0)
    answer: dict[str, Any] = {}
    latencies: list[float] = []
    async with SessionManager(settings).running() as sessions:
        async with Client(build_server(settings, sessions), mode="legacy", elicitation_callback=decline) as client:
            attacker: Any = (await client.call_tool("new_session", {})).structured_content["session"]
            other: Any = (await client.call_tool("new_session", {})).structured_content["session"]
            first: Any = (await client.call_tool("execute_code", {"code": "1", "session": attacker})).structured_content
            r: Any = (await client.call_tool("execute_code", {"code": "1", "session": other})).structured_content
            assert r["success"], r
            session_dir = Path(first["notebook"]).parent
            flooding = session_dir / "work" / "flooding"
            took: list[float] = []

            async def attack() -> None:
                t = time.monotonic()
                result = await client.call_tool("execute_code", {"code": code, "session": attacker, "timeout": timeout})
                took.append(time.monotonic() - t)
                answer.update(result.structured_content or {})
                answer["_answer_bytes"] = len(json.dumps([c.model_dump() for c in result.content])) + len(
                    json.dumps(result.structured_content))

            with anyio.fail_after(120):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(attack)
                    await until(flooding.exists, "the attack never began")
                    while not answer:
                        t = time.monotonic()
                        r = (await client.call_tool("execute_code", {"code": "x = 1", "session": other})).structured_content
                        latencies.append(time.monotonic() - t)
                        assert r["success"], r
                        await anyio.sleep(0.05)
            r = (await client.call_tool("execute_code", {"code": "2 + 2", "session": attacker})).structured_content
            assert r["result"] == 4, {k: r.get(k) for k in ("error_type", "error", "ending", "notes")}  # the attacked session still works after
            r = (await client.call_tool("execute_code", {"code": "input('again? ')", "session": attacker})).structured_content
            # and its next question gets its own answer, no stale reply of the attack
            assert r["result"] == "yes", {k: r.get(k) for k in ("error_type", "error", "ending", "notes", "restart_reason")}
    print(f"attack: ending={answer.get('ending')} took={took[0]:.1f}s answer={answer.get('_answer_bytes')} B; other session: "
          f"{len(latencies)} calls, max {max(latencies, default=0):.2f}s; journal {(session_dir / 'journal.jsonl').stat().st_size} B; "
          f"notes={answer.get('notes')}")
    return answer, latencies, took[0], session_dir / "journal.jsonl"


@pytest.mark.parametrize("sigint", ["honoured", "ignored"])
async def test_a_cell_flooding_input_requests_and_never_reading_replies_does_not_freeze_other_sessions(
        sigint: str, short_tmp: Path) -> None:
    code = FREEZER if sigint == "honoured" else "import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\n" + FREEZER
    answer, latencies, took, journal = await _attack_while_timing_another_session(code, 8, short_tmp)
    assert latencies, "the attack ended before another session's call could be timed"
    assert max(latencies) < 2.0, f"another session's x = 1 took {max(latencies):.2f} s during the attack: {latencies}"
    # a hung kernel is interrupted, then restarted (whether the interrupt ended the cell or not), and the answer says why
    assert answer["ending"] == "restarted", answer
    assert "stopped reading" in json.dumps(answer), answer
    assert any("stopped reading" in n for n in answer["notes"]), answer["notes"]
    assert took < 8 + 3 + 15, f"the attacking cell ran {took:.1f} s with a timeout of 8 s"
    assert answer["_answer_bytes"] < 20_000, answer["_answer_bytes"]
    assert journal.stat().st_size < 60_000, journal.stat().st_size


# input_requests that the server answers after the kernel closed its stdin socket: the replies wait in the
# server's socket, as when a cell that never reads them is cut by its timeout before its channel fills
UNREAD_THEN_TIMEOUT = """\
import signal, time
signal.signal(signal.SIGINT, signal.SIG_IGN)
k = get_ipython().kernel
parent, ident = k.get_parent('shell'), k._parent_ident['shell']
for _ in range(300):
    k.session.send(k.stdin_socket, 'input_request', {'prompt': 'x', 'password': False}, parent=parent, ident=ident)
k.stdin_socket.close(linger=1000)
while True:
    time.sleep(1)
"""

# what waits on the new kernel's stdin socket that it never asked for (it reads nothing there until an input())
UNASKED_ON_STDIN = """\
import time
k = get_ipython().kernel
time.sleep(1)
unasked = []
while k.stdin_socket.poll(500):
    unasked.append(k.session.recv(k.stdin_socket)[1]['content'])
unasked[:3], len(unasked)
"""


async def test_replies_the_old_kernel_never_read_do_not_reach_the_kernel_of_the_restart(short_tmp: Path) -> None:
    """A restart in place reuses the client and the kernel's ports: replies queued for the old process must not be
    delivered to the new one, whose next input() would take the first as its answer (a stale decline: EOFError)."""
    settings = make_settings(short_tmp, pool_size=0, restart_spares=0)
    async with SessionManager(settings).running() as sessions:
        async with Client(build_server(settings, sessions), mode="legacy", elicitation_callback=decline) as client:
            s: Any = (await client.call_tool("new_session", {})).structured_content["session"]
            r: Any = (await client.call_tool("execute_code", {"code": UNREAD_THEN_TIMEOUT, "session": s, "timeout": 5})).structured_content
            assert r["ending"] == "restarted", r
            assert any("got no answer" in n for n in r["notes"]), r["notes"]  # the server did answer its questions
            r = (await client.call_tool("execute_code", {"code": UNASKED_ON_STDIN, "session": s})).structured_content
            assert r["result"] == [[], 0], r  # before the fix: 300 stale declines ({"value": "\x04"})
            r = (await client.call_tool("execute_code", {"code": "input('again? ')", "session": s})).structured_content
            assert r["result"] == "yes", {k: r.get(k) for k in ("error_type", "error", "ending", "notes")}


# A few questions asked without reading the answers (far under the channel's high-water mark, so never "hung"),
# then the cell ends by itself: what a flood on a slow machine looks like when its timeout comes first
FEW_UNREAD = """\
k = get_ipython().kernel
parent, ident = k.get_parent('shell'), k._parent_ident['shell']
for _ in range(50):
    k.session.send(k.stdin_socket, 'input_request', {'prompt': 'x', 'password': False}, parent=parent, ident=ident)
import time
time.sleep(1)
'ended'
"""


async def test_a_kernel_that_asks_again_before_its_answer_is_sent_is_not_kept_after_its_cell(short_tmp: Path) -> None:
    """CI at 022b0a5 (a slower machine): FREEZER's flood had sent only 898 questions by its 8 s timeout, under the
    channel's high-water mark, so it was never "hung"; the interrupt ended it and the kernel was kept with its
    replies unread. A kernel that asks again before the answer to its last question was even sent does not read its
    replies (input() waits for each): it is restarted once the cell ends, however it ends, and the next input() is
    answered by its own reply."""
    settings = make_settings(short_tmp, pool_size=0, restart_spares=0)
    async with SessionManager(settings).running() as sessions:
        async with Client(build_server(settings, sessions), mode="legacy", elicitation_callback=decline) as client:
            s: Any = (await client.call_tool("new_session", {})).structured_content["session"]
            r: Any = (await client.call_tool("execute_code", {"code": FEW_UNREAD, "session": s, "timeout": 30})).structured_content
            assert r["result"] == "ended" and r["ending"] == "restarted", r  # before: "completed", the kernel kept
            assert "asked again before the answer" in r["restart_reason"], r
            assert r["error_type"] == "KernelRestarted" and r["error"].startswith("KernelRestarted: "), r  # not a timeout
            assert any("stopped reading the server's replies" in n for n in r["notes"]), r["notes"]
            r = (await client.call_tool("execute_code", {"code": UNASKED_ON_STDIN, "session": s})).structured_content
            assert r["result"] == [[], 0], r
            r = (await client.call_tool("execute_code", {"code": "input('again? ')", "session": s})).structured_content
            assert r["result"] == "yes", {k: r.get(k) for k in ("error_type", "error", "ending", "notes")}
            r = (await client.call_tool("execute_code", {"code": "[input('again? ') for _ in range(3)]", "session": s})).structured_content
            assert r["result"] == ["yes"] * 3 and r["ending"] == "completed", r  # questions asked one at a time: kept


async def test_a_flood_of_declined_input_questions_ends_at_the_timeout_with_a_small_answer_and_record(short_tmp: Path) -> None:
    answer, latencies, took, journal = await _attack_while_timing_another_session(DECLINED_FLOOD, 5, short_tmp)
    assert took < 5 + 3 + 5, f"a 5 s cell ran {took:.1f} s"
    assert answer["ending"] in ("interrupted", "restarted"), answer
    notes = answer.get("notes") or []
    assert len(json.dumps(notes)) < 1_500, notes[:5]
    assert any("got no answer" in n for n in notes), notes
    assert answer["_answer_bytes"] < 20_000, answer["_answer_bytes"]
    lines = journal.read_text().splitlines()
    flood_line = next(line for line in lines if "input('q? ')" in line)
    assert len(flood_line) < 20_000, f"the journal line is {len(flood_line):,} bytes"
    assert latencies and max(latencies) < 2.0, latencies


WAIT = 3.0  # a stalled send's deadline in the two tests below: a loop held through it is one gap this long


async def _ticks_during(send: Any) -> tuple[BaseException | None, float, float]:
    """Run ``send()`` while a task ticks every 10 ms on the event loop: (what it raised, the longest gap between two
    ticks or from the last tick to the send's end, seconds). A send that holds the loop shows as one gap as long as
    its wait; a busy machine's moment without the CPU as a shorter one (a count of ticks against the ideal pace
    mistook the second for the first once under load, and could miss a held wait at the end of a long flood)."""
    longest = 0.0
    last = 0.0
    ticking = anyio.Event()
    raised: list[BaseException] = []

    async def tick() -> None:
        nonlocal longest, last
        last = time.monotonic()
        ticking.set()
        while True:
            await anyio.sleep(0.01)
            now = time.monotonic()
            longest, last = max(longest, now - last), now

    started = time.monotonic()
    async with anyio.create_task_group() as tg:
        tg.start_soon(tick)
        await ticking.wait()  # the ticker runs before the send can hold the loop
        try:
            await send()
        except Exception as exc:  # noqa: BLE001 - reported to the caller
            raised.append(exc)
        longest = max(longest, time.monotonic() - last)
        tg.cancel_scope.cancel()
    return (raised[0] if raised else None), longest, time.monotonic() - started


async def test_a_kernel_socket_the_kernel_never_reads_is_a_stall_not_a_frozen_loop() -> None:
    """The local backends' transport: the server's end of a kernel's socket (``kernel.zmtp``) to libzmq's own ROUTER,
    which never reads: the loop's write buffer fills to ``zmtp.WRITE_HIGH``, then a send waits, then it is a stall."""
    import zmq
    from jupyter_client.session import Session

    from kernelexec.kernel import channels, zmtp
    from kernelexec.kernel.stdin import KernelStalled, send_to_kernel

    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    router.set(zmq.RCVHWM, 10)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    session = Session(key=b"k")
    channel = channels.Channel(zmtp.Connection(f"tcp://127.0.0.1:{port}", b"DEALER", b"server"), session)
    try:
        async def flood() -> None:
            for _ in range(100_000):
                await send_to_kernel(channel, session.msg("input_reply", {"value": "x" * 10_000}), within=WAIT)

        raised, longest, took = await _ticks_during(flood)
    finally:
        channel.socket.close(linger=0)
        router.close(linger=0)
        ctx.term()
    assert isinstance(raised, KernelStalled), raised
    assert took < WAIT + 5 and longest < WAIT * 2 / 3, (took, longest)  # the loop turned through the wait


async def test_a_blocking_channel_send_runs_off_the_loop_and_is_abandoned_at_its_deadline() -> None:
    """A gateway's transport: a channel whose send is a blocking write (a WebSocket) on a real connection whose
    peer never reads."""
    import socket

    from kernelexec.kernel.stdin import KernelStalled, send_to_kernel

    ours, peer = socket.socketpair()

    class Channel:  # the shape of gateway_channels._Channel: a named channel with a blocking send
        channel_name = "stdin"

        def send(self, msg: dict[str, Any]) -> None:
            ours.sendall(json.dumps(msg).encode() * 10_000)

    try:
        async def once() -> None:
            await send_to_kernel(Channel(), {"value": "x" * 1000}, within=WAIT)

        raised, longest, took = await _ticks_during(once)
    finally:
        ours.close()  # the abandoned writer's sendall ends with an error
        peer.close()
    assert isinstance(raised, KernelStalled), raised
    assert took < WAIT + 1.5 and longest < WAIT * 2 / 3, (took, longest)


async def test_a_large_kernel_message_is_verified_and_decoded_off_the_event_loop() -> None:
    """A stream flood's 1 MiB messages each cost the event loop ~11 ms (up to 50 ms under load) of HMAC and JSON
    decoding, and another session's calls waited behind one per turn of the loop. A large message is checked and
    decoded in a worker thread: the loop keeps turning while it is (before: not once during the receive)."""
    import zmq
    from jupyter_client.session import Session

    from kernelexec.kernel import channels, wire, zmtp

    kernel_ctx = zmq.Context()
    kernel = kernel_ctx.socket(zmq.ROUTER)  # a kernel's shell socket, libzmq's own; ours is the server's end
    port = kernel.bind_to_random_port("tcp://127.0.0.1")
    ours = zmtp.Connection(f"tcp://127.0.0.1:{port}", b"DEALER", b"server")
    session = wire.harden(Session(key=b"k"))

    class Client:  # what receive asks of a kernel client: its channel, with the socket and the session
        iopub_channel = channels.Channel(ours, session)

    text = "x" * (32 << 20)
    turns = 0

    async def turning() -> None:
        nonlocal turns
        while True:
            turns += 1
            await anyio.lowlevel.checkpoint()

    try:
        ours.send_multipart([b"hello"])
        with anyio.fail_after(30):
            while not kernel.poll(0):
                await anyio.sleep(0.01)
        assert kernel.recv_multipart() == [b"server", b"hello"]
        Session(key=b"k").send(kernel, "stream", {"name": "stdout", "text": text}, parent={"msg_id": "m"}, ident=[b"server"])
        with anyio.fail_after(30):  # it waits whole: receive takes it at once
            while not ours.ready():
                await anyio.sleep(0.01)
        async with anyio.create_task_group() as tg:
            tg.start_soon(turning)
            await anyio.lowlevel.checkpoint()
            before = turns
            msg = await channels.receive(Client, "iopub", 5)
            during = turns - before
            tg.cancel_scope.cancel()
    finally:
        ours.close(linger=0)
        kernel.close(linger=0)
        kernel_ctx.term()
    assert len(msg["content"]["text"]) == len(text) and msg["parent_header"] == {"msg_id": "m"}
    assert during >= 10, f"the event loop turned {during} times while a 32 MiB message was verified and decoded"
