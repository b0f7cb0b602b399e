"""A fleet failover that restores from a checkpoint (issues 32 and 33): the session's gateway kernel dies
(``os._exit`` in a cell) and the replica that drove it is SIGKILLed; the next call, on another replica, finds the
variables loaded from the kernel's checkpoint (the answer's "restored … from the checkpoint"), not rerun. Two real
``kernelexec serve`` replicas on one real PostgreSQL and one real Jupyter Server gateway (tests/fleet_parts.py).
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from .fleet_parts import Fleet, call, gateway, new_fleet
from .pg import Postgres, postgres

__all__ = ["gateway", "postgres"]  # fixtures

pytestmark = [pytest.mark.anyio, pytest.mark.slow]


@pytest.fixture(scope="module")
def fleet(short_tmp: Path, postgres: Postgres, gateway: Any) -> Iterator[Fleet]:
    found = new_fleet(short_tmp, postgres, gateway, "restore")
    try:
        yield found
    finally:
        found.stop_all()


async def test_a_dead_kernel_and_its_sigkilled_replica_then_another_replica_loads_the_checkpoint(fleet: Fleet) -> None:
    victim, survivor = fleet.start("victim"), fleet.start("survivor")
    handle = (await call(victim.url, "rows = [{'k': i} for i in range(1000)]\nlabel = 'before'"))["session"]
    taken = await call(survivor.url, "rows.append({'k': 1000})", session=handle)  # an in-place change: saved too
    assert taken.get("restored") is None and not taken.get("restart_reason"), taken  # a live kernel's takeover: no refill
    status = (await call(victim.url, "_kernelexec_checkpoint_status()._repr_json_()", session=handle))["result"]
    assert {"rows", "label"} <= set(status["saved"]), status  # the background save of the last cell is done
    dead = await call(victim.url, "import os\nos._exit(3)", session=handle)
    assert dead["ending"] == "kernel_died", dead
    victim.proc.send_signal(signal.SIGKILL)
    victim.proc.wait(10)
    after = await call(survivor.url, "(len(rows), rows[-1], label)", session=handle)
    said = {k: after.get(k) for k in ("result", "ending", "error_type", "error", "restart_reason", "restored", "stderr")}
    assert after["result"] == [1001, {"k": 1000}, "before"], (said, survivor.output()[-3000:], victim.output()[-2000:])
    restored = after.get("restored") or {}
    assert {"rows", "label"} <= set(restored.get("restored", [])) and restored.get("reran") == [], after
    reason = after.get("restart_reason") or ""
    assert "restored" in reason and "from the checkpoint" in reason, reason
