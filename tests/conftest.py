"""Shared fixtures: real kernels behind a real MCP server, reached through real MCP clients.

Kernels are expensive (~0.5 s each), so one server and its sessions are shared per test module;
tests that need a clean kernel open their own session with ``new_session``.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import pytest
from mcp import Client

from kernelexec.config import Settings, load_settings
from kernelexec.server import build_server
from kernelexec.sessions import SessionManager


@pytest.fixture(scope="session")
def anyio_backend() -> str:
    return "asyncio"  # jupyter_client does not run on trio


@pytest.fixture(scope="session")
def short_tmp() -> Iterator[Path]:
    """A short base directory: unix socket paths must stay under 107 bytes."""
    path = Path(tempfile.mkdtemp(prefix="kxt"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def make_settings(base: Path, **overrides: Any) -> Settings:
    state = Path(tempfile.mkdtemp(prefix="s", dir=base))
    return load_settings(state_dir=state, **overrides)


class Harness:
    """A running server with an in-memory client; ``call`` returns (structured, result)."""

    def __init__(self, client: Client, sessions: SessionManager, settings: Settings) -> None:
        self.client = client
        self.sessions = sessions
        self.settings = settings

    async def call(self, tool: str, **arguments: Any) -> Any:
        return await self.client.call_tool(tool, arguments)

    async def run(self, code: str, **arguments: Any) -> dict[str, Any]:
        result = await self.client.call_tool("execute_code", {"code": code, **arguments})
        assert not result.is_error, result.content
        assert result.structured_content is not None
        return result.structured_content

    async def new_session(self, **arguments: Any) -> str:
        result = await self.client.call_tool("new_session", arguments)
        assert not result.is_error, result.content
        return result.structured_content["session"]


async def start_harness(settings: Settings):
    sessions = SessionManager(settings)
    cm = sessions.running()
    await cm.__aenter__()
    server = build_server(settings, sessions)
    client = Client(server)
    await client.__aenter__()
    return Harness(client, sessions, settings), cm


@asynccontextmanager
async def serving(settings: Settings) -> AsyncIterator[Harness]:
    """A server with these settings and an in-memory client, torn down on exit."""
    h, cm = await start_harness(settings)
    try:
        yield h
    finally:
        await h.client.__aexit__(None, None, None)
        await cm.__aexit__(None, None, None)


@pytest.fixture(scope="module")
async def harness(short_tmp: Path) -> AsyncIterator[Harness]:
    """The default server (standard profile, all tools), shared by a module."""
    async with serving(make_settings(short_tmp)) as h:
        yield h


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_port(port: int, proc: subprocess.Popen[bytes], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise TimeoutError(f"nothing listening on {port}")


def kernelexec_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "kernelexec", *args]


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KERNELEXEC_")}
    env.update(extra)
    return env


def pids_with(marker: str) -> list[int]:
    """Processes whose command line contains ``marker`` (a session directory, a connection file, a kernel id)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                if marker.encode() in fh.read():
                    found.append(int(pid))
        except OSError:
            continue
    return found


def stop(proc: subprocess.Popen[bytes], grace: float = 10) -> None:
    proc.terminate()
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(grace)


@contextmanager
def http_server(state_dir: Path, *args: str) -> Iterator[str]:
    """``kernelexec serve --transport http`` as a real process on a free loopback port; yields its /mcp URL."""
    port = free_port()
    proc = subprocess.Popen(
        kernelexec_cmd("serve", "--transport", "http", "--port", str(port), "--state-dir", str(state_dir), *args),
        env=clean_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        wait_for_port(port, proc)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        stop(proc)
