"""Per-call overhead, timed the way the issue's bar times it: the MCP SDK's own client vs raw jupyter_client.

    python -m benchmarks --only overhead [--quick]        (or: python -m benchmarks.overhead [--calls N])

One ``x=1`` round trip, back to back, in each of (interleaved call by call, so load from elsewhere on the
machine hits every row alike):

- raw: jupyter_client's ``BlockingKernelClient.execute`` + its shell reply and its IOPub ``idle``, on a plain
  ipykernel started by jupyter_client's kernel manager (ipc, no history) in this process;
- stdio: ``mcp.Client`` over ``stdio_client`` to a ``kernelexec serve`` child calling ``execute_code(code="x=1")``
  (the client validates the structured content against the tool's output schema on every call);
- streamable HTTP: the same against ``kernelexec serve --transport http`` (a session handle);
- in memory: the same against a server in this process;
- the SDK's floor: the SDK's client over stdio to the thinnest server the SDK allows around jupyter_client
  (``benchmarks/sdk_floor.py``: one tool, a plain ipykernel through ``AsyncKernelClient``, nothing else), so the
  stdio row's distance from it is kernelexec's own share of a call;
- then, back to back, in memory again once the session holds a long history (IPython's ``_i<n>`` names);

and the stdio server process's own CPU time per call (all its threads), which other load on the machine
barely changes, unlike the times.

Each row prints its median and p95; ``ratio`` is its median over the raw row's.
"""

from __future__ import annotations

import argparse
import logging
import os
import queue
import sys
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import anyio
from mcp import Client
from mcp.client.stdio import StdioServerParameters

from benchmarks.common import (
    call,
    clean_env,
    http_server,
    in_memory,
    log,
    make_settings,
    raw_kernel,
    short_tmp,
    stdio_params,
    stdio_server_pid,
)
from benchmarks.stats import Measurement

MS = "ms"
RAW = "overhead x=1: raw BlockingKernelClient (reply+idle)"
FLOOR = "overhead x=1: the SDK's floor over stdio (one tool around AsyncKernelClient)"
CODE = "x=1"
LONG_SESSION = 5000


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process so far (all its threads), from /proc."""
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def blocking_execute(kc: Any, code: str, timeout: float = 30.0) -> dict[str, Any]:
    """``BlockingKernelClient.execute``, then its shell reply and its IOPub idle: a raw caller's round trip."""
    msg_id = kc.execute(code)
    deadline = time.monotonic() + timeout
    reply = None
    idle = False
    while not idle:
        msg = kc.get_iopub_msg(timeout=max(0.0, deadline - time.monotonic()))
        idle = (msg["parent_header"].get("msg_id") == msg_id and msg["msg_type"] == "status"
                and msg["content"]["execution_state"] == "idle")
    while reply is None:
        msg = kc.get_shell_msg(timeout=max(0.0, deadline - time.monotonic()))
        if msg["parent_header"].get("msg_id") == msg_id:
            reply = msg["content"]
    return reply


def drain(kc: Any) -> None:
    for get in (kc.get_iopub_msg, kc.get_shell_msg):
        try:
            while True:
                get(timeout=0)
        except queue.Empty:
            pass


async def timed_call(call: Any, samples: list[float] | None) -> None:
    """One ``execute_code`` call, checked; its time in ms appended to ``samples`` (None: a warm-up call)."""
    t0 = time.perf_counter()
    result = await call()
    elapsed = time.perf_counter() - t0
    assert not result.is_error and result.structured_content["success"], result
    if samples is not None:
        samples.append(elapsed * 1000)


async def bench_overhead(plan: Any, base: Path, out: list[Measurement]) -> None:
    """The ``overhead`` section: raw, stdio, streamable HTTP and in-memory ``x=1``, interleaved."""
    calls, warmup = plan.calls, plan.warmup
    log(f"[overhead] x=1 back to back: raw BlockingKernelClient, SDK client over stdio, HTTP, in memory, the SDK's floor; "
        f"{calls} calls each, interleaved")
    raw: list[float] = []
    stdio: list[float] = []
    http: list[float] = []
    memory: list[float] = []
    floor: list[float] = []
    server_cpu: list[float] = []
    long_session: list[float] = []
    async with raw_kernel(base) as (km, _akc), Client(stdio_params(base / "ov-stdio")) as s_client, \
            http_server(base / "ov-http", timeout=180) as (url, _proc), Client(url) as h_client, \
            in_memory(make_settings(base)) as (m_client, _sessions), Client(StdioServerParameters(
                command=sys.executable, args=[str(Path(__file__).with_name("sdk_floor.py")), str(base / "ov-floor")],
                env=clean_env())) as f_client:
        kc = km.blocking_client()
        kc.start_channels()
        try:
            kc.wait_for_ready(timeout=60)
            drain(kc)
            handle = (await call(h_client, "new_session"))["session"]

            async def stdio_call() -> Any:
                return await s_client.call_tool("execute_code", {"code": CODE})

            async def http_call() -> Any:
                return await h_client.call_tool("execute_code", {"code": CODE, "session": handle})

            async def memory_call() -> Any:
                return await m_client.call_tool("execute_code", {"code": CODE})

            async def floor_call() -> Any:
                return await f_client.call_tool("execute_code", {"code": CODE})

            rows = ((stdio_call, stdio), (http_call, http), (memory_call, memory), (floor_call, floor))
            server_pid = stdio_server_pid(base / "ov-stdio")
            cpu_before = 0.0
            for i in range(warmup + calls):
                if i == warmup and server_pid is not None:
                    cpu_before = cpu_seconds(server_pid)
                t0 = time.perf_counter()
                reply = blocking_execute(kc, CODE)
                elapsed = time.perf_counter() - t0
                assert reply["status"] == "ok", reply
                if i >= warmup:
                    raw.append(elapsed * 1000)
                for fn, samples in rows:
                    await timed_call(fn, samples if i >= warmup else None)
            if server_pid is not None:
                server_cpu.append((cpu_seconds(server_pid) - cpu_before) / calls * 1000)
            # a long session: IPython keeps every cell's input in the namespace (_i<n>; outputs as _<n>), so the
            # in-memory session is given LONG_SESSION cells' worth of them, then timed again
            await m_client.call_tool("execute_code", {"code": (
                f"get_ipython().user_ns.update({{f'_i{{n}}': 'x=1' for n in range(10**6, 10**6 + {LONG_SESSION})}})")})
            for i in range(warmup + calls):
                await timed_call(memory_call, long_session if i >= warmup else None)
        finally:
            kc.stop_channels()
    out.append(Measurement(RAW, MS, raw, note="plain ipykernel via jupyter_client's kernel manager, ipc, no history"))
    out.append(Measurement("overhead x=1: execute_code, SDK client over stdio", MS, stdio, baseline=RAW,
                           note="mcp.Client + stdio_client, output schema validated per call: the issue's bar"))
    out.append(Measurement("overhead x=1: execute_code, SDK client over streamable HTTP", MS, http, baseline=RAW))
    out.append(Measurement("overhead x=1: execute_code, SDK client in memory", MS, memory, baseline=RAW))
    out.append(Measurement(FLOOR, MS, floor, baseline=RAW,
                           note="benchmarks/sdk_floor.py: no sandbox, record or session; the lowest ratio the stdio row can reach"))
    out.append(Measurement(f"overhead x=1: execute_code in memory, a session {LONG_SESSION:,} cells long", MS,
                           long_session, baseline=RAW,
                           note="after the rows above, back to back: what a cell costs once the session has a long history"))
    out.append(Measurement("overhead x=1: stdio server CPU per call", MS, server_cpu,
                           note="the kernelexec serve process's user+system CPU (all its threads) over the timed calls, "
                                "per call: what the server itself spends, much less sensitive to other load than the times"))


def main(argv: list[str] | None = None) -> None:
    from benchmarks.stats import table

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=20)
    args = parser.parse_args(argv)
    for name in ("httpx", "httpx2"):  # MCPServer() sets the root logger to INFO: no line per HTTP request
        logging.getLogger(name).setLevel(logging.WARNING)
    plan = argparse.Namespace(calls=args.calls, warmup=args.warmup)
    out: list[Measurement] = []

    async def run() -> None:
        with short_tmp() as base:
            await bench_overhead(plan, base, out)

    anyio.run(run, backend="asyncio")
    print(table(out))


if __name__ == "__main__":
    main()
