"""What each OS sandbox layer adds to a session's start.

    python -m benchmarks.layers [--rounds 8] [--quick] [--json FILE]

Cold ``new_session`` (``pool_size=0``: the kernel is started inside its layers, the startup code run
and the policy checked before the answer) under seven configurations, from ``sandbox="off"`` to every
layer this machine supports, adding one layer at a time with ``disable_layers``:

    sandbox off                       env + guard only (no pre-exec wrapper)
    no OS layers                      the wrapper: scrubbed env, rlimits, capabilities dropped (as root)
    + landlock                        + Landlock file (and TCP) rules
    + seccomp                         + the seccomp filter (no fork/exec under strict/standard)
    + netns (wrapper unshare)         + a network namespace made by the wrapper, without bubblewrap
    + bubblewrap                      bubblewrap instead: mount/pid/ipc/uts namespaces and its own netns
    + cgroup = full                   + memory/pids cgroups: what ``sandbox="auto"`` gives here

Every configuration is its own in-memory server, all open at once; each round starts one session in
each configuration in turn (the order rotates every round), so load from elsewhere on the machine
hits them alike. The first round warms the page cache and is not counted. Each session runs one cell
(its answer's ``layers`` are checked against the configuration; it also reports whether ipykernel
imported ``debugpy`` while starting) and its kernel's RSS with wrappers is read, then it is closed. For comparison, ``new_session`` served from a warm pool (``pool_size=1``,
all layers), refilled before each call. Ratios are over the sandbox-off median.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # ``python benchmarks/layers.py``
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import anyio

from benchmarks.common import call, has_setting, in_memory, log, make_settings, session_root_pid, short_tmp, tree_rss_mb
from benchmarks.stats import Measurement, table, to_json

MS = "ms"
ALL = ["landlock", "seccomp", "bubblewrap", "netns", "cgroup"]
OFF_NAME = "layers: cold new_session, sandbox off"


@dataclass
class Step:
    name: str
    overrides: dict[str, Any]
    adds: str  # the layer name this step must add to the answer's ``layers`` ('' = nothing to check)


STEPS = [
    Step(OFF_NAME, {"sandbox": "off"}, ""),
    Step("layers: cold new_session, no OS layers (env, rlimits, caps)", {"disable_layers": ALL}, "rlimits"),
    Step("layers: cold new_session, + landlock", {"disable_layers": ["seccomp", "bubblewrap", "netns", "cgroup"]}, "landlock"),
    Step("layers: cold new_session, + seccomp", {"disable_layers": ["bubblewrap", "netns", "cgroup"]}, "seccomp"),
    Step("layers: cold new_session, + netns (wrapper unshare)", {"disable_layers": ["bubblewrap", "cgroup"]}, "netns"),
    Step("layers: cold new_session, + bubblewrap (instead of the wrapper's netns)", {"disable_layers": ["cgroup"]}, "bubblewrap"),
    Step("layers: cold new_session, + cgroup = full (sandbox auto)", {}, "cgroup"),
]
# the first call of each session: also tells whether ipykernel imported debugpy while starting (the guard's
# plan blocks it, which makes kernels start faster and smaller; sandbox="off" does not)
PROBE = "import sys\nx = 1\nresult = sys.modules.get('debugpy') is not None"
POOLED = "layers: new_session from the warm pool (pool_size=1, full)"


async def bench_layers(rounds: int, base: Path, out: list[Measurement]) -> None:
    """Append a start-time row per configuration (ratio over sandbox off), the pooled row, and RSS rows."""
    if not has_setting("disable_layers") or not has_setting("pool_size"):
        out.append(Measurement(OFF_NAME, MS, [], note="this kernelexec has no disable_layers/pool_size settings"))
        return
    log(f"[layers] {len(STEPS)} configurations + the warm pool, {rounds} counted rounds (+1 warm-up), order rotating")
    starts: dict[str, list[float]] = {s.name: [] for s in STEPS}
    rss: dict[str, list[float]] = {s.name: [] for s in STEPS}
    seen: dict[str, list[str]] = {}
    debugpy: dict[str, bool] = {}
    pooled: list[float] = []
    async with AsyncExitStack() as stack:
        servers = {}
        for s in STEPS:
            servers[s.name] = await stack.enter_async_context(in_memory(make_settings(base, pool_size=0, **s.overrides)))
        pool_client, pool_sessions = await stack.enter_async_context(in_memory(make_settings(base, pool_size=1)))
        for i in range(rounds + 1):
            order = STEPS[i % len(STEPS):] + STEPS[:i % len(STEPS)]
            for s in order:
                client, sessions = servers[s.name]
                t0 = time.perf_counter()
                info = await call(client, "new_session")
                elapsed = time.perf_counter() - t0
                handle = info["session"]
                r = await call(client, "execute_code", code=PROBE, session=handle)
                if not r["success"]:
                    raise RuntimeError(f"{s.name}: x = 1 failed: {r.get('error')}")
                layers = r.get("layers", [])
                if s.adds and not any(layer.startswith(s.adds) for layer in layers):
                    raise RuntimeError(f"{s.name}: expected a {s.adds!r} layer, the answer says {layers}")
                seen[s.name] = layers
                debugpy[s.name] = r.get("result") is True
                if i:
                    starts[s.name].append(elapsed * 1000)
                    rss[s.name].append(tree_rss_mb(session_root_pid(sessions, handle)))
                await call(client, "close_session", session=handle)
            with anyio.fail_after(120):
                while not pool_sessions.pool.sessions:
                    await anyio.sleep(0.05)
            await anyio.sleep(0.2)
            t0 = time.perf_counter()
            info = await call(pool_client, "new_session")
            elapsed = time.perf_counter() - t0
            if i:
                pooled.append(elapsed * 1000)
            await call(pool_client, "close_session", session=info["session"])
            log(f"  round {i}/{rounds}" + (" (warm-up)" if not i else ""))
    launches = await anyio.to_thread.run_sync(wrapper_launches, base, rounds * 4)
    for s in STEPS:
        out.append(Measurement(s.name, MS, starts[s.name], baseline=None if s.name == OFF_NAME else OFF_NAME,
                               note="layers: " + "+".join(seen.get(s.name, []))
                               + ("; debugpy imported by ipykernel at start (not blocked)" if debugpy.get(s.name) else "")))
    out.append(Measurement(POOLED, MS, pooled, baseline=OFF_NAME, note="the pool refilled before each call"))
    off_launch = launch_name(STEPS[0])
    for s in STEPS:
        out.append(Measurement(launch_name(s), MS, launches[s.name], baseline=None if s.name == OFF_NAME else off_launch,
                               note=LAUNCH_NOTE if s.name == OFF_NAME else ""))
    off_rss = "layers mem: kernel + wrappers RSS, sandbox off"
    for s in STEPS:
        name = s.name.replace("layers: cold new_session", "layers mem: kernel + wrappers RSS")
        out.append(Measurement(name, "MB", rss[s.name], baseline=None if s.name == OFF_NAME else off_rss))


LAUNCH_NOTE = ("the layers alone: cgroups created, the shim, bubblewrap and the pre-exec wrapper applying the plan, "
               "then exec of `python -S -c pass` instead of the kernel; no kernel, no MCP")


def launch_name(step: Step) -> str:
    return step.name.replace("layers: cold new_session", "layers: launch only")


def wrapper_launches(base: Path, reps: int) -> dict[str, list[float]]:
    """Each configuration's sandbox plan (standard profile) launched around a trivial command, as the
    provisioner launches a kernel: cgroups created, then ``plan.wrap(cmd)`` with the wrapper's JSON."""
    import json as _json
    import subprocess
    import uuid

    from benchmarks.common import make_settings as _settings
    from kernelexec.kernel.launch import SessionDirs
    from kernelexec.sandbox.plan import plan_for

    samples: dict[str, list[float]] = {s.name: [] for s in STEPS}
    settings = {s.name: _settings(base, **s.overrides) for s in STEPS}
    for i in range(reps + 1):  # the first round is a warm-up
        for s in STEPS[i % len(STEPS):] + STEPS[:i % len(STEPS)]:
            st = settings[s.name]
            dirs = SessionDirs(st.sessions_dir / f"w{i}")
            dirs.create()
            plan = plan_for(st, "standard", session_dir=dirs.root, rw=[], ro=[], cwd=dirs.work, key=f"bench-{uuid.uuid4().hex[:12]}")
            env = {"PATH": os.environ.get("PATH", os.defpath), "KERNELEXEC_SANDBOX": _json.dumps(plan.wrapper)}
            t0 = time.perf_counter()
            plan.create_cgroups()
            try:
                proc = subprocess.run(plan.wrap([sys.executable, "-S", "-c", "pass"]), env=env, cwd=dirs.work,
                                      stdin=subprocess.DEVNULL, capture_output=True, timeout=60)
            finally:
                elapsed = time.perf_counter() - t0
                plan.remove_cgroups()
            if proc.returncode != 0:
                raise RuntimeError(f"{s.name}: the wrapper failed ({proc.returncode}): {proc.stderr.decode(errors='replace')[-300:]}")
            if i:
                samples[s.name].append(elapsed * 1000)
    return samples


async def bench_layers_section(plan: Any, base: Path, out: list[Measurement]) -> None:
    """The section of ``python -m benchmarks``: 8 counted rounds (3 with --quick)."""
    await bench_layers(min(plan.cold, 8), base, out)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.layers", description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=8, help="counted starts per configuration (default 8)")
    parser.add_argument("--quick", action="store_true", help="2 rounds: a smoke run")
    parser.add_argument("--json", metavar="FILE", help="also write the results (summaries and raw samples) to FILE")
    args = parser.parse_args(argv)
    rounds = 2 if args.quick else args.rounds
    for name in ("httpx", "httpx2"):
        logging.getLogger(name).setLevel(logging.WARNING)
    from kernelexec.sandbox.probe import probe

    load0 = os.getloadavg()

    async def go() -> list[Measurement]:
        out: list[Measurement] = []
        with short_tmp("kxy") as base:
            await bench_layers(rounds, base, out)
        return out

    t0 = time.perf_counter()
    rows = anyio.run(go, backend="asyncio")
    wall = time.perf_counter() - t0
    print(table(rows))
    notes = [f"  {r.name}: {r.note}" for r in rows if r.note]
    print("\nnotes:\n" + "\n".join(notes))
    f = probe()
    print("\nratio = median / sandbox-off median. machine: " + "; ".join(f"{k} {v}" for k, v in f.as_rows())
          + f"; {os.cpu_count()} CPUs; load average {load0[0]:.2f} at start, {os.getloadavg()[0]:.2f} at end; total {wall:.0f} s")
    if args.json:
        Path(args.json).write_text(json.dumps({"rounds": rounds, "wall_s": wall, "results": to_json(rows)}, indent=2))
        log(f"wrote {args.json}")


if __name__ == "__main__":
    main()
