"""State that outlives its kernel (issue 32): what checkpoints cost per cell, and how fast state comes back.

    python -m benchmarks --only durable [--quick]

Rows (in memory, the default settings, warm spares off), each "on" row against its "off" baseline
(``--checkpoint-mb 0``), the overhead in its note; servers alternate in blocks so drift on a shared box hits both:
- ``durable: x=1``: the same object bound again: nothing to save, the saver not even woken.
- ``durable: x=i``: a new small int each cell: one small pickle and the manifest, after the answer.
- ``durable: 1 MB change per cell``: a new 1 MB numpy array bound per cell.
- ``durable: 200 MB change per cell``: a new 200 MB array per cell; back to back, a save still running when the
  next cell starts is dropped and done after it (never waited for): the note says how many were.
- ``durable: back after os._exit, 200 MB DataFrame``: a session whose DataFrame is built by a BUILD_S s cell (a
  loop of numpy blocks with sleeps between them: the slow part of a real computation; ``--quick`` shortens it to
  QUICK_BUILD_S s and says so in the row's name); once the last save is done, a cell ``os._exit``s the kernel, then
  the timed call reads ``df`` (the new kernel loads it from the checkpoint first) and checks it equal. Goal: <= 3 s.
- ``durable: fork_session``: the checkpoint named by the source kernel, its files copied by the server (local
  kernels; a gateway's are relayed through the kernels instead), loaded by the fork's.
- ``durable: fork_session through a gateway, 8 MB`` and ``200 MB``: the same, with the kernels on a gateway
  (Enterprise Gateway when tests/gateways.py finds one, else the Kernel Gateway; the default pool of one kernel,
  so the fork's kernel is usually started already): the server cannot reach their files, so the checkpoint is
  relayed from kernel to kernel through the server as binary comm buffers.
- ``durable: restart_session(restore=true)`` vs ``restart_session(replay=true)``: the checkpoint loaded vs every
  recorded cell (the BUILD_S s one too) run again.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from benchmarks.common import call, in_memory, log, make_settings
from benchmarks.stats import Measurement, median

DF_MB = 200
BUILD_S = 30.0
QUICK_BUILD_S = 6.0
BLOCKS = 40  # the build's loop: a numpy block, then a sleep, BLOCKS times


def _ms(t0: float) -> float:
    return (time.perf_counter() - t0) * 1000


async def _per_cell(base: Path, mb: float, code: str, n: int, superseded: list[int] | None = None) -> list[float]:
    async with in_memory(make_settings(base, checkpoint_mb=mb, pool_size=0)) as (client, _):
        s = (await call(client, "new_session"))["session"]
        await call(client, "execute_code", code="import numpy as np", session=s)
        samples = []
        for i in range(n + 3):
            t0 = time.perf_counter()
            await call(client, "execute_code", code=code.replace("I", str(i)), session=s)
            if i >= 3:  # warm-up
                samples.append(_ms(t0))
        if superseded is not None:
            status = await call(client, "execute_code", code="_kernelexec_checkpoint_status()._repr_json_()", session=s)
            superseded.append(int(status["result"].get("superseded", 0)))
        await call(client, "close_session", session=s)
    return samples


def _pair(name: str, on: list[float], off: list[float], note: str) -> list[Measurement]:
    """An on row against its off baseline; the note says the overhead of the medians."""
    ratio = median(on) / median(off) if on and off and median(off) else float("nan")
    return [Measurement(f"durable: {name}, checkpoints off", "ms", off, note="--checkpoint-mb 0"),
            Measurement(f"durable: {name}, checkpoints on", "ms", on, baseline=f"durable: {name}, checkpoints off",
                        note=f"overhead {ratio - 1:+.1%} (medians); {note}")]


async def _gateway_forks(base: Path, rounds: int, out: list[Measurement]) -> None:
    """Forks of a session on a gateway holding 8 MB, then 200 MB: the relay through the kernels."""
    from tests.gateways import enterprise_gateway_command, running_gateway

    kind = "enterprise_gateway" if enterprise_gateway_command() else "kernel_gateway"
    with running_gateway(kind, base) as gateway:
        settings = make_settings(base, kernel_gateway=gateway.url,
                                 kernel_gateway_token=gateway.token)
        async with in_memory(settings) as (client, _):
            s = (await call(client, "new_session"))["session"]
            for mb in (8, DF_MB):
                await call(client, "execute_code", session=s, timeout=300,
                           code=f"import numpy as np\nblob = np.arange({mb * 1_000_000 // 8}, dtype=np.float64)")
                forks = []
                for _ in range(rounds):
                    t0 = time.perf_counter()
                    f = await call(client, "fork_session", session=s, timeout=300)
                    forks.append(_ms(t0))
                    assert "blob" in f["restored"]["restored"], f
                    check = await call(client, "execute_code", session=f["session"],
                                       code=f"result = bool(blob[-1] == {mb * 1_000_000 // 8 - 1})")
                    assert check["result"] is True, check
                    await call(client, "close_session", session=f["session"])
                out.append(Measurement(f"durable: fork_session through a gateway, {mb} MB", "ms", forks,
                                       note=f"kernels on {kind}: the checkpoint relayed kernel to kernel through "
                                            f"the server as binary comm buffers, loaded by the fork's (goal <= 3 s)"))
            await call(client, "close_session", session=s)


async def bench_durable(plan: Any, base: Path, out: list[Measurement]) -> None:
    quick = getattr(plan, "quick", False)
    n = 20 if quick else 60
    n_big = 6 if quick else 16
    rounds = 2 if quick else 4
    log(f"[durable] per-cell overhead: {n} calls each ({n_big} for 200 MB), checkpoints on and off")
    cases = {
        "x=1": ("x = 1", n, "the same object bound again: nothing to save, the saver not woken"),
        "x=i (a new int each cell)": ("x = I", n, "one small pickle + the manifest, written after the answer"),
        "1 MB change per cell": ("a = np.full(125_000, I, dtype=np.float64)", n, "a new 1 MB numpy array per cell"),
        "200 MB change per cell": ("a = np.full(25_000_000, I, dtype=np.float64)", n_big,
                                   "a new 200 MB numpy array per cell, back to back"),
    }
    on: dict[str, list[float]] = {k: [] for k in cases}
    off: dict[str, list[float]] = {k: [] for k in cases}
    superseded: list[int] = []
    for _ in range(2):  # on and off alternate in blocks, so drift on a shared box hits both
        for name, (code, count, _note) in cases.items():
            on[name] += await _per_cell(base, 1024, code, count // 2, superseded if name.startswith("200") else None)
            off[name] += await _per_cell(base, 0, code, count // 2)
    for name, (_code, _count, note) in cases.items():
        if name.startswith("200"):
            note += f"; {sum(superseded)} saves dropped by the next cell and done after it"
        out += _pair(name, on[name], off[name], note)
    rows = DF_MB * 1_000_000 // 8 // 5
    build_s = QUICK_BUILD_S if quick else BUILD_S
    label = f"{DF_MB} MB DataFrame, {build_s:g} s cell" + (" (--quick: shortened from 30 s)" if quick else "")
    block = rows * 5 // BLOCKS
    build = ("import time, numpy as np, pandas as pd\nparts = []\n"
             f"for i in range({BLOCKS}):\n"
             f"    parts.append(np.arange(i * {block}, (i + 1) * {block}, dtype=np.float64))\n"
             f"    time.sleep({build_s / BLOCKS!r})  # the slow part of a real computation\n"
             f"df = pd.DataFrame(np.concatenate(parts).reshape({rows}, 5), columns=list('abcde'))\ndel parts")
    expected = float(block * BLOCKS - 1)
    check = "result = (float(df['e'].iloc[-1]), df.shape, float(df['a'].sum()))"
    want = [expected, [rows, 5], float(sum(range(0, rows * 5, 5)))]
    built: list[float] = []
    back, forks, restore, replay = [], [], [], []
    async with in_memory(make_settings(base, pool_size=0)) as (client, _):
        s = (await call(client, "new_session"))["session"]
        t0 = time.perf_counter()
        await call(client, "execute_code", code=build, session=s, timeout=300)
        built.append(_ms(t0))
        status = await call(client, "execute_code", code="_kernelexec_checkpoint_status()._repr_json_()", session=s)
        log(f"[durable] {DF_MB} MB DataFrame built; checkpoint {status['result'].get('bytes', 0) / 1e6:.0f} MB")
        for _ in range(rounds):
            # the last cell's save done first (a death while it runs recomputes df from its cell instead: the row
            # would measure the rerun); the check cell reads df['a'].sum(), which counts as a possible change
            await call(client, "execute_code", code="_kernelexec_checkpoint_status()._repr_json_()", session=s)
            await client.call_tool("execute_code", {"code": "import os\nos._exit(1)", "session": s})
            t0 = time.perf_counter()
            r = await call(client, "execute_code", code=check, session=s, timeout=300)
            back.append(_ms(t0))
            assert r["result"] == want and r["restored"] and "df" in r["restored"]["restored"], r
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
            assert (await call(client, "execute_code", code=check, session=s))["result"] == want
        await call(client, "close_session", session=s)
    out += [
        Measurement(f"durable: the build cell, {label}", "ms", built, note="the first run of the cell"),
        Measurement(f"durable: back after os._exit, {label}", "ms", back,
                    note="the call after the death: a new kernel, df loaded inside it from the checkpoint, "
                         "then checked equal (goal <= 3 s)"),
        Measurement(f"durable: fork_session, {label}", "ms", forks,
                    note="named by the source kernel, its files copied on this host, loaded by the fork's (goal <= 3 s)"),
        Measurement(f"durable: restart_session(replay=true), {label}", "ms", replay,
                    note="every recorded cell run again"),
        Measurement(f"durable: restart_session(restore=true), {label}", "ms", restore,
                    baseline=f"durable: restart_session(replay=true), {label}",
                    note="loaded from the checkpoint; no cell run again"),
    ]
    await _gateway_forks(base, rounds, out)
