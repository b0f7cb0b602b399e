"""Before a server starts, and for ``kernelexec doctor``: is the profile's boundary here, and what
will each profile use on this machine. Above the sandbox and the backends: it asks them, they
never ask it.
"""

from __future__ import annotations

from .config import Profile, Settings
from .environments import explain, prepare
from .errors import KernelexecError, SandboxUnavailable
from .provisioned import provisioner_of
from .sandbox import available, describe_layers, plan_for, probe
from .terminal import safe


def preflight(settings: Settings, *, environment: bool = True) -> list[str]:
    """Check at server start that the profile's boundary exists here; return warnings to log.

    strict and standard refuse to start when neither Landlock nor bubblewrap works, unless
    ``--allow-degraded`` is given: an in-kernel guard alone would be theatre. With ``environment``,
    the kernels' Python (``--python``) must be usable too: a path that does not exist, is not Python
    or is too old raises ``EnvironmentUnusable`` naming it, and a missing ipykernel overlay is built.
    """
    profile = settings.effective_profile
    warnings: list[str] = []
    if environment and not (settings.kernel_spec or settings.kernel_gateway):
        env = prepare(settings.python, settings.working_dir, settings.cache_dir)
        if not env.own:
            warnings.append(f"kernels run in {env.describe()}: {env.reason}")
    return warnings + _boundary(settings, profile)


def _boundary(settings: Settings, profile: Profile) -> list[str]:
    if settings.kernel_spec:
        provisioner = provisioner_of(settings.kernel_spec)  # raises KernelSpecError with what to do
        return [f"kernels are launched by {provisioner} (kernelspec {settings.kernel_spec}): the engine it launches "
                "on provides the isolation; only the in-kernel guard is ours there"]
    if settings.kernel_gateway:
        return [f"kernels run on the gateway {settings.kernel_gateway}: its machine provides the isolation; "
                "only the in-kernel guard is ours there"]
    if settings.sandbox == "off":
        return ["the OS sandbox is off (--sandbox off): only the in-kernel guard applies, which is not a boundary"]
    f = available(settings)
    if profile != "trusted" and not (f.landlock_abi or f.bwrap):
        message = (f"the {profile} profile needs Landlock or bubblewrap to confine kernels, and this machine has neither "
                   "(see `kernelexec doctor`)")
        if not settings.allow_degraded:
            raise SandboxUnavailable(message + "; install bubblewrap, or pass --allow-degraded to run with the in-kernel guard only")
        return [f"DEGRADED: {message}; running anyway because of --allow-degraded"]
    plan = plan_for(settings, profile, session_dir=settings.sessions_dir, rw=[], ro=[], cwd=settings.sessions_dir, key="preflight")
    return [f"degraded: {d}" for d in plan.degraded]


def report(settings: Settings) -> str:
    """``kernelexec doctor``: what this machine supports and what each profile will use."""
    f = probe()
    lines = ["kernelexec doctor", "", "machine:"]
    lines += [f"  {name:<36} {value}" for name, value in f.as_rows()]
    lines += ["", "layers per profile (as configured):"]
    for profile in ("strict", "standard", "trusted"):
        plan = plan_for(settings, profile, session_dir=settings.sessions_dir, rw=[], ro=[], cwd=settings.sessions_dir, key="doctor")
        marker = " (selected)" if profile == settings.effective_profile else ""
        lines.append(f"  {profile:<9}{marker:<11} {describe_layers(plan.layers)}")
        lines += [f"  {'':<20} missing: {d}" for d in plan.degraded]
    lines += ["", "kernel environment (--python; for --working-dir " + str(settings.working_dir or "none") + "):"]
    lines += explain(settings.python, settings.working_dir, settings.cache_dir)
    try:
        warnings = preflight(settings, environment=False)
        lines += ["", "status: ok" if not warnings else "status: " + "; ".join(warnings)]
    except KernelexecError as exc:
        lines += ["", f"status: REFUSED: {exc}"]
    return safe("\n".join(lines))  # paths, kernelspec names and config text: no terminal controls
