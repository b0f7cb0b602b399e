"""The run view (an MCP App) in a real browser: headless Chromium loads a small MCP Apps host page
(``ui/test-host/host.js``: ext-apps' ``AppBridge`` and an MCP client that negotiates Apps) which
embeds the view and forwards its tool calls to a real ``kernelexec serve --transport http`` on
127.0.0.1 (``tests/view_browser.mjs`` drives it). Needs Debian's ``chromium``, npm's
``playwright-core`` in ``.ci/node`` and ``ui/node_modules`` (``.ci/run`` installs all three);
without them the test skips, except in CI, where it fails. Screenshots: ``<tmp>/run-view*.png``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from .conftest import http_server

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
PLAYWRIGHT = ROOT / ".ci" / "node" / "node_modules" / "playwright-core"
UI = ROOT / "ui"
DRIVER = Path(__file__).with_name("view_browser.mjs")


def _missing() -> str | None:
    if not Path("/usr/bin/chromium").exists():
        return "Debian's chromium is not installed (apt-get install chromium; .ci/run does it)"
    if not PLAYWRIGHT.is_dir() or shutil.which("node") is None:
        return "npm's playwright-core is not in .ci/node (.ci/run installs it)"
    if not (UI / "node_modules" / "@modelcontextprotocol" / "ext-apps").is_dir():
        return "ui/node_modules is missing (cd ui && npm ci; .ci/run does it)"
    return None


def test_run_view_in_a_browser_shows_output_plot_table_and_interrupts(short_tmp: Path, tmp_path: Path) -> None:
    missing = _missing()
    if missing:
        if os.environ.get("CI"):
            pytest.fail(missing)
        pytest.skip(missing)
    shots = Path(os.environ.get("KERNELEXEC_ARTIFACTS", tmp_path))
    shots.mkdir(parents=True, exist_ok=True)
    state = short_tmp / "view-state"
    with http_server(state) as url:
        options = {"mcp": url, "ui": str(UI), "playwright": str(PLAYWRIGHT), "shots": str(shots),
                   "userDataDir": str(tmp_path / "chromium")}
        proc = subprocess.run(["node", str(DRIVER), json.dumps(options)], capture_output=True, text=True, timeout=240)
    steps = {s["step"]: s for s in (json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{"))}
    assert "done" in steps, (steps.get("error"), proc.stderr[-2000:])

    listed = {t["name"]: t.get("visibility") for t in steps["ready"]["tools"]}
    assert listed["view_interrupt"] == ["app"] and listed["view_table"] == ["app"] and listed["execute_code"] is None

    shown = steps["shown"]
    assert shown["stdout"].strip() == "hello from the kernel"
    assert shown["plotSrc"] == "data:image/png;base64," and shown["plotSize"][0] > 100  # decoded and drawn
    assert re.fullmatch(r"CPU \d+\.\d\d s \u00b7 peak \d+ MB", shown["cost"]), shown["cost"]  # the answer's cpu_seconds, peak_memory_mb
    assert shown["firstPage"] == {"count": 20, "first": ["0", "0", "0", "row 0"], "page": "page 1 of 3 (45 rows)"}
    assert shown["secondPage"] == {"count": 20, "first": ["20", "20", "400", "row 20"], "page": "page 2 of 3 (45 rows)"}
    assert shown["sorted"] == ["44", "44", "1936", "row 44"]
    assert "df" in shown["variables"]

    stopped = steps["interrupted"]
    assert stopped["seconds"] < 15 and not stopped["success"]  # time.sleep(30), stopped by the button
    assert stopped["status"] == "error" and "KeyboardInterrupt" in stopped["error"]

    assert steps["done"]["offsite"] == []  # nothing but the host and data:/blob: URIs was requested
    assert (shots / "run-view.png").stat().st_size > 10_000


def test_run_view_follows_a_running_cell_live_and_answers_its_input(short_tmp: Path, tmp_path: Path) -> None:
    """With --yield-after 1 the call answers "running" at once; the view follows the run with get_run (output
    while it runs), shows a text field when the code waits in input(), and sends the typed answer with send_input."""
    missing = _missing()
    if missing:
        if os.environ.get("CI"):
            pytest.fail(missing)
        pytest.skip(missing)
    shots = Path(os.environ.get("KERNELEXEC_ARTIFACTS", tmp_path))
    shots.mkdir(parents=True, exist_ok=True)
    with http_server(short_tmp / "live-view-state", "--yield-after", "1") as url:
        options = {"mcp": url, "ui": str(UI), "playwright": str(PLAYWRIGHT), "shots": str(shots),
                   "userDataDir": str(tmp_path / "chromium"), "scenario": "live"}
        proc = subprocess.run(["node", str(DRIVER), json.dumps(options)], capture_output=True, text=True, timeout=240)
    steps = {s["step"]: s for s in (json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{"))}
    assert "done" in steps, (steps.get("error"), proc.stderr[-2000:])
    live = steps["live"]
    assert live["firstEnding"] == "running", live  # the call yielded: what follows is the view's own doing
    assert live["whileRunning"]["status"] == "running" and "tick 2" in live["whileRunning"]["stdout"], live
    asked = live["asked"]
    assert asked["status"] == "input" and asked["prompt"] == "Your name? " and "not the assistant" in asked["who"], asked
    assert "tick 6" in asked["stdout"]
    done = live["done"]
    assert done["status"] == "ok" and "hi Ada" in done["result"] and "hello Ada" in done["stdout"] and done["inputHidden"], done
    assert steps["done"]["offsite"] == [], steps["done"]
