"""``kernelexec lab``: a real Jupyter Server, in its own process, attached to a live session's kernel."""

from __future__ import annotations

import json
import queue
import subprocess
import threading
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

pytest.importorskip("jupyter_server")
from tornado.websocket import WebSocketClientConnection, websocket_connect  # noqa: E402

from .conftest import Harness, clean_env, free_port, kernelexec_cmd, make_settings, start_harness, stop, wait_for_port  # noqa: E402

pytestmark = [pytest.mark.anyio, pytest.mark.slow]


class Lab:
    def __init__(self, proc: subprocess.Popen[str], port: int) -> None:
        self.proc = proc
        self.port = port
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))

    async def line(self, prefix: str, timeout: float = 60) -> str:
        """The next stdout line starting with ``prefix`` (earlier lines are skipped)."""
        with anyio.fail_after(timeout):
            while True:
                try:
                    line = self.lines.get_nowait()
                except queue.Empty:
                    if self.proc.poll() is not None:
                        raise RuntimeError(f"kernelexec lab exited with {self.proc.returncode}") from None
                    await anyio.sleep(0.05)
                    continue
                if line.startswith(prefix):
                    return line


@pytest.fixture(scope="module")
async def session(short_tmp: Path) -> AsyncIterator[tuple[Harness, str]]:
    harness, cm = await start_harness(make_settings(short_tmp))
    try:
        handle = await harness.new_session()
        await harness.run("shared = 'set over MCP'", session=handle)
        yield harness, handle
    finally:
        await harness.client.__aexit__(None, None, None)
        await cm.__aexit__(None, None, None)


@pytest.fixture(scope="module")
async def lab(session: tuple[Harness, str], short_tmp: Path) -> AsyncIterator[tuple[Lab, str, str]]:
    harness, handle = session
    port = free_port()
    runtime = short_tmp / "jupyter-runtime"
    proc = subprocess.Popen(
        kernelexec_cmd("lab", "--no-browser", "--port", str(port), "--state-dir", str(harness.settings.state_dir)),
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        env=clean_env(JUPYTER_RUNTIME_DIR=str(runtime), JUPYTER_CONFIG_DIR=str(short_tmp / "jupyter-config")),
    )
    try:
        lab = Lab(proc, port)
        url = (await lab.line("kernelexec lab: ")).split(" at ", 1)[1]
        assert url.startswith(f"http://127.0.0.1:{port}/") and "?token=" in url
        token = url.split("?token=", 1)[1]
        attached = await lab.line(f"attached session {handle} as kernel ")
        wait_for_port(port, proc)
        yield lab, token, attached.rsplit(" ", 1)[1]
    finally:
        stop(proc, grace=15)


async def execute(ws: WebSocketClientConnection, code: str) -> list[dict[str, Any]]:
    """Run code over Jupyter Server's kernel websocket; return this request's messages, up to both its
    reply (shell) and its idle status (iopub): the two channels are not ordered with each other."""
    msg_id = uuid.uuid4().hex
    header = {"msg_id": msg_id, "msg_type": "execute_request", "username": "test", "session": uuid.uuid4().hex,
              "version": "5.3", "date": ""}
    content = {"code": code, "silent": False, "store_history": True, "user_expressions": {}, "allow_stdin": False,
               "stop_on_error": True}
    await ws.write_message(json.dumps({"header": header, "parent_header": {}, "metadata": {}, "content": content,
                                       "channel": "shell"}))
    messages: list[dict[str, Any]] = []
    replied = idle = False
    with anyio.fail_after(30):
        while True:
            raw = await ws.read_message()
            assert raw is not None, "websocket closed"
            msg = json.loads(raw)
            if msg.get("parent_header", {}).get("msg_id") != msg_id:
                continue
            messages.append(msg)
            replied = replied or msg["msg_type"] == "execute_reply"
            idle = idle or (msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle")
            if replied and idle:
                return messages


def api(port: int, path: str) -> str:
    return f"http://127.0.0.1:{port}/api/{path}"


async def test_jupyter_lists_the_session_kernel(lab: tuple[Lab, str, str]) -> None:
    server, token, kernel_id = lab
    async with httpx.AsyncClient() as client:
        kernels = (await client.get(api(server.port, "kernels"), params={"token": token})).json()
        assert kernel_id in [k["id"] for k in kernels]
    async with httpx.AsyncClient() as stranger:  # no token, no cookie from the request above
        assert (await stranger.get(api(server.port, "kernels"))).status_code == 403


async def test_code_run_through_jupyter_shares_the_session_state(session: tuple[Harness, str], lab: tuple[Lab, str, str]) -> None:
    harness, handle = session
    server, token, kernel_id = lab
    ws = await websocket_connect(f"ws://127.0.0.1:{server.port}/api/kernels/{kernel_id}/channels?token={token}")
    try:
        messages = await execute(ws, "from_lab = shared.upper()\nfrom_lab")
    finally:
        ws.close()
    results = [m["content"]["data"]["text/plain"] for m in messages if m["msg_type"] == "execute_result"]
    assert results == ["'SET OVER MCP'"]
    r = await harness.run("from_lab", session=handle)
    assert r["result"] == "SET OVER MCP"


async def test_interrupt_from_jupyter_stops_a_running_mcp_call(session: tuple[Harness, str], lab: tuple[Lab, str, str]) -> None:
    harness, handle = session
    server, token, kernel_id = lab
    answer: dict[str, Any] = {}

    async def long_call() -> None:
        answer.update(await harness.run("print('started', flush=True)\nimport time\ntime.sleep(60)", session=handle, timeout=120))

    async with anyio.create_task_group() as tg, httpx.AsyncClient() as client:
        tg.start_soon(long_call)
        with anyio.fail_after(30):
            while not harness.sessions.sessions[handle].busy:
                await anyio.sleep(0.05)
            await anyio.sleep(0.5)  # let the cell start; should an interrupt still come early, the next one stops it
            while not answer:
                reply = await client.post(api(server.port, f"kernels/{kernel_id}/interrupt"), params={"token": token})
                assert reply.status_code == 204
                await anyio.sleep(1.0)
        restart = await client.post(api(server.port, f"kernels/{kernel_id}/restart"), params={"token": token})
        assert restart.status_code == 500  # refused: restarting is the session's business
    assert answer["error_type"] == "KeyboardInterrupt" and answer["ending"] == "completed"
    assert (await harness.run("shared", session=handle))["result"] == "set over MCP"


async def test_after_a_warm_spare_takes_over_jupyter_attaches_the_new_kernel(session: tuple[Harness, str],
                                                                            lab: tuple[Lab, str, str]) -> None:
    """The spare has its own ports and key: it is published under a new entry, which Jupyter attaches."""
    harness, handle = session
    server, token, kernel_id = lab
    kernel = harness.sessions.sessions[handle].kernel
    with anyio.fail_after(60):
        while kernel.spare is None:
            await anyio.sleep(0.1)
    await harness.call("restart_session", session=handle)
    assert kernel.spare_takeovers == 1
    await harness.run("shared = 'set over MCP'\nafter = 'restarted'", session=handle)
    new_id = (await server.line(f"attached session {handle} as kernel ")).rsplit(" ", 1)[1]
    assert new_id != kernel_id
    ws = await websocket_connect(f"ws://127.0.0.1:{server.port}/api/kernels/{new_id}/channels?token={token}")
    try:
        messages = await execute(ws, "after")
    finally:
        ws.close()
    assert [m["content"]["data"]["text/plain"] for m in messages if m["msg_type"] == "execute_result"] == ["'restarted'"]
    async with httpx.AsyncClient() as client:
        kernels = [k["id"] for k in (await client.get(api(server.port, "kernels"), params={"token": token})).json()]
    assert new_id in kernels and kernel_id not in kernels  # the dead kernel's entry is gone


async def test_stopping_lab_leaves_the_session_kernel_running(session: tuple[Harness, str], lab: tuple[Lab, str, str]) -> None:
    harness, handle = session
    server, _, _ = lab
    server.proc.terminate()
    server.proc.wait(15)
    r = await harness.run("shared", session=handle)
    assert r["result"] == "set over MCP" and r["restart_reason"] is None
