"""A fleet leader's reaping (session/upkeep.py: ``reap_fleet``, every half second on the leader) when the store fails
a moment: the replica stays up and serves, as its lease keeping does (session/fleet.py). A real ``kernelexec serve``
replica on a real PostgreSQL whose ``sessions`` table is taken away for a few seconds (what a failing query looks
like to the replica, whatever the cause: a restart, a cut connection, a migration), then put back."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx2
import psycopg
import pytest

from .fleet_parts import gateway, new_fleet
from .pg import Postgres, postgres

__all__ = ["gateway", "postgres"]  # fixtures

pytestmark = [pytest.mark.slow]


def test_a_failing_idle_query_does_not_stop_the_leader(short_tmp: Path, postgres: Postgres, gateway: Any) -> None:
    fleet = new_fleet(short_tmp, postgres, gateway, "reapfault")
    try:
        replica = fleet.start("a", "--idle-timeout", "60")  # the only replica: the leader, reaping from the store
        time.sleep(3)  # it takes the lead
        with psycopg.connect(fleet.store, autocommit=True) as conn:
            conn.execute("SET lock_timeout = '10s'")
            conn.execute("ALTER TABLE sessions RENAME TO sessions_away")
            try:
                time.sleep(3)  # several reaps meanwhile, each failing in the store
                alive = replica.proc.poll() is None
            finally:
                conn.execute("ALTER TABLE sessions_away RENAME TO sessions")
        assert alive, replica.output()[-3000:]
        health = httpx2.get(replica.url.removesuffix("/mcp") + "/healthz", timeout=10)
        assert health.status_code == 200, replica.output()[-3000:]
        assert replica.proc.poll() is None, replica.output()[-3000:]
    finally:
        fleet.stop_all()
