"""What a warm session costs in memory, and what the first plot of a new install costs.

    python -m benchmarks --only memory        (or: python -m benchmarks.memory [--quick] [--json FILE])

Memory: every row sums ``/proc/<pid>/smaps_rollup`` over the session's whole process tree (the process
the provisioner started and everything below it: the pre-exec wrapper, bubblewrap, the kernel), so a
helper process per session is counted. ``n`` sessions are alive at once in one server (PSS splits shared
pages between them, as it would in production); the baselines are plain ipykernels (ipc, no history)
started by jupyter_client the same way, alone and with the same data stack imported and the same plot.

    warm session, nothing imported      a pooled session (``warm_imports=[]``) after ``x = 1``
    warm session, data stack imported   a pooled session (the default ``warm_imports``) after the plot

First plot: ``import pandas, matplotlib.pyplot`` + one DataFrame plot as the first cell of the first
session of a brand-new install (a new state dir *and* a new cache dir, one server each round), sent as
soon as the server is up, and again after the server's start-up work (its warm pool) is done; compared
with the same cell in a later session of the same server.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # ``python benchmarks/memory.py``
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import anyio

from benchmarks.common import (
    call,
    has_setting,
    in_memory,
    kernel_pid_below,
    log,
    make_settings,
    pss_mb,
    raw_execute,
    raw_kernel,
    rss_mb,
    session_root_pid,
    short_tmp,
    tree_pss_mb,
    tree_rss_mb,
)
from benchmarks.stats import Measurement, table, to_json

MB = "MB"
PLOT = """\
import pandas as pd, matplotlib.pyplot as plt
df = pd.DataFrame({"x": range(10), "y": [i * i for i in range(10)]})
df.plot(x="x", y="y")
plt.show()
"""
RAW_IDLE_RSS, RAW_IDLE_PSS = "mem: raw ipykernel, idle, RSS", "mem: raw ipykernel, idle, PSS"
RAW_STACK_RSS, RAW_STACK_PSS = "mem: raw ipykernel, data stack + plot, RSS", "mem: raw ipykernel, data stack + plot, PSS"
FIRST_LATER = "first plot: the cell in a later session (pool refilled)"


async def wait_pool(sessions, timeout: float = 180.0) -> float:
    """Until the warm pool is full (its kernels started and warmed); returns the seconds waited."""
    t0 = time.monotonic()
    while len(sessions.pool.sessions) < sessions.settings.pool_size:
        if time.monotonic() - t0 > timeout:
            raise RuntimeError("the pool did not fill")
        await anyio.sleep(0.05)
    return time.monotonic() - t0


async def raw_baseline(n: int, base: Path, out: list[Measurement]) -> None:
    """``n`` plain ipykernels alive at once: idle, then with the data stack imported and one plot."""
    from contextlib import AsyncExitStack

    rows: dict[str, list[float]] = {RAW_IDLE_RSS: [], RAW_IDLE_PSS: [], RAW_STACK_RSS: [], RAW_STACK_PSS: []}
    async with AsyncExitStack() as stack:
        kernels = [await stack.enter_async_context(raw_kernel(base)) for _ in range(n)]
        for stage, code, rss_row, pss_row in (("idle", "x = 1", RAW_IDLE_RSS, RAW_IDLE_PSS),
                                              ("stack", PLOT, RAW_STACK_RSS, RAW_STACK_PSS)):
            for _km, kc in kernels:
                reply = await raw_execute(kc, code, timeout=180)
                assert reply["status"] == "ok", (stage, reply)
            await anyio.sleep(0.5)
            for km, _kc in kernels:
                root = km.provisioner.process.pid
                rows[rss_row].append(tree_rss_mb(root))
                rows[pss_row].append(tree_pss_mb(root))
    for name, samples in rows.items():
        base_name = {RAW_STACK_RSS: RAW_IDLE_RSS, RAW_STACK_PSS: RAW_IDLE_PSS}.get(name)
        out.append(Measurement(name, MB, samples, baseline=base_name, note=f"{n} alive at once" if name == RAW_IDLE_RSS else ""))


async def warm_sessions(n: int, base: Path, out: list[Measurement]) -> None:
    """``n`` sessions from the warm pool alive at once, with and without the data stack imported ahead."""
    for label, extra, code, raw_rss, raw_pss in (
            ("nothing imported", {"warm_imports": []}, "x = 1", RAW_IDLE_RSS, RAW_IDLE_PSS),
            ("data stack imported + plot", {}, PLOT, RAW_STACK_RSS, RAW_STACK_PSS)):
        if extra and not has_setting("warm_imports"):
            continue
        log(f"      {n} warm sessions, {label}")
        rss, pss, kernel_pss = [], [], []
        async with in_memory(make_settings(base, pool_size=1, **extra)) as (client, sessions):
            handles = []
            for _ in range(n):
                await wait_pool(sessions)
                handles.append((await call(client, "new_session"))["session"])
            for h in handles:
                r = await call(client, "execute_code", code=code, session=h, timeout=180)
                assert r["success"], r
            await anyio.sleep(0.5)
            for h in handles:
                root = session_root_pid(sessions, h)
                rss.append(tree_rss_mb(root))
                pss.append(tree_pss_mb(root))
                kernel_pss.append(pss_mb(kernel_pid_below(root)) or 0)
        out.append(Measurement(f"mem: warm session, {label}, RSS (all its processes)", MB, rss, baseline=raw_rss))
        out.append(Measurement(f"mem: warm session, {label}, PSS (all its processes)", MB, pss, baseline=raw_pss,
                               note=f"{n} sessions alive at once; the kernel process alone: "
                                    f"{sorted(kernel_pss)[len(kernel_pss) // 2]:.1f} MB PSS"))


async def bench_memory_per_session(plan, base: Path, out: list[Measurement]) -> None:
    n = max(2, plan.sessions)
    log(f"[mem] memory per session: {n} raw ipykernels, {n} warm sessions without and with the data stack")
    await raw_baseline(n, base, out)
    await warm_sessions(n, base, out)
    out.append(Measurement("mem: benchmark process RSS (in-memory server+client)", MB, [rss_mb() or 0],
                           note="includes the client and everything run so far"))


async def bench_first_plot(plan, base: Path, out: list[Measurement]) -> None:
    """Each round a new install: a new state dir and a new cache dir, a server, its first session's first cell."""
    rounds = 2 if plan.quick else 4
    log(f"[mem] first plot: {rounds} new installs (new state and cache dirs), first session vs later ones")
    at_once, at_once_total, after_ready, ready_wait, later = [], [], [], [], []
    for i in range(rounds):
        for wait_first in (False, True):
            root = base / f"install{i}{'w' if wait_first else ''}"
            root.mkdir()
            extra = {"cache_dir": root / "cache"} if has_setting("cache_dir") else {}
            async with in_memory(make_settings(root, pool_size=1, **extra)) as (client, sessions):
                t_up = time.perf_counter()
                if wait_first:
                    await wait_pool(sessions)
                    ready_wait.append((time.perf_counter() - t_up) * 1000)
                t0 = time.perf_counter()
                handle = (await call(client, "new_session"))["session"]
                t1 = time.perf_counter()
                r = await call(client, "execute_code", code=PLOT, session=handle, timeout=180)
                t2 = time.perf_counter()
                assert r["success"] and any(o["mime_type"] == "image/png" for o in r["outputs"]), r
                if wait_first:
                    after_ready.append((t2 - t1) * 1000)
                    for _ in range(2):
                        await wait_pool(sessions)
                        handle = (await call(client, "new_session"))["session"]
                        t0 = time.perf_counter()
                        r = await call(client, "execute_code", code=PLOT, session=handle, timeout=180)
                        later.append((time.perf_counter() - t0) * 1000)
                        assert r["success"], r
                else:
                    at_once.append((t2 - t1) * 1000)
                    at_once_total.append((t2 - t0) * 1000)
    out.append(Measurement(FIRST_LATER, "ms", later, note="import pandas, matplotlib.pyplot + one DataFrame plot, end to end"))
    out.append(Measurement("first plot: the cell, first session of a new install, server's start-up done", "ms", after_ready,
                           baseline=FIRST_LATER, note=f"start-up (pool filled) took {sorted(ready_wait)[len(ready_wait) // 2]:.0f} ms "
                                                      "(median) before the first call"))
    out.append(Measurement("first plot: the cell, first session of a new install, called at once", "ms", at_once,
                           baseline=FIRST_LATER, note="the first call sent as soon as the server is up"))
    out.append(Measurement("first plot: new_session + the cell, new install, called at once", "ms", at_once_total,
                           baseline=FIRST_LATER))


COLD_UNPREPARED = "first plot: the cell in a cold kernel, no prepared font list (as before)"


async def bench_font_list(plan, base: Path, out: list[Measurement]) -> None:
    """The cell in a cold kernel (no pool, nothing imported ahead), with matplotlib's font list prepared at start-up
    and without: a server whose cache dir lies in a work root, which kernels can write, is never offered one (each
    kernel scans the fonts itself, as every kernel did before). Two servers, rounds alternating."""
    rounds = 3 if plan.quick else 6
    log(f"[mem] first plot in a cold kernel: {rounds} rounds, font list prepared vs not")
    prepared, unprepared = [], []
    work = base / "fonts-work"
    work.mkdir()
    cold = {"pool_size": 0, "warm_imports": []}
    async with in_memory(make_settings(base, cache_dir=base / "fonts-cache", **cold)) as (p_client, _), \
            in_memory(make_settings(base, cache_dir=work / "cache", work_roots=[work], **cold)) as (u_client, _):
        with anyio.fail_after(180):
            while not list((base / "fonts-cache" / "matplotlib").glob("fontlist-v*.json")):
                await anyio.sleep(0.1)
        for i in range(rounds + 1):  # the first round warms the page cache
            for client, samples in ((p_client, prepared), (u_client, unprepared))[::1 if i % 2 else -1]:
                handle = (await call(client, "new_session"))["session"]
                await call(client, "execute_code", code="x = 1", session=handle)  # the kernel started
                t0 = time.perf_counter()
                r = await call(client, "execute_code", code=PLOT, session=handle, timeout=180)
                if i:
                    samples.append((time.perf_counter() - t0) * 1000)
                assert r["success"], r
                await call(client, "close_session", session=handle)
    out.append(Measurement(COLD_UNPREPARED, "ms", unprepared, note="the cache dir in a work root: never offered to kernels"))
    out.append(Measurement("first plot: the cell in a cold kernel, font list prepared at start-up", "ms", prepared,
                           baseline=COLD_UNPREPARED))


async def bench_memory_section(plan, base: Path, out: list[Measurement]) -> None:
    await bench_memory_per_session(plan, base, out)
    await bench_first_plot(plan, base, out)
    if has_setting("cache_dir") and has_setting("work_roots"):
        await bench_font_list(plan, base, out)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    plan = argparse.Namespace(quick=args.quick, sessions=2 if args.quick else 4)
    out: list[Measurement] = []
    with short_tmp() as base:
        anyio.run(bench_memory_section, plan, base, out, backend="asyncio")
    print(table(out))
    if args.json:
        Path(args.json).write_text(json.dumps({"results": to_json(out)}, indent=2))


if __name__ == "__main__":
    main()
