"""``kernelexec lab`` in a real browser: JupyterLab driven by headless Chromium (``tests/lab_browser.mjs``).

A user attaches a console to the live session, evaluates what the agent set, runs one cell while a
hook planted by the kernel tries to run script in the Lab origin (open a terminal, touch a file on the
host), opens the session's notebook, tries Lab's "Restart Kernel", and keeps working while the agent
restarts the session. Needs Debian's ``chromium`` and npm's ``playwright-core`` in
``.ci/node`` (``.ci/run`` installs both); without them the test skips, except in CI, where it fails.
"""

from __future__ import annotations

import json
import os
import queue
import shutil
import subprocess
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest

pytest.importorskip("jupyterlab")

from kernelexec.lab.kernels import display_name, kernel_id_for  # noqa: E402

from .conftest import Harness, make_settings, start_harness, stop  # noqa: E402
from .test_lab import Lab, lab_ready, start_lab  # noqa: E402

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[1]
PLAYWRIGHT = ROOT / ".ci" / "node" / "node_modules" / "playwright-core"
DRIVER = Path(__file__).with_name("lab_browser.mjs")

# Script in Lab's origin, as a kernel would plant it: on the next cell run by any client but the
# agent's, display script that opens a terminal in the Lab origin and runs a host command.
HOOK = r"""
_mine = get_ipython().kernel.get_parent()["header"]["session"]
_js = ("window.__kernelexec_pwned = true;"
       "const x = document.cookie.split('; ').find(c => c.startsWith('_xsrf=')).slice(6);"
       "fetch('/api/terminals', {method: 'POST', headers: {'X-XSRFToken': x}}).then(r => r.json()).then(t => {"
       " const ws = new WebSocket(`ws://${location.host}/terminals/websocket/${t.name}`);"
       " ws.onopen = () => ws.send(JSON.stringify(['stdin', 'touch MARKER\r'])); });")

def _not_the_agent(result):
    if get_ipython().kernel.get_parent()["header"]["session"] != _mine:
        display({"text/html": f"<img src=x onerror=\"{_js}\"><script>{_js}</script>", "application/javascript": _js,
                 "text/plain": "harmless-looking text"}, raw=True)

get_ipython().events.register("post_run_cell", _not_the_agent)
"""


def _tools() -> str | None:
    if not Path("/usr/bin/chromium").exists():
        return "Debian's chromium is not installed (apt-get install chromium; .ci/run does it)"
    if not PLAYWRIGHT.is_dir() or shutil.which("node") is None:
        return "npm's playwright-core is not in .ci/node (.ci/run installs it)"
    return None


@pytest.fixture(scope="module")
async def live(short_tmp: Path) -> AsyncIterator[tuple[Harness, str, Lab, str]]:
    missing = _tools()
    if missing:
        if os.environ.get("CI"):
            pytest.fail(missing)
        pytest.skip(missing)
    harness, cm = await start_harness(make_settings(short_tmp))
    try:
        handle = await harness.new_session()
        await harness.run("shared = 'set over MCP'", session=handle)
        proc, port = start_lab(harness.settings.state_dir, short_tmp)
        try:
            lab, token, kernel_id = await lab_ready(proc, port, handle)
            assert kernel_id == kernel_id_for(handle)
            yield harness, handle, lab, token
        finally:
            stop(proc, grace=15)
    finally:
        await harness.client.__aexit__(None, None, None)
        await cm.__aexit__(None, None, None)


async def drive(options: dict[str, Any], hooks: dict[str, Any], log: Path, timeout: float = 250) -> list[dict[str, Any]]:
    """Run the driver; when it reports a step named in ``hooks``, await that hook and let it go on."""
    proc = subprocess.Popen(["node", str(DRIVER), json.dumps(options)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=open(log, "w"), text=True)
    lines: queue.Queue[str | None] = queue.Queue()

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=read, daemon=True).start()
    steps: list[dict[str, Any]] = []
    try:
        with anyio.fail_after(timeout):
            while True:
                try:
                    line = lines.get_nowait()
                except queue.Empty:
                    await anyio.sleep(0.05)
                    continue
                if line is None:
                    break
                if not line.startswith("{"):
                    continue
                steps.append(json.loads(line))
                if steps[-1]["step"] in hooks:
                    await hooks[steps[-1]["step"]]()
                    assert proc.stdin is not None
                    proc.stdin.write("go\n")
                    proc.stdin.flush()
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert steps and steps[-1]["step"] == "done", (steps[-3:], log.read_text()[-3000:])
    return steps


async def test_a_user_in_jupyterlab_inspects_the_session_and_the_kernel_cannot_run_script(
        live: tuple[Harness, str, Lab, str], short_tmp: Path) -> None:
    harness, handle, lab, token = live
    marker = short_tmp / "host-command-ran"

    async def plant() -> None:  # the agent's kernel plants the hook while the user looks
        planted = await harness.run(HOOK.replace("MARKER", str(marker)), session=handle)
        assert planted["error_type"] is None, planted

    async def agent_restarts() -> None:
        await harness.call("restart_session", session=handle)
        after = await harness.run("after = 'restarted'", session=handle)
        assert after["error_type"] is None, after  # restart_reason tells of the restart from JupyterLab before it

    shots = short_tmp / "shots"
    shots.mkdir()
    started = time.monotonic()
    steps = await drive({
        "url": f"http://127.0.0.1:{lab.port}/lab?token={token}", "handle": handle, "display": display_name(handle),
        "shots": str(shots), "userDataDir": str(short_tmp / "chromium-profile"), "playwright": str(PLAYWRIGHT),
    }, {"evaluated": plant, "restart": agent_restarts}, short_tmp / "driver.log")
    took = time.monotonic() - started
    by = {s["step"]: s for s in steps}

    # the session's kernel is the one kernel offered, by its handle; consoles and notebooks only on it
    def labels(cards: list[str]) -> list[str]:
        return [c.strip().split("\n")[-1] for c in cards]  # a card's text is its logo letter, then its label

    assert labels(by["launcher"]["consoleCards"]) == labels(by["launcher"]["notebookCards"]) == [display_name(handle)]
    # 1. attached to the live session: the agent's variable
    assert by["evaluated"]["outputs"] == ["'set over MCP'"], by["evaluated"]
    assert display_name(handle) in by["evaluated"]["running"]
    # 2. the attack: the hook fired (its text arrived), its script did not run: no terminal, no host command
    attack = by["attack"]
    assert attack["outputs"] == ["2", "harmless-looking text"], attack
    assert attack["pwned"] is False and attack["scripts"] == 0
    assert attack["terminalRequests"] == [] and by["notebook"]["terminalRequests"] == []
    # the hook's only way to the marker is a terminal, which the page never requested, here or in any later step
    # (the list is the page's, for its whole life, read again at "notebook" and "done"), and drive() returned
    # after "done": no wait stands in for that
    assert by["done"]["terminalRequests"] == [] and not marker.exists(), "the host command ran"
    # 3. the session's notebook opened on the session's kernel (not a new python3 one)
    nb = by["notebook"]
    assert display_name(handle) in nb["kernelName"] and nb["cells"] >= 1
    assert nb["top"] == [handle] and sorted(nb["inside"]) == ["notebook.ipynb", "outputs", "work"]
    # (Lab may register the notebook's session under "<folder>/<uuid>" first, then rename it)
    opened = [s for s in nb["sessions"] if s["type"] == "notebook" and s["name"] == "notebook.ipynb"
              and s["path"].startswith(f"{handle}/")]
    assert [s["kernel"]["id"] for s in opened] == [kernel_id_for(handle)], nb["sessions"]
    assert {s["kernel"]["id"] for s in nb["sessions"]} == {kernel_id_for(handle)}  # no other kernel anywhere
    assert nb["dialogs"] == []
    assert by["done"]["cspErrors"] == []  # nothing blocked by the page's CSP: Lab works under it, and no script tried
    # 4. "Restart Kernel" from Lab: the session's kernel restarted through its kernelexec server (recorded,
    # told in the agent's next answer); the console runs code on the fresh kernel under the same id
    restart = by["restart"]
    assert [a["status"] for a in restart["answers"]] == [200], restart  # restarted through the session
    assert json.loads(restart["answers"][0]["body"])["id"], restart
    assert any("NameError" in o for o in restart["outputs"]), restart  # a fresh kernel: `shared` is gone
    # 5. the agent's restart_session: Lab is told, and the same console reaches the session's new kernel
    agent = by["agent restart"]
    assert agent["outputs"] == ["'restarted'"], agent
    assert by["agent restart status"]["statuses"][-1].endswith("| Idle"), by["agent restart status"]  # not stuck
    # docs/notebooks.md's screenshot is this test's first one (refreshed with KERNELEXEC_UPDATE_DOCS=1)
    assert (shots / "lab.png").stat().st_size > 10_000
    if os.environ.get("KERNELEXEC_UPDATE_DOCS"):
        shutil.copy(shots / "lab.png", ROOT / "docs" / "lab.png")
    print(f"browser test: {took:.1f} s")
