"""Kernels from an installed kernelspec, launched by the provisioner that kernelspec names.

``--kernel-spec NAME`` makes every session's kernel a kernel of that spec, started through
jupyter_client's provisioner seam: the ``gateway-provisioners`` package's remote provisioners
(``kubernetes-provisioner``, ``docker-provisioner``, ``docker-swarm-provisioner``,
``yarn-provisioner``, ``distributed-provisioner`` for SSH hosts), made with their ``jupyter k8s-spec``,
``jupyter docker-spec``, ``jupyter yarn-spec`` or ``jupyter ssh-spec install`` commands, or any
other provisioner. ``ProvisionedKernel`` plugs into ``Kernel``'s seams; requests, timeouts,
interrupts and death handling are the local ones.

What differs from a local kernel, and why:

* **startup code inline** (``remote_startup``): the kernel's machine does not have our files.
* **isolation is the engine's** (its pod, container or host): our OS layers are not applied, the
  in-kernel guard is. ``layers`` says ``provisioner:<name>``.
* **restart = a new kernel.** Remote launchers report connection info for a kernel id once; a
  restart through jupyter_client reuses the id and can reconnect to the old kernel. A new manager
  gets a new id, a new pod/process and fresh connection info.
* **shutdown bounded.** jupyter_client's shutdown waits on the provisioner
  (``RemoteProvisionerBase.wait`` blocks the event loop on ``Popen.wait`` for a local launch, and
  a graceful kernel exit took ~29 s), and ``now=True`` leaves the launcher's listener process
  behind. Here: SIGTERM through the provisioner, a short wait, its ``kill`` (SIGKILL, pod delete),
  then ``shutdown_requested`` so the launcher's listener exits, under one deadline, and a local
  launch reaped in a thread. (Container provisioners call their Kubernetes/Docker clients
  synchronously; a deadline cannot cut such a call short, so liveness is polled once a second.)
* **deaths seen at once** when the launch is local: the launcher's listener answers polls for a
  few seconds after its kernel died, so the process itself is asked first.
"""

from __future__ import annotations

import contextlib
import functools
import getpass
import logging
import os
import subprocess
import time
from pathlib import Path
from typing import Any, cast

import anyio
from jupyter_client.connect import write_connection_file
from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel

from kernelexec.backends.remote_startup import install_remote_startup, remote_spill_ok
from kernelexec.errors import KernelexecError, KernelStartError
from kernelexec.kernel.channels import BoundedManager
from kernelexec.kernel.driver import Kernel
from kernelexec.kernel.launch import LaunchSpec, other_slot
from kernelexec.kernel.wire import shared_context
from kernelexec.sandbox.plan import SandboxPlan

logger = logging.getLogger(__name__)

SHUTDOWN_WAIT = 10.0  # seconds for a kernel to go: SIGTERM, then the provisioner's kill
_TERM_GRACE = 2.0  # of which SIGTERM gets this long


class KernelSpecError(KernelexecError):
    """``--kernel-spec`` names no installed kernelspec, or one that cannot be used."""


def provisioner_of(name: str) -> str:
    """The provisioner ``--kernel-spec NAME`` launches through; raises ``KernelSpecError`` with what to do."""
    try:
        spec = KernelSpecManager().get_kernel_spec(name)
    except NoSuchKernel:
        found = ", ".join(sorted(KernelSpecManager().find_kernel_specs())) or "none"
        raise KernelSpecError(
            f"--kernel-spec {name!r}: no such kernelspec (installed: {found}); make one with e.g. "
            "`jupyter k8s-spec install` or `jupyter ssh-spec install` from gateway-provisioners") from None
    if spec.language.lower() != "python":
        raise KernelSpecError(f"--kernel-spec {name!r} is a {spec.language} kernel; kernelexec runs Python")
    provisioner = spec.metadata.get("kernel_provisioner", {}).get("provisioner_name", "local-provisioner")
    from jupyter_client.provisioning import KernelProvisionerFactory

    if not KernelProvisionerFactory.instance().is_provisioner_available(spec):
        raise KernelSpecError(
            f"--kernel-spec {name!r} names the provisioner {provisioner!r}, which is not installed here "
            "(pip install gateway-provisioners, with its [k8s], [docker] or [yarn] extra as needed)")
    return provisioner


_DEAD_AFTER = 3  # consecutive "not alive" answers from a remote provisioner before a kernel is called dead


class ProvisionedManager(BoundedManager):
    """jupyter_client's manager, made robust for remote provisioners.

    * **liveness:** a locally launched kernel's process is authoritative. Otherwise the provisioner is
      asked, and gateway-provisioners' poll is a TCP connect to the launcher's listener with a 10 ms
      timeout (``GP_SOCKET_TIMEOUT``): on a busy machine one timeout reads as a death, so a kernel is
      called dead only after ``_DEAD_AFTER`` answers in a row.
    * **interrupts** are ``interrupt_request`` messages on the control channel (ipykernel then sends
      itself SIGINT), not signals relayed by that same listener.
    """

    _not_alive = 0

    async def _async_is_alive(self) -> bool:
        process = getattr(self.provisioner, "local_proc", None)
        if process is not None:
            return self.has_kernel and process.poll() is None
        if await super()._async_is_alive():
            self._not_alive = 0
            return True
        self._not_alive += 1
        return self._not_alive < _DEAD_AFTER and self.has_kernel

    is_alive = _async_is_alive  # type: ignore[assignment]  # async, as AsyncKernelManager has it

    async def _async_interrupt_kernel(self) -> None:
        if not self.has_kernel:
            return
        self._connect_control_socket()
        self.session.send(self._control_socket, self.session.msg("interrupt_request", content={}))

    interrupt_kernel = _async_interrupt_kernel  # type: ignore[assignment]  # async, as AsyncKernelManager has it


@functools.cache
def provisioner_for_sessions(name: str) -> str:
    """``provisioner_of``, looked up once per name per server process, not on every kernel start."""
    return provisioner_of(name)


class ProvisionedKernel(Kernel):
    """A session's kernel from ``--kernel-spec``, launched by the provisioner the kernelspec names."""

    # no warm spare: each restart is already a new kernel from the provisioner
    liveness_every = 1.0  # a provisioner's poll may be a remote call (Kubernetes, Docker): not 5 a second

    def __init__(self, spec: LaunchSpec, *, startup_timeout: float = 60.0, spec_name: str = "",
                 provisioner_name: str = "") -> None:
        super().__init__(spec, startup_timeout=startup_timeout)
        self.spec_name, self.provisioner_name = spec_name, provisioner_name
        if not self.spec_name:
            raise KernelStartError("ProvisionedKernel needs a kernelspec name (--kernel-spec)", "")
        guarded = spec.policy.get("profile") != "trusted"
        layer = f"provisioner:{self.provisioner_name}"
        spec.plan = SandboxPlan(layers=[layer, "guard"] if guarded else [layer])  # our OS layers do not apply

    def spill_path_ok(self, path: Any) -> bool:
        return remote_spill_ok(path, self.spec.dirs.root.name)

    # --- the seams --------------------------------------------------------------------------------
    def create_manager(self) -> ProvisionedManager:
        return ProvisionedManager(kernel_name=self.spec_name, kernel_spec_manager=KernelSpecManager(),
                                  context=shared_context())

    def start_kwargs(self) -> dict[str, Any]:
        """The launch environment: PATH and the server's ``KERNEL_*`` variables (remote provisioners read
        KERNEL_USERNAME, KERNEL_NAMESPACE, KERNEL_IMAGE, ...), nothing else of the server's. KERNEL_USERNAME
        defaults to the server's user (gateway-provisioners refuses root unless configured otherwise)."""
        env = {k: v for k, v in os.environ.items() if k.startswith("KERNEL_")}
        env.setdefault("KERNEL_USERNAME", getpass.getuser())
        env["PATH"] = os.environ.get("PATH", os.defpath)
        return {"env": env}

    async def install_startup(self) -> None:
        """Publish the connection info (for ``kernelexec lab``), then install our startup code inline."""
        km = self.km
        assert km is not None  # called by start, once the kernel answers
        with contextlib.suppress(Exception):
            info = km.get_connection_info()
            fields: dict[str, Any] = {k: v for k, v in info.items() if k != "signature_scheme"}
            write_connection_file(str(self.connection_file), **fields,
                                  signature_scheme=info.get("signature_scheme", "hmac-sha256"))
        await install_remote_startup(self)
        self.note(f"kernel {km.kernel_id} launched by {self.provisioner_name} ({self.spec_name}); "
                   "installed kernelexec's startup code")

    # --- lifecycle the remote way -------------------------------------------------------------------
    async def restart(self) -> None:
        """A new kernel (new id, new connection info) in place of the old one; the startup code runs again."""
        self.restarts += 1
        await self.shutdown()
        self.slot = other_slot(self.slot)  # a new connection file: `kernelexec lab` sees a new kernel
        await self.start()

    async def shutdown(self) -> None:
        """Stop the kernel through its provisioner within ``SHUTDOWN_WAIT`` (see the module docstring)."""
        if self.kc is not None:
            self.kc.stop_channels()
            self.kc = None
        km, self.km = self.km, None
        if km is not None:
            with anyio.CancelScope(shield=True):
                await self._stop(cast(ProvisionedManager, km))  # create_manager made it
        if self._log is not None:
            self._log.close()
            self._log = None

    async def _stop(self, km: ProvisionedManager) -> None:
        provisioner = km.provisioner
        try:
            if provisioner is not None and km.has_kernel:
                with anyio.move_on_after(SHUTDOWN_WAIT):
                    if await km.is_alive():
                        with contextlib.suppress(Exception):
                            await provisioner.terminate()
                        deadline = time.monotonic() + _TERM_GRACE
                        while time.monotonic() < deadline and await km.is_alive():
                            await anyio.sleep(0.05)
                    if await km.is_alive():
                        await provisioner.kill()
                with anyio.move_on_after(5):
                    await provisioner.shutdown_requested(restart=False)  # the launcher's listener exits
                await self._reap(provisioner)
                await provisioner.cleanup(restart=False)
        except Exception:
            logger.exception("stopping kernel %s of %s failed", km.kernel_id, self.spec_name)
        finally:
            with contextlib.suppress(Exception):
                await km._async_cleanup_resources()
            with contextlib.suppress(Exception):
                km.provisioner = None  # jupyter_client keeps it otherwise; nothing of it is needed any more
        self.note(f"stopped kernel {km.kernel_id}")

    @staticmethod
    async def _reap(provisioner: Any) -> None:
        """Collect a locally launched process (no zombie), in a thread and bounded; SIGKILL it if it lingers."""
        process: subprocess.Popen[bytes] | None = getattr(provisioner, "local_proc", None)
        if process is None:
            return
        try:
            await anyio.to_thread.run_sync(process.wait, 3.0, abandon_on_cancel=True)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(OSError):
                process.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                await anyio.to_thread.run_sync(process.wait, 3.0, abandon_on_cancel=True)

    # --- what is known about the process --------------------------------------------------------------
    def exit_code(self) -> int | None:
        process = getattr(self.km.provisioner, "local_proc", None) if self.km and self.km.provisioner else None
        return None if process is None else process.poll()

    def exit_status(self) -> str:
        if self.exit_code() is None and self.km is not None and getattr(self.km.provisioner, "local_proc", None) is None:
            return f"launched by {self.provisioner_name}: exit status not reported"
        return super().exit_status()

    def log_tail(self, limit: int = 2000) -> str:
        """Our notes, then the launcher's own log when the provisioner keeps it on this machine."""
        tail = super().log_tail(limit)
        path = getattr(self.km.provisioner, "kernel_log", None) if self.km and self.km.provisioner else None
        if isinstance(path, str) and Path(path).is_file():
            with contextlib.suppress(OSError):
                tail += "\n" + Path(path).read_bytes()[-limit:].decode(errors="replace")
        return tail[-limit:] if tail else f"(the kernel's own log is wherever {self.provisioner_name} keeps it)"
