"""kernelexec benchmarks: one command, one table.

    python -m benchmarks [--quick] [--json FILE] [--only SECTION]   (or: python benchmarks/run.py ...)

Each row names the baseline it is compared with; ``ratio`` is the row's median over the baseline's.
Sections (each starts and stops its own kernels, so they do not compete for the CPU):

1. cold start     raw ``AsyncKernelManager.start_kernel`` + ``wait_for_ready``  vs  the ``new_session`` tool
                  (kernel started, startup code run, policy checked; no warm pool), alternating, in memory;
                  and ``new_session`` served from the warm pool when the server has one. Each kernel's idle RSS/PSS.
   startup        spawn -> ``initialize`` answered over stdio: ``kernelexec serve`` vs a bare MCP SDK server with no
                  tools, alternating (benchmarks/startup.py; ``python -m benchmarks.startup`` alone).
2. round trip     ``x=1``: raw jupyter_client reply+idle (plain kernel, ipc, no history)  vs
                  ``Kernel.execute`` / ``Session.run`` (no MCP) and ``execute_code`` in memory, over stdio
                  (a ``kernelexec serve`` child) and over streamable HTTP (a session handle, one kernel).
   overhead       the issue's bar: ``execute_code(code="x=1")`` through the SDK's own client over stdio, HTTP
                  and in memory vs raw ``BlockingKernelClient.execute`` + reply/idle, interleaved call by call
                  (benchmarks/overhead.py; ``python -m benchmarks.overhead`` alone).
3. CPU-bound      a pure-Python loop and a numpy loop: ``execute_code`` vs ``python -c``, timed inside the
                  code (perf_counter) and end to end (``python -c`` pays interpreter start and imports).
4. memory         RSS/PSS of a warm session's whole process tree (kernel + sandbox wrappers), nothing imported and
                  with the data stack + a plot, vs plain ipykernels the same way; the first ``import pandas,
                  matplotlib`` + plot of a brand-new install (new state and cache dirs) vs a later session
                  (benchmarks/memory.py; ``python -m benchmarks.memory`` alone).
5. mixed load     4 sessions x 50 calls in parallel in memory vs the same 200 cells serially in one session.
6. layers         cold ``new_session`` with sandbox off, then adding the OS layers one at a time, and from the
                  warm pool (benchmarks/layers.py; ``python -m benchmarks.layers`` alone).
   environments   first ``import pandas, matplotlib.pyplot`` + one plot in a new pooled session, with the data
                  stack imported ahead (--warm-imports, the default) and without; idle pooled kernel RSS/PSS both
                  ways; cold ``new_session`` per environment kind: own interpreter, a project .venv on 3.12 (ipykernel
                  from the overlay), --python 3.13 (benchmarks/environments.py; 2 rounds with --quick)
7. baselines      one pure-Python loop in ``python -c``, ``execute_code`` and smolagents' ``LocalPythonExecutor``
                  (benchmarks/baselines.py; smolagents from ``pip install 'kernelexec[bench]'``).
8. load           20 HTTP clients x 100 calls with bearer tokens and leak checks (benchmarks/load.py; 5 x 20
                  with --quick): its rows join this table, and its own report (server RSS/fds before, at peak
                  and after; CPU per call; checks) is printed after it. ``python -m benchmarks.load`` alone.
9. recording      ``Recorder.append`` of a ~30 KB cell (print + PNG) when the notebook holds 10 vs 5,000 cells, and
                  ``write_notebook`` (the whole notebook from the journal) at both; no kernel (benchmarks/recording.py).
    store         ``execute_code("x=1")`` with the session store (SQLite; PostgreSQL 15 on loopback) vs the same server
                  recording in files only, alternating (benchmarks/store.py).
10. flood         a stdio server, one session flooding 1 MiB stream messages past the kernel's cap while another
                  runs ``1+1``: its latency vs no flood (p99 included) and the server's VmHWM growth (benchmarks/flood.py).
11. answers       characters (and a token estimate) per ``execute_code`` answer for ten typical calls (a plot,
                  a DataFrame, a print, errors...), text blocks vs structured content (benchmarks/answers.py).
12. codemode      a brokered ``mcp_tools`` call's round trip (timed in the cell) vs a direct SDK client call to the
                  same upstream server, HTTP and stdio; characters the model reads for a 50-call task done as 50
                  direct tool calls vs one cell; execute_code's description with code mode on (benchmarks/codemode.py).
13. durable       checkpoint overhead per cell (x=1, x=i, 1 MB, 200 MB changes) on vs off; a 200 MB DataFrame back
                  after os._exit; fork_session (local, and 8/200 MB through a gateway); restart_session(restore=true)
                  vs (replay=true) (benchmarks/durable.py).
14. fleet         x=1 through HAProxy (deploy/haproxy.cfg) to a replica whose kernel is on a gateway (Enterprise
                  Gateway, else Kernel Gateway) vs one server with local kernels, alternating; failover and calls/s
                  with 1-3 replicas to come with the fleet's shared store (benchmarks/fleet.py).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

if __package__ in (None, ""):  # ``python benchmarks/run.py``: make ``benchmarks`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import anyio
from mcp import Client

from benchmarks.answers import bench_answers
from benchmarks.baselines import bench_smolagents
from benchmarks.codemode import bench_codemode
from benchmarks.common import (
    call,
    clean_env,
    has_setting,
    http_server,
    in_memory,
    kernel_pids,
    log,
    make_settings,
    pss_mb,
    raw_execute,
    raw_kernel,
    rss_mb,
    session_kernel_pid,
    session_root_pid,
    short_tmp,
    stdio_params,
    stdio_server_pid,
    tree_rss_mb,
)
from benchmarks.durable import bench_durable
from benchmarks.environments import bench_environments_section
from benchmarks.fleet import bench_fleet
from benchmarks.flood import bench_flood
from benchmarks.layers import bench_layers_section
from benchmarks.memory import bench_memory_section
from benchmarks.overhead import bench_overhead
from benchmarks.packages import bench_packages
from benchmarks.recording import bench_recording
from benchmarks.startup import bench_startup
from benchmarks.stats import Measurement, table, to_json
from benchmarks.store import bench_store

MS = "ms"

LOOP_CODE = """\
import time
_t0 = time.perf_counter()
_s = 0
for _i in range(4_000_000):
    _s += _i * _i
_dt = time.perf_counter() - _t0
print(repr(_dt))
"""

NUMPY_CODE = """\
import time
import numpy as np
_a = np.arange(2_000_000, dtype=np.float64)
_s = float((_a * _a).sum())  # untimed: first touch of the temporaries' pages
_t0 = time.perf_counter()
for _k in range(60):
    _s = float((_a * _a).sum())
_dt = time.perf_counter() - _t0
print(repr(_dt))
"""


MIX = [
    "x = 1",
    "sum(i * i for i in range(10_000))",
    "print('hello ' * 10)",
    "d = {i: str(i) for i in range(1000)}\nlen(d)",
    "import math\nresult = math.factorial(200) % 1000",
]


@dataclass
class Plan:
    cold: int          # kernels started per cold-start series
    calls: int         # x=1 round trips per transport
    warmup: int
    cpu: int           # repetitions of each CPU-bound cell
    sessions: int      # mixed load: parallel sessions ...
    per_session: int   # ... times calls each
    quick: bool = False

    @classmethod
    def make(cls, quick: bool) -> Plan:
        if quick:
            return cls(cold=3, calls=30, warmup=5, cpu=2, sessions=2, per_session=10, quick=True)
        return cls(cold=10, calls=300, warmup=20, cpu=5, sessions=4, per_session=50)


def ms(seconds: float) -> float:
    return seconds * 1000


# --- 1. cold start ---------------------------------------------------------------------------------
async def bench_cold_start(plan: Plan, base: Path, out: list[Measurement]) -> None:
    """Raw starts and new_session calls alternate, so load from elsewhere on the machine hits both alike."""
    log(f"[1/5] cold start: {plan.cold} raw kernels and {plan.cold} new_session calls, alternating")
    raw_start, raw_rss, raw_pss = [], [], []
    starts, rss, pss, tree = [], [], [], []
    async with in_memory(make_settings(base, pool_size=0)) as (client, sessions):
        for i in range(plan.cold + 1):  # the first round warms the page cache and is not counted
            t0 = time.perf_counter()
            async with raw_kernel(base) as (km, kc):
                elapsed = time.perf_counter() - t0
                await raw_execute(kc, "x = 1")
                await anyio.sleep(0.3)
                if i:
                    raw_start.append(ms(elapsed))
                    pid = km.provisioner.process.pid
                    raw_rss.append(rss_mb(pid))
                    raw_pss.append(pss_mb(pid))

            t0 = time.perf_counter()
            info = await call(client, "new_session")
            elapsed = time.perf_counter() - t0
            handle = info["session"]
            await call(client, "execute_code", code="x = 1", session=handle)
            await anyio.sleep(0.3)
            if i:
                starts.append(ms(elapsed))
                pid = session_kernel_pid(sessions, handle)
                rss.append(rss_mb(pid))
                pss.append(pss_mb(pid))
                tree.append(tree_rss_mb(session_root_pid(sessions, handle)))
            await call(client, "close_session", session=handle)
    out.append(Measurement("cold: raw start_kernel+wait_for_ready", MS, raw_start, note="plain ipykernel, ipc, no sandbox"))
    out.append(Measurement("cold: new_session (in-memory MCP)", MS, starts, baseline="cold: raw start_kernel+wait_for_ready",
                           note="kernel started, startup code run, policy verified" + (" (pool_size=0)" if has_setting("pool_size") else "")))
    if has_setting("pool_size"):
        out.append(await warm_new_session(plan, base))
    if has_setting("restart_spares"):
        out.extend(await bench_restart(plan, base))
    out.append(Measurement("mem: raw ipykernel idle RSS", "MB", raw_rss))
    out.append(Measurement("mem: session kernel idle RSS", "MB", rss, baseline="mem: raw ipykernel idle RSS"))
    out.append(Measurement("mem: session kernel + sandbox wrappers RSS", "MB", tree, baseline="mem: raw ipykernel idle RSS",
                           note="the provisioner's process and everything below it"))
    out.append(Measurement("mem: raw ipykernel idle PSS", "MB", raw_pss))
    out.append(Measurement("mem: session kernel idle PSS", "MB", pss, baseline="mem: raw ipykernel idle PSS"))


async def warm_new_session(plan: Plan, base: Path) -> Measurement:
    """``new_session`` when the server keeps a started kernel ready (``--pool-size 1``), the pool refilled between calls."""
    log(f"[1/5] cold start: {plan.cold} new_session calls served from the warm pool")
    samples = []
    async with in_memory(make_settings(base, pool_size=1)) as (client, sessions):
        for i in range(plan.cold + 1):
            with anyio.fail_after(60):
                while not getattr(sessions, "pool", None):
                    await anyio.sleep(0.05)
            await anyio.sleep(0.2)
            t0 = time.perf_counter()
            info = await call(client, "new_session")
            elapsed = time.perf_counter() - t0
            if i:
                samples.append(ms(elapsed))
            await call(client, "close_session", session=info["session"])
    return Measurement("cold: new_session from the warm pool (pool_size=1)", MS, samples,
                       baseline="cold: raw start_kernel+wait_for_ready", note="the pool refilled before each call")


COLD_RESTART = "cold: restart_session, cold (restart_spares=0)"


async def bench_restart(plan: Plan, base: Path) -> list[Measurement]:
    """``restart_session`` with and without a warm spare, alternating; the spare is ready before each timed call."""
    log(f"[1/5] cold start: {plan.cold} restart_session calls each, cold and from a warm spare")
    cold, spared = [], []
    async with in_memory(make_settings(base, pool_size=0, restart_spares=0)) as (c_client, _), \
            in_memory(make_settings(base, pool_size=0, restart_spares=1)) as (s_client, s_sessions):
        c_handle = (await call(c_client, "new_session"))["session"]
        s_handle = (await call(s_client, "new_session"))["session"]
        await call(c_client, "execute_code", code="x = 1", session=c_handle)
        await call(s_client, "execute_code", code="x = 1", session=s_handle)
        for i in range(plan.cold + 1):
            t0 = time.perf_counter()
            await call(c_client, "restart_session", session=c_handle)
            if i:
                cold.append(ms(time.perf_counter() - t0))
            kernel = s_sessions.sessions[s_handle].kernel
            with anyio.fail_after(120):
                while kernel.spare is None:
                    await anyio.sleep(0.05)
            await anyio.sleep(0.2)
            t0 = time.perf_counter()
            await call(s_client, "restart_session", session=s_handle)
            if i:
                spared.append(ms(time.perf_counter() - t0))
    return [Measurement(COLD_RESTART, MS, cold, note="kill, start a kernel in the sandbox, startup code, policy check"),
            Measurement("cold: restart_session from a warm spare (restart_spares=1)", MS, spared, baseline=COLD_RESTART,
                        note="the spare was started ahead in the session's own sandbox")]


# --- 2. round trips --------------------------------------------------------------------------------
FLOOR = "x=1: raw jupyter_client (reply+idle)"


async def bench_raw_floor(plan: Plan, base: Path, out: list[Measurement]) -> None:
    log(f"[2/5] round trip x=1: raw floor ({plan.calls} calls)")
    samples = []
    async with raw_kernel(base) as (_km, kc):
        for _ in range(plan.warmup):
            await raw_execute(kc, "x=1")
        for _ in range(plan.calls):
            t0 = time.perf_counter()
            reply = await raw_execute(kc, "x=1")
            samples.append(ms(time.perf_counter() - t0))
            assert reply["status"] == "ok", reply
    out.append(Measurement(FLOOR, MS, samples, note="plain ipykernel, ipc, --HistoryManager.enabled=False"))


async def bench_in_memory(plan: Plan, base: Path, out: list[Measurement]) -> None:
    """MCP in memory, Session.run and Kernel.execute, interleaved on one kernel so drift hits all three alike."""
    log(f"[2/5] round trip x=1: in memory, Session.run, Kernel.execute ({plan.calls} calls each, interleaved)")
    mcp_s, run_s, kern_s = [], [], []
    async with in_memory(make_settings(base)) as (client, sessions):
        handle = (await call(client, "execute_code", code="x = 1"))["session"]
        session = sessions.sessions[handle]
        kernel = session.kernel
        for _ in range(plan.warmup):
            await call(client, "execute_code", code="x=1")
        for _ in range(plan.calls):
            t0 = time.perf_counter()
            r = await call(client, "execute_code", code="x=1")
            t1 = time.perf_counter()
            await session.run("x=1", timeout=60)
            t2 = time.perf_counter()
            ex = await kernel.execute("x=1", timeout=60, grace=3)
            t3 = time.perf_counter()
            assert r["success"] and ex.success
            mcp_s.append(ms(t1 - t0))
            run_s.append(ms(t2 - t1))
            kern_s.append(ms(t3 - t2))
    out.append(Measurement("x=1: Kernel.execute (no MCP, no record)", MS, kern_s, baseline=FLOOR,
                           note="kernelexec kernel: startup hooks, result report"))
    out.append(Measurement("x=1: Session.run (no MCP)", MS, run_s, baseline=FLOOR, note="+ render + journal fsync"))
    out.append(Measurement("x=1: execute_code in-memory MCP", MS, mcp_s, baseline=FLOOR))


async def bench_stdio(plan: Plan, base: Path, out: list[Measurement]) -> None:
    log(f"[2/5] round trip x=1: stdio ({plan.calls} calls)")
    state = base / "stdio"
    samples = []
    async with Client(stdio_params(state)) as client:
        for _ in range(plan.warmup):
            await call(client, "execute_code", code="x=1")
        for _ in range(plan.calls):
            t0 = time.perf_counter()
            r = await call(client, "execute_code", code="x=1")
            samples.append(ms(time.perf_counter() - t0))
            assert r["success"], r
        pid = stdio_server_pid(state)
        if pid is not None:
            out_rss = rss_mb(pid)
            kernels = kernel_pids(pid)
            out.append(Measurement("mem: stdio server process RSS", "MB", [out_rss] if out_rss else [],
                                   note=f"after {plan.calls + plan.warmup} calls, {len(kernels)} kernel process(es) incl. the warm pool"))
    out.append(Measurement("x=1: execute_code stdio", MS, samples, baseline=FLOOR))


async def bench_http(plan: Plan, base: Path, out: list[Measurement]) -> None:
    log(f"[2/5] round trip x=1: streamable HTTP ({plan.calls} calls, one session handle)")
    samples = []
    async with http_server(base / "http") as (url, proc):
        async with Client(url) as client:
            handle = (await call(client, "new_session"))["session"]
            for _ in range(plan.warmup):
                await call(client, "execute_code", code="x=1", session=handle)
            for _ in range(plan.calls):
                t0 = time.perf_counter()
                r = await call(client, "execute_code", code="x=1", session=handle)
                samples.append(ms(time.perf_counter() - t0))
                assert r["success"] and r["session"] == handle, r
            server_rss = rss_mb(proc.pid)
            nk = len(kernel_pids(proc.pid))
    out.append(Measurement("x=1: execute_code streamable HTTP", MS, samples, baseline=FLOOR))
    if server_rss:
        out.append(Measurement("mem: HTTP server process RSS", "MB", [server_rss], note=f"{nk} kernel process(es) incl. the warm pool"))


# --- 3. CPU-bound ---------------------------------------------------------------------------------------
async def bench_cpu(plan: Plan, base: Path, out: list[Measurement]) -> None:
    log(f"[3/5] CPU-bound cells: loop and numpy, {plan.cpu} runs each, execute_code vs python -c")
    env = clean_env()
    async with in_memory(make_settings(base)) as (client, sessions), raw_kernel(base) as (_km, kc):
        handle = (await call(client, "new_session"))["session"]
        for label, code in (("loop", LOOP_CODE), ("numpy", NUMPY_CODE)):
            await call(client, "execute_code", code=code, session=handle)  # warm-up (imports numpy once)
            await raw_execute(kc, code, timeout=120)
            k_in, k_e2e, p_in, p_e2e, r_in = [], [], [], [], []
            for _ in range(plan.cpu):
                reply = await raw_execute(kc, code, timeout=120, user_expressions={"dt": "_dt"})
                r_in.append(ms(float(reply["user_expressions"]["dt"]["data"]["text/plain"])))
                t0 = time.perf_counter()
                r = await call(client, "execute_code", code=code, session=handle, timeout=120)
                k_e2e.append(ms(time.perf_counter() - t0))
                assert r["success"], r
                k_in.append(ms(float(r["stdout"].strip())))
                t0 = time.perf_counter()
                proc = await anyio.run_process([sys.executable, "-c", code], env=env, check=True)
                p_e2e.append(ms(time.perf_counter() - t0))
                p_in.append(ms(float(proc.stdout.decode().strip())))
            py_in, py_e2e = f"cpu {label}: python -c (inside)", f"cpu {label}: python -c (end-to-end)"
            out.append(Measurement(py_in, MS, p_in))
            out.append(Measurement(f"cpu {label}: plain ipykernel (inside)", MS, r_in, baseline=py_in))
            out.append(Measurement(f"cpu {label}: execute_code (inside)", MS, k_in, baseline=py_in))
            out.append(Measurement(py_e2e, MS, p_e2e, note="includes interpreter start" + (" + numpy import" if label == "numpy" else "")))
            out.append(Measurement(f"cpu {label}: execute_code (end-to-end)", MS, k_e2e, baseline=py_e2e))


# --- 4. memory per session and the first plot: benchmarks/memory.py -------------------------------------


# --- 5. mixed load ---------------------------------------------------------------------------------------
async def bench_mixed(plan: Plan, base: Path, out: list[Measurement]) -> None:
    total = plan.sessions * plan.per_session
    log(f"[5/5] mixed load: {plan.sessions} sessions x {plan.per_session} calls in parallel vs {total} serial")
    async with in_memory(make_settings(base, max_sessions=max(16, plan.sessions + 2))) as (client, _sessions):
        async def worker(handle: str, count: int, offset: int, lat: list[float]) -> None:
            for i in range(count):
                code = MIX[(i + offset) % len(MIX)]
                t0 = time.perf_counter()
                r = await call(client, "execute_code", code=code, session=handle)
                lat.append(ms(time.perf_counter() - t0))
                assert r["success"], r

        serial_handle = (await call(client, "new_session"))["session"]
        await worker(serial_handle, plan.warmup, 0, [])
        serial: list[float] = []
        t0 = time.perf_counter()
        await worker(serial_handle, total, 0, serial)
        serial_tput = total / (time.perf_counter() - t0)
        await call(client, "close_session", session=serial_handle)

        handles = [(await call(client, "new_session"))["session"] for _ in range(plan.sessions)]
        for h in handles:
            await worker(h, 5, 0, [])
        parallel: list[float] = []
        t0 = time.perf_counter()
        async with anyio.create_task_group() as tg:
            for k, h in enumerate(handles):
                tg.start_soon(worker, h, plan.per_session, k, parallel)
        par_tput = total / (time.perf_counter() - t0)

    s_name = f"mixed: 1 session x {total} serial, latency"
    st_name = f"mixed: 1 session x {total} serial, throughput"
    out.append(Measurement(s_name, MS, serial))
    out.append(Measurement(f"mixed: {plan.sessions} sessions x {plan.per_session} parallel, latency", MS, parallel, baseline=s_name))
    out.append(Measurement(st_name, "calls/s", [serial_tput]))
    out.append(Measurement(f"mixed: {plan.sessions} sessions x {plan.per_session} parallel, throughput", "calls/s", [par_tput],
                           baseline=st_name, note=f"{os.cpu_count()} CPUs"))


ORDER = [
    "cold:", "layers:", "overhead x=1:", "x=1:", "cpu loop", "cpu numpy", "cpu vs smolagents", "mem:", "first plot:",
    "layers mem:", "mixed:",
    "alone:", "load:", "record:", "flood:", "install:",
]


def ordered(rows: list[Measurement]) -> list[Measurement]:
    def key(r: Measurement) -> int:
        return next((i for i, p in enumerate(ORDER) if r.name.startswith(p)), len(ORDER))
    return sorted(rows, key=key)  # stable: keeps each section's own order


LOAD_REPORT: list[str] = []  # the load test's own report, printed after the main table


async def bench_load(plan: Plan, base: Path, out: list[Measurement]) -> None:
    import contextlib
    import io

    from benchmarks import load

    quick = plan.quick
    args = argparse.Namespace(clients=5 if quick else 20, calls=20 if quick else 100, tokens=2, pool_size=4, slow_share=0.2,
                              alone=2 if quick else 5, seed=7, progress=10.0, quick=quick, json=None, rows_out=[])
    log(f"[load] {args.clients} HTTP clients x {args.calls} calls over streamable HTTP, 2 bearer tokens")
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        status = await load.run(args)
    out.extend(args.rows_out)
    LOAD_REPORT.append(buffer.getvalue() + ("" if status == 0 else "\nTHE LOAD TEST FAILED (see above)\n"))


SECTIONS = {
    "cold": [bench_cold_start],
    "startup": [bench_startup],
    "roundtrip": [bench_raw_floor, bench_in_memory, bench_stdio, bench_http],
    "overhead": [bench_overhead],
    "cpu": [bench_cpu],
    "memory": [bench_memory_section],
    "mixed": [bench_mixed],
    "layers": [bench_layers_section],
    "environments": [bench_environments_section],
    "baselines": [bench_smolagents],
    "load": [bench_load],
    "recording": [bench_recording],
    "store": [bench_store],
    "packages": [bench_packages],
    "flood": [bench_flood],
    "answers": [bench_answers],
    "codemode": [bench_codemode],
    "durable": [bench_durable],
    "fleet": [bench_fleet],
}


async def run_all(plan: Plan, only: list[str] | None = None) -> list[Measurement]:
    out: list[Measurement] = []
    chosen = [fn for name, fns in SECTIONS.items() if not only or name in only for fn in fns]
    with short_tmp() as base:
        for section in chosen:
            t0 = time.perf_counter()
            await section(plan, base, out)
            log(f"      done in {time.perf_counter() - t0:.1f} s")
    return ordered(out)


def environment() -> dict[str, str]:
    from importlib.metadata import version

    def v(name: str) -> str:
        try:
            return version(name)
        except Exception:
            return "?"

    import kernelexec
    from kernelexec.config import load_settings

    src = Path(kernelexec.__file__).resolve().parent.parent
    try:
        rev = subprocess.run(["git", "-C", str(src), "describe", "--always", "--dirty"], capture_output=True,
                             text=True, timeout=10).stdout.strip() or "not a git checkout"
    except OSError:
        rev = "?"
    return {
        "kernelexec": f"{src} ({rev})",
        "sandbox": str(getattr(load_settings(), "sandbox", "none (no such setting)")),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": str(os.cpu_count()),
        "mcp": v("mcp"),
        "jupyter_client": v("jupyter_client"),
        "ipykernel": v("ipykernel"),
        "pyzmq": v("pyzmq"),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small n: a smoke run of every section (~30 s)")
    parser.add_argument("--json", metavar="FILE", help="also write the results (summaries and raw samples) to FILE")
    parser.add_argument("--only", action="append", choices=list(SECTIONS), metavar="SECTION",
                        help=f"run only this section (repeatable): {', '.join(SECTIONS)}")
    args = parser.parse_args(argv)
    plan = Plan.make(args.quick)
    for name in ("httpx", "httpx2"):  # MCPServer() sets the root logger to INFO: no line per HTTP request
        logging.getLogger(name).setLevel(logging.WARNING)
    env = environment()
    env["loadavg at start"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
    log("kernelexec benchmarks" + (" (quick)" if args.quick else "") + ": " + ", ".join(f"{k} {v}" for k, v in env.items()))
    t0 = time.perf_counter()
    rows = anyio.run(run_all, plan, args.only, backend="asyncio")
    wall = time.perf_counter() - t0
    env["loadavg at end"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(table(rows))
    notes = [f"  {r.name}: {r.note}" for r in rows if r.note]
    if notes:
        print("\nnotes:\n" + "\n".join(notes))
    print(f"\nratio = median / baseline median. kernelexec {env['kernelexec']}; {env['cpus']} CPUs, python {env['python']}, mcp {env['mcp']}, "
          f"jupyter_client {env['jupyter_client']}, ipykernel {env['ipykernel']}; sandbox {env['sandbox']}; "
          f"load average {env['loadavg at start']} at start, {env['loadavg at end']} at end; total {wall:.0f} s")
    for report in LOAD_REPORT:
        print("\n--- the load test's report " + "-" * 60 + report)
    if args.json:
        Path(args.json).write_text(json.dumps({"environment": env, "quick": args.quick, "wall_s": wall,
                                               "sections": args.only or list(SECTIONS), "results": to_json(rows)}, indent=2))
        log(f"wrote {args.json}")


if __name__ == "__main__":
    main()
