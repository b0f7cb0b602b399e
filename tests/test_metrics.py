"""Prometheus metrics (issue 34, point 3), through real parts: ``kernelexec serve --transport http`` as a process,
the SDK's client over streamable HTTP with a bearer token, and a real Prometheus (Debian's ``prometheus``) scraping
/metrics with the token from a credentials file, then asked through its HTTP API.

- /metrics on the MCP port refuses a request without the token (401) and that request runs nothing;
- a real Prometheus scrapes it with the token and sees the runs, the kernels, their memory, the latencies;
  a scrape without the token is a target down (401);
- --metrics-port serves the same page on 127.0.0.1 without a token;
- without tokens (loopback only), /metrics answers only a Host that names loopback (DNS rebinding).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from .conftest import free_port, http_server, wait_for_port
from .support import stop

pytestmark = pytest.mark.anyio

TOKEN = "metrics-test-token-0123456789abcdef"
PROMETHEUS = shutil.which("prometheus")
UPSTREAM = Path(__file__).resolve().parent / "codemode_upstream.py"


@pytest.fixture(scope="module")
def server() -> Iterator[dict[str, Any]]:
    state = Path(tempfile.mkdtemp(prefix="km", dir="/tmp"))  # short: the kernels' sockets live under it
    port = free_port()
    try:
        # no pool or spare: a kernel the pool starts in the background must not pass for a session a refused call made
        with http_server(state / "state", "--auth-token", TOKEN, "--metrics-port", str(port), "--pool-size", "0",
                         "--restart-spares", "0") as url:
            yield {"url": url, "base": url.removesuffix("/mcp"), "loopback": f"http://127.0.0.1:{port}", "state": state / "state"}
    finally:
        shutil.rmtree(state, ignore_errors=True)


def page(url: str, token: str | None = TOKEN, **headers: str) -> httpx2.Response:
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    return httpx2.get(url, headers=headers, timeout=30)


def sample(text: str, name: str) -> float:
    """The sum of a metric's samples named exactly ``name`` (with any labels) in an exposition page."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_metrics_without_the_token_is_refused_and_runs_nothing(server: dict[str, Any]) -> None:
    before = page(server["base"] + "/metrics").text
    sessions_dir = server["state"] / "sessions"
    sessions = sorted(os.listdir(sessions_dir)) if sessions_dir.exists() else []
    for headers in ({}, {"Authorization": "Bearer not-the-token-not-the-token"}, {"Authorization": TOKEN}):
        refused = httpx2.get(server["base"] + "/metrics", headers=headers, timeout=30)
        assert refused.status_code == 401, (headers, refused.status_code)
        assert "kernelexec_" not in refused.text
    assert httpx2.post(server["base"] + "/metrics", json={"code": "1"}, timeout=30).status_code in (401, 405)
    after = page(server["base"] + "/metrics").text
    assert sample(after, "kernelexec_runs_total") == sample(before, "kernelexec_runs_total")
    assert sample(after, "kernelexec_call_seconds_count") == sample(before, "kernelexec_call_seconds_count")
    assert (sorted(os.listdir(sessions_dir)) if sessions_dir.exists() else []) == sessions


def test_the_metrics_port_serves_loopback_without_a_token(server: dict[str, Any]) -> None:
    open_page = page(server["loopback"] + "/metrics", token=None)
    assert open_page.status_code == 200
    assert "# TYPE kernelexec_runs_total counter" in open_page.text
    assert "kernelexec_sessions " in open_page.text


async def test_made_up_tool_names_never_become_series(server: dict[str, Any]) -> None:
    """A caller's calls to tools that do not exist are counted under tool="unknown": 50 made-up names add no
    series (before, each name became its own label set, kept for the server's life: memory a caller grows)."""
    client = Client(streamable_http_client(server["url"], http_client=httpx2.AsyncClient(
        headers={"Authorization": f"Bearer {TOKEN}"}, timeout=120)))
    async with client:
        for i in range(50):
            try:
                await client.call_tool(f"bogus_tool_{i}", {})
            except Exception:  # noqa: BLE001 - an unknown tool is an error either way
                pass
    text = page(server["base"] + "/metrics").text
    assert "bogus_tool_" not in text
    assert 'tool="unknown"' in text


async def run_cells(url: str) -> None:
    client = Client(streamable_http_client(url, http_client=httpx2.AsyncClient(headers={"Authorization": f"Bearer {TOKEN}"}, timeout=120)))
    async with client:
        first = await client.call_tool("execute_code", {"code": "x = 1"})
        assert not first.is_error, first.content
        session = first.structured_content["session"]
        held = await client.call_tool("execute_code", {"code": "block = b'm' * (64 * 2**20)", "session": session})
        assert not held.is_error, held.content  # its answer over HTTP says what it cost (test_cell_cost.py: how much)
        # a high-water mark (VmHWM): the first answer's may sit above the resting memory the 64 MiB land on (by what
        # the start freed again; 0.6 MiB once under a loaded CI), so "first + 64" is not a bound; 8 MiB of room is
        assert held.structured_content["peak_memory_mb"] >= first.structured_content["peak_memory_mb"] + 64 - 8
        assert 0 <= held.structured_content["cpu_seconds"] < 5
        failed = await client.call_tool("execute_code", {"code": "1/0", "session": session})
        assert failed.structured_content["error_type"] == "ZeroDivisionError"


def query(prometheus: str, promql: str) -> list[dict[str, Any]]:
    answer = httpx2.get(f"{prometheus}/api/v1/query", params={"query": promql}, timeout=30).json()
    assert answer["status"] == "success", answer
    return answer["data"]["result"]


def value(prometheus: str, promql: str) -> float | None:
    result = query(prometheus, promql)
    return float(result[0]["value"][1]) if result else None


@pytest.fixture
def prometheus(server: dict[str, Any], tmp_path: Path) -> Iterator[str]:
    if PROMETHEUS is None:
        if os.environ.get("CI"):
            pytest.fail("no prometheus binary: .ci/run installs Debian's prometheus")
        pytest.skip("no prometheus binary (apt-get install prometheus)")
    target = server["base"].removeprefix("http://")
    credentials = tmp_path / "token"
    credentials.write_text(TOKEN + "\n")
    config = tmp_path / "prometheus.yml"
    config.write_text(f"""\
global:
  scrape_interval: 1s
  scrape_timeout: 1s
scrape_configs:
  - job_name: kernelexec
    authorization:
      credentials_file: {credentials}
    static_configs:
      - targets: ['{target}']
  - job_name: kernelexec-without-token
    static_configs:
      - targets: ['{target}']
""")
    port = free_port()
    proc = subprocess.Popen([PROMETHEUS, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'data'}",
                             f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
                            stdout=subprocess.DEVNULL, stderr=open(tmp_path / "prometheus.log", "wb"))  # noqa: SIM115
    try:
        wait_for_port(port, proc)
        yield f"http://127.0.0.1:{port}"
    finally:
        stop(proc)


def until_value(prometheus: str, promql: str, ok: Any, timeout: float = 60) -> float | None:
    deadline = time.monotonic() + timeout
    seen = None
    while time.monotonic() < deadline:
        seen = value(prometheus, promql)
        if seen is not None and ok(seen):
            return seen
        time.sleep(0.5)
    raise AssertionError(f"{promql}: {seen} after {timeout} s")


async def test_a_real_prometheus_scrapes_the_runs_with_the_token(server: dict[str, Any], prometheus: str) -> None:
    await run_cells(server["url"])
    # the page as scraped now: the runs these cells made (earlier tests of this module ran none)
    until_value(prometheus, 'kernelexec_runs_total{job="kernelexec",ending="ok"}', lambda v: v >= 2)
    assert until_value(prometheus, 'kernelexec_runs_total{job="kernelexec",ending="error"}', lambda v: v >= 1) == 1
    targets = httpx2.get(f"{prometheus}/api/v1/targets", timeout=30).json()["data"]["activeTargets"]
    health = {t["labels"]["job"]: (t["health"], t.get("lastError", "")) for t in targets}
    assert health["kernelexec"][0] == "up", health
    until_value(prometheus, 'up{job="kernelexec-without-token"}', lambda v: v == 0)
    targets = httpx2.get(f"{prometheus}/api/v1/targets", timeout=30).json()["data"]["activeTargets"]
    refused = [t.get("lastError", "") for t in targets if t["labels"]["job"] == "kernelexec-without-token"]
    assert refused and "401" in refused[0], refused
    # the rest, as Prometheus has them
    assert until_value(prometheus, 'sum(kernelexec_kernels{job="kernelexec",state="idle"})', lambda v: v >= 1) >= 1
    assert until_value(prometheus, 'kernelexec_sessions{job="kernelexec"}', lambda v: v >= 1) >= 1
    memory = until_value(prometheus, 'max(kernelexec_kernel_memory_bytes{job="kernelexec"})', lambda v: v >= 64 * 2**20)
    assert memory is not None and memory < 4 * 2**30
    assert value(prometheus, 'kernelexec_call_seconds_count{job="kernelexec",tool="execute_code",outcome="ok"}') == 3
    assert value(prometheus, 'kernelexec_queue_wait_seconds_count{job="kernelexec",tool="execute_code"}') == 3
    cpu = value(prometheus, 'kernelexec_cell_cpu_seconds_total{job="kernelexec"}')
    assert cpu is not None and cpu > 0
    # the store's calls, timed: the session's record; the three cells, each answered in full by its own call, left no
    # run record (nobody holds their run ids: durable.observer), so none of them paid a store write besides the journal
    assert (value(prometheus, 'sum(kernelexec_store_seconds_count{job="kernelexec",operation="put_session"})') or 0) >= 1
    assert (value(prometheus, 'sum(kernelexec_store_seconds_count{job="kernelexec",operation="put_run"})') or 0) == 0


def test_without_tokens_the_page_answers_only_a_loopback_host(short_tmp: Path) -> None:
    with http_server(short_tmp / "state", "--pool-size", "0", "--restart-spares", "0") as url:
        base = url.removesuffix("/mcp")
        assert page(base + "/metrics", token=None).status_code == 200
        port = base.rsplit(":", 1)[1]
        assert page(base + "/metrics", token=None, host=f"localhost:{port}").status_code == 200
        rebound = page(base + "/metrics", token=None, host=f"attacker.example:{port}")
        assert rebound.status_code == 421 and "kernelexec_" not in rebound.text


async def test_the_metrics_port_under_stdio_counts_a_busy_kernel_and_its_runs(short_tmp: Path) -> None:
    from mcp.client.stdio import stdio_client

    from .support import stdio_params

    port = free_port()
    url = f"http://127.0.0.1:{port}/metrics"
    tools = short_tmp / "tools.json"  # code mode: one upstream server (tests/codemode_upstream.py), its calls counted
    tools.write_text(json.dumps({"mcpServers": {"local": {"command": sys.executable, "args": [str(UPSTREAM), "stdio", "local"]}}}))
    async with Client(stdio_client(stdio_params(short_tmp / "state", "--metrics-port", str(port), "--tools-config", str(tools)))) as client:
        first = await client.call_tool("execute_code", {"code": "import mcp_tools\nx = mcp_tools.local.add(a=1, b=2)\ntry:\n    mcp_tools.local.fail()\n"
                                                                "except Exception as exc:\n    failed = exc"})
        assert not first.is_error and first.structured_content["success"], (first.structured_content["error"], first.structured_content["traceback"][-3:])
        running = await client.call_tool("execute_code", {"code": "import time; time.sleep(4)", "background": True})
        assert running.structured_content["ending"] == "running", running.structured_content
        deadline = time.monotonic() + 3  # the run takes the session's lock just after the answer: look a few times
        while 'kernelexec_kernels{state="busy"} 1.0' not in (busy := page(url, token=None).text) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert 'kernelexec_kernels{state="busy"} 1.0' in busy, [line for line in busy.splitlines() if "kernels{" in line]
        done = await client.call_tool("get_run", {"run_id": running.structured_content["run_id"], "wait_s": 30})
        assert done.structured_content["ending"] == "completed", done.structured_content
        refused = await client.call_tool("install_packages", {"packages": ["not a requirement!"], "session": first.structured_content["session"]})
        assert refused.is_error, refused.content
        deadline = time.monotonic() + 5  # a run's end is counted by its observers just after its answer went out
        while 'kernelexec_runs_total{ending="ok"} 2.0' not in (after := page(url, token=None).text) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert 'kernelexec_kernels{state="idle"} 1.0' in after
        assert 'kernelexec_runs_total{ending="ok"} 2.0' in after, [line for line in after.splitlines() if "runs_total" in line]
        assert 'kernelexec_installs_total{outcome="error"} 1.0' in after
        assert 'kernelexec_broker_calls_total{outcome="ok"} 1.0' in after
        assert 'kernelexec_broker_calls_total{outcome="error"} 1.0' in after
        assert 'kernelexec_call_seconds_count{outcome="error",tool="install_packages"} 1.0' in after
        assert 'kernelexec_call_seconds_count{outcome="ok",tool="get_run"} 1.0' in after
