"""State that outlives its kernel (issue 32): what checkpoints cost per cell, and how fast state comes back.

    python -m benchmarks --only durable [--quick]

Rows (in memory, the default settings, warm spares off):
- ``durable: x=1, checkpoints on`` vs ``... off`` (``--checkpoint-mb 0``): one ``execute_code`` each, alternating
  servers is not possible (a setting), so each server runs its block of calls; the save runs after the answer.
- ``durable: 1 MB change per cell, on`` vs ``off``: a new 1 MB numpy array bound per cell.
- ``durable: back after os._exit, DF_MB MB DataFrame``: a cell ``os._exit``s the kernel, then the timed call reads
  ``df`` (the new kernel loads it from the checkpoint first); the DataFrame is DF_MB MB, the issue's
  size (the whole section with --quick took 37 s on a shared 2-core box: back after os._exit 442 ms median,
  fork 1.5 s, restore 2.0 s vs replay 5.2 s; the 2048 MiB default memory limit holds the frame and its pickle).
- ``durable: fork_session of it``: the checkpoint copied and loaded in a new kernel.
- ``durable: restart_session(restore=true)`` vs ``restart_session(replay=true)``: the DataFrame's cell also
  sleeps BUILD_S seconds (a stand-in for a slow computation), which replay pays again and restore does not.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from benchmarks.common import call, in_memory, log, make_settings
from benchmarks.stats import Measurement

DF_MB = 200
BUILD_S = 3.0


def _ms(t0: float) -> float:
    return (time.perf_counter() - t0) * 1000


async def _per_cell(base: Path, mb: float, code: str, n: int) -> list[float]:
    async with in_memory(make_settings(base, checkpoint_mb=mb, pool_size=0)) as (client, _):
        s = (await call(client, "new_session"))["session"]
        await call(client, "execute_code", code="import numpy as np", session=s)
        samples = []
        for i in range(n + 3):
            t0 = time.perf_counter()
            await call(client, "execute_code", code=code.replace("I", str(i)), session=s)
            if i >= 3:  # warm-up
                samples.append(_ms(t0))
        await call(client, "close_session", session=s)
    return samples


async def bench_durable(plan: Any, base: Path, out: list[Measurement]) -> None:
    quick = getattr(plan, "quick", False)
    n = 20 if quick else 60
    rounds = 2 if quick else 4
    log(f"[durable] per-cell overhead: {n} calls each, checkpoints on and off")
    mb_code = "a = np.full(125_000, I, dtype=np.float64)"  # 1 MB, a new object each cell
    x_on: list[float] = []
    x_off: list[float] = []
    i_on: list[float] = []
    i_off: list[float] = []
    m_on: list[float] = []
    m_off: list[float] = []
    for _ in range(2):  # on and off alternate in blocks, so drift on a shared box hits both
        x_on += await _per_cell(base, 1024, "x = 1", n // 2)
        x_off += await _per_cell(base, 0, "x = 1", n // 2)
        i_on += await _per_cell(base, 1024, "x = I", n // 2)
        i_off += await _per_cell(base, 0, "x = I", n // 2)
        m_on += await _per_cell(base, 1024, mb_code, n // 2)
        m_off += await _per_cell(base, 0, mb_code, n // 2)
    out += [
        Measurement("durable: x=1, checkpoints off", "ms", x_off, note="--checkpoint-mb 0"),
        Measurement("durable: x=1, checkpoints on", "ms", x_on, baseline="durable: x=1, checkpoints off",
                    note="x bound again to the same object: nothing to save, no thread started"),
        Measurement("durable: x=i (a new int each cell), checkpoints off", "ms", i_off),
        Measurement("durable: x=i (a new int each cell), checkpoints on", "ms", i_on,
                    baseline="durable: x=i (a new int each cell), checkpoints off",
                    note="one small pickle + manifest written by a thread after the answer"),
        Measurement("durable: 1 MB change per cell, checkpoints off", "ms", m_off),
        Measurement("durable: 1 MB change per cell, checkpoints on", "ms", m_on,
                    baseline="durable: 1 MB change per cell, checkpoints off", note="one 1 MB numpy array rebound per cell"),
    ]
    rows = DF_MB * 1_000_000 // 8 // 5
    build = (f"import time, numpy as np, pandas as pd\ntime.sleep({BUILD_S})\n"
             f"df = pd.DataFrame(np.arange({rows * 5}, dtype=np.float64).reshape({rows}, 5), columns=list('abcde'))")
    expected = float(rows * 5 - 1)
    back, forks, restore, replay = [], [], [], []
    async with in_memory(make_settings(base, pool_size=0)) as (client, _):
        s = (await call(client, "new_session"))["session"]
        await call(client, "execute_code", code=build, session=s, timeout=300)
        status = await call(client, "execute_code", code="_kernelexec_checkpoint_status()._repr_json_()", session=s)
        log(f"[durable] {DF_MB} MB DataFrame built; checkpoint {status['result'].get('bytes', 0) / 1e6:.0f} MB")
        for _ in range(rounds):
            await client.call_tool("execute_code", {"code": "import os\nos._exit(1)", "session": s})
            t0 = time.perf_counter()
            r = await call(client, "execute_code", code="result = float(df['e'].iloc[-1])", session=s, timeout=300)
            back.append(_ms(t0))
            assert r["result"] == expected and r["restored"] and "df" in r["restored"]["restored"], r
        for _ in range(rounds):
            t0 = time.perf_counter()
            f = await call(client, "fork_session", session=s)
            forks.append(_ms(t0))
            assert "df" in f["restored"]["restored"], f
            await call(client, "close_session", session=f["session"])
        for _ in range(rounds):
            t0 = time.perf_counter()
            info = await call(client, "restart_session", session=s, restore=True)
            restore.append(_ms(t0))
            assert "df" in info["restored"]["restored"], info
        for _ in range(max(1, rounds // 2)):
            t0 = time.perf_counter()
            await call(client, "restart_session", session=s, replay=True)
            replay.append(_ms(t0))
        await call(client, "close_session", session=s)
    out += [
        Measurement(f"durable: back after os._exit, {DF_MB} MB DataFrame", "ms", back,
                    note="the call after the death: a new kernel, df loaded inside it from the checkpoint, then read"),
        Measurement(f"durable: fork_session, {DF_MB} MB DataFrame", "ms", forks, note="checkpoint copied + loaded in a new kernel"),
        Measurement(f"durable: restart_session(replay=true), {DF_MB} MB + {BUILD_S:g} s cell", "ms", replay,
                    note="every recorded cell run again"),
        Measurement(f"durable: restart_session(restore=true), {DF_MB} MB + {BUILD_S:g} s cell", "ms", restore,
                    baseline=f"durable: restart_session(replay=true), {DF_MB} MB + {BUILD_S:g} s cell",
                    note="loaded from the checkpoint; no cell run again"),
    ]
