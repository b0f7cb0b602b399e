"""Real kernel gateways on 127.0.0.1 for the tests and benchmarks: a Jupyter Server, a Jupyter Kernel Gateway
and a Jupyter Enterprise Gateway, each started with a token, its kernels local to this machine.

Enterprise Gateway 3.x pins jupyter_client<7 and jupyter_server<2, which cannot share kernelexec's environment,
so it runs from its own virtual environment (``.ci/egw``, made by ``.ci/run`` from
tests/enterprise-gateway.txt, or ``KERNELEXEC_TEST_EG=/path/to/jupyter-enterprisegateway``). Its kernels are
started from a kernelspec that runs this environment's Python, so every flavour's kernels are the same ipykernel.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .support import clean_env, free_port, wait_for_port

KINDS = ("jupyter_server", "kernel_gateway", "enterprise_gateway")
RUNNING: list[Gateway] = []  # the gateways up now: a failing test's report carries their logs (tests/conftest.py)
ROOT = Path(__file__).resolve().parent.parent
EG_REQUIREMENTS = ROOT / "tests" / "enterprise-gateway.txt"
DEATH_WORDS = ("KernelRestarter", "died, removing", "Error:", "Kernel shutdown:")  # Gateway.report


@dataclass
class Gateway:
    kind: str
    url: str
    token: str
    proc: subprocess.Popen[bytes]
    log: Path

    def api(self, path: str, method: str = "GET") -> Any:
        request = urllib.request.Request(self.url + path, method=method,
                                         headers={"Authorization": f"token {self.token}"})
        with urllib.request.urlopen(request, timeout=30) as response:  # noqa: S310 - 127.0.0.1 only
            body = response.read()
        return json.loads(body) if body else None

    def log_tail(self, size: int = 6000) -> str:
        try:
            return self.log.read_bytes()[-size:].decode(errors="replace")
        except OSError as exc:
            return f"(no log: {exc})"

    def report(self, size: int = 4000) -> str:
        """For a failing test: the log's lines about kernels dying, restarted or dropped (the reason a test's kernel
        vanished, long scrolled out of the tail under load), then its tail."""
        try:
            lines = self.log.read_text(errors="replace").splitlines()
        except OSError as exc:
            return f"(no log: {exc})"
        deaths = [line for line in lines if any(word in line for word in DEATH_WORDS)][-30:]
        return "\n".join(["kernel deaths and restarts:", *deaths, "", "the log's tail:", self.log_tail(size)])

    def kernel_ids(self) -> set[str]:
        return {k["id"] for k in self.api("/api/kernels")}


def enterprise_gateway_command() -> str | None:
    """The ``jupyter-enterprisegateway`` to run: ``KERNELEXEC_TEST_EG``, else .ci/egw's, else None."""
    named = os.environ.get("KERNELEXEC_TEST_EG")
    if named:
        return named
    local = ROOT / ".ci" / "egw" / "bin" / "jupyter-enterprisegateway"
    return str(local) if local.exists() else None


def _command(kind: str, port: int, token: str, root: Path, *, strict: bool) -> list[str]:
    if kind == "jupyter_server":
        return [sys.executable, "-m", "jupyter_server", f"--ServerApp.port={port}", "--ServerApp.port_retries=0",
                f"--IdentityProvider.token={token}", "--ServerApp.ip=127.0.0.1", "--no-browser", "--allow-root",
                f"--ServerApp.root_dir={root}"]
    if kind == "kernel_gateway":
        return [sys.executable, "-m", "kernel_gateway", "--KernelGatewayApp.ip=127.0.0.1",
                f"--KernelGatewayApp.port={port}", "--KernelGatewayApp.port_retries=0",
                f"--KernelGatewayApp.auth_token={token}", "--JupyterWebsocketPersonality.list_kernels=True"]
    eg = enterprise_gateway_command()
    if eg is None:
        raise FileNotFoundError(f"no Jupyter Enterprise Gateway: python3 -m venv .ci/egw && .ci/egw/bin/pip install "
                                f"-r {EG_REQUIREMENTS.relative_to(ROOT)} (or set KERNELEXEC_TEST_EG)")
    # local kernels (no process proxy in the kernelspec). EG refuses to start kernels for root by default (the
    # KERNEL_USERNAME a request names, else its own user); tests here run as root, so unless ``strict`` only a
    # user named nobody is refused instead
    return [eg, "--EnterpriseGatewayApp.ip=127.0.0.1", f"--EnterpriseGatewayApp.port={port}",
            "--EnterpriseGatewayApp.port_retries=0", f"--EnterpriseGatewayApp.auth_token={token}",
            "--EnterpriseGatewayApp.list_kernels=True", *([] if strict else ["--EnterpriseGatewayApp.unauthorized_users=nobody"])]


PYTHON3 = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]  # this environment's ipykernel


def _kernelspecs(root: Path, specs: dict[str, list[str]]) -> Path:
    """A ``share`` directory for ``JUPYTER_PATH`` holding a kernelspec of each name running its command."""
    share = root / "share"
    for name, argv in specs.items():
        spec = share / "kernels" / name
        spec.mkdir(parents=True)
        (spec / "kernel.json").write_text(json.dumps({
            "argv": argv, "display_name": f"{name} (kernelexec tests)", "language": "python"}))
    return share


def start_gateway(kind: str, base: Path, tries: int = 3, *, strict: bool = False,
                  kernelspecs: dict[str, list[str]] | None = None, args: tuple[str, ...] = ()) -> Gateway:
    """Started on a free port; again on another if something took that port first (other tests run alongside).
    ``kernelspecs``: more kernels the gateway offers, by name (argv with ``{connection_file}``); ``args``: more of
    its command line."""
    for attempt in range(tries):
        try:
            return _start_once(kind, base, strict=strict, kernelspecs=kernelspecs or {}, args=args)
        except RuntimeError as exc:
            if "already in use" not in str(exc) or attempt == tries - 1:
                raise
    raise AssertionError("unreachable")


def _start_once(kind: str, base: Path, *, strict: bool, kernelspecs: dict[str, list[str]], args: tuple[str, ...]) -> Gateway:
    port, token = free_port(), secrets.token_hex(16)
    root = Path(tempfile.mkdtemp(prefix=kind[:2], dir=base))
    (root / "tmp").mkdir()
    # TMPDIR: the remote kernels' session directories land here and go with the test's temp dir; IPYTHONDIR: their
    # IPython profile (the history database every kernel writes at start and after each cell) is this gateway's own,
    # not shared with every other test's and the developer's (the gateways pass their kernels only PATH and the
    # variables they are told to)
    passed = "TMPDIR,IPYTHONDIR"
    env = clean_env(JUPYTER_RUNTIME_DIR=str(root / "runtime"), JUPYTER_CONFIG_DIR=str(root / "config"),
                    TMPDIR=str(root / "tmp"), IPYTHONDIR=str(root / "ipython"), KG_ENV_PROCESS_WHITELIST=passed,
                    EG_ENV_PROCESS_WHITELIST=passed)
    if kind == "enterprise_gateway":  # Enterprise Gateway's own kernelspecs have no plain python3
        kernelspecs = {"python3": PYTHON3, **kernelspecs}
        env.pop("VIRTUAL_ENV", None)
    if kernelspecs:
        env["JUPYTER_PATH"] = str(_kernelspecs(root, kernelspecs))
    cmd = [*_command(kind, port, token, root, strict=strict), *args]
    log = root / "server.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, cwd=root, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)
    gateway = Gateway(kind, f"http://127.0.0.1:{port}", token, proc, log)
    try:
        wait_for_port(port, proc, timeout=120)
        RUNNING.append(gateway)
        deadline = time.monotonic() + 60
        while True:  # listening is not serving yet
            try:
                gateway.api("/api/kernelspecs")
                return gateway
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise
                time.sleep(0.2)
    except BaseException:
        stop_gateway(gateway)
        raise RuntimeError(f"{kind} did not start:\n{log.read_text(errors='replace')[-3000:]}") from None


def stop_gateway(gateway: Gateway) -> None:
    if gateway in RUNNING:
        RUNNING.remove(gateway)
    gateway.proc.send_signal(signal.SIGTERM)  # the servers shut their kernels down on SIGTERM
    try:
        gateway.proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        gateway.proc.kill()
        gateway.proc.wait()


@contextmanager
def running_gateway(kind: str, base: Path, *, strict: bool = False, kernelspecs: dict[str, list[str]] | None = None,
                    args: tuple[str, ...] = ()) -> Iterator[Gateway]:
    """``strict``: Enterprise Gateway with its default authorization (root refused); the rest as ``start_gateway``."""
    gateway = start_gateway(kind, base, strict=strict, kernelspecs=kernelspecs, args=args)
    try:
        yield gateway
    finally:
        stop_gateway(gateway)
