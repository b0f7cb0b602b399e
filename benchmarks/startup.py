"""How long a client waits for ``kernelexec serve`` to answer: spawn to ``initialize`` answered, over stdio.

An MCP client (Claude Code, Claude Desktop, Cursor) starts the server as a stdio child each time it starts, and some
give up on a server that does not answer in time. The baseline is the floor any server on the MCP SDK pays: a bare
``MCPServer`` with no tools, spawned and initialized the same way. Both alternate, so other load hits both alike.

The code-only plugin's hook is a process too, started before every tool call Claude Code makes: ``kernelexec hook
pre-tool-use --code-only`` given a PreToolUse event on stdin, spawn to its decision, against the floor of any hook
written in Python (``python -c pass``).

    python -m benchmarks.startup [--rounds N]   (or: python -m benchmarks --only startup)
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import anyio
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client

from benchmarks.common import clean_env, kernelexec_cmd, log, short_tmp, stdio_params
from benchmarks.stats import Measurement

BARE_SERVER = "from mcp.server.mcpserver import MCPServer\nMCPServer('bare').run()\n"
BASELINE = "start: a bare MCP SDK server, spawn -> initialize answered (stdio)"
HOOK_FLOOR = "start: python -c pass, spawn -> exit (the floor of a hook in Python)"
HOOK_EVENT = json.dumps({"session_id": "bench", "transcript_path": "/tmp/transcript.jsonl", "cwd": "/tmp",
                         "permission_mode": "default", "hook_event_name": "PreToolUse", "tool_name": "Bash",
                         "tool_input": {"command": "ls"}}).encode()


def _ran_in(cmd: list[str], stdin: bytes = b"") -> float:
    t0 = time.perf_counter()
    subprocess.run(cmd, input=stdin, capture_output=True, check=True, timeout=60, env=clean_env())
    return (time.perf_counter() - t0) * 1000


async def _initialized_in(params: StdioServerParameters) -> float:
    t0 = time.perf_counter()
    async with Client(stdio_client(params)):
        elapsed = time.perf_counter() - t0  # Client's __aenter__ returns once initialize is answered
    return elapsed * 1000


async def bench_startup(plan: Any, base: Path, out: list[Measurement]) -> None:
    rounds = getattr(plan, "cold", 10)  # the cold-start section's count: 10, or 3 with --quick
    log(f"[startup] {rounds} spawns of kernelexec serve and of a bare SDK server, alternating")
    bare = StdioServerParameters(command=sys.executable, args=["-c", BARE_SERVER], env=clean_env())
    bare_ms, serve_ms = [], []
    for i in range(rounds + 1):  # the first round fills the page cache and is not counted
        with anyio.fail_after(120):
            b = await _initialized_in(bare)
            s = await _initialized_in(stdio_params(base / f"state-{i}"))
        if i:
            bare_ms.append(b)
            serve_ms.append(s)
    floor_ms, hook_ms = [], []
    hook = kernelexec_cmd("hook", "pre-tool-use", "--code-only")
    for i in range(3 * rounds + 1):
        f = _ran_in([sys.executable, "-c", "pass"])
        h = _ran_in(hook, HOOK_EVENT)
        if i:
            floor_ms.append(f)
            hook_ms.append(h)
    out.append(Measurement(BASELINE, "ms", bare_ms, note="MCPServer with no tools: the SDK's own import and start-up"))
    out.append(Measurement("start: kernelexec serve, spawn -> initialize answered (stdio)", "ms", serve_ms,
                           baseline=BASELINE,
                           note="a new state dir each time; kernels start in the background and are not waited for"))
    out.append(Measurement(HOOK_FLOOR, "ms", floor_ms, note="the interpreter's own start and exit"))
    out.append(Measurement("start: kernelexec hook pre-tool-use --code-only, spawn -> decision", "ms", hook_ms,
                           baseline=HOOK_FLOOR, note="a Bash PreToolUse event on stdin: denied, as before every tool call"))


def main(argv: list[str] | None = None) -> None:
    from benchmarks.stats import table

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args(argv)
    out: list[Measurement] = []
    with short_tmp() as base:
        anyio.run(bench_startup, argparse.Namespace(cold=args.rounds), base, out, backend="asyncio")
    print(table(out))


if __name__ == "__main__":
    main()
