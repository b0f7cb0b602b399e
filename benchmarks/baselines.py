"""The same CPU-bound cell in plain Python, in kernelexec and in smolagents' ``LocalPythonExecutor``.

``LocalPythonExecutor`` is the engine the old "safe local Python executor" MCP server wrapped: it
walks the code's AST in the server's own process and evaluates each node in Python, so a loop pays
an interpreter on top of the interpreter. kernelexec runs the same code in a real CPython kernel.

One pure-Python loop (``SMOL_N`` iterations; it prints its own timing and its sum) runs, in turn,
``plan.cpu`` times in each of:

- ``python -c`` (a fresh interpreter each time): timed inside the code and end to end;
- ``execute_code`` in an in-memory MCP server (one session, warmed up): inside and end to end;
- ``LocalPythonExecutor(additional_authorized_imports=[])`` in this process (one executor, warmed up):
  inside the code and the executor call (no MCP, no process start: the cost inside the old server).

Rows chain their baselines: execute_code over ``python -c``, smolagents over execute_code, so the
ratio of the smolagents rows is how many times slower it is than kernelexec on the same code.
``smolagents`` is optional (``pip install 'kernelexec[bench]'``); without it its rows say so, empty.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import anyio

from benchmarks.common import call, clean_env, in_memory, log, make_settings
from benchmarks.stats import Measurement

MS = "ms"
SMOL_N = 100_000  # ~10 ms in CPython; the AST interpreter takes seconds, so not the 4M of the "cpu loop" rows
SMOL_SUM = sum(i * i for i in range(SMOL_N))
SMOL_CODE = f"""\
import time
_t0 = time.perf_counter()
_s = 0
for _i in range({SMOL_N}):
    _s += _i * _i
_dt = time.perf_counter() - _t0
print(_dt)
print(_s)
"""

PREFIX = "cpu vs smolagents:"
PY_IN, PY_E2E = f"{PREFIX} python -c (inside)", f"{PREFIX} python -c (end-to-end)"
KX_IN, KX_E2E = f"{PREFIX} execute_code (inside)", f"{PREFIX} execute_code (end-to-end)"
SM_IN, SM_E2E = f"{PREFIX} LocalPythonExecutor (inside)", f"{PREFIX} LocalPythonExecutor call (end-to-end)"


def parse(printed: str, where: str) -> float:
    """The loop's own time in ms from its two printed lines (time, then the sum, which is checked)."""
    lines = [line for line in printed.strip().splitlines() if line.strip()]
    if len(lines) < 2 or int(lines[-1]) != SMOL_SUM:
        raise RuntimeError(f"{where}: unexpected output {printed[-200:]!r}")
    return float(lines[-2]) * 1000


def smolagents_executor() -> tuple[object | None, str]:
    """A LocalPythonExecutor as the old server used it (no extra imports), or None and why not."""
    try:
        from importlib.metadata import version

        from smolagents.local_python_executor import LocalPythonExecutor
    except Exception as exc:  # not installed, or broken
        return None, f"smolagents not installed ({type(exc).__name__}: {exc}); pip install 'kernelexec[bench]'"
    executor = LocalPythonExecutor(additional_authorized_imports=[], timeout_seconds=300)
    executor.send_tools({})  # what smolagents' agents do before the first call: installs final_answer and the builtins
    return executor, f"smolagents {version('smolagents')}"


async def bench_smolagents(plan, base: Path, out: list[Measurement]) -> None:
    reps = plan.cpu
    executor, about = smolagents_executor()
    log(f"[baselines] CPU-bound loop ({SMOL_N:,} iterations) x {reps}: python -c, execute_code, "
        f"LocalPythonExecutor ({about})")
    env = clean_env()
    py_in, py_e2e, kx_in, kx_e2e, sm_in, sm_e2e = [], [], [], [], [], []
    async with in_memory(make_settings(base)) as (client, _sessions):
        handle = (await call(client, "new_session"))["session"]
        await call(client, "execute_code", code=SMOL_CODE, session=handle)  # warm-up
        if executor is not None:
            executor(SMOL_CODE)  # warm-up
        for _ in range(reps):
            t0 = time.perf_counter()
            proc = await anyio.run_process([sys.executable, "-c", SMOL_CODE], env=env, check=True)
            py_e2e.append((time.perf_counter() - t0) * 1000)
            py_in.append(parse(proc.stdout.decode(), "python -c"))

            t0 = time.perf_counter()
            r = await call(client, "execute_code", code=SMOL_CODE, session=handle, timeout=300)
            kx_e2e.append((time.perf_counter() - t0) * 1000)
            if not r["success"]:
                raise RuntimeError(f"execute_code: {r.get('error')}")
            kx_in.append(parse(r["stdout"], "execute_code"))

            if executor is not None:
                t0 = time.perf_counter()
                result = executor(SMOL_CODE)  # blocks this loop on purpose: the old server did the same
                sm_e2e.append((time.perf_counter() - t0) * 1000)
                sm_in.append(parse(result.logs, "LocalPythonExecutor"))
    out.append(Measurement(PY_IN, MS, py_in, note=f"the same {SMOL_N:,}-iteration pure-Python loop in every row of this group"))
    out.append(Measurement(KX_IN, MS, kx_in, baseline=PY_IN))
    missing = "" if executor is not None else " - not measured: smolagents not installed"
    out.append(Measurement(SM_IN + missing, MS, sm_in, baseline=KX_IN,
                           note=(about + "; AST interpreter in the server's process, additional_authorized_imports=[]; "
                                 "ratio = times slower than execute_code") if executor is not None else about + ": not measured"))
    out.append(Measurement(PY_E2E, MS, py_e2e, note="includes interpreter start"))
    out.append(Measurement(KX_E2E, MS, kx_e2e, baseline=PY_E2E, note="in-memory MCP call"))
    out.append(Measurement(SM_E2E + missing, MS, sm_e2e, baseline=KX_E2E,
                           note="in process, no MCP and no process start; ratio = times slower than execute_code end to end"
                           if executor is not None else about + ": not measured"))
