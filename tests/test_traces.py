"""Traces (issue 34, point 2): a real `kernelexec serve` exporting over OTLP/HTTP to a receiver in this test,
which decodes the exporter's real protobuf (opentelemetry-proto's ExportTraceServiceRequest); a real SDK client
sends `_meta.traceparent` on tools/call; code mode's upstream (tests/codemode_upstream.py) logs the `_meta` it got.
Off (no OTEL_*), the OpenTelemetry SDK is never imported."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client

from .support import build_wheel, clean_env, http_server, kernelexec_cmd, package_index

pytest.importorskip("opentelemetry.proto.collector.trace.v1.trace_service_pb2")
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest  # noqa: E402

UPSTREAM = Path(__file__).resolve().parent / "codemode_upstream.py"
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{PARENT_ID}-01"


class Receiver:
    """An OTLP/HTTP traces endpoint on 127.0.0.1: POST /v1/traces, protobuf bodies decoded; every span kept."""

    def __init__(self) -> None:
        self.spans: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                if self.path != "/v1/traces" or self.headers.get("Content-Type") != "application/x-protobuf":
                    self.send_response(404)
                    self.end_headers()
                    return
                request = ExportTraceServiceRequest()
                request.ParseFromString(body)
                with receiver.lock:
                    for rs in request.resource_spans:
                        service = {a.key: a.value.string_value for a in rs.resource.attributes}.get("service.name")
                        for ss in rs.scope_spans:
                            for s in ss.spans:
                                receiver.spans.append({
                                    "name": s.name, "trace_id": s.trace_id.hex(), "span_id": s.span_id.hex(),
                                    "parent": s.parent_span_id.hex(), "service": service, "state": s.trace_state,
                                    "start": s.start_time_unix_nano, "end": s.end_time_unix_nano,
                                    "attributes": {a.key: _value(a.value) for a in s.attributes},
                                })
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def named(self, name: str) -> list[dict[str, Any]]:
        with self.lock:
            return [s for s in self.spans if s["name"] == name]

    def wait_id(self, span_id: str, timeout: float = 30) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                found = [s for s in self.spans if s["span_id"] == span_id]
            if found:
                return found[0]
            time.sleep(0.1)
        raise AssertionError(f"no span {span_id} received")

    def wait_for(self, name: str, timeout: float = 30) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = self.named(name)
            if found:
                return found[-1]
            time.sleep(0.1)
        raise AssertionError(f"no span {name!r} received; got {[s['name'] for s in self.spans]}")


def _value(v: Any) -> Any:
    kind = v.WhichOneof("value")
    return getattr(v, kind) if kind else None


@pytest.fixture()
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    thread = threading.Thread(target=r.server.serve_forever, daemon=True)
    thread.start()
    try:
        yield r
    finally:
        r.server.shutdown()


def serve_params(state_dir: Path, receiver: Receiver, *args: str) -> StdioServerParameters:
    cmd = kernelexec_cmd("serve", "--state-dir", str(state_dir), "--pool-size", "0", *args)
    env = clean_env(OTEL_EXPORTER_OTLP_ENDPOINT=receiver.url, OTEL_BSP_SCHEDULE_DELAY="100", OTEL_SERVICE_NAME="kx-test",
                    PIP_CONFIG_FILE=os.devnull)
    return StdioServerParameters(command=cmd[0], args=cmd[1:], env=env)


@pytest.mark.anyio
@pytest.mark.timeout(180)
async def test_a_tool_call_is_a_span_tree_under_the_clients_traceparent(short_tmp: Path, receiver: Receiver) -> None:
    meta_log = short_tmp / "upstream-meta.jsonl"
    tools = short_tmp / "tools.json"
    tools.write_text(json.dumps({"mcpServers": {"local": {"command": sys.executable, "args": [str(UPSTREAM), "stdio", "local"],
                                                          "env": {"UPSTREAM_META_LOG": str(meta_log)}}}}))
    wheel = build_wheel(short_tmp / "wheels", "kxtraced", "1.0", "VALUE = 7\n")
    with package_index(short_tmp / "index", [wheel]) as index:
        await check_the_tree(short_tmp, receiver, tools, meta_log, index)


async def check_the_tree(short_tmp: Path, receiver: Receiver, tools: Path, meta_log: Path, index: str) -> None:
    params = serve_params(short_tmp / "state", receiver, "--tools-config", str(tools), "--index-url", index)
    async with Client(stdio_client(params)) as client:
        result = await client.call_tool("execute_code", {"code": "x = 6 * 7\nx"},
                                        meta={"traceparent": TRACEPARENT, "tracestate": "kx=1"})
        assert not result.is_error, result.content
        for name in ("kernelexec.queue_wait", "kernelexec.kernel.execute", "kernelexec.record", "kernelexec.render"):
            receiver.wait_for(name)
        tool = receiver.wait_id(receiver.wait_for("kernelexec.kernel.execute")["parent"])
        # code mode: the broker's span, and the upstream got a traceparent of the same trace
        code = "import mcp_tools\nmcp_tools.local.traced()"
        result = await client.call_tool("execute_code", {"code": code}, meta={"traceparent": TRACEPARENT})
        assert not result.is_error, result.content
        assert "traced" in str(result.structured_content), result.structured_content
        broker = receiver.wait_for("kernelexec.broker call_tool")
        sent = receiver.wait_for("MCP send tools/call traced")
        # a cell that raises: its kernel span says so
        result = await client.call_tool("execute_code", {"code": "1/0"}, meta={"traceparent": TRACEPARENT})
        deadline = time.monotonic() + 30
        while not (raised := [s for s in receiver.named("kernelexec.kernel.execute") if s["attributes"].get("error.type")]):
            assert time.monotonic() < deadline, receiver.named("kernelexec.kernel.execute")
            await anyio.sleep(0.1)
        assert raised[0]["attributes"]["error.type"] == "cell_error"
        assert len(raised) == 1
        failed = receiver.wait_id(raised[0]["parent"])
        assert failed["name"] == "tools/call execute_code" and failed["parent"] == PARENT_ID, failed
        # an install: its span under install_packages's
        result = await client.call_tool("install_packages", {"packages": ["kxtraced"]}, meta={"traceparent": TRACEPARENT})
        assert not result.is_error, result.content
        install = receiver.wait_for("kernelexec.install")
        install_tool = receiver.wait_for("tools/call install_packages")

    # the tool span continues the client's context: its trace, its parent
    assert tool["trace_id"] == TRACE_ID and tool["parent"] == PARENT_ID, tool
    assert tool["service"] == "kx-test" and tool["state"] == "kx=1"
    assert tool["attributes"]["mcp.method.name"] == "tools/call"
    assert tool["attributes"]["gen_ai.tool.name"] == "execute_code"
    assert "jsonrpc.request.id" in tool["attributes"]
    assert tool["attributes"]["kernelexec.session"]  # the session's handle, set by the server on the SDK's span
    # its children: the first call's tree
    first = [s for s in receiver.spans if s["trace_id"] == TRACE_ID and s["parent"] == tool["span_id"]]
    assert {"kernelexec.queue_wait", "kernelexec.kernel.execute", "kernelexec.record", "kernelexec.render"} <= {
        s["name"] for s in first}, [(s["name"], s["parent"]) for s in receiver.spans]
    wait = next(s for s in first if s["name"] == "kernelexec.queue_wait")
    run = next(s for s in first if s["name"] == "kernelexec.kernel.execute")
    assert wait["start"] <= wait["end"] <= run["end"]

    # code mode: the broker span sits under the second call's kernel execution, the SDK's client span under it,
    # and the upstream received that client span as its parent
    run2 = receiver.wait_id(broker["parent"])
    second_tool = receiver.wait_id(run2["parent"])
    assert broker["trace_id"] == TRACE_ID and run2["name"] == "kernelexec.kernel.execute", (broker, run2)
    assert second_tool["name"] == "tools/call execute_code" and second_tool["parent"] == PARENT_ID
    assert len({tool["span_id"], second_tool["span_id"], failed["span_id"]}) == 3
    assert broker["attributes"]["gen_ai.tool.name"] == "traced"
    assert sent["parent"] == broker["span_id"]
    assert install["trace_id"] == TRACE_ID and install["parent"] == install_tool["span_id"], (install, install_tool)
    assert install_tool["parent"] == PARENT_ID
    got = [json.loads(line) for line in meta_log.read_text().splitlines()]
    assert len(got) == 1, got
    assert got[0].get("traceparent") == f"00-{TRACE_ID}-{sent['span_id']}-01", got


@pytest.mark.anyio
@pytest.mark.timeout(180)
async def test_over_streamable_http_a_call_continues_the_clients_trace(short_tmp: Path, receiver: Receiver) -> None:
    """The same tree over the HTTP transport (stateless 2026-07-28, a bearer token): the client's `_meta.traceparent`
    is the tool span's parent, and the queue wait, the kernel's execution, the record and the render are its children."""
    tokens = short_tmp / "tokens"
    tokens.write_text("trace-token-0123456789abcdef\n")
    otel = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url, "OTEL_BSP_SCHEDULE_DELAY": "100", "OTEL_SERVICE_NAME": "kx-http"}
    with http_server(short_tmp / "state", "--pool-size", "0", "--auth-token-file", str(tokens), env=otel) as url:
        http = httpx2.AsyncClient(headers={"Authorization": "Bearer trace-token-0123456789abcdef"}, timeout=60)
        async with Client(streamable_http_client(url, http_client=http)) as client:
            result = await client.call_tool("execute_code", {"code": "x = 6 * 7\nx"},
                                            meta={"traceparent": TRACEPARENT, "tracestate": "kx=1"})
            assert not result.is_error and result.structured_content["result"] == 42, result.content
            for name in ("kernelexec.queue_wait", "kernelexec.kernel.execute", "kernelexec.record", "kernelexec.render"):
                receiver.wait_for(name)
    tool = receiver.wait_id(receiver.wait_for("kernelexec.kernel.execute")["parent"])
    assert tool["name"] == "tools/call execute_code" and tool["service"] == "kx-http", tool
    assert tool["trace_id"] == TRACE_ID and tool["parent"] == PARENT_ID and tool["state"] == "kx=1", tool
    assert tool["attributes"]["gen_ai.tool.name"] == "execute_code" and tool["attributes"]["kernelexec.session"]
    children = {s["name"] for s in receiver.spans if s["trace_id"] == TRACE_ID and s["parent"] == tool["span_id"]}
    assert {"kernelexec.queue_wait", "kernelexec.kernel.execute", "kernelexec.record", "kernelexec.render"} <= children, \
        [(s["name"], s["trace_id"], s["parent"]) for s in receiver.spans]


def test_without_otel_variables_the_sdk_is_never_imported() -> None:
    """Off: building the server and configuring traces import no SDK, and a span is no object at all."""
    code = ("import sys\nfrom kernelexec import tracing\nimport kernelexec.server.build, kernelexec.cli\n"
            "assert tracing.configure() is False\n"
            "with tracing.span('x') as s: assert s is None\n"
            "bad = sorted(m for m in sys.modules if m.startswith(('opentelemetry.sdk', 'opentelemetry.exporter')))\n"
            "assert not bad, bad\nprint('ok')")
    env = {k: v for k, v in clean_env().items() if not k.startswith("OTEL_")}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
    # and on, the same check fails: the test can tell
    env["OTEL_EXPORTER_OTLP_ENDPOINT"] = "http://127.0.0.1:9"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode != 0


def test_which_variables_turn_traces_on() -> None:
    from kernelexec.tracing import wanted

    assert not wanted({})
    assert wanted({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"})
    assert wanted({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4318/v1/traces"})
    assert wanted({"OTEL_TRACES_EXPORTER": "otlp"})
    assert not wanted({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"})
    assert not wanted({"OTEL_SDK_DISABLED": "true", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"})
