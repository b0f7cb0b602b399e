"""MCP over stdio with the pipes read and written on the event loop, not through worker threads.

The SDK's ``stdio_server()`` wraps stdin and stdout in ``anyio.wrap_file``: every request line is read by a
worker thread and every answer written and flushed by one, so each call pays three thread hops (a queue, a
wake-up, the GIL handed over, the loop woken back) on the server's busiest path. Its supported option is
to pass the two streams in; these are non-blocking pipe ends the event loop waits on (``wait_readable``,
``wait_writable``), and everything else (parsing, framing, the session) stays the SDK's.

What the SDK's own claim does is kept: while serving, fd 0 reads the null device and fd 1 writes to stderr,
so a child or a stray ``print`` never touches the wire, and both are put back on exit. Standard streams that
are not pipes or sockets (a file, a terminal) are left to the SDK's own transport.
"""

from __future__ import annotations

import os
import stat
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, cast

import anyio
from mcp.server.stdio import stdio_server

CHUNK = 1 << 16


class PipeLines:
    """The request lines on a non-blocking pipe, as text (the SDK iterates its stdin for them)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self._buffer = bytearray()
        self._scanned = 0  # the buffer holds no line break before this (a long line is scanned once, not per read)
        self._eof = False

    def __aiter__(self) -> PipeLines:
        return self

    async def __anext__(self) -> str:
        while True:
            end = self._buffer.find(b"\n", self._scanned)
            if end >= 0:
                line = bytes(self._buffer[: end + 1])
                del self._buffer[: end + 1]
                self._scanned = 0
                return line.decode("utf-8", errors="replace")  # a line break never splits a UTF-8 character
            self._scanned = len(self._buffer)
            if self._eof:
                if self._buffer:
                    rest = bytes(self._buffer)
                    self._buffer.clear()
                    return rest.decode("utf-8", errors="replace")
                raise StopAsyncIteration
            try:
                chunk = os.read(self.fd, CHUNK)
            except BlockingIOError:
                await anyio.wait_readable(self.fd)
                continue
            if chunk:
                self._buffer += chunk
            else:
                self._eof = True


class PipeWriter:
    """Answers onto a non-blocking pipe, each written whole before the next (the SDK's one writer task)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    async def write(self, text: str) -> None:
        data = memoryview(text.encode("utf-8"))
        while data:
            try:
                data = data[os.write(self.fd, data):]
            except BlockingIOError:
                await anyio.wait_writable(self.fd)

    async def flush(self) -> None:
        """Nothing is buffered: ``write`` returns once the pipe has it all."""


def _pipe_like(fd: int) -> bool:
    try:
        mode = os.fstat(fd).st_mode
    except OSError:
        return False
    return stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)


class _Claimed:
    """fd 0 and 1 moved to private, non-blocking descriptors; fd 0 then reads /dev/null and fd 1 goes to stderr."""

    def __init__(self) -> None:
        self.stdin = self.stdout = -1
        self._blocking: dict[int, bool] = {}

    def __enter__(self) -> _Claimed:
        try:
            for fd, attr in ((0, "stdin"), (1, "stdout")):
                private = os.dup(fd)
                os.set_inheritable(private, False)
                setattr(self, attr, private)
                self._blocking[private] = os.get_blocking(private)
                os.set_blocking(private, False)
            null = os.open(os.devnull, os.O_RDONLY)
            try:
                os.dup2(null, 0)
            finally:
                os.close(null)
            os.dup2(2, 1)
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        for fd, private in ((0, self.stdin), (1, self.stdout)):
            if private < 0:
                continue
            os.set_blocking(private, self._blocking.get(private, True))
            os.dup2(private, fd)
            os.close(private)
        self.stdin = self.stdout = -1


@asynccontextmanager
async def stdio_streams() -> AsyncIterator[tuple[Any, Any]]:
    """The SDK's ``stdio_server`` (its read and write streams), over the process's own stdin and stdout."""
    if not (_pipe_like(0) and _pipe_like(1)):
        async with stdio_server() as streams:
            yield streams
        return
    with _Claimed() as claimed:
        lines, writer = PipeLines(claimed.stdin), PipeWriter(claimed.stdout)
        async with stdio_server(stdin=cast(Any, lines), stdout=cast(Any, writer)) as streams:
            yield streams


async def run_stdio(server: Any) -> None:
    """``MCPServer.run_stdio_async``, over ``stdio_streams``."""
    lowlevel = server._lowlevel_server  # the SDK's own run_stdio_async does just this, with its streams
    async with stdio_streams() as (read_stream, write_stream):
        await lowlevel.run(read_stream, write_stream, lowlevel.create_initialization_options())
