"""Where kernels run: the backends behind ``kernel.driver.Kernel`` (local, a kernelspec's provisioner, a gateway)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING

from kernelexec.config import Settings

if TYPE_CHECKING:
    from kernelexec.kernel.driver import Kernel
    from kernelexec.kernel.launch import LaunchSpec

KernelFactory = Callable[..., "Kernel"]  # (spec: LaunchSpec, *, startup_timeout: float) -> Kernel


def kernel_factory(settings: Settings) -> KernelFactory:
    """How this server makes a session's kernel: local kernels, kernels on a remote gateway, or kernels a
    kernelspec's provisioner launches (the last two imported only when configured), bound to their settings."""
    if settings.kernel_spec:
        from kernelexec.backends.kernelspecs import ProvisionedKernel, provisioner_for_sessions

        return functools.partial(ProvisionedKernel, spec_name=settings.kernel_spec,
                                 provisioner_name=provisioner_for_sessions(settings.kernel_spec))
    if settings.kernel_gateway:
        from kernelexec.backends.gateway import GatewayKernel

        return functools.partial(GatewayKernel, url=settings.kernel_gateway, token=settings.kernel_gateway_token)
    from kernelexec.backends.local import LocalKernel

    return LocalKernel


def new_kernel(settings: Settings, spec: LaunchSpec) -> Kernel:
    """A session's kernel, not started."""
    return kernel_factory(settings)(spec, startup_timeout=settings.startup_timeout)
