"""The fleet's parts for tests (issue 33), shared by tests/test_fleet.py (clients talking to replicas directly) and
tests/test_fleet_lb.py (through HAProxy): real ``kernelexec serve`` replicas on loopback ports, one real PostgreSQL
as their store, one real Jupyter Server as their gateway, one key file and one shared directory."""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from mcp import Client

from kernelexec.store import open_store

from .gateways import Gateway, start_gateway, stop_gateway
from .pg import Postgres
from .support import clean_env, free_port, wait_for_port
from .zygote import ForkedServer

LEASE_TTL = 5.0  # session/fleet.py's


@dataclass
class Replica:
    name: str
    url: str
    proc: ForkedServer
    log: Path

    def output(self) -> str:
        return self.log.read_text(errors="replace")


@dataclass
class Fleet:
    """The parts every replica shares: the store, the gateway, the key file and the shared directory."""

    base: Path
    store: str
    gateway: Gateway
    key_file: Path
    shared: Path
    replicas: list[Replica] = field(default_factory=list)

    def args(self, name: str, *extra: str, gateway: bool = True) -> list[str]:
        found = ["--state-dir", str(self.base / name), "--shared-dir", str(self.shared), "--state-key-file", str(self.key_file),
                 "--yield-after", "1", "--pool-size", "0", "--restart-spares", "0",
                 "--max-sessions", "64", *extra]  # a replica counts every session it served (20 clients' in the LB tests)
        if gateway:
            found += ["--kernel-gateway", self.gateway.url, "--kernel-gateway-token", self.gateway.token]
        return found

    def start(self, name: str, *extra: str, gateway: bool = True, port: int | None = None) -> Replica:
        """A replica started and listening (on ``port``: a restarted replica keeps its place behind a balancer)."""
        port = port or free_port()
        log = self.base / f"{name}.log"
        with log.open("ab") as out:  # forked from the zygote (tests/zygote.py): the same server, without its imports
            proc = ForkedServer(["serve", "--transport", "http", "--port", str(port), *self.args(name, *extra, gateway=gateway)],
                                env=clean_env(KERNELEXEC_STORE=self.store), stdout=out)
        replica = Replica(name, f"http://127.0.0.1:{port}/mcp", proc, log)
        self.replicas.append(replica)
        try:
            wait_for_port(port, proc, timeout=60)
        except Exception:
            raise AssertionError(f"replica {name} did not start:\n{replica.output()[-3000:]}") from None
        return replica

    def restart(self, replica: Replica) -> Replica:
        """``replica`` stopped as a deploy stops it (SIGTERM, its leases released) and started again on its port."""
        began = time.monotonic()
        replica.proc.terminate()
        replica.proc.wait(60)
        print(f"{replica.name}: exited {time.monotonic() - began:.1f} s after SIGTERM")
        self.replicas.remove(replica)
        return self.start(replica.name, port=int(replica.url.rsplit(":", 1)[1].split("/", 1)[0]))

    def stop_all(self) -> None:
        for replica in self.replicas:
            if replica.proc.poll() is None:
                with _resumed(replica):
                    replica.proc.terminate()
                try:
                    replica.proc.wait(20)
                except subprocess.TimeoutExpired:
                    replica.proc.kill()
                    replica.proc.wait(20)


@contextmanager
def _resumed(replica: Replica) -> Iterator[None]:
    replica.proc.send_signal(signal.SIGCONT)  # a stopped process would not act on its SIGTERM
    yield


@pytest.fixture(scope="module")
def gateway(short_tmp: Path) -> Iterator[Gateway]:
    found = start_gateway("jupyter_server", short_tmp)
    yield found
    stop_gateway(found)


def new_fleet(short_tmp: Path, postgres: Postgres, gateway: Any, prefix: str) -> Fleet:
    """A fleet (no replica yet) in a directory of its own (another module's fleet may share short_tmp): a key
    file (0600), a shared directory and a database of its own."""
    base = Path(tempfile.mkdtemp(prefix=prefix, dir=short_tmp))
    key_file = base / "state.key"
    key_file.write_text(os.urandom(32).hex() + "\n")
    key_file.chmod(0o600)
    shared = base / "shared"
    shared.mkdir()
    return Fleet(base, postgres.url(postgres.create_db()), gateway, key_file, shared)


@pytest.fixture(scope="module")
def fleet(short_tmp: Path, postgres: Postgres, gateway: Gateway) -> Iterator[Fleet]:
    found = new_fleet(short_tmp, postgres, gateway, "fleet")
    try:
        for name in ("a", "b", "c"):
            found.start(name)
        yield found
    finally:
        found.stop_all()


async def call(url: str, code: str, **arguments: Any) -> dict[str, Any]:
    """execute_code on the replica at ``url``, its answer followed (get_run, same replica) when it yielded."""
    async with Client(url) as client:
        result = await client.call_tool("execute_code", {"code": code, **arguments})
        while result.structured_content is not None and result.structured_content.get("ending") == "running":
            result = await client.call_tool("get_run", {"run_id": result.structured_content["run_id"], "wait_s": 30})
    assert not result.is_error, result.content
    assert result.structured_content is not None
    return result.structured_content


async def journal_sources(fleet: Fleet, handle: str) -> list[str]:
    store = await open_store(fleet.store, fleet.base)
    try:
        return [str(e.record.get("source", "")) for e in await store.journal(handle) if e.record.get("cell_type") == "code"]
    finally:
        await store.close()
