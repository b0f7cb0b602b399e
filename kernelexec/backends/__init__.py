"""Where kernels run: the backends behind ``kernel.driver.Kernel`` (local, a kernelspec's provisioner, a gateway)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from kernelexec.config import Settings

if TYPE_CHECKING:
    from kernelexec.kernel.driver import Kernel


def kernel_class(settings: Settings) -> type[Kernel]:
    """Local kernels, kernels on a remote gateway, or kernels a kernelspec's provisioner launches
    (the last two imported only when configured)."""
    if settings.kernel_spec:
        from kernelexec.backends.kernelspecs import ProvisionedKernel

        return ProvisionedKernel.for_settings(settings)
    if settings.kernel_gateway:
        from kernelexec.backends.gateway import GatewayKernel

        return GatewayKernel.for_settings(settings)  # bound to the gateway's URL and token
    from kernelexec.backends.local import LocalKernel

    return LocalKernel
