"""A cell that speaks the kernel protocol itself: everything a kernel sends is untrusted input.

A cell holds its kernel's session key, so it can put any message on IOPub, past the in-kernel
output cap and the packer. These tests do exactly that, through real MCP clients (stdio where the
defect was stdio's), and check that the server, its notebook record and the next start survive.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import anyio
import nbformat
import pytest
from mcp import Client, StdioServerParameters

from .conftest import Harness, clean_env, kernelexec_cmd, make_settings, serving, until
from .test_recording import server_pid

pytestmark = pytest.mark.anyio

# Defines _send(msg_type, content, raw=False) in the kernel: a message on IOPub, parented to the
# running request, packed as ASCII-escaped JSON (so "\ud800" reaches the server as a lone
# surrogate), or with ``raw`` bytes as the content part itself (anything at all, even not an object).
SENDER = r'''
import json as _json
_k = get_ipython().kernel
def _send(msg_type, content, raw=False):
    s = _k.session
    old = s.pack
    s.pack = lambda o: _json.dumps(o, default=str, ensure_ascii=True).encode()
    try:
        s.send(_k.iopub_socket, msg_type, content.encode() if raw else content, parent=_k.get_parent("shell"))
    finally:
        s.pack = old
'''

SURROGATES = [
    "_send('stream', {'name': 'stdout', 'text': 'a\\ud800b'})",
    "_send('display_data', {'data': {'text/plain': '\\udfff', 'text/html': '<b>\\ud800</b>'}, 'metadata': {'k\\ud800': 1}})",
    "_send('execute_result', {'data': {'text/plain': 'r\\ud800'}, 'metadata': {}, 'execution_count': 1})",
    "_send('error', {'ename': 'E\\ud800', 'evalue': 'v\\udc00', 'traceback': ['\\ud800']})",
    "_send('stream', {'name': 'stderr', 'text': '\\ud83d\\ude00 pair, then lone \\ud83d'})",
]

MALFORMED = {
    "a stream without a name": "_send('stream', {'text': 'no name'})",
    "a stream named otherwise": "_send('stream', {'name': 'stdin', 'text': 'x'})",
    "an unhashable display_id": "_send('display_data', {'data': {'text/plain': 'x'}, 'metadata': {}, 'transient': {'display_id': [1]}})",
    "an update with an unhashable display_id": "_send('update_display_data', {'data': {'text/plain': 'x'}, 'metadata': {}, 'transient': {'display_id': {}}})",
    "a display without data": "_send('display_data', {'metadata': {}})",
    "data that is not an object": "_send('display_data', {'data': ['x'], 'metadata': {}})",
    "a key that is no MIME type": "_send('display_data', {'data': {'not a mime': 'x'}, 'metadata': {}})",
    "content that is not an object": "_send('stream', '5', raw=True)",
    "content that is not JSON": "_send('stream', '{\"name\": ', raw=True)",
    "nesting beyond any message": "_send('display_data', '{\"data\": {\"application/json\": ' + '[' * 100000 + ']' * 100000 + '}}', raw=True)",
    "an error with a traceback of numbers": "_send('error', {'ename': 'E', 'evalue': 'v', 'traceback': [1, 2]})",
    "an image that is not base64": "_send('display_data', {'data': {'image/png': '!!! not base64 !!!', 'text/plain': 'p'}, 'metadata': {}})",
    "a NaN": "_send('execute_result', '{\"data\": {\"application/json\": {\"x\": NaN}}, \"metadata\": {}, \"execution_count\": 1}', raw=True)",
}


def stdio_params(state: Path) -> StdioServerParameters:
    cmd = kernelexec_cmd("serve", "--state-dir", str(state), "--pool-size", "0", "--restart-spares", "0")
    return StdioServerParameters(command=cmd[0], args=cmd[1:], env=clean_env())


@pytest.mark.slow
async def test_lone_surrogates_from_a_kernel_never_kill_the_stdio_server_or_the_next_start(short_tmp: Path) -> None:
    state = short_tmp / "surrogates"
    async with Client(stdio_params(state)) as client:
        assert not (await client.call_tool("execute_code", {"code": SENDER})).is_error
        answers = []
        for code in SURROGATES:
            answer = await client.call_tool("execute_code", {"code": code})
            assert answer.structured_content is not None and not answer.is_error, answer.content
            answers.append(answer.structured_content)
        assert answers[0]["stdout"] == "a\ufffdb"
        assert answers[3]["error"] == "E\ufffd: v\ufffd"
        after = await client.call_tool("execute_code", {"code": "1 + 1"})
        assert after.structured_content["result"] == 2  # the server is alive and answers
        handle = after.structured_content["session"]
        notebook = Path(after.structured_content["notebook"])
        nb = nbformat.read(notebook, as_version=4)
        nbformat.validate(nb)
        assert len(nb.cells) == len(SURROGATES) + 2
        assert nb.cells[1].outputs[0].text == "a\ufffdb"
        pair = next(c for c in nb.cells if "pair" in c.source)
        assert pair.outputs[0].text == "\U0001f600 pair, then lone \ufffd"
        resource = await client.read_resource(f"kernelexec://sessions/{handle}/notebook.ipynb")
        assert nbformat.reads(resource.contents[0].text, as_version=4).cells[1].outputs[0].text == "a\ufffdb"
    # the next serve, exec and replay on the same state directory work
    done = subprocess.run(kernelexec_cmd("exec", "--state-dir", str(state), "result = 6 * 7"),
                          env=clean_env(), capture_output=True, timeout=120)
    assert done.returncode == 0 and json.loads(done.stdout)["result"] == 42, done.stderr
    replayed = subprocess.run(kernelexec_cmd("replay", "--state-dir", str(state), str(notebook.parent)),
                              env=clean_env(), capture_output=True, timeout=180)
    assert replayed.returncode in (0, 1), replayed.stderr  # 2 would be: could not replay at all
    assert b"Traceback" not in replayed.stderr and b"cells:" in replayed.stdout


async def test_one_broken_session_directory_is_skipped_at_start(short_tmp: Path) -> None:
    state = short_tmp / "broken-dir"
    sessions = state / "sessions"
    broken = sessions / "brokenhandle1"
    broken.mkdir(parents=True)
    (broken / "journal.jsonl").write_bytes(b'{"cell_type": "code", "source": "x", "outputs": [], "metadata": {}}\n')
    (broken / "notebook.ipynb").mkdir()  # cannot be replaced by a file: rebuilding it fails
    async with Client(stdio_params(state)) as client:
        answer = await client.call_tool("execute_code", {"code": "1 + 1"})
        assert answer.structured_content["result"] == 2


@pytest.fixture(scope="module")
async def hostile(short_tmp: Path):  # type: ignore[no-untyped-def]
    async with serving(make_settings(short_tmp, pool_size=0, restart_spares=0)) as h:
        yield h


async def test_code_with_a_lone_surrogate_is_refused_before_it_reaches_the_kernel(hostile: Harness) -> None:
    """A JSON client can send "\\ud800" (stdio clients cannot even encode it): refused with a clear
    error, never an unexpected one, and nothing half-recorded."""
    s = await hostile.new_session()
    for code in ["x = '\ud800'", "print('\udcff')"]:
        refused = await hostile.call("execute_code", code=code, session=s)
        assert refused.is_error and "lone UTF-16 surrogate" in refused.content[0].text
    ok = await hostile.run("'\U0001f600'", session=s)
    assert ok["result"] == "\U0001f600"
    assert [c.source for c in nbformat.read(ok["notebook"], as_version=4).cells] == ["'\U0001f600'"]


@pytest.mark.parametrize("what", list(MALFORMED))
async def test_a_malformed_message_is_dropped_and_the_cell_still_reaches_the_record(hostile: Harness, what: str) -> None:
    s = await hostile.new_session()
    await hostile.run(SENDER, session=s)
    code = MALFORMED[what] + "\nprint('after')\nmarker = 1"
    answer = await hostile.run(code, session=s)
    assert answer["stdout"] == "after\n"
    assert answer["success"], answer
    if what == "a NaN":  # not JSON, but harmless once read as null: kept, nothing dropped
        assert answer["notes"] == []
    else:
        assert any("the server dropped" in note for note in answer["notes"]), answer["notes"]
    journal = Path(answer["notebook"]).with_name("journal.jsonl").read_text().splitlines()
    assert json.loads(journal[-1])["source"] == code  # the audit record has no hole
    nb = nbformat.read(answer["notebook"], as_version=4)
    nbformat.validate(nb)
    assert nb.cells[-1].source == code
    assert (await hostile.run("marker", session=s))["result"] == 1


def _hwm_kb(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmHWM:")))


@pytest.mark.slow
async def test_a_stream_flood_past_the_kernel_cap_keeps_the_server_small_and_others_responsive(short_tmp: Path) -> None:
    state = short_tmp / "flood"
    async with Client(stdio_params(state)) as client:
        other = (await client.call_tool("new_session", {})).structured_content["session"]
        await client.call_tool("execute_code", {"code": "1", "session": other})
        sender = await client.call_tool("execute_code", {"code": SENDER})
        flooding_now = Path(sender.structured_content["notebook"]).parent / "work" / "flooding"
        pid = server_pid(state)
        before = _hwm_kb(pid)
        flood = ("open('flooding', 'w').close()\nchunk = 'x' * (1 << 20)\nfor i in range(300):\n    _k.session.send(_k.iopub_socket, 'stream', "
                 "{'name': 'stdout', 'text': chunk}, parent=_k.get_parent('shell'))\nprint('end')")
        latencies: list[float] = []
        answer: dict = {}

        async def flooding() -> None:
            result = await client.call_tool("execute_code", {"code": flood, "timeout": 300})
            answer.update(result.structured_content)

        async with anyio.create_task_group() as tg:
            tg.start_soon(flooding)
            await until(flooding_now.exists, "the flood never began")  # the latencies below are timed during it
            while not answer:
                t = time.monotonic()
                r = await client.call_tool("execute_code", {"code": "1 + 1", "session": other})
                latencies.append(time.monotonic() - t)
                assert r.structured_content["result"] == 2
        growth_mb = (_hwm_kb(pid) - before) / 1024
    assert answer["success"], answer
    assert len(answer["stdout"]) < 100_000 and answer["stdout"].endswith("end\n")
    assert any(n.startswith("stdout: 314,572,80") and "past the server's per-cell cap" in n for n in answer["notes"]), answer["notes"]
    assert answer["stdout_file"] and Path(answer["stdout_file"]).stat().st_size >= 60_000_000
    assert growth_mb < 250, f"server high-water mark grew {growth_mb:.0f} MB for a 300 MiB flood"
    latencies.sort()
    assert latencies, "the flood ended before another call could be timed"
    p99 = latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))]
    assert p99 < 1.0, f"another session's 1+1 p99 was {p99:.2f} s during the flood"


def test_the_door_refuses_oversized_parts_and_non_finite_numbers() -> None:
    from kernelexec.kernel import wire
    with pytest.raises(ValueError, match="more than"):
        wire.loads(b'"' + b"x" * wire.MAX_PART_BYTES + b'"')
    assert wire.loads(b'{"a": 1e999, "b": -1e999, "c": NaN, "d": 1.5}') == {"a": None, "b": None, "c": None, "d": 1.5}
    assert wire.loads(b'{"k\\ud800": "\\ud83d\\ude00 \\udfff"}') == {"k\ufffd": "\U0001f600 \ufffd"}


# A cell sends, on one of its kernel's own sockets, one message whose frames all point at one buffer (``copy=False``):
# the kernel holds one buffer, the wire carries them all. Sent from the IOPub thread, or the cell's own stdin socket
# (to the server's identity, which the kernel keeps for input()).
_IOPUB = "t = get_ipython().kernel.iopub_thread\nt.schedule(lambda: t.socket.send_multipart(frames, copy=False))\n"
_STDIN = ("k = get_ipython().kernel\nident = k._parent_ident['shell']\n"
          "k.stdin_socket.send_multipart((ident if isinstance(ident, list) else [ident]) + frames, copy=False)\n")


@pytest.mark.slow
@pytest.mark.parametrize(("send", "frame_mib", "count"), [
    pytest.param(_IOPUB, 64, 16, id="iopub-frames-over-the-part-cap"),
    pytest.param(_IOPUB, 40, 24, id="iopub-frames-under-the-part-cap"),
    pytest.param(_STDIN, 40, 24, id="stdin-frames-under-the-part-cap"),
])
async def test_one_message_of_many_frames_does_not_grow_the_server_by_what_the_kernel_never_held(
        short_tmp: Path, send: str, frame_mib: int, count: int) -> None:
    """libzmq received a whole multipart message into the server's memory before anything of kernelexec saw it, and
    ZMQ_MAXMSGSIZE bounds one frame, not their number: 16 frames of one 64 MiB buffer grew the server by 1,087 MB
    (300 would be 19 GiB, for one cell of any profile). The server's end of a kernel's sockets is ``kernel.zmtp``
    now, which skips a message past its bounds as the bytes come, without holding them; the session goes on."""
    state = short_tmp / "frames"
    async with Client(stdio_params(state)) as client:
        first = await client.call_tool("execute_code", {"code": "1"})
        assert first.structured_content["success"], first.structured_content
        pid = server_pid(state)
        before = _hwm_kb(pid)
        code = (f"buf = bytearray({frame_mib} << 20)\nframes = [b'x'] + [memoryview(buf)] * {count}\n"
                f"{send}'sent'")
        sent = await client.call_tool("execute_code", {"code": code, "timeout": 120})
        assert sent.structured_content["result"] == "sent", sent.structured_content
        after = await client.call_tool("execute_code", {"code": "1 + 1"})  # its answer comes after the big message
        assert after.structured_content["result"] == 2
        await anyio.sleep(2)
        growth_mb = (_hwm_kb(pid) - before) / 1024
        last = await client.call_tool("execute_code", {"code": "3"})
    assert growth_mb < 300, f"the server's high-water mark grew {growth_mb:.0f} MB for a kernel holding {frame_mib} MiB"
    # nothing skipped silently: the answer of the cell during which it was skipped says so (the kernel sends it on its
    # own thread, so it may be the next cell's); one message, said once
    notes = [n for answer in (sent, after, last) for n in answer.structured_content["notes"] if "past the server's bounds" in n]
    assert len(notes) == 1 and notes[0].startswith("the server dropped a kernel message"), \
        [answer.structured_content["notes"] for answer in (sent, after, last)]
