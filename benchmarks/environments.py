"""Kernels in the user's Python (the project's environment): first plot, idle memory, cold start per environment kind.

    python -m benchmarks.environments [--rounds 5] [--quick] [--json FILE]

Rows:

    first plot, pooled session        ``new_session`` served from a warm pool (``pool_size=1``), then its first
                                      cell ``import pandas, matplotlib.pyplot`` + one plot, timed end to end;
                                      with ``warm_imports`` (the default: warm kernels import the data stack
                                      ahead) and with ``warm_imports=[]`` (nothing ahead: the old behaviour)
    idle pooled kernel RSS/PSS        the pooled session's kernel before its first cell, with and without
    cold new_session per environment  ``pool_size=0``; kernelexec's own interpreter, a project ``.venv``
                                      (Python 3.12, no ipykernel: served from the overlay) and ``--python``
                                      on 3.13, where those interpreters exist on this machine

Pools are refilled (and the warm imports finished) before each measured call.
"""

from __future__ import annotations

import argparse
import json
import logging
import subprocess
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # ``python benchmarks/environments.py``
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import anyio

from benchmarks.common import call, has_setting, in_memory, log, make_settings, pss_mb, rss_mb, session_kernel_pid, short_tmp
from benchmarks.stats import Measurement, table, to_json
from tests.support import pyenv_python

PLOT = """\
import pandas as pd, matplotlib.pyplot as plt
df = pd.DataFrame({"x": range(10), "y": [i * i for i in range(10)]})
df.plot(x="x", y="y")
plt.show()
"""


async def _wait_pool(sessions, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while len(sessions.pool.sessions) < sessions.settings.pool_size:
        if time.monotonic() > deadline:
            raise RuntimeError("the pool did not fill")
        await anyio.sleep(0.05)
    await anyio.sleep(0.2)


async def bench_first_plot(rounds: int, base: Path, out: list[Measurement]) -> None:
    variants = [("warm imports", {})]
    if has_setting("warm_imports"):
        variants.append(("nothing ahead", {"warm_imports": []}))
    for label, extra in variants:
        log(f"      first plot in {rounds} pooled sessions ({label})")
        times, rss, pss = [], [], []
        async with in_memory(make_settings(base, pool_size=1, profile="standard", **extra)) as (client, sessions):
            for i in range(rounds + 1):  # the first round warms the page cache
                await _wait_pool(sessions)
                handle = (await call(client, "new_session"))["session"]
                pid = session_kernel_pid(sessions, handle)
                idle = rss_mb(pid), pss_mb(pid)
                t0 = time.perf_counter()
                r = await call(client, "execute_code", code=PLOT, session=handle)
                dt = (time.perf_counter() - t0) * 1000
                assert r["success"], r
                assert any(o["mime_type"] == "image/png" for o in r["outputs"]), r
                await call(client, "close_session", session=handle)
                if i:
                    times.append(dt)
                    rss.append(idle[0])
                    pss.append(idle[1])
        out.append(Measurement(f"env: first pandas+pyplot plot, pooled session ({label})", "ms", times,
                               baseline="env: first pandas+pyplot plot, pooled session (nothing ahead)"))
        out.append(Measurement(f"env: idle pooled kernel RSS ({label})", "MB", rss,
                               baseline="env: idle pooled kernel RSS (nothing ahead)"))
        out.append(Measurement(f"env: idle pooled kernel PSS ({label})", "MB", pss,
                               baseline="env: idle pooled kernel PSS (nothing ahead)"))


def _project(base: Path, python: str) -> Path:
    """A fixture project: pyproject.toml and a .venv made by ``python -m venv`` (no ipykernel)."""
    project = base / f"proj{Path(python).name.replace('python', '')}"
    if not (project / ".venv").exists():
        project.mkdir(exist_ok=True)
        (project / "pyproject.toml").write_text('[project]\nname = "bench-project"\nversion = "0"\n')
        subprocess.run([python, "-m", "venv", "--without-pip", str(project / ".venv")], check=True, timeout=120)
    return project


async def bench_cold_per_environment(rounds: int, base: Path, out: list[Measurement]) -> None:
    kinds: list[tuple[str, dict]] = [("own interpreter", {})]
    if has_setting("python"):
        py312, py313 = pyenv_python("3.12"), pyenv_python("3.13")
        if py312:
            kinds.append(("project .venv 3.12 + overlay", {"working_dir": _project(base, py312), "profile": "trusted"}))
        else:
            log("      NO python3.12 here: the project .venv row is skipped")
        if py313:
            kinds.append(("--python 3.13", {"python": py313}))
        else:
            log("      NO python3.13 here: the --python row is skipped")
    for label, extra in kinds:
        log(f"      cold new_session x {rounds}: {label}")
        samples = []
        async with in_memory(make_settings(base, pool_size=0, **extra)) as (client, _sessions):
            for _ in range(rounds + 1):
                t0 = time.perf_counter()
                handle = (await call(client, "new_session"))["session"]
                samples.append((time.perf_counter() - t0) * 1000)
                r = await call(client, "execute_code", code="import sys; sys.version_info[:2]", session=handle)
                assert r["success"], r
                await call(client, "close_session", session=handle)
        out.append(Measurement(f"env: cold new_session ({label})", "ms", samples[1:],
                               baseline="env: cold new_session (own interpreter)",
                               note=f"Python {'.'.join(map(str, r['result']))}" if isinstance(r.get("result"), list) else ""))


async def bench_environments(rounds: int, base: Path, out: list[Measurement]) -> None:
    await bench_first_plot(rounds, base, out)
    await bench_cold_per_environment(rounds, base, out)


async def bench_environments_section(plan, base: Path, out: list[Measurement]) -> None:
    """``benchmarks/run.py``'s section: 2 rounds with --quick, 5 otherwise."""
    log("[env] environments: first plot (pooled, with/without warm imports), idle memory, cold start per environment")
    await bench_environments(2 if plan.quick else 5, base, out)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="2 rounds")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    rounds = 2 if args.quick else args.rounds
    out: list[Measurement] = []
    with short_tmp() as base:
        anyio.run(bench_environments, rounds, base, out, backend="asyncio")
    print(table(out))
    if args.json:
        Path(args.json).write_text(json.dumps({"rounds": rounds, "results": to_json(out)}, indent=2))


if __name__ == "__main__":
    main()
