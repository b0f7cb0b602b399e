"""Reproductions of the two resource problems the soak surfaced (``python -m benchmarks.repro``).

1. Kernel memory grows with everything a session ever printed. IPython 9's ``InteractiveShell._tee``
   copies every stdout/stderr write into ``shell.history_manager.outputs[execution_count]``, an
   in-memory dict that is never pruned (``--HistoryManager.enabled=False`` does not stop it). The
   copy is taken *before* kernelexec's stream cap, so a cell printing 2 MB pins 2 MB in the kernel
   even though only ``--kernel-stream-cap`` characters were forwarded.
2. The background notebook write costs O(session). Every 0.5 s the session manager materialises
   each dirty notebook by re-reading and re-serialising the whole journal (``Recorder.write_notebook``),
   so under steady calls the server spends CPU (and, with large outputs, memory) in proportion to
   the session's history, and the latency tail of every call grows with it.

Both go through the public tool interface of an in-memory server, as a client would.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import anyio

from benchmarks.common import call, cpu_seconds, in_memory, make_settings, rss_mb, session_kernel_pid, short_tmp
from benchmarks.stats import percentile

PRINT_2MB = "print('x' * 2_000_000)"
HELD = (
    "_hm = get_ipython().history_manager\n"
    "result = [len(_hm.outputs), sum(len(''.join(o.bundle.get('stream', []))) for v in _hm.outputs.values() for o in v)]"
)


async def kernel_retains_output(base: Path, prints: int = 30) -> None:
    print(f"1. kernel RSS while a session prints 2 MB per call ({prints} calls)")
    async with in_memory(make_settings(base)) as (client, sessions):
        h = (await call(client, "new_session"))["session"]
        pid = session_kernel_pid(sessions, h)
        before = rss_mb(pid)
        for _ in range(prints):
            await call(client, "execute_code", code=PRINT_2MB, session=h)
        after = rss_mb(pid)
        print(f"   kernel RSS {before:.0f} MB -> {after:.0f} MB (+{(after - before) / prints:.2f} MB per call)")
        held = await client.call_tool("execute_code", {"code": HELD, "session": h})
        sc = held.structured_content or {}
        if sc.get("success"):
            cells, chars = sc["result"]
            print(f"   get_ipython().history_manager.outputs holds {cells} cells, {chars:,} characters of stream text")
            await call(client, "execute_code", code="_hm.outputs.clear()\nimport gc\ngc.collect()", session=h)
            print(f"   after history_manager.outputs.clear(): kernel RSS {rss_mb(pid):.0f} MB")
        else:
            print(f"   (could not inspect history_manager under this profile: {sc.get('error')})")


async def notebook_write_grows(base: Path, blocks: int = 4, per_block: int = 300) -> None:
    print(f"\n2. x=1 in one session: latency and CPU per call as its notebook grows ({per_block} calls per row)")
    async with in_memory(make_settings(base)) as (client, sessions):
        h = (await call(client, "new_session"))["session"]
        session = sessions.sessions[h]
        for b in range(blocks):
            lat = []
            c0 = cpu_seconds()
            for _ in range(per_block):
                t0 = time.perf_counter()
                await call(client, "execute_code", code="x=1", session=h)
                lat.append((time.perf_counter() - t0) * 1000)
            cpu = (cpu_seconds() - c0) / per_block * 1000
            t0 = time.perf_counter()
            session.recorder.write_notebook()
            write = (time.perf_counter() - t0) * 1000
            print(f"   cells {b * per_block:5d}-{(b + 1) * per_block:5d}: median {percentile(lat, 50):5.2f} ms, "
                  f"p95 {percentile(lat, 95):6.2f}, p99 {percentile(lat, 99):6.2f}; CPU of this process (server+client) {cpu:5.2f} ms/call; "
                  f"one write_notebook {write:5.0f} ms")
        print("   with large outputs (2 MB prints; the journal keeps the forwarded 1 MB of each):")
        for _ in range(2):
            for _ in range(30):
                await call(client, "execute_code", code=PRINT_2MB, session=h)
            await anyio.sleep(1)
            t0 = time.perf_counter()
            session.recorder.write_notebook()
            write = (time.perf_counter() - t0) * 1000
            size = session.recorder.journal.stat().st_size / 1e6
            print(f"   journal {size:4.0f} MB: one write_notebook {write:5.0f} ms (repeated every 0.5 s while calls come in); "
                  f"server RSS {rss_mb():.0f} MB")


async def main_async() -> None:
    with short_tmp("kxr") as base:
        await kernel_retains_output(base)
        await notebook_write_grows(base)


def main() -> None:
    anyio.run(main_async, backend="asyncio")


if __name__ == "__main__":
    main()
