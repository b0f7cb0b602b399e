"""The local backend: a kernel on this machine, launched by our jupyter_client provisioner inside the
session's sandbox plan, with a warm spare for its restarts."""

from __future__ import annotations

from typing import Any

from jupyter_client.manager import AsyncKernelManager

from kernelexec.backends.provisioner import IPC_PORTS, KERNEL_NAME, KernelexecSpecManager
from kernelexec.backends.spares import Spares
from kernelexec.kernel.channels import BoundedManager
from kernelexec.kernel.driver import Kernel
from kernelexec.kernel.launch import LaunchSpec
from kernelexec.kernel.wire import shared_context
from kernelexec.layout import SLOTS


class LocalKernel(Kernel):
    """A kernel on this machine, launched by our provisioner inside the session's sandbox plan."""

    supports_packages = True
    checkpoint_on_this_host = True  # a fork copies its checkpoint files directly (session/checkpoint_copy.py)

    def __init__(self, spec: LaunchSpec, *, startup_timeout: float = 60.0, slot: str = SLOTS[0]) -> None:
        super().__init__(spec, startup_timeout=startup_timeout, slot=slot)
        self.spares = Spares(self)

    def create_manager(self) -> AsyncKernelManager:
        return kernel_manager(self.spec, self.slot)

    def start_kwargs(self) -> dict[str, Any]:
        return self.spec.start_kwargs(self._log)

    def exit_code(self) -> int | None:
        process = getattr(self.km.provisioner, "process", None) if self.km else None
        return None if process is None else process.poll()


def kernel_manager(spec: LaunchSpec, slot: str = SLOTS[0]) -> AsyncKernelManager:
    """A kernel manager whose kernels launch through our provisioner, inside ``spec.plan``.

    Used for live sessions, restarts and warm spares (spares.py) and for notebook replay, so the
    same layers and startup code apply everywhere. ``slot`` names its connection file and sockets.
    Start it with ``start_kernel(**spec.start_kwargs(log))``.
    """
    prefix = str(spec.dirs.ipc_prefix_for(slot))
    km = BoundedManager(
        transport="ipc",
        connection_file=str(spec.dirs.connection_file_for(slot)),
        kernel_spec_manager=KernelexecSpecManager(spec.plan.for_slot(slot), ipc_prefix=prefix),
        kernel_name=KERNEL_NAME,
        context=shared_context(),
    )
    km.ip = prefix
    # Fixed socket names <prefix>-1 … -5: jupyter_client would otherwise look for free names with one
    # stat() each from 1 upwards, on the server's event loop, past anything the session's live kernel
    # has put in ipc/ (a million links of a socket cost it nothing). The provisioner unlinks exactly these.
    km.shell_port, km.iopub_port, km.stdin_port, km.control_port, km.hb_port = IPC_PORTS
    return km
