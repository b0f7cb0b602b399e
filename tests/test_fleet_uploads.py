"""A fleet's upload budgets are the fleet's (issue 33): counted in the store (``Store.reserve``), not per replica.
Two real ``kernelexec serve`` replicas on one real PostgreSQL and one real Jupyter Server gateway, PUTs straight to
each replica (server/uploads.py).

What it shows (attacker-style: a token trying to pass its budgets by spreading its calls over the replicas):
URLs minted at once through both replicas never pass ``--max-upload-urls-per-token`` together; a body being
received on one replica counts against ``--max-upload-spool-mb`` on the other; and a SIGKILLed replica's body stops
counting once its lease ran out (its reservation is not leaked).
"""

from __future__ import annotations

import signal
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from mcp import Client

from .fleet_parts import LEASE_TTL, Fleet, call, gateway, new_fleet
from .pg import Postgres, postgres

__all__ = ["gateway", "postgres"]  # fixtures

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

URLS = 3  # --max-upload-urls-per-token
SPOOL = 1024 * 1024  # --max-upload-spool-mb 1
BODY = 700 * 1024  # two of these at once pass the spool budget; one fits
PUT = {"Content-Type": "application/octet-stream"}


@pytest.fixture(scope="module")
def fleet(short_tmp: Path, postgres: Postgres, gateway: Any) -> Iterator[Fleet]:
    found = new_fleet(short_tmp, postgres, gateway, "uploads")
    try:
        for name in ("a", "b"):
            found.start(name, "--max-upload-urls-per-token", str(URLS), "--max-upload-spool-mb", "1", "--yield-after", "5")
        yield found
    finally:
        found.stop_all()


async def mint(url: str, handle: str, name: str, expires_s: int = 600) -> str | None:
    """An upload URL minted on the replica at ``url`` (its own origin), or None when the budget refused it."""
    async with Client(url) as client:
        granted = await client.call_tool("upload_url", {"filename": name, "session": handle, "expires_s": expires_s})
    if granted.is_error:
        said = "".join(getattr(c, "text", "") for c in granted.content)
        assert "--max-upload-urls-per-token" in said, said
        return None
    assert granted.structured_content is not None
    return str(granted.structured_content["uploadUrl"])


async def test_urls_minted_at_once_through_two_replicas_never_pass_the_tokens_budget(fleet: Fleet) -> None:
    a, b = fleet.replicas[:2]
    handle = (await call(a.url, "1"))["session"]
    minted: list[str | None] = []

    async def one(url: str, n: int) -> None:
        minted.append(await mint(url, handle, f"f{n}.txt", expires_s=30))

    async with anyio.create_task_group() as tg:
        for n in range(8):
            tg.start_soon(one, (a.url, b.url)[n % 2], n)
    granted = [u for u in minted if u is not None]
    assert len(granted) == URLS, minted  # per replica it was URLS each: 2 * URLS
    async with httpx2.AsyncClient(timeout=60) as http:  # a used URL gives its place back, on any replica
        assert (await http.put(granted[0], content=b"x", headers=PUT)).status_code == 201
    assert await mint(b.url, handle, "after.txt", expires_s=30) is not None
    assert await mint(a.url, handle, "over.txt", expires_s=30) is None


async def test_a_body_on_one_replica_counts_on_the_other_and_a_killed_replicas_is_freed(fleet: Fleet) -> None:
    await anyio.sleep(31)  # the first test's URLs expired: the token's URL budget is free again
    victim = fleet.start("victim", "--max-upload-urls-per-token", str(URLS), "--max-upload-spool-mb", "1")
    other = fleet.replicas[1]
    handle = (await call(other.url, "1"))["session"]
    slow_url, fast_url = await mint(victim.url, handle, "slow.bin"), await mint(other.url, handle, "fast.bin")
    assert slow_url is not None and fast_url is not None
    started = anyio.Event()

    async def trickle() -> AsyncIterator[bytes]:
        yield b"s" * 1024
        started.set()
        await anyio.sleep(3600)  # never finishes: its replica is killed meanwhile

    async def slow_put() -> None:
        async with httpx2.AsyncClient(timeout=None) as http:
            try:
                await http.put(slow_url, content=trickle(), headers={**PUT, "Content-Length": str(BODY)})
            except httpx2.HTTPError:
                pass  # its replica died

    async with anyio.create_task_group() as tg:
        tg.start_soon(slow_put)
        await started.wait()
        await anyio.sleep(1)  # the victim reserved the body's length
        async with httpx2.AsyncClient(timeout=60) as http:
            refused = await http.put(fast_url, content=b"f" * BODY, headers=PUT)
            assert refused.status_code == 503 and "--max-upload-spool-mb" in refused.text, refused.text
            victim.proc.send_signal(signal.SIGKILL)
            victim.proc.wait(10)
            killed = time.monotonic()
            again = await mint(other.url, handle, "fast2.bin")
            assert again is not None
            with anyio.fail_after(LEASE_TTL + 15):
                while (landed := await http.put(again, content=b"f" * BODY, headers=PUT)).status_code == 503:
                    again = await mint(other.url, handle, "fast2.bin")
                    assert again is not None
                    await anyio.sleep(0.5)
            assert landed.status_code == 201, landed.text
            print(f"the killed replica's body stopped counting {time.monotonic() - killed:.1f} s after its SIGKILL")
        tg.cancel_scope.cancel()
