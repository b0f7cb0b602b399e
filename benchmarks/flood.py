"""Hostile flood soak: one session floods stream messages past the kernel's output cap while another runs ``1+1``.

    python -m benchmarks --only flood [--quick]      (or: python -m benchmarks.flood [--quick] [--mib N])

A ``kernelexec serve`` child over stdio (so its memory is its own: ``/proc/<pid>/status``) with two
sessions. The hostile one sends ``N`` x 1 MiB ``stream`` messages straight on its kernel session
(``get_ipython().kernel.session.send``, as tests/test_hostile_kernel.py does): they bypass the
in-kernel output cap and packer, so only the server's own caps stand between them and its memory.
Meanwhile the other session runs ``execute_code("1+1")`` in a loop until the flood's answer arrives.

Rows: the other session's latency with no flood (the baseline: the same calls, the same session,
just before) and during the floods (median, p95, p99); the server's peak-RSS (VmHWM) growth over
the floods, and how long each flooding cell took. Three floods of N = 200 MiB one after the other
(one of 50 MiB with --quick): bounded so that a server without a server-side cap (before 19848c6)
still finishes, at a cost of a few times N in RSS.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # ``python benchmarks/flood.py``
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import anyio
from mcp import Client

from benchmarks.common import (
    call,
    has_setting,
    log,
    short_tmp,
    stdio_params,
    stdio_server_pid,
)
from benchmarks.stats import Measurement, table

FLOOD = """\
_k = get_ipython().kernel
chunk = 'x' * (1 << 20)
for i in range({mib}):
    _k.session.send(_k.iopub_socket, 'stream', {{'name': 'stdout', 'text': chunk}}, parent=_k.get_parent('shell'))
print('end')
"""

CALM = "flood: 1+1 in another session, no flood"


def hwm_mb(pid: int) -> float:
    """The process's peak resident set size so far (VmHWM), in MB."""
    with open(f"/proc/{pid}/status") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith("VmHWM:")) / 1024


def serve_args() -> list[str]:
    """No warm pool, no spares: nothing starts in the background while the rows are timed."""
    args = []
    if has_setting("pool_size"):
        args += ["--pool-size", "0"]
    if has_setting("restart_spares"):
        args += ["--restart-spares", "0"]
    return args


async def measure(base: Path, mib: int, calm_calls: int, rounds: int = 1, warmup: int = 10) -> list[Measurement]:
    log(f"[flood] stdio server, two sessions: {calm_calls} calm 1+1 calls, then 1+1 calls during {rounds} x a {mib} MiB stream flood")
    state = base / "flood"
    calm: list[float] = []
    during: list[float] = []
    answers: list[dict[str, Any]] = []
    flood_ms: list[float] = []
    async with Client(stdio_params(state, *serve_args())) as client:
        other = (await call(client, "new_session"))["session"]
        hostile = (await call(client, "new_session"))["session"]
        assert (await call(client, "execute_code", code="_k = get_ipython().kernel", session=hostile))["success"]
        for _ in range(warmup):
            await call(client, "execute_code", code="1+1", session=other)
        for _ in range(calm_calls):
            t0 = time.perf_counter()
            r = await call(client, "execute_code", code="1+1", session=other)
            calm.append((time.perf_counter() - t0) * 1000)
            assert r["result"] == 2, r
        pid = stdio_server_pid(state)
        assert pid is not None, "no kernelexec serve child found"
        before = hwm_mb(pid)

        async def flooding(answer: dict[str, Any]) -> None:
            t0 = time.perf_counter()
            answer.update(await call(client, "execute_code", code=FLOOD.format(mib=mib), session=hostile, timeout=600))
            flood_ms.append((time.perf_counter() - t0) * 1000)

        for k in range(rounds):
            answers.append({})
            async with anyio.create_task_group() as tg:
                tg.start_soon(flooding, answers[-1])
                await anyio.sleep(0.3)
                while not answers[-1]:
                    t0 = time.perf_counter()
                    r = await call(client, "execute_code", code="1+1", session=other)
                    during.append((time.perf_counter() - t0) * 1000)
                    assert r["result"] == 2, r
            log(f"[flood] round {k + 1}/{rounds}: {flood_ms[-1] / 1000:.1f} s, {len(during)} calls timed so far, "
                f"server VmHWM {hwm_mb(pid):.0f} MB")
        after = hwm_mb(pid)
    answer = answers[-1]
    stdout = answer.get("stdout") or ""
    kept = f"the answer's stdout held {len(stdout):,} characters" + (", ended 'end'" if stdout.endswith("end\n") else "")
    if answer.get("stdout_file"):
        kept += ", the rest in its stdout_file"
    return [
        Measurement(CALM, "ms", calm, note=f"the same session just before the flood, {warmup} warm-up calls"),
        Measurement(f"flood: 1+1 in another session, during a {mib} MiB stream flood", "ms", during, baseline=CALM,
                    note=f"{rounds} flood(s) of {mib} x 1 MiB stream messages sent past the kernel's cap on its own session"),
        Measurement("flood: server peak RSS (VmHWM) growth during the flood", "MB", [after - before],
                    note=f"kernelexec serve over stdio: VmHWM {before:.0f} MB before, {after:.0f} MB after {rounds} flood(s)"),
        Measurement(f"flood: the flooding cell ({mib} MiB), end to end", "ms", flood_ms,
                    note=f"success={[a.get('success') for a in answers]}; last: {kept}"),
    ]


async def bench_flood(plan: Any, base: Path, out: list[Measurement]) -> None:
    """The ``flood`` section of ``python -m benchmarks``."""
    quick = getattr(plan, "quick", False)
    out.extend(await measure(base, mib=50 if quick else 200, calm_calls=30 if quick else 200, rounds=1 if quick else 3))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.flood", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--mib", type=int, help="MiB per flood (default 200, 50 with --quick)")
    parser.add_argument("--rounds", type=int, help="floods, one after the other (default 3, 1 with --quick)")
    args = parser.parse_args(argv)
    mib = args.mib or (50 if args.quick else 200)
    rounds = args.rounds or (1 if args.quick else 3)
    with short_tmp() as base:
        rows = anyio.run(measure, base, mib, 30 if args.quick else 200, rounds, backend="asyncio")
    print(table(rows))
    for r in rows:
        if r.note:
            print(f"  {r.name}: {r.note}")


if __name__ == "__main__":
    main()
