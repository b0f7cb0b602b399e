"""What a fleet's shape costs per call: ``execute_code("x=1")`` through HAProxy (deploy/haproxy.cfg) to a replica whose
kernel runs on a gateway, against one server with local kernels.

    python -m benchmarks --only fleet [--quick]

Four real servers on 127.0.0.1, all ``kernelexec serve --transport http`` with one session handle each (a
2026-07-28 client: the handle travels as ``Mcp-Param-Session``, which the balancer hashes on):

* one server, local kernels                      the baseline
* the same server through HAProxy               what the balancer adds
* one server, its kernel on a gateway           what the gateway's REST + WebSocket hop adds
* through HAProxy, its kernel on a gateway      the fleet's shape, one replica

Jupyter Enterprise Gateway when tests/gateways.py finds one (.ci/egw), else the Jupyter Kernel Gateway. Samples
alternate between the four, each first in turn, so drift on the machine hits them alike.

Not measured yet (rows to come with the fleet's shared store and leases, issue 33): failover time (a replica
SIGKILLed, the next call served by another) and calls/s with 1, 2 and 3 replicas. ``bench_failover`` and
``bench_replicas`` hold their place and say so in the log.
"""

from __future__ import annotations

import time
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

from mcp import Client

from benchmarks.common import call, http_server, log
from benchmarks.stats import Measurement

MS = "ms"
BASE = "fleet: x=1 one server, local kernels"


async def bench_fleet(plan: Any, base: Path, out: list[Measurement]) -> None:
    from tests.balancer import have_haproxy, running_haproxy
    from tests.gateways import enterprise_gateway_command, running_gateway

    if not have_haproxy():
        log("[fleet] skipped: no haproxy (apt-get install haproxy)")
        return
    kind = "enterprise_gateway" if enterprise_gateway_command() else "kernel_gateway"
    calls = plan.calls // 3 if not plan.quick else plan.calls
    log(f"[fleet] x=1 execute_code: local vs HAProxy vs {kind} vs both ({calls} calls each, alternating)")
    with running_gateway(kind, base) as gateway:
        async with AsyncExitStack() as stack:
            local_url, _ = await stack.enter_async_context(http_server(base / "fleet-local"))
            remote_url, _ = await stack.enter_async_context(http_server(
                base / "fleet-gw", "--kernel-gateway", gateway.url, "--kernel-gateway-token", gateway.token))
            local_lb = stack.enter_context(running_haproxy(base, [local_url]))
            remote_lb = stack.enter_context(running_haproxy(base, [remote_url]))
            rows = {BASE: local_url, "fleet: x=1 through HAProxy, local kernels": local_lb.url,
                    f"fleet: x=1 one server, kernel on {kind}": remote_url,
                    f"fleet: x=1 through HAProxy, kernel on {kind}": remote_lb.url}
            clients: dict[str, tuple[Client, str]] = {}
            for name, url in rows.items():
                client = await stack.enter_async_context(Client(url))
                clients[name] = (client, (await call(client, "new_session"))["session"])
            samples: dict[str, list[float]] = {name: [] for name in rows}
            names = list(clients)
            for i in range(plan.warmup + calls):
                for name in names[i % len(names):] + names[:i % len(names)]:  # each setup first in turn
                    client, handle = clients[name]
                    t0 = time.perf_counter()
                    r = await call(client, "execute_code", code="x=1", session=handle)
                    if i >= plan.warmup:
                        samples[name].append((time.perf_counter() - t0) * 1000)
                    assert r["success"] and r["session"] == handle, r
    for name, values in samples.items():
        out.append(Measurement(name, MS, values, baseline=None if name == BASE else BASE,
                               note="2026-07-28 client, session handle as Mcp-Param-Session" if name == BASE else ""))
    await bench_failover(plan, base, out)
    await bench_replicas(plan, base, out)


async def bench_failover(plan: Any, base: Path, out: list[Measurement]) -> None:
    """Time from a replica's SIGKILL to the next call of its session served by another replica."""
    log("[fleet] failover: not measured yet (needs the fleet's leases and shared store, issue 33)")


async def bench_replicas(plan: Any, base: Path, out: list[Measurement]) -> None:
    """calls/s of N clients through HAProxy with 1, 2 and 3 replicas (this machine's 2 cores bound it)."""
    log("[fleet] calls/s with 1-3 replicas: not measured yet (needs the fleet's shared store, issue 33)")
