"""stdio's pipes on the event loop (server/stdio_pipes.py, issue 35's per-call overhead): lines read whole however
the pipe cuts them, answers written whole past a full pipe, fd 0 and 1 diverted while serving and put back after,
and a real ``kernelexec serve`` under the SDK's own client with no thread parked in a read of its request pipe
(the SDK's default transport keeps one there: a thread hop per request)."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import threading
import time
from pathlib import Path

import anyio
import pytest
from mcp import Client

from kernelexec.server.stdio_pipes import CHUNK, PipeLines, PipeWriter

from .support import stdio_params

pytestmark = pytest.mark.anyio

READ_SYSCALL = {"x86_64": 0, "aarch64": 63}.get(platform.machine())


async def test_lines_come_whole_across_chunks_and_split_characters() -> None:
    r, w = os.pipe()
    os.set_blocking(r, False)
    long_line = "é" * (CHUNK // 2 + 7) + "€ end"  # its two- and three-byte characters straddle the reads' chunks
    huge_line = "x" * (40 * CHUNK)  # a request of megabytes: many reads before its line break
    payload = (long_line + "\n" + "short\n" + huge_line + "\n" + "no newline at the end").encode()

    def feed() -> None:
        for i in range(0, len(payload), 4093):  # odd pieces, with pauses: reads find partial lines
            os.write(w, payload[i:i + 4093])
            if i % 64 == 0:
                time.sleep(0.001)
        os.close(w)

    writer = threading.Thread(target=feed)
    writer.start()
    try:
        lines = [line async for line in PipeLines(r)]
    finally:
        writer.join()
        os.close(r)
    assert lines == [long_line + "\n", "short\n", huge_line + "\n", "no newline at the end"]


async def test_an_answer_larger_than_the_pipe_is_written_whole_and_in_order() -> None:
    r, w = os.pipe()
    os.set_blocking(w, False)
    answers = [f"{i:04d}" + "x" * 300_000 + "\n" for i in range(4)]  # each far past a pipe's 64 KiB
    received = bytearray()

    def drain() -> None:
        while chunk := os.read(r, 8192):
            received.extend(chunk)
            time.sleep(0.0005)  # a slow reader: the writer meets a full pipe

    reader = threading.Thread(target=drain)
    reader.start()
    try:
        out = PipeWriter(w)
        for answer in answers:
            await out.write(answer)
            await out.flush()
    finally:
        os.close(w)
        reader.join()
        os.close(r)
    assert received.decode() == "".join(answers)


def test_fd_0_and_1_are_diverted_while_serving_and_put_back_after(tmp_path: Path) -> None:
    """Inside: fd 0 reads the null device, fd 1 is stderr (a stray print misses the wire); after: both are the pipes."""
    script = r"""
import os, sys, anyio
from kernelexec.server.stdio_pipes import stdio_streams

def ident(fd):
    st = os.fstat(fd)
    return (st.st_dev, st.st_ino)

wire_in, wire_out, null, err = ident(0), ident(1), os.stat(os.devnull), ident(2)

async def main():
    async with stdio_streams() as (requests, answers):
        assert ident(0) == (null.st_dev, null.st_ino), "fd 0 is not the null device while serving"
        assert ident(1) == err, "fd 1 is not stderr while serving"
        os.write(1, b"stray\n")
        async for _ in requests:  # none: the client closed its end
            pass
        await answers.aclose()
    assert ident(0) == wire_in and ident(1) == wire_out, "fd 0/1 not put back"
    assert os.get_blocking(0) and os.get_blocking(1), "the pipes left non-blocking"

anyio.run(main)
os.write(1, b"done\n")
"""
    proc = subprocess.run([sys.executable, "-c", script], input=b"", capture_output=True,
                          timeout=60, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr.decode()
    assert proc.stdout == b"done\n"  # the stray line went to stderr, not the wire
    assert b"stray" in proc.stderr


def threads_reading(pid: int) -> list[str]:
    """The threads of ``pid`` blocked in the read() system call (from /proc/<pid>/task/<tid>/syscall)."""
    found = []
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/syscall") as fh:
                fields = fh.read().split()
            with open(f"/proc/{pid}/task/{tid}/comm") as fh:
                name = fh.read().strip()
        except OSError:
            continue
        if fields and fields[0] == str(READ_SYSCALL):
            found.append(f"{tid} {name} fd {int(fields[1], 16)}")
    return found


@pytest.mark.skipif(READ_SYSCALL is None, reason="read()'s system call number is known here for x86_64 and aarch64")
async def test_the_stdio_server_waits_for_requests_on_its_event_loop_not_in_a_thread(short_tmp: Path) -> None:
    from benchmarks.common import stdio_server_pid

    async with Client(stdio_params(short_tmp / "pipes", "--pool-size", "0", "--restart-spares", "0")) as client:
        for _ in range(3):
            result = await client.call_tool("execute_code", {"code": "x = 1"})
            assert result.structured_content is not None and result.structured_content["success"]
        pid = stdio_server_pid(short_tmp / "pipes")
        assert pid is not None
        try:
            open(f"/proc/{pid}/task/{pid}/syscall").close()
        except OSError:
            pytest.skip("/proc/<pid>/task/<tid>/syscall is not readable here")
        await anyio.sleep(0.3)  # idle between requests: where does the server wait for the next one?
        assert threads_reading(pid) == []
        result = await client.call_tool("execute_code", {"code": "x + 1"})
        assert result.structured_content is not None and result.structured_content["result"] == 2
