"""How long a client waits for ``kernelexec serve`` to answer: spawn to ``initialize`` answered, over stdio.

An MCP client (Claude Code, Claude Desktop, Cursor) starts the server as a stdio child each time it starts, and some
give up on a server that does not answer in time. The baseline is the floor any server on the MCP SDK pays: a bare
``MCPServer`` with no tools, spawned and initialized the same way. Both alternate, so other load hits both alike.

    python -m benchmarks.startup [--rounds N]   (or: python -m benchmarks --only startup)
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import anyio
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client

from benchmarks.common import clean_env, log, short_tmp, stdio_params
from benchmarks.stats import Measurement

BARE_SERVER = "from mcp.server.mcpserver import MCPServer\nMCPServer('bare').run()\n"
BASELINE = "start: a bare MCP SDK server, spawn -> initialize answered (stdio)"


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
    out.append(Measurement(BASELINE, "ms", bare_ms, note="MCPServer with no tools: the SDK's own import and start-up"))
    out.append(Measurement("start: kernelexec serve, spawn -> initialize answered (stdio)", "ms", serve_ms,
                           baseline=BASELINE,
                           note="a new state dir each time; kernels start in the background and are not waited for"))


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
