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

Then a real fleet (PostgreSQL, a Jupyter Server gateway, three replicas behind HAProxy): the failover time (the
replica a session is hashed to SIGKILLed, time to that session's next answered call) and calls/s of 12 clients with
1, 2 and 3 replicas (on a 2-core machine the replicas, the gateway, its kernels, PostgreSQL and the clients share
two cores: more replicas cannot add throughput there; the rows show what the fleet's shape costs or keeps).
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, ExitStack, asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

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


@asynccontextmanager
async def fleet_of(base: Path, names: tuple[str, ...]) -> AsyncIterator[Any]:
    """Replicas sharing one PostgreSQL, one Jupyter Server gateway, one key file and one shared directory
    (tests/fleet_parts.py's Fleet, as tests/test_fleet_lb.py runs it)."""
    from tests.fleet_parts import Fleet
    from tests.gateways import running_gateway
    from tests.pg import running_postgres

    root = base / f"fleet-{'-'.join(names)}"
    root.mkdir()
    key_file = root / "state.key"
    key_file.write_text(os.urandom(32).hex() + "\n")
    key_file.chmod(0o600)
    (root / "shared").mkdir()
    with running_postgres() as pg, running_gateway("jupyter_server", root) as gateway:
        fleet = Fleet(root, pg.url(pg.create_db()), gateway, key_file, root / "shared")
        try:
            for name in names:
                await anyio.to_thread.run_sync(fleet.start, name)
            yield fleet
        finally:
            await anyio.to_thread.run_sync(fleet.stop_all)


def _lb_client(url: str, served: list[str]) -> Client:
    async def seen(response: httpx2.Response) -> None:
        served.append(response.headers.get("x-kernelexec-replica", ""))
    http = httpx2.AsyncClient(timeout=120, event_hooks={"response": [seen]})
    return Client(streamable_http_client(url, http_client=http))


async def bench_failover(plan: Any, base: Path, out: list[Measurement]) -> None:
    """Time from the SIGKILL of the replica a session's calls are hashed to, to the next call of that session answered
    through HAProxy (by another replica: the balancer redispatches, the lease is free or runs out, the kernel is
    attached)."""
    from tests.balancer import running_haproxy

    rounds = 3 if plan.quick else 6
    log(f"[fleet] failover: SIGKILL the replica serving a session, time to its next answered call ({rounds} rounds)")
    samples: list[float] = []
    async with fleet_of(base, ("fa", "fb", "fc")) as fleet:
        with running_haproxy(base, [r.url for r in fleet.replicas]) as lb:
            served: list[str] = []
            async with _lb_client(lb.url, served) as client:
                await client.list_tools()
                handle = (await call(client, "execute_code", code="k = 0"))["session"]
                for i in range(rounds):
                    for _ in range(3):
                        await call(client, "execute_code", code="k += 1", session=handle)
                    victim = next(r for r in fleet.replicas if r.url == lb.replicas[served[-1]] and r.proc.poll() is None)
                    victim.proc.send_signal(signal.SIGKILL)
                    victim.proc.wait(10)
                    t0 = time.perf_counter()
                    r = await call(client, "execute_code", code="k", session=handle)
                    samples.append((time.perf_counter() - t0) * 1000)
                    assert r["result"] == 3 * (i + 1), r
                    fleet.replicas.remove(victim)
                    port = int(victim.url.rsplit(":", 1)[1].split("/", 1)[0])
                    await anyio.to_thread.run_sync(partial(fleet.start, victim.name, port=port))
                    await anyio.sleep(3)  # back up in the balancer's health check
    out.append(Measurement("fleet: failover, SIGKILL to next answered call", MS, samples,
                           note="3 replicas behind HAProxy, killed between calls (no lease to wait out)"))


async def bench_replicas(plan: Any, base: Path, out: list[Measurement]) -> None:
    """calls/s of 12 clients (each its own session, Mcp-Param-Session hashed) through HAProxy with 1, 2 and 3 replicas
    of one fleet: one throughput sample per round, rounds alternating between the three."""
    from tests.balancer import running_haproxy

    clients, calls, rounds = 12, (10 if plan.quick else 25), (2 if plan.quick else 3)
    log(f"[fleet] calls/s: {clients} clients x {calls} calls through HAProxy, 1 vs 2 vs 3 replicas ({rounds} rounds)")
    samples: dict[int, list[float]] = {1: [], 2: [], 3: []}
    async with fleet_of(base, ("ra", "rb", "rc")) as fleet:
        with ExitStack() as stack:
            lbs = {n: stack.enter_context(running_haproxy(base, [r.url for r in fleet.replicas[:n]])) for n in samples}
            await anyio.sleep(3)  # the balancers' first health checks
            for _ in range(rounds):
                for n, lb in lbs.items():
                    served: list[str] = []

                    async def one_client(url: str = lb.url, served: list[str] = served) -> None:
                        async with _lb_client(url, served) as client:
                            await client.list_tools()
                            handle = (await call(client, "execute_code", code="c = 0"))["session"]
                            for i in range(calls):
                                r = await call(client, "execute_code", code="c += 1\nc", session=handle)
                                while r.get("ending") == "running":  # yielded (--yield-after 1) under load: collected
                                    r = await call(client, "get_run", run_id=r["run_id"], wait_s=30)
                                assert r["result"] == i + 1, r

                    t0 = time.perf_counter()
                    try:
                        async with anyio.create_task_group() as tg:
                            for _ in range(clients):
                                tg.start_soon(one_client)
                                await anyio.sleep(0.1)  # connections opened in turn, as clients arrive
                    except Exception as exc:  # noqa: BLE001 - reported, not hidden: the row stays empty
                        log(f"[fleet] calls/s with {n} replica(s): a client failed ({exc!r}); no sample this round")
                        continue
                    samples[n].append(clients * (calls + 1) / (time.perf_counter() - t0))
    base_row = "fleet: calls/s through HAProxy, 1 replica"
    for n, values in samples.items():
        if not values:
            continue
        name = base_row if n == 1 else f"fleet: calls/s through HAProxy, {n} replicas"
        out.append(Measurement(name, "calls/s", values, baseline=None if n == 1 else base_row,
                               note=f"{clients} clients, own sessions, kernels on one Jupyter Server" if n == 1 else ""))
