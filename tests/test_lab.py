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
import nbformat
import pytest

pytest.importorskip("jupyter_server")
from jupyter_server.services.kernels.connection.base import deserialize_msg_from_ws_v1, serialize_msg_to_ws_v1  # noqa: E402
from tornado.websocket import WebSocketClientConnection, websocket_connect  # noqa: E402

from kernelexec.lab.kernels import kernel_id_for, spec_name  # noqa: E402

from .conftest import Harness, clean_env, free_port, kernelexec_cmd, make_settings, start_harness, stop, until, wait_for_port  # noqa: E402

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
    # a pooled kernel (its folder hidden from Lab's file browser) and a restart spare (Lab keeps the kernel id)
    harness, cm = await start_harness(make_settings(short_tmp, pool_size=1, restart_spares=1))
    try:
        handle = await harness.new_session()
        await harness.run("shared = 'set over MCP'", session=handle)
        yield harness, handle
    finally:
        await harness.client.__aexit__(None, None, None)
        await cm.__aexit__(None, None, None)


def start_lab(state_dir: Path, base: Path) -> tuple[subprocess.Popen[str], int]:
    port = free_port()
    proc = subprocess.Popen(
        kernelexec_cmd("lab", "--no-browser", "--port", str(port), "--state-dir", str(state_dir)),
        stdout=subprocess.PIPE, stderr=open(base / f"lab-{port}.log", "w"), text=True,
        env=clean_env(JUPYTER_RUNTIME_DIR=str(base / "jupyter-runtime"), JUPYTER_CONFIG_DIR=str(base / "jupyter-config"),
                      JUPYTER_DATA_DIR=str(base / "jupyter-data")),
    )
    return proc, port


async def lab_ready(proc: subprocess.Popen[str], port: int, handle: str) -> tuple[Lab, str, str]:
    lab = Lab(proc, port)
    url = (await lab.line("kernelexec lab: ")).split(" at ", 1)[1]
    assert url.startswith(f"http://127.0.0.1:{port}/") and "?token=" in url
    token = url.split("?token=", 1)[1]
    attached = await lab.line(f"attached session {handle} as kernel ")
    wait_for_port(port, proc)
    return lab, token, attached.rsplit(" ", 1)[1]


@pytest.fixture(scope="module")
async def lab(session: tuple[Harness, str], short_tmp: Path) -> AsyncIterator[tuple[Lab, str, str]]:
    harness, handle = session
    proc, port = start_lab(harness.settings.state_dir, short_tmp)
    try:
        yield await lab_ready(proc, port, handle)
    finally:
        stop(proc, grace=15)


V1 = "v1.kernel.websocket.jupyter.org"


async def connect(port: int, token: str, kernel_id: str, v1: bool = False) -> WebSocketClientConnection:
    return await websocket_connect(f"ws://127.0.0.1:{port}/api/kernels/{kernel_id}/channels?token={token}",
                                   subprotocols=[V1] if v1 else None)


def decode(raw: str | bytes) -> tuple[dict[str, Any], str]:
    """A websocket frame as JupyterLab would read it (v1 binary or legacy JSON), and its raw text."""
    if isinstance(raw, bytes):
        channel, parts = deserialize_msg_from_ws_v1(raw)
        header, parent, metadata, content = (json.loads(p) for p in parts[:4])
        return ({"header": header, "msg_type": header["msg_type"], "parent_header": parent, "metadata": metadata,
                 "content": content, "channel": channel, "buffers": parts[4:]}, b"".join(parts).decode("utf-8", "replace"))
    return json.loads(raw), raw


async def execute(ws: WebSocketClientConnection, code: str, raw_frames: list[str] | None = None) -> list[dict[str, Any]]:
    """Run code over Jupyter Server's kernel websocket; return this request's messages, up to both its
    reply (shell) and its idle status (iopub): the two channels are not ordered with each other.
    Every frame received (also other requests') is appended to ``raw_frames`` as text."""
    msg_id = uuid.uuid4().hex
    header = {"msg_id": msg_id, "msg_type": "execute_request", "username": "test", "session": uuid.uuid4().hex,
              "version": "5.3", "date": ""}
    content = {"code": code, "silent": False, "store_history": True, "user_expressions": {}, "allow_stdin": False,
               "stop_on_error": True}
    msg = {"header": header, "parent_header": {}, "metadata": {}, "content": content}
    if ws.selected_subprotocol == V1:
        await ws.write_message(serialize_msg_to_ws_v1(msg, "shell", lambda d: json.dumps(d).encode()), binary=True)
    else:
        await ws.write_message(json.dumps({**msg, "channel": "shell"}))
    messages: list[dict[str, Any]] = []
    replied = idle = False
    with anyio.fail_after(30):
        while True:
            raw = await ws.read_message()
            assert raw is not None, "websocket closed"
            msg, text = decode(raw)
            if raw_frames is not None:
                raw_frames.append(text)
                raw_frames.append(json.dumps(msg))
            if msg.get("parent_header", {}).get("msg_id") != msg_id:
                continue
            messages.append(msg)
            replied = replied or msg["msg_type"] == "execute_reply"
            idle = idle or (msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle")
            if replied and idle:
                return messages


def api(port: int, path: str) -> str:
    return f"http://127.0.0.1:{port}/api/{path}"


def plain(messages: list[dict[str, Any]]) -> list[str]:
    return [m["content"]["data"]["text/plain"] for m in messages if m["msg_type"] in ("execute_result", "display_data")]


async def test_jupyter_lists_the_session_kernel_under_a_stable_id(session: tuple[Harness, str], lab: tuple[Lab, str, str]) -> None:
    _, handle = session
    server, token, kernel_id = lab
    assert kernel_id == kernel_id_for(handle)
    async with httpx.AsyncClient(params={"token": token}) as client:
        kernels = (await client.get(api(server.port, "kernels"))).json()
        assert [(k["id"], k["name"]) for k in kernels] == [(kernel_id, spec_name(handle))]  # the pooled kernel is not there
        specs = (await client.get(api(server.port, "kernelspecs"))).json()
    assert list(specs["kernelspecs"]) == [spec_name(handle)] and specs["default"] == spec_name(handle)
    spec = specs["kernelspecs"][spec_name(handle)]
    assert handle in spec["spec"]["display_name"] and spec["resources"] == {}
    async with httpx.AsyncClient() as stranger:  # no token, no cookie from the request above
        assert (await stranger.get(api(server.port, "kernels"))).status_code == 403


async def test_code_run_through_jupyter_shares_the_session_state(session: tuple[Harness, str], lab: tuple[Lab, str, str]) -> None:
    harness, handle = session
    server, token, kernel_id = lab
    ws = await connect(server.port, token, kernel_id)
    try:
        messages = await execute(ws, "from_lab = shared.upper()\nfrom_lab")
    finally:
        ws.close()
    assert plain(messages) == ["'SET OVER MCP'"]
    r = await harness.run("from_lab", session=handle)
    assert r["result"] == "SET OVER MCP"


ATTACK = r"""

SCRIPT = "fetch('/api/terminals', {method: 'POST'}).then(r => r.json()).then(t => { const ws = new WebSocket(`ws://${location.host}/terminals/websocket/${t.name}`); ws.onopen = () => ws.send(JSON.stringify(['stdin', 'touch /tmp/pwned\r'])); });"

def evil(*args):
    display({"text/html": f"<b>hi</b><script>{SCRIPT}</script>", "application/javascript": SCRIPT,
             "image/svg+xml": f"<svg xmlns='http://www.w3.org/2000/svg'><script>{SCRIPT}</script></svg>",
             "text/markdown": f"<script>{SCRIPT}</script>", "application/vnd.jupyter.widget-view+json": {"model_id": "x"},
             "application/vnd.evil.javascript": SCRIPT, "image/png": "<script>", "text/plain": "plain rendering"}, raw=True)
    ip = get_ipython()
    # with the session key a kernel can send anything: widget comms, a message type Lab acts on, buffers
    ip.kernel.session.send(ip.kernel.iopub_socket, "comm_open",
                           {"comm_id": "c1", "target_name": "jupyter.widget", "data": {"state": {"html": SCRIPT}}},
                           parent=ip.kernel.get_parent())
    ip.kernel.session.send(ip.kernel.iopub_socket, "debug_event", {"event": "stopped", "body": SCRIPT},
                           parent=ip.kernel.get_parent(), buffers=[SCRIPT.encode()])
    ip.kernel.session.send(ip.kernel.iopub_socket, "display_data",
                           {"data": {"text/html": SCRIPT, "application/javascript": SCRIPT}, "metadata": {"isolated": False},
                            "transient": {"display_id": "d", "evil": SCRIPT}}, parent=ip.kernel.get_parent())

get_ipython().events.register("post_run_cell", evil)
"""


@pytest.mark.parametrize("v1", [False, True], ids=["legacy-protocol", "v1-protocol"])
async def test_kernel_output_reaches_the_browser_as_plain_renderings_only(session: tuple[Harness, str],
                                                                          lab: tuple[Lab, str, str], v1: bool) -> None:
    """Script injected into Lab: a hook the kernel plants shows script on the next cell run from Lab."""
    harness, handle = session
    server, token, kernel_id = lab
    planted = await harness.run(ATTACK, session=handle)
    assert planted["error_type"] is None, planted
    frames: list[str] = []
    ws = await connect(server.port, token, kernel_id, v1=v1)
    try:
        assert ws.selected_subprotocol == (V1 if v1 else None)
        messages = await execute(ws, "1 + 1", frames)
        messages += await execute(ws, "import time; time.sleep(0.5)", frames)  # anything the first one's hook sent late
    finally:
        ws.close()
        await harness.run("get_ipython().events.unregister('post_run_cell', evil)", session=handle)
    assert "plain rendering" in plain(messages) and "2" in plain(messages)
    everything = "\n".join(frames)
    for needle in ("<script", "fetch(", "SCRIPT", "debug_event", "comm_open", "isolated"):
        assert needle not in everything, needle
    for frame in frames:  # every bundle of every frame, also those of other requests
        try:
            data = json.loads(frame).get("content", {}).get("data")
        except ValueError:  # a v1 frame's raw parts
            continue
        assert data is None or set(data) <= {"text/plain", "image/png", "image/jpeg"}, data
    types = {m["msg_type"] for m in messages}
    assert not types & {"comm_open", "comm_msg", "debug_event"}
    withheld = [t for t in plain(messages) if t.startswith("[")]
    assert withheld and "text/html" in withheld[0]  # the user is told what was withheld
    assert all(m.get("buffers") in (None, []) for m in messages)


async def test_jupyter_starts_no_kernel_and_serves_no_terminal(session: tuple[Harness, str], lab: tuple[Lab, str, str]) -> None:
    _, handle = session
    server, token, kernel_id = lab
    async with httpx.AsyncClient(params={"token": token}, headers={"X-XSRFToken": "x"}, cookies={"_xsrf": "x"}) as client:
        for body in ({}, {"name": "python3"}, {"name": spec_name(handle)}):
            r = await client.post(api(server.port, "kernels"), json=body)
            assert r.status_code == 403 and "does not start kernels" in r.json()["message"], r.text
        r = await client.post(api(server.port, "sessions"), json={"path": "x.ipynb", "type": "notebook", "name": "x.ipynb",
                                                                  "kernel": {"name": "python3"}})
        # Jupyter's sessions handler answers any refusal with a 500; what Lab shows is the message
        assert r.status_code == 500 and r.json()["message"].startswith("kernelexec lab does not start kernels"), r.text
        assert (await client.get(api(server.port, "terminals"))).status_code == 404
        assert (await client.post(api(server.port, "terminals"))).status_code == 404
        assert (await client.get(f"http://127.0.0.1:{server.port}/terminals/websocket/1")).status_code == 404
        assert (await client.get(f"http://127.0.0.1:{server.port}/nbconvert/html/{handle}/notebook.ipynb")).status_code == 404
        assert (await client.get(api(server.port, "kernelspecs/python3"))).status_code == 404
        kernels = (await client.get(api(server.port, "kernels"))).json()
    assert [k["id"] for k in kernels] == [kernel_id]  # nothing was started


async def test_pages_allow_no_inline_script(session: tuple[Harness, str], lab: tuple[Lab, str, str]) -> None:
    """The second layer: were HTML with script to reach the page, its inline script and event handlers
    would not run, and scripts load only from Lab's own bundles (not /files/, where a kernel writes)."""
    _, handle = session
    server, token, _ = lab
    async with httpx.AsyncClient(params={"token": token}, headers={"X-XSRFToken": "x"}, cookies={"_xsrf": "x"}) as client:
        page = await client.get(f"http://127.0.0.1:{server.port}/lab")
        nb = await client.get(f"http://127.0.0.1:{server.port}/files/{handle}/notebook.ipynb")
    assert page.status_code == 200 and nb.status_code == 200
    csp = dict(d.strip().split(" ", 1) for d in page.headers["Content-Security-Policy"].split(";") if " " in d.strip())
    scripts = csp["script-src"].split()
    assert "'unsafe-inline'" not in scripts and "'self'" not in scripts and "*" not in scripts
    assert all(s.startswith("'") or s.endswith(("/static/", "/lab/extensions/")) for s in scripts), scripts
    assert "sandbox" in nb.headers["Content-Security-Policy"]  # raw files: an opaque origin


async def test_the_session_notebook_opens_on_the_session_kernel_and_is_served_sanitized(session: tuple[Harness, str],
                                                                                       lab: tuple[Lab, str, str]) -> None:
    harness, handle = session
    server, token, kernel_id = lab
    await harness.run("from IPython.display import HTML, display\ndisplay(HTML('<script>alert(1)</script>ok'))\n"
                      "print('printed')", session=handle)
    async with httpx.AsyncClient(params={"token": token}, headers={"X-XSRFToken": "x"}, cookies={"_xsrf": "x"}) as client:
        # what JupyterLab sends when the notebook's metadata names python3
        r = await client.post(api(server.port, "sessions"), json={"path": f"{handle}/notebook.ipynb", "type": "notebook",
                                                                  "name": "notebook.ipynb", "kernel": {"name": "python3"}})
        assert r.status_code == 201, r.text
        assert r.json()["kernel"]["id"] == kernel_id and r.json()["kernel"]["name"] == spec_name(handle)
        nb = (await client.get(api(server.port, f"contents/{handle}/notebook.ipynb"))).json()
        raw = (await client.get(f"http://127.0.0.1:{server.port}/files/{handle}/notebook.ipynb")).text
    on_disk = (harness.settings.sessions_dir / handle / "notebook.ipynb").read_text()
    assert "<script>alert(1)</script>" in on_disk  # the record keeps what the kernel sent …
    assert nb["content"]["metadata"]["kernelspec"]["name"] == spec_name(handle) and nb["writable"] is False
    for served in (nb["content"], json.loads(raw)):  # … Lab gets none of it, trusted or not
        outputs = [o for c in served["cells"] for o in c.get("outputs", [])]
        assert all(set(o.get("data", {})) <= {"text/plain", "image/png", "image/jpeg"} for o in outputs), outputs
        assert {"output_type": "stream", "name": "stdout", "text": "printed\n"} in outputs
        assert "<script" not in json.dumps([c["source"] for c in served["cells"] if c["cell_type"] != "code"])


async def test_the_file_browser_shows_notebooks_and_work_files_only(session: tuple[Harness, str], lab: tuple[Lab, str, str]) -> None:
    harness, handle = session
    server, token, _ = lab
    planted = await harness.run("open('result.txt', 'w').write('42')", session=handle)
    assert planted["error_type"] is None, planted
    # links out of work/ (the policy refuses os.symlink in the kernel; the folder must not rely on that)
    work_dir = harness.settings.sessions_dir / handle / "work"
    (work_dir / "key.json").symlink_to("../kernel.json")
    (work_dir / "host.txt").symlink_to("/etc/passwd")
    pooled = [d.name for d in harness.settings.sessions_dir.iterdir() if d.is_dir() and d.name != handle]
    assert pooled, "the harness keeps a pooled kernel's session folder"
    async with httpx.AsyncClient(params={"token": token}, headers={"X-XSRFToken": "x"}, cookies={"_xsrf": "x"}) as client:
        async def get(path: str) -> httpx.Response:
            return await client.get(api(server.port, f"contents/{path}"))

        assert [m["name"] for m in (await get("")).json()["content"]] == [handle]
        assert sorted(m["name"] for m in (await get(handle)).json()["content"]) == ["notebook.ipynb", "outputs", "work"]
        work = (await get(f"{handle}/work")).json()["content"]
        assert [m["name"] for m in work] == ["result.txt"]  # no symlink out of work/
        assert (await get(f"{handle}/work/result.txt")).json()["content"] == "42"
        for path in (f"{handle}/kernel.json", f"{handle}/work/key.json", f"{handle}/work/host.txt", f"{handle}/ipc",
                     f"{handle}/journal.jsonl", f"{handle}/home", pooled[0], f"{pooled[0]}/kernel.json", "../connections"):
            assert (await get(path)).status_code == 404, path
            assert (await client.get(f"http://127.0.0.1:{server.port}/files/{path}")).status_code in (403, 404), path
        writes = [
            await client.put(api(server.port, f"contents/{handle}/work/new.txt"), json={"type": "file", "format": "text", "content": "x"}),
            await client.post(api(server.port, f"contents/{handle}/work"), json={"type": "file"}),
            await client.delete(api(server.port, f"contents/{handle}/notebook.ipynb")),
            await client.patch(api(server.port, f"contents/{handle}/work/result.txt"), json={"path": f"{handle}/work/moved.txt"}),
            await client.post(api(server.port, f"contents/{handle}/notebook.ipynb/checkpoints")),
        ]
    assert [w.status_code for w in writes] == [403] * 5, [w.text for w in writes]
    assert "read-only" in writes[0].json()["message"]
    assert sorted(p.name for p in (harness.settings.sessions_dir / handle / "work").iterdir()) == ["host.txt", "key.json", "result.txt"]


async def test_interrupt_from_jupyter_stops_a_running_mcp_call(session: tuple[Harness, str], lab: tuple[Lab, str, str]) -> None:
    harness, handle = session
    server, token, kernel_id = lab
    answer: dict[str, Any] = {}
    began = harness.settings.sessions_dir / handle / "work" / "began"
    began.unlink(missing_ok=True)

    async def long_call() -> None:
        answer.update(await harness.run("open('began', 'w').close()\nimport time\ntime.sleep(60)", session=handle, timeout=120))

    async with anyio.create_task_group() as tg, httpx.AsyncClient() as client:
        tg.start_soon(long_call)
        with anyio.fail_after(30):
            # the cell runs (its file is there), so the interrupt lands in it, not before it
            await until(began.exists, "the long cell never began")
            while not answer:
                reply = await client.post(api(server.port, f"kernels/{kernel_id}/interrupt"), params={"token": token})
                assert reply.status_code == 204
                await anyio.sleep(1.0)
    assert answer["error_type"] == "KeyboardInterrupt" and answer["ending"] == "completed"
    assert (await harness.run("shared", session=handle))["result"] == "set over MCP"


async def test_restart_from_jupyter_restarts_through_the_session_and_the_agent_is_told(session: tuple[Harness, str],
                                                                                     lab: tuple[Lab, str, str]) -> None:
    """JupyterLab's "Restart Kernel" asks the kernelexec server holding the session (a request file it picks
    up); the session restarts its kernel in turn with its calls, records it, and its next answer says so;
    Lab gets the session's new kernel under the same id."""
    harness, _ = session
    server, token, _ = lab
    handle = await harness.new_session()
    await harness.run("before = 1", session=handle)
    kernel_id = (await server.line(f"attached session {handle} as kernel ")).rsplit(" ", 1)[1]
    async with httpx.AsyncClient(params={"token": token}, timeout=60) as client:
        restart = await client.post(api(server.port, f"kernels/{kernel_id}/restart"))
    assert restart.status_code == 200 and restart.json()["id"] == kernel_id, restart.text
    after = await harness.run("'before' in dir()", session=handle)
    assert after["result"] is False, after
    assert "restarted from JupyterLab" in (after["restart_reason"] or ""), after
    marker = [c for c in nbformat.read(after["notebook"], as_version=4).cells if c.cell_type == "markdown"][-1]
    assert "JupyterLab" in marker.source and marker.metadata.kernelexec["event"] == "restart"
    ws = await connect(server.port, token, kernel_id)
    try:
        assert plain(await execute(ws, "1 + 1")) == ["2"]  # the new kernel, same id
    finally:
        ws.close()
    await harness.call("close_session", session=handle)


async def told_restarting(ws: WebSocketClientConnection) -> None:
    """Read the websocket until Jupyter's 'restarting' status (JupyterLab then reconnects)."""
    with anyio.fail_after(15):
        while True:
            raw = await ws.read_message()
            assert raw is not None, "closed without saying why"
            msg = decode(raw)[0]
            if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "restarting":
                return


async def test_after_restart_session_jupyter_keeps_the_kernel_id_and_is_told(session: tuple[Harness, str],
                                                                           lab: tuple[Lab, str, str]) -> None:
    """A warm spare (new ports and key) takes over: same kernel id, the open websocket hears 'restarting'
    (JupyterLab then reconnects and says the kernel restarted), and a reconnect reaches the new kernel."""
    harness, handle = session
    server, token, kernel_id = lab
    kernel = harness.sessions.sessions[handle].kernel
    with anyio.fail_after(60):
        while kernel.spare is None:
            await anyio.sleep(0.1)
    ws = await connect(server.port, token, kernel_id)
    try:
        await execute(ws, "1")
        await harness.call("restart_session", session=handle)
        assert kernel.spare_takeovers == 1
        await harness.run("shared = 'set over MCP'\nafter = 'restarted'", session=handle)
        assert (await server.line(f"session {handle} has a new kernel")).endswith(kernel_id)
        await told_restarting(ws)
    finally:
        ws.close()
    ws = await connect(server.port, token, kernel_id)
    try:
        assert plain(await execute(ws, "after")) == ["'restarted'"]
    finally:
        ws.close()
    async with httpx.AsyncClient(params={"token": token}) as client:
        assert [k["id"] for k in (await client.get(api(server.port, "kernels"))).json()] == [kernel_id]


async def test_a_plain_restart_session_is_told_too(session: tuple[Harness, str], lab: tuple[Lab, str, str]) -> None:
    """Without a spare the session's kernel restarts under the same connection file: Lab hears it all the
    same (the kernel's Jupyter session id changes) and stays attached to the id."""
    harness, _ = session
    server, token, _ = lab
    handle = await harness.new_session()
    await harness.run("before = 1", session=handle)
    kernel_id = (await server.line(f"attached session {handle} as kernel ")).rsplit(" ", 1)[1]
    ws = await connect(server.port, token, kernel_id)
    try:
        await execute(ws, "before")
        await harness.call("restart_session", session=handle)
        assert harness.sessions.sessions[handle].kernel.spare_takeovers == 0  # a plain restart, no spare yet
        await harness.run("after = 2", session=handle)  # the new kernel speaks on iopub
        await told_restarting(ws)
    finally:
        ws.close()
    ws = await connect(server.port, token, kernel_id)
    try:
        assert plain(await execute(ws, "after")) == ["2"]
    finally:
        ws.close()
    await harness.call("close_session", session=handle)


async def test_a_new_lab_run_attaches_the_session_under_the_same_id_and_stopping_it_leaves_the_kernel(
        session: tuple[Harness, str], lab: tuple[Lab, str, str], short_tmp: Path) -> None:
    harness, handle = session
    server, _, kernel_id = lab
    server.proc.terminate()
    server.proc.wait(15)
    r = await harness.run("shared", session=handle)
    assert r["result"] == "set over MCP" and r["restart_reason"] is None
    proc, port = start_lab(harness.settings.state_dir, short_tmp)
    try:
        _, _, again = await lab_ready(proc, port, handle)
    finally:
        stop(proc, grace=15)
    assert again == kernel_id
    workspaces = harness.settings.state_dir / "lab" / "workspaces"
    assert workspaces.is_dir()  # Lab's own workspace dir, not ~/.jupyter/lab/workspaces
