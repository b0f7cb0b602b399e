"""Code mode: what a brokered tool call costs, and what the model reads.

    python -m benchmarks --only codemode [--quick]       (or: python -m benchmarks.codemode [--quick])

1. Round trip of one tool call (``add(a=1, b=2)``) to the same upstream MCP server (tests/codemode_upstream.py,
   streamable HTTP on 127.0.0.1, and a stdio child): a direct SDK ``mcp.Client`` call from this process, vs
   ``mcp_tools.<server>.add(a=1, b=2)`` timed *inside* a cell (perf_counter around each call): the kernel's
   marked ``input_request`` on its stdin channel, the server's broker (schema check, allow/approve rules,
   record), the SDK call, the reply. The difference of the medians is what the broker adds (goal: <= 2 ms).
2. Characters the model reads for one task — the forecast of 50 cities, then the three warmest — done as 50
   direct tool calls (each call's arguments it writes and each result it reads) vs one ``execute_code`` cell
   (the code it writes and the answer it reads).
3. ``execute_code``'s description with code mode on (one line per callable tool) vs off.

Measured here (December, 2 CPUs, load average 1.8; 300 calls each): direct 2.27 ms vs brokered 3.79 ms over
HTTP (+1.51), 1.21 vs 2.31 ms over stdio (+1.10); the task: 5,700 characters read (+1,850 written) as 50
direct calls vs 251 (+201 written) as one cell; the description 102 -> 1,691 characters for 22 tools.
Under load from other work (load average ~5) the broker's added time rose to 3-6 ms.
"""

from __future__ import annotations

import argparse
import json
import logging
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio

UPSTREAM = Path(__file__).resolve().parent.parent / "tests" / "codemode_upstream.py"
CITIES = [f"City{i:02d}" for i in range(50)]
TASK_CELL = ("import mcp_tools\n"
             "cities = [f'City{i:02d}' for i in range(50)]\n"
             "found = [mcp_tools.bench.forecast(city=c, days=i % 7) for i, c in enumerate(cities)]\n"
             "result = sorted(found, key=lambda f: -f['high_c'])[:3]")


def _text_chars(content: list[Any]) -> int:
    return sum(len(c.text) if c.type == "text" else len(c.model_dump_json(by_alias=True, exclude_none=True))
               for c in content if c.type != "image")


async def measure(calls: int, warmup: int) -> dict[str, Any]:
    from mcp import Client
    from mcp.client.stdio import StdioServerParameters

    from kernelexec.config import load_settings
    from kernelexec.server.build import build_server
    from kernelexec.session.manager import SessionManager
    from tests.support import free_port, wait_for_port

    found: dict[str, Any] = {}
    port = free_port()
    proc = subprocess.Popen([sys.executable, str(UPSTREAM), "http", "bench", str(port)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        wait_for_port(port, proc)
        url = f"http://127.0.0.1:{port}/mcp"
        with tempfile.TemporaryDirectory(prefix="kxcm") as folder:
            config = Path(folder) / "tools.json"
            config.write_text(json.dumps({"mcpServers": {
                "bench": {"type": "http", "url": url},
                "benchio": {"command": sys.executable, "args": [str(UPSTREAM), "stdio", "benchio"]}}}))
            settings = load_settings(state_dir=Path(folder) / "state", pool_size=0, restart_spares=0, tools_config=str(config))
            sessions = SessionManager(settings)
            direct_io = StdioServerParameters(command=sys.executable, args=[str(UPSTREAM), "stdio", "direct"])
            # rounds alternate direct and brokered batches, so load from elsewhere on the machine hits both alike
            rounds, batch = max(1, calls // 25), min(25, calls)
            async with sessions.running(), Client(build_server(settings, sessions)) as client, \
                    Client(url) as direct_http, Client(direct_io) as direct_stdio:
                for name, server, direct in (("http", "bench", direct_http), ("stdio", "benchio", direct_stdio)):
                    found[f"direct {name}"], found[f"brokered {name}"] = [], []
                    for _ in range(warmup):
                        await direct.call_tool("add", {"a": 1, "b": 2})
                    for round_ in range(rounds):
                        for _ in range(batch):
                            t0 = time.perf_counter()
                            await direct.call_tool("add", {"a": 1, "b": 2})
                            found[f"direct {name}"].append((time.perf_counter() - t0) * 1000)
                        skip = warmup if round_ == 0 else 0
                        code = (f"import mcp_tools, time\nfn = mcp_tools.{server}.add\n_t = []\n"
                                f"for _i in range({skip + batch}):\n    _t0 = time.perf_counter()\n    fn(a=1, b=2)\n"
                                f"    _t.append((time.perf_counter() - _t0) * 1000)\nresult = _t[{skip}:]")
                        r = await client.call_tool("execute_code", {"code": code, "timeout": 600})
                        assert r.structured_content and r.structured_content.get("success"), r.content
                        found[f"brokered {name}"] += r.structured_content["result"]
                # the task done in one cell
                r = await client.call_tool("execute_code", {"code": TASK_CELL})
                assert r.structured_content and r.structured_content.get("success"), r.content
                found["cell"] = {"writes": len(TASK_CELL), "reads": _text_chars(r.content)}
                tools = {t.name: t for t in (await client.list_tools()).tools}
                found["description with code mode"] = len(tools["execute_code"].description or "")
                found["callable"] = (tools["execute_code"].description or "").count("\nmcp_tools.")
            # the task as 50 direct calls: what the model writes (name + arguments) and reads (the result content)
            async with Client(url) as client:
                writes = reads = 0
                for i, city in enumerate(CITIES):
                    arguments = {"city": city, "days": i % 7}
                    result = await client.call_tool("forecast", arguments)
                    writes += len("forecast") + len(json.dumps(arguments))
                    reads += _text_chars(result.content) + len(json.dumps(result.structured_content or {}))
                found["direct 50"] = {"writes": writes, "reads": reads}
            off = load_settings(state_dir=Path(folder) / "state2", pool_size=0)
            sessions = SessionManager(off)
            async with sessions.running(), Client(build_server(off, sessions)) as client:
                tools = {t.name: t for t in (await client.list_tools()).tools}
                found["description without"] = len(tools["execute_code"].description or "")
    finally:
        proc.terminate()
        proc.wait(10)
    return found


def _median(values: list[float]) -> float:
    s = sorted(values)
    return s[len(s) // 2] if len(s) % 2 else (s[len(s) // 2 - 1] + s[len(s) // 2]) / 2


async def bench_codemode(plan: Any, base: Path, out: list[Any]) -> None:
    """The ``codemode`` section of benchmarks/run.py."""
    from benchmarks.common import log
    from benchmarks.stats import Measurement

    calls = 50 if plan.quick else 300
    logging.getLogger("kernelexec.codemode.broker").setLevel(logging.WARNING)  # one log line per call otherwise
    log(f"[codemode] brokered tool call vs direct SDK call ({calls} each), and characters for a 50-call task")
    found = await measure(calls, 10)
    for name in ("http", "stdio"):
        direct, brokered = found[f"direct {name}"], found[f"brokered {name}"]
        out.append(Measurement(f"tool call, direct SDK client ({name})", "ms", direct))
        out.append(Measurement(f"tool call, mcp_tools in a cell ({name})", "ms", brokered, baseline=f"tool call, direct SDK client ({name})",
                               note=f"broker adds {_median(brokered) - _median(direct):.2f} ms at the median (goal <= 2 ms)"))
    direct50, cell = found["direct 50"], found["cell"]
    out.append(Measurement("task: 50 direct tool calls, chars the model reads", "chars", [float(direct50["reads"])],
                           note=f"plus {direct50['writes']:,} chars it writes (50 calls' arguments)"))
    out.append(Measurement("task: one execute_code cell, chars the model reads", "chars", [float(cell["reads"])],
                           baseline="task: 50 direct tool calls, chars the model reads",
                           note=f"plus {cell['writes']:,} chars it writes (the cell)"))
    out.append(Measurement("execute_code description, code mode off", "chars", [float(found["description without"])]))
    out.append(Measurement(f"execute_code description, code mode on ({found['callable']} tools)", "chars", [float(found["description with code mode"])],
                           baseline="execute_code description, code mode off"))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="50 calls per row instead of 300")
    args = parser.parse_args(argv)
    from benchmarks.stats import Measurement, table

    rows: list[Measurement] = []

    class Plan:
        quick = args.quick

    anyio.run(bench_codemode, Plan, Path(tempfile.gettempdir()), rows)
    print(table(rows))
    print("\nnotes:\n" + "\n".join(f"  {r.name}: {r.note}" for r in rows if r.note))


if __name__ == "__main__":
    main()
