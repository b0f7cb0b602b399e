"""deploy/haproxy.cfg run as it ships by Debian's haproxy on 127.0.0.1, for tests/test_haproxy.py and
``python -m benchmarks --only fleet``: the config's addresses come from the environment; the replicas not given
point at closed ports (their health checks fail and they take no traffic)."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from .support import free_port, wait_for_port

CONFIG = Path(__file__).resolve().parent.parent / "deploy" / "haproxy.cfg"
HAPROXY = shutil.which("haproxy") or "/usr/sbin/haproxy"
SLOTS = 3  # the replicas deploy/haproxy.cfg names (r1..r3)


@dataclass
class Balancer:
    url: str  # the balancer's /mcp
    replicas: dict[str, str]  # server name in the config -> that replica's own /mcp
    log: Path


def have_haproxy() -> bool:
    return os.path.exists(HAPROXY)


@contextmanager
def running_haproxy(base: Path, replica_urls: list[str]) -> Iterator[Balancer]:
    if len(replica_urls) > SLOTS:
        raise ValueError(f"deploy/haproxy.cfg names {SLOTS} replicas")
    port = free_port()
    env = {"PATH": os.environ.get("PATH", ""), "KERNELEXEC_LB_BIND": f"127.0.0.1:{port}"}
    replicas = {}
    for i in range(SLOTS):
        if i < len(replica_urls):
            env[f"KERNELEXEC_REPLICA_{i + 1}"] = replica_urls[i].split("//", 1)[1].split("/", 1)[0]
            replicas[f"r{i + 1}"] = replica_urls[i]
        else:
            env[f"KERNELEXEC_REPLICA_{i + 1}"] = f"127.0.0.1:{free_port()}"
    log = base / f"haproxy-{port}.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([HAPROXY, "-db", "-f", str(CONFIG)], env=env, stdin=subprocess.DEVNULL,
                                stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_for_port(port, proc)
        yield Balancer(f"http://127.0.0.1:{port}/mcp", replicas, log)
    finally:
        proc.terminate()
        proc.wait(10)
