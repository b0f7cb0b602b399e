"""What a cell cost (issue 34, point 4): each answer reports the CPU seconds of that cell alone and the kernel's
peak memory, measured in the kernel around the cell (startup/runtime.py), checked by the host (kernel/report.py)."""

from __future__ import annotations

import pytest

from kernelexec.kernel.execution import Execution
from kernelexec.kernel.report import take_reply

from .conftest import Harness

pytestmark = pytest.mark.anyio

BURN = "import time\nend = time.process_time() + 0.5\nwhile time.process_time() < end:\n    pass"
MB = 2**20


async def test_a_cells_cpu_seconds_are_its_own_and_its_peak_memory_grows_with_what_it_holds(harness: Harness) -> None:
    burnt = await harness.run(BURN)
    assert burnt["success"], burnt
    assert 0.4 <= burnt["cpu_seconds"] <= 1.5, burnt["cpu_seconds"]
    light = await harness.run("x = 1", session=burnt["session"])
    assert light["cpu_seconds"] < 0.1, light["cpu_seconds"]  # the cell alone, not the kernel's lifetime total
    base = light["peak_memory_mb"]
    assert base > 10, base  # an IPython kernel's own resident memory
    held = await harness.run(f"block = b'k' * {300 * MB}", session=burnt["session"])  # written, so resident
    # base is a high-water mark (the burn cell's), not what the kernel held just before: a little of it may have
    # been given back since, so the 300 MB block lifts the peak by a little less than 300 over it
    assert held["peak_memory_mb"] >= base + 290, (base, held["peak_memory_mb"])
    answer = await harness.call("execute_code", code="x = 2", session=burnt["session"])
    header = answer.content[0].text.splitlines()[0]  # a quick cell: no cpu=, the kernel's peak past 256 MB said
    assert " cpu=" not in header and f" peak={held['peak_memory_mb']:.0f}MB" in header, header
    again = await harness.call("execute_code", code=BURN, session=burnt["session"])
    assert " cpu=0." in again.content[0].text.splitlines()[0] or " cpu=1." in again.content[0].text.splitlines()[0]


def test_the_kernels_measure_is_kept_only_as_numbers() -> None:
    def cost(measure: object) -> Execution:
        ex = Execution(code="")
        report = {"status": "ok", "data": {"application/json": {"kind": "none", "cost": measure}}}
        take_reply({"execution_count": 1, "user_expressions": {"report": report}}, ex, lambda _: False)
        return ex

    ex = cost({"cpu_s": 0.25, "peak_rss": 123 * MB})
    assert (ex.cpu_seconds, ex.peak_memory) == (0.25, 123 * MB)
    for forged in ({"cpu_s": -1, "peak_rss": "a lot"}, {"cpu_s": float("nan"), "peak_rss": True}, {"cpu_s": 1e300}, "cheap", None):
        ex = cost(forged)
        assert (ex.cpu_seconds, ex.peak_memory) == (None, None), forged
