"""Kernels launched by a kernelspec's provisioner (``--kernel-spec``): gateway-provisioners' real
``DistributedProvisioner``, with a kernelspec made by its own ``jupyter ssh-spec install``.

Its host list is ``localhost``, which the provisioner launches without SSH but otherwise exactly as
on a remote host: through its ``launch_ipykernel.py`` launcher, which answers the provisioner's
response socket (bound to 127.0.0.1 here by ``GP_RESPONSE_IP``) with encrypted connection info and
keeps a listener for signals. The launcher itself binds the kernel's ports on all interfaces (its
code says so); only 127.0.0.1 is ever talked to.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client, StdioServerParameters

from kernelexec.backends.kernelspecs import ProvisionedKernel

from .conftest import Harness, clean_env, kernelexec_cmd, make_settings, pids_with, serving

pytestmark = pytest.mark.anyio

SPEC = "kx_ssh"


def _ssh_spec_command() -> list[str]:
    script = Path(sys.executable).with_name("jupyter-ssh-spec")
    return [str(script)] if script.exists() else [sys.executable, "-m", "gateway_provisioners.cli.ssh_specapp"]


@pytest.fixture(scope="module")
def ssh_spec(short_tmp: Path) -> Iterator[dict[str, str]]:
    """A kernelspec installed by gateway-provisioners' own installer, and the environment that finds it."""
    prefix = short_tmp / "gp"
    subprocess.run([*_ssh_spec_command(), "install", "--prefix", str(prefix), "--kernel-name", SPEC,
                    "--remote-hosts", "localhost"], check=True, capture_output=True, timeout=120)
    kernel_json = prefix / "share" / "jupyter" / "kernels" / SPEC / "kernel.json"
    spec = json.loads(kernel_json.read_text())
    assert spec["metadata"]["kernel_provisioner"]["provisioner_name"] == "distributed-provisioner"
    spec["argv"][0] = sys.executable  # the installer writes "python"; name this environment's interpreter
    kernel_json.write_text(json.dumps(spec))
    env = {"JUPYTER_PATH": str(prefix / "share" / "jupyter"), "KERNEL_USERNAME": "kernelexec",
           "GP_RESPONSE_IP": "127.0.0.1", "GP_KERNEL_LOG_DIR": str(short_tmp)}
    with pytest.MonkeyPatch.context() as mp:
        for key, value in env.items():
            mp.setenv(key, value)
        from gateway_provisioners import response_manager

        # read when the module is first imported: if it was imported before, the response socket is elsewhere
        assert response_manager.response_ip == "127.0.0.1"
        yield env


@pytest.fixture(scope="module")
async def remote(ssh_spec: dict[str, str], short_tmp: Path) -> AsyncIterator[Harness]:
    async with serving(make_settings(short_tmp, kernel_spec=SPEC)) as h:
        yield h


def kernel_of(h: Harness, session: str) -> ProvisionedKernel:
    kernel = h.sessions.sessions[session].kernel
    assert isinstance(kernel, ProvisionedKernel)
    return kernel


async def gone(kernel_id: str, timeout: float = 30) -> bool:
    with anyio.move_on_after(timeout):
        while pids_with(kernel_id):
            await anyio.sleep(0.1)
        return True
    return False


async def test_a_stateful_session_runs_in_a_provisioned_kernel(remote: Harness) -> None:
    s = await remote.new_session()
    first = await remote.run("x = 1", session=s)
    second = await remote.run("x + 1", session=s)
    assert second["result"] == 2 and second["execution_count"] == first["execution_count"] + 1
    assert second["layers"] == ["provisioner:distributed-provisioner", "guard"]
    kernel = kernel_of(remote, s)
    launched = pids_with(kernel.km.kernel_id)
    pid = (await remote.run("import os\nos.getpid()", session=s))["result"]
    assert pid in launched  # the provisioner's launcher runs the kernel, with the kernel id on its command line
    assert kernel.km.provisioner.__class__.__name__ == "DistributedProvisioner"
    r = await remote.run("import subprocess", session=s)
    assert r["error_type"] == "ImportError" and "not allowed in the 'standard' profile" in r["error"]
    r = await remote.run("import os, tempfile\n[os.getcwd(), tempfile.gettempdir()]", session=s)
    cwd, tmp = r["result"]
    assert os.path.basename(os.path.dirname(cwd)) == f"kernelexec-{s}" and os.path.basename(tmp) == "tmp"
    r = await remote.run("import matplotlib.pyplot as plt\nfig, ax = plt.subplots()\nax.plot([1, 2])\nfig", session=s)
    assert "image/png" in [o["mime_type"] for o in r["outputs"]]


async def test_a_timeout_interrupts_through_the_provisioner(remote: Harness) -> None:
    s = await remote.new_session()
    await remote.run("kept = 1", session=s)
    r = await remote.run("import time\ntime.sleep(60)", session=s, timeout=1)
    assert r["timed_out"] is True and r["ending"] == "interrupted", r  # SIGINT through the launcher's listener
    assert (await remote.run("kept + 1", session=s))["result"] == 2


async def test_restart_is_a_new_kernel_and_the_old_one_is_gone(remote: Harness) -> None:
    s = await remote.new_session()
    await remote.run("lost = 1", session=s)
    old = kernel_of(remote, s).km.kernel_id
    assert pids_with(old)
    info = await remote.call("restart_session", session=s)
    assert info.structured_content["status"] == "restarted"
    assert (await remote.run("lost", session=s))["error_type"] == "NameError"
    new = kernel_of(remote, s).km.kernel_id
    assert new != old and pids_with(new)
    assert await gone(old)  # the kernel and the launcher's listener: nothing left behind
    assert (await remote.run("import subprocess", session=s))["error_type"] == "ImportError"


async def test_a_kernel_that_dies_is_replaced_with_its_guard(remote: Harness) -> None:
    s = await remote.new_session()
    old = kernel_of(remote, s).km.kernel_id
    r = await remote.run("import os\nos._exit(3)", session=s, timeout=60)
    assert r["ending"] == "kernel_died" and "exit code 3" in r["restart_reason"], r
    assert (await remote.run("1 + 1", session=s))["result"] == 2
    assert (await remote.run("import subprocess", session=s))["error_type"] == "ImportError"
    assert await gone(old)


async def test_replay_refills_a_new_provisioned_kernel(remote: Harness) -> None:
    s = await remote.new_session()
    await remote.run("kept = 41", session=s)
    info = await remote.call("restart_session", session=s, replay=True)
    assert info.structured_content["status"] == "restarted"
    assert (await remote.run("kept + 1", session=s))["result"] == 42


async def test_closing_a_session_leaves_no_process(remote: Harness) -> None:
    s = await remote.new_session()
    await remote.run("1", session=s)
    kernel_id = kernel_of(remote, s).km.kernel_id
    await remote.call("close_session", session=s)
    assert await gone(kernel_id)


async def test_the_provisioners_refusal_is_a_clear_error(ssh_spec: dict[str, str], short_tmp: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """gateway-provisioners refuses root as KERNEL_USERNAME by default; the caller is told so, nothing hangs."""
    monkeypatch.setenv("KERNEL_USERNAME", "root")
    async with serving(make_settings(short_tmp, kernel_spec=SPEC, pool_size=0)) as h:
        result = await h.call("new_session")
        assert result.is_error and "not authorized" in result.content[0].text
        assert h.sessions.sessions == {} or all(s.kernel is None for s in h.sessions.sessions.values())


def test_a_missing_kernelspec_is_refused_at_start(ssh_spec: dict[str, str], short_tmp: Path) -> None:
    run = subprocess.run(kernelexec_cmd("serve", "--state-dir", str(short_tmp / "nospec"), "--kernel-spec", "nope"),
                         env=clean_env(**ssh_spec), capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert run.returncode != 0
    assert "--kernel-spec 'nope': no such kernelspec" in run.stderr and SPEC in run.stderr
    doctor = subprocess.run(kernelexec_cmd("doctor", "--kernel-spec", SPEC), env=clean_env(**ssh_spec),
                            capture_output=True, text=True, timeout=60)
    assert "launched by distributed-provisioner" in doctor.stdout
    both = subprocess.run(kernelexec_cmd("serve", "--kernel-spec", SPEC, "--kernel-gateway", "http://127.0.0.1:1"),
                          env=clean_env(**ssh_spec), capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert both.returncode != 0 and "give one" in both.stderr


async def test_over_stdio(ssh_spec: dict[str, str], short_tmp: Path) -> None:
    cmd = kernelexec_cmd("serve", "--state-dir", str(short_tmp / "stdio-prov"), "--kernel-spec", SPEC)
    params = StdioServerParameters(command=cmd[0], args=cmd[1:], env=clean_env(**ssh_spec))
    async with Client(params) as client:
        r: Any = await client.call_tool("execute_code", {"code": "y = 20"})
        assert r.structured_content["success"], r.content
        r = await client.call_tool("execute_code", {"code": "y + 1"})
        assert r.structured_content["result"] == 21, r.content
        assert r.structured_content["layers"] == ["provisioner:distributed-provisioner", "guard"]
