"""The jupyter_client seam: a kernel provisioner that launches kernels inside their sandbox plan.

Registered as the ``kernelexec-sandbox`` entry point (group ``jupyter_client.kernel_provisioners``)
and named in the kernel spec that ``KernelexecSpecManager`` serves, so anything that starts a
kernel through jupyter_client — live sessions, restarts, nbclient replay — gets the same layers.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from pathlib import Path
from typing import Any

from jupyter_client.kernelspec import KernelSpec, KernelSpecManager
from jupyter_client.provisioning import LocalProvisioner
from traitlets import Dict, Unicode

from kernelexec.kernel.launch import LIFELINE_ENV, LIFELINE_WANTED, Lifeline
from kernelexec.layout import startup_file
from kernelexec.sandbox.plan import SandboxPlan

IPC_PORTS = (1, 2, 3, 4, 5)  # shell, iopub, stdin, control, heartbeat: a kernel's socket names <slot prefix>-N

KERNEL_NAME = "kernelexec"
PROVISIONER_NAME = "kernelexec-sandbox"


class SandboxProvisioner(LocalProvisioner):
    """LocalProvisioner plus the sandbox: wraps the kernel command and manages the session's cgroups."""

    plan = Dict(config=True, help="The SandboxPlan of this kernel's slot, as a dict (see kernelexec.sandbox.plan)")
    ipc_prefix = Unicode("", config=True, help="This kernel's ipc socket prefix (<session>/ipc/<slot>); empty: tcp")

    _lifeline: Lifeline | None = None  # this provisioner's running kernel's own lifeline (launch.Lifeline)

    @property
    def sandbox(self) -> SandboxPlan:
        return SandboxPlan(**self.plan)

    async def pre_launch(self, **kwargs: Any) -> dict[str, Any]:
        if self.ipc_prefix:
            _clear_ipc_dir(Path(self.ipc_prefix))
        kwargs = await super().pre_launch(**kwargs)
        sandbox = self.sandbox
        sandbox.hand_over(Path(self.parent.connection_file) if self.parent is not None else Path("/nonexistent"))
        sandbox.create_cgroups()
        env = dict(kwargs.get("env") or {})
        env["KERNELEXEC_SANDBOX"] = json.dumps(sandbox.wrapper)
        env["KERNELEXEC_KERNEL"] = json.dumps(sandbox.kernel_options)
        if env.get(LIFELINE_ENV) == LIFELINE_WANTED:  # every launch its own pipe (a restart too: pre_launch again)
            self._close_lifeline()
            self._lifeline = Lifeline()
            env[LIFELINE_ENV] = str(self._lifeline.read)
            kwargs["pass_fds"] = (*kwargs.get("pass_fds", ()), self._lifeline.read)
        kwargs["env"] = env
        kwargs["cmd"] = sandbox.wrap(kwargs["cmd"])
        return kwargs

    async def launch_kernel(self, cmd: list[str], **kwargs: Any) -> Any:
        try:
            return await super().launch_kernel(cmd, **kwargs)
        except BaseException:
            self._close_lifeline()
            raise
        finally:
            if self._lifeline is not None:
                self._lifeline.launched()

    async def cleanup(self, restart: bool = False) -> None:
        await super().cleanup(restart=restart)
        self._close_lifeline()  # the kernel is gone (cleanup follows its end): nothing waits on it
        if not restart:
            self.sandbox.remove_cgroups()

    def _close_lifeline(self) -> None:
        lifeline, self._lifeline = self._lifeline, None
        if lifeline is not None:
            lifeline.close()


def _clear_ipc_dir(prefix: Path) -> None:
    """Unlink whatever sits at this slot's socket names (``<prefix>-1`` … ``-5``, fixed by
    ``launch.kernel_manager``): a stale socket of the slot's previous kernel, or a symlink planted to
    send the server's zmq client to a host socket. Names only, never a listing or a scan: the session's
    live kernel can fill ``ipc/`` with a million entries, and this runs on the server's event loop. If
    something is put back at a name before the kernel binds it, that kernel fails to start (a restart
    is then a cold one); sockets of the session's other slot are left alone."""
    for port in IPC_PORTS:
        try:
            os.unlink(f"{prefix}-{port}")  # never follows a symlink
        except OSError:
            pass


class KernelexecSpecManager(KernelSpecManager):
    """Serves the one kernel spec a session's kernel in one slot uses: our entry point, our provisioner,
    the plan for that slot (a warm spare's has its own cgroups, so starting it never pushes the live
    kernel over its caps) and the slot's socket prefix, both passed explicitly."""

    def __init__(self, plan: SandboxPlan, *, ipc_prefix: str = "", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._plan = plan
        self._ipc_prefix = ipc_prefix

    def get_kernel_spec(self, kernel_name: str) -> KernelSpec:
        return KernelSpec(
            # -s: no user site-packages. HOME is the session's writable home, and a .pth planted in its
            # ~/.local site-packages would run in the next kernel before the startup code.
            # -S: no site at startup (kernel_main.py does its work, without sitecustomize): see setup_path there.
            argv=[self._plan.python or sys.executable, "-s", "-S", str(startup_file("kernel_main.py")), "-f", "{connection_file}"],
            display_name="Python 3 (kernelexec)",
            language="python",
            interrupt_mode="signal",
            metadata={
                "kernel_provisioner": {
                    "provisioner_name": PROVISIONER_NAME,
                    "config": {"plan": dataclasses.asdict(self._plan), "ipc_prefix": self._ipc_prefix},
                }
            },
        )

    def find_kernel_specs(self) -> dict[str, str]:
        return {KERNEL_NAME: ""}
