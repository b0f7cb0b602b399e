"""Soak: thousands of calls, normal and hostile, across several sessions, through a real MCP client.

    python -m benchmarks.soak [--calls 2000] [--sessions 4] [--transport memory|stdio|both] [--json FILE]

Two servers per transport: a ``standard``-profile one holding ``--sessions`` sessions, and a
``trusted``-profile one holding one session where the kernel-killing cells (``os._exit(1)``) go.
In memory both are built in this process (``build_server`` + ``SessionManager.running()`` +
``mcp.Client``), so the server's fds are ``/proc/self/fd``; over stdio they are two
``kernelexec serve`` children, counted through ``/proc/<pid>/fd``.

The mix (weights per 1,000 calls): plain cells, exceptions, ~2 MB prints, a 50 MB list allocated
and freed, a matplotlib figure, ``list_variables``, ``time.sleep(5)`` with ``timeout=1``, and
``os._exit(1)``. Every answer is checked against what that cell must produce.

Every session first runs each kind of cell once (warm-up); then fds, RSS and kernel processes
are sampled ("start"), the calls run, and after a short settle they are sampled again ("end").
Exit status: 0 when all is well; bit 1 set when the servers' open fds grew by more than
``--fd-tolerance``; bit 2 set when any answer was not what its cell must produce.
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import os
import random
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # ``python benchmarks/soak.py``
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import anyio
from mcp import Client

from benchmarks.common import (
    call,
    children,
    cpu_seconds,
    fd_count,
    fd_kinds,
    in_memory,
    kernel_pids,
    log,
    make_settings,
    rss_mb,
    short_tmp,
    stdio_params,
    stdio_server_pid,
)
from benchmarks.stats import Measurement, render_grid, table

# kind -> (weight per 1000, where it runs)
WEIGHTS: dict[str, int] = {
    "ok": 790,
    "exception": 50,
    "churn": 40,
    "plot": 30,
    "big_print": 30,
    "variables": 30,
    "timeout": 15,
    "death": 15,
}

PLOT = """\
import matplotlib.pyplot as plt
fig, ax = plt.subplots()
ax.plot([i * i for i in range({n})])
ax.set_title('soak {n}')
plt.show()
"""


@dataclass
class Cell:
    kind: str
    index: int

    def request(self) -> tuple[str, dict[str, Any]]:
        i = self.index
        if self.kind == "ok":
            code = [f"x = {i}\nresult = x * 2", f"print('line', {i})", f"sum(range({i % 1000}))"][i % 3]
            return "execute_code", {"code": code}
        if self.kind == "exception":
            return "execute_code", {"code": f"raise ValueError('soak {i}')" if i % 2 else "1 / 0"}
        if self.kind == "big_print":
            return "execute_code", {"code": "print('x' * 2_000_000)"}
        if self.kind == "churn":
            return "execute_code", {"code": "_big = [0] * 6_250_000  # 50 MB of pointers\ndel _big\nresult = 'freed'"}
        if self.kind == "plot":
            return "execute_code", {"code": PLOT.format(n=10 + i % 50)}
        if self.kind == "variables":
            return "list_variables", {}
        if self.kind == "timeout":
            return "execute_code", {"code": "import time\ntime.sleep(5)", "timeout": 1}
        if self.kind == "death":
            return "execute_code", {"code": "import os\nos._exit(1)"}
        raise ValueError(self.kind)

    def check(self, sc: dict[str, Any] | None, is_error: bool) -> str | None:
        """None when the answer is what this cell must produce, else what was wrong."""
        if is_error or sc is None:
            return "tool error"
        k, i = self.kind, self.index
        if k == "variables":
            return None if isinstance(sc.get("variables"), list) else "no variables list"
        if k == "ok":
            want = [{"result": 2 * i}, {"stdout": f"line {i}\n"}, {"result": sum(range(i % 1000))}][i % 3]
            bad = {key: sc.get(key) for key, v in want.items() if sc.get(key) != v}
            return None if sc.get("success") and not bad else f"success={sc.get('success')} {bad} {sc.get('error')}"
        if k == "exception":
            want = "ValueError" if i % 2 else "ZeroDivisionError"
            return None if not sc.get("success") and sc.get("error_type") == want else f"error_type={sc.get('error_type')}"
        if k == "big_print":
            ok = sc.get("success") and sc.get("stdout_file") and len(sc.get("stdout", "")) < 100_000
            return None if ok else f"success={sc.get('success')} stdout={len(sc.get('stdout', ''))} file={sc.get('stdout_file')}"
        if k == "churn":
            return None if sc.get("success") and sc.get("result") == "freed" else f"{sc.get('error')}"
        if k == "plot":
            pngs = [o for o in sc.get("outputs", []) if o.get("mime_type") == "image/png"]
            return None if sc.get("success") and pngs else f"success={sc.get('success')} outputs={sc.get('outputs')}"
        if k == "timeout":
            ok = sc.get("timed_out") and sc.get("ending") in ("interrupted", "restarted")
            return None if ok else f"timed_out={sc.get('timed_out')} ending={sc.get('ending')}"
        if k == "death":
            return None if sc.get("ending") == "kernel_died" else f"ending={sc.get('ending')}"
        return "unknown kind"


@dataclass
class Server:
    """One server as the soak sees it: a client, its sessions, and how to read its process."""

    name: str
    client: Client
    pid: int | str  # "self" in memory
    sessions_mgr: Any = None  # the SessionManager, in memory only
    handles: list[str] = field(default_factory=list)

    def fds(self) -> int:
        return fd_count(self.pid)


@dataclass
class Tally:
    latencies: dict[str, list[float]] = field(default_factory=dict)
    unexpected: list[str] = field(default_factory=list)
    endings: Counter = field(default_factory=Counter)
    calls: int = 0

    def add(self, kind: str, ms: float) -> None:
        self.latencies.setdefault(kind, []).append(ms)
        self.calls += 1


async def run_cell(server: Server, handle: str, cell: Cell, tally: Tally | None) -> None:
    tool, args = cell.request()
    t0 = time.perf_counter()
    try:
        result = await server.client.call_tool(tool, {**args, "session": handle})
        sc, is_error = result.structured_content, bool(result.is_error)
        text = " ".join(getattr(c, "text", "") for c in result.content)[:300] if is_error else ""
    except Exception as exc:  # a protocol failure is an unexpected answer, not a crash of the soak
        sc, is_error, text = None, True, repr(exc)[:300]
    ms = (time.perf_counter() - t0) * 1000
    if tally is None:
        return
    tally.add(cell.kind, ms)
    if sc is not None and sc.get("ending"):
        tally.endings[sc["ending"]] += 1
    problem = cell.check(sc, is_error)
    if problem:
        tally.unexpected.append(f"{server.name}/{handle[:6]} {cell.kind}#{cell.index}: {problem} {text}".strip())


def make_plan(calls: int, seed: int, standard: list[str], trusted: list[str]) -> dict[tuple[str, str], list[Cell]]:
    """Cells per (server, session): deaths go to the trusted session, the rest round-robin over all."""
    rng = random.Random(seed)
    kinds, weights = zip(*WEIGHTS.items(), strict=True)
    targets = [("standard", h) for h in standard] + [("trusted", h) for h in trusted]
    plan: dict[tuple[str, str], list[Cell]] = {t: [] for t in targets}
    rr = 0
    for i in range(calls):
        kind = rng.choices(kinds, weights)[0]
        if kind == "death":
            plan[("trusted", trusted[i % len(trusted)])].append(Cell(kind, i))
        else:
            plan[targets[rr % len(targets)]].append(Cell(kind, i))
            rr += 1
    return plan


@asynccontextmanager
async def memory_servers(base: Path, n_sessions: int) -> AsyncIterator[dict[str, Server]]:
    async with AsyncExitStack() as stack:
        servers = {}
        for name, profile in (("standard", "standard"), ("trusted", "trusted")):
            # the product's default of warm spares: deaths and timeouts here exercise their takeovers and refills
            settings = make_settings(base, profile=profile, max_sessions=max(16, n_sessions + 1), restart_spares=1)
            client, mgr = await stack.enter_async_context(in_memory(settings))
            servers[name] = Server(name, client, "self", mgr)
        yield servers


@asynccontextmanager
async def stdio_servers(base: Path, n_sessions: int) -> AsyncIterator[dict[str, Server]]:
    async with AsyncExitStack() as stack:
        servers = {}
        for name, extra in (("standard", []), ("trusted", ["--profile", "trusted"])):
            state = base / f"stdio-{name}"
            # no warm spares over stdio: the soak cannot see into the server to wait for one, and a spare
            # appearing between the two snapshots would read as fds grown (in memory they are awaited)
            args = [*extra, "--max-sessions", str(max(16, n_sessions + 1)), "--restart-spares", "0"]
            client = await stack.enter_async_context(Client(stdio_params(state, *args)))
            await client.list_tools()
            pid = stdio_server_pid(state)
            if pid is None:
                raise RuntimeError(f"cannot find the stdio server process for {state}")
            servers[name] = Server(name, client, pid)
        yield servers


async def settle_spares(servers: dict[str, Server], timeout: float = 60) -> None:
    """In memory: wait until each server holds the warm spares its settings call for, and none is
    starting, so the start and end snapshots compare like with like."""
    with anyio.move_on_after(timeout):
        for server in servers.values():
            mgr = server.sessions_mgr
            if mgr is None or not getattr(mgr.settings, "restart_spares", 0):
                continue
            while True:
                kernels = [s.kernel for s in mgr.sessions.values() if s.kernel is not None]
                ready = sum(1 for k in kernels if k.spare is not None)
                starting = any(k._spare_starting is not None for k in kernels)
                if not starting and ready >= min(mgr.settings.restart_spares, len(kernels)):
                    break
                await anyio.sleep(0.1)


def kernel_procs(servers: dict[str, Server]) -> tuple[int, int]:
    """(live kernel processes, zombie children) over all servers."""
    live = zombies = 0
    seen: set[int] = set()
    for s in servers.values():
        pid = s.pid
        if pid in seen:
            continue
        seen.add(pid)  # both in-memory servers are this process
        kernels = kernel_pids(pid)
        live += len(kernels)
        for c in children(os.getpid() if pid == "self" else int(pid)):
            try:
                with open(f"/proc/{c}/stat") as fh:
                    if fh.read().rsplit(")", 1)[1].split()[0] == "Z":
                        zombies += 1
            except OSError:
                continue
    return live, zombies


def snapshot(servers: dict[str, Server]) -> dict[str, Any]:
    pids = {s.pid for s in servers.values()}
    fds = {str(p): fd_count(p) for p in pids}
    kinds = {str(p): fd_kinds(p) for p in pids}
    rss = {str(p): rss_mb(p) for p in pids}
    kernels = [k for p in pids for k in kernel_pids(p)]
    live, zombies = kernel_procs(servers)
    return {
        "calls": 0,
        "server_cpu_s": sum(cpu_seconds(p) for p in pids),
        "fds": sum(fds.values()),
        "fds_by_pid": fds,
        "fd_kinds": kinds,
        "server_rss_mb": sum(v for v in rss.values() if v),
        "kernel_rss_mb": sum(rss_mb(k) or 0 for k in kernels),
        "kernels": live,
        "zombies": zombies,
    }


def restart_counts(servers: dict[str, Server]) -> int | None:
    """Kernel restarts the in-memory session managers counted (None over stdio)."""
    total = 0
    for s in servers.values():
        if s.sessions_mgr is None:
            return None
        total += sum(sess.kernel.restarts for sess in s.sessions_mgr.sessions.values() if sess.kernel is not None)
    return total


async def soak(transport: str, args: argparse.Namespace, base: Path) -> dict[str, Any]:
    opener = memory_servers if transport == "memory" else stdio_servers
    async with opener(base, args.sessions) as servers:
        std, tru = servers["standard"], servers["trusted"]
        for _ in range(args.sessions):
            std.handles.append((await call(std.client, "new_session"))["session"])
        tru.handles.append((await call(tru.client, "new_session"))["session"])

        # warm-up: every session runs every kind once (deaths only where they belong)
        log(f"[{transport}] warm-up: {len(WEIGHTS)} kinds in {args.sessions + 1} sessions")
        async with anyio.create_task_group() as tg:
            for s in servers.values():
                for h in s.handles:
                    async def warm(s: Server = s, h: str = h) -> None:
                        for k, kind in enumerate(WEIGHTS):
                            if kind != "death" or s.name == "trusted":
                                await run_cell(s, h, Cell(kind, k), None)
                    tg.start_soon(warm)
        await anyio.sleep(1.0)
        await settle_spares(servers)
        restarts_before = restart_counts(servers)
        start = snapshot(servers)
        log(f"[{transport}] start: fds {start['fds']}, server RSS {start['server_rss_mb']:.0f} MB, "
            f"kernels {start['kernels']}; running {args.calls} calls")

        plan = make_plan(args.calls, args.seed, std.handles, tru.handles)
        tally = Tally()
        step = max(50, args.calls // 8)
        progress = {"next": step}
        timeline = [start]

        async def worker(server: Server, handle: str, cells: list[Cell]) -> None:
            for cell in cells:
                await run_cell(server, handle, cell, tally)
                if tally.calls >= progress["next"]:
                    progress["next"] += step
                    snap = {**snapshot(servers), "calls": tally.calls}
                    timeline.append(snap)
                    log(f"[{transport}]   {tally.calls}/{args.calls} calls: fds {snap['fds']}, server RSS "
                        f"{snap['server_rss_mb']:.0f} MB, kernels RSS {snap['kernel_rss_mb']:.0f} MB")

        t0 = time.perf_counter()
        async with anyio.create_task_group() as tg:
            for (name, handle), cells in plan.items():
                tg.start_soon(worker, servers[name], handle, cells)
        elapsed = time.perf_counter() - t0

        await anyio.sleep(args.settle)
        await settle_spares(servers)
        end = {**snapshot(servers), "calls": tally.calls, "label": "end"}
        timeline.append(end)
        gc.collect()
        end_gc = snapshot(servers) if transport == "memory" else end
        restarts_after = restart_counts(servers)

    restarts_answers = tally.endings.get("restarted", 0) + tally.endings.get("kernel_died", 0)
    return {
        "transport": transport,
        "calls": tally.calls,
        "seconds": elapsed,
        "calls_per_s": tally.calls / elapsed if elapsed else 0.0,
        "start": start,
        "end": end,
        "end_after_gc": end_gc,
        "fd_growth": end["fds"] - start["fds"],
        "fd_growth_after_gc": end_gc["fds"] - start["fds"],
        "timeline": [{k: v for k, v in t.items() if k not in ("fd_kinds", "fds_by_pid")} for t in timeline],
        "kernel_restarts": restarts_answers,
        "kernel_restarts_counted_by_server": None if restarts_before is None or restarts_after is None
        else restarts_after - restarts_before,
        "endings": dict(tally.endings),
        "kinds": {k: len(v) for k, v in tally.latencies.items()},
        "latencies": tally.latencies,
        "unexpected": tally.unexpected,
    }


def report(r: dict[str, Any], tolerance: int) -> str:
    s, e, g = r["start"], r["end"], r["end_after_gc"]
    rows = [
        ["server open fds", s["fds"], e["fds"], f"{e['fds'] - s['fds']:+d}"],
        ["server RSS (MB)", f"{s['server_rss_mb']:.1f}", f"{e['server_rss_mb']:.1f}", f"{e['server_rss_mb'] - s['server_rss_mb']:+.1f}"],
        ["kernels' RSS (MB, sum)", f"{s['kernel_rss_mb']:.1f}", f"{e['kernel_rss_mb']:.1f}", f"{e['kernel_rss_mb'] - s['kernel_rss_mb']:+.1f}"],
        ["kernel processes", s["kernels"], e["kernels"], f"{e['kernels'] - s['kernels']:+d}"],
        ["server CPU (s, cumulative)", f"{s['server_cpu_s']:.1f}", f"{e['server_cpu_s']:.1f}", f"{e['server_cpu_s'] - s['server_cpu_s']:+.1f}"],
        ["zombie children", s["zombies"], e["zombies"], f"{e['zombies'] - s['zombies']:+d}"],
    ]
    if r["transport"] == "memory":
        rows.insert(1, ["server open fds after gc.collect()", s["fds"], g["fds"], f"{g['fds'] - s['fds']:+d}"])
    lines = [
        f"== soak over {r['transport']}: {r['calls']} calls in {r['seconds']:.1f} s = {r['calls_per_s']:.1f} calls/s ==",
        render_grid(["", "start", "end", "change"], [[str(c) for c in row] for row in rows], right_align={1, 2, 3}),
        "",
        "kernel restarts: " + str(r["kernel_restarts"]) + " (answers with ending restarted/kernel_died)"
        + ("" if r["kernel_restarts_counted_by_server"] is None else f"; {r['kernel_restarts_counted_by_server']} counted by the session managers"),
        "endings: " + ", ".join(f"{k} {v}" for k, v in sorted(r["endings"].items())),
        "timeline (calls: fds / server RSS MB / kernels RSS MB / server CPU s): " + "; ".join(
            f"{t.get('label', t['calls'])}: {t['fds']} / {t['server_rss_mb']:.0f} / {t['kernel_rss_mb']:.0f} / {t['server_cpu_s']:.0f}"
            for t in r["timeline"]),
        "",
        table([Measurement(k, "ms", v) for k, v in sorted(r["latencies"].items(), key=lambda kv: -len(kv[1]))]),
    ]
    grown = {k: v - s["fd_kinds"].get(p, {}).get(k, 0)
             for p, kinds in e["fd_kinds"].items() for k, v in kinds.items()
             if v != s["fd_kinds"].get(p, {}).get(k, 0)}
    if grown:
        lines.append("fd kinds that changed: " + ", ".join(f"{k} {v:+d}" for k, v in sorted(grown.items(), key=lambda kv: -abs(kv[1]))[:12]))
    verdict = "OK" if r["fd_growth"] <= tolerance else f"FAIL: fds grew by {r['fd_growth']} (> {tolerance})"
    lines.append(f"fd check: {verdict}")
    if r["unexpected"]:
        lines.append(f"UNEXPECTED ANSWERS: {len(r['unexpected'])}")
        lines += ["  " + u for u in r["unexpected"][:20]]
    else:
        lines.append("answers: all as expected")
    return "\n".join(lines)


async def main_async(args: argparse.Namespace) -> list[dict[str, Any]]:
    transports = ["memory", "stdio"] if args.transport == "both" else [args.transport]
    results = []
    with short_tmp("kxs") as base:
        for t in transports:
            results.append(await soak(t, args, base))
    return results


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.soak", description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=2000, help="calls after warm-up (default 2000)")
    parser.add_argument("--sessions", type=int, default=4, help="standard-profile sessions (plus one trusted); default 4")
    parser.add_argument("--transport", choices=["memory", "stdio", "both"], default="memory")
    parser.add_argument("--fd-tolerance", type=int, default=8, help="allowed growth of the servers' open fds (default 8)")
    parser.add_argument("--settle", type=float, default=2.0, help="seconds to wait before the end sample (default 2)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", metavar="FILE", help="also write the results to FILE")
    args = parser.parse_args(argv)
    for name in ("httpx", "httpx2"):
        logging.getLogger(name).setLevel(logging.WARNING)
    results = anyio.run(main_async, args, backend="asyncio")
    status = 0
    for r in results:
        print(report(r, args.fd_tolerance))
        print()
        if r["fd_growth"] > args.fd_tolerance:
            status |= 1
        if r["unexpected"]:
            status |= 2
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2, default=str))
        log(f"wrote {args.json}")
    sys.exit(status)


if __name__ == "__main__":
    main()
