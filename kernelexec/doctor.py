"""Before a server starts, and for ``kernelexec doctor``: is the profile's boundary here, and what
will each profile use on this machine. Above the sandbox and the backends: it asks them, they
never ask it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from kernelexec.backends.kernelspecs import provisioner_of
from kernelexec.config import Profile, Settings
from kernelexec.environment.overlay import explain, prepare
from kernelexec.errors import InvalidRequest, KernelexecError, SandboxUnavailable
from kernelexec.host import check_reach
from kernelexec.layout import check_socket_room
from kernelexec.sandbox.plan import describe_layers, plan_for
from kernelexec.sandbox.probe import available, kernel_reach, probe
from kernelexec.terminal import safe


def preflight(settings: Settings, *, environment: bool = True) -> list[str]:
    """Check at server start that the profile's boundary exists here; return warnings to log.

    strict and standard refuse to start when neither Landlock nor bubblewrap works, unless
    ``--allow-degraded`` is given: an in-kernel guard alone would be theatre. With ``environment``,
    the kernels' Python (``--python``) must be usable too: a path that does not exist, is not Python
    or is too old raises ``EnvironmentUnusable`` naming it, and a missing ipykernel overlay is built.
    """
    profile = settings.effective_profile
    reach = kernel_reach(settings)
    check_reach(settings, reach)  # kernelexec's own state, cache and install, and your home: never within reach
    try:
        check_socket_room(settings.sessions_dir / ("x" * 16))  # a session's handle is 16 characters
    except InvalidRequest:
        raise InvalidRequest(f"the state directory {settings.state_dir} is too long for the kernels' unix socket paths "
                             "(107 bytes at most): pass a shorter --state-dir (KERNELEXEC_STATE_DIR), e.g. ~/.kernelexec "
                             "or /var/tmp/kernelexec-$USER") from None
    warnings: list[str] = []
    if environment and not (settings.kernel_spec or settings.kernel_gateway):
        env = prepare(settings.python, settings.working_dir, settings.cache_dir, reach=reach)
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
    lines += ["", "session store (--store):", *store_report(settings)]
    lines += ["", "kernel environment (--python; for --working-dir " + str(settings.working_dir or "none") + "):"]
    lines += explain(settings.python, settings.working_dir, settings.cache_dir, kernel_reach(settings))
    try:
        warnings = preflight(settings, environment=False)
        lines += ["", "status: ok" if not warnings else "status: " + "; ".join(warnings)]
    except KernelexecError as exc:
        lines += ["", f"status: REFUSED: {exc}"]
    lines += ["", *claude_code_report()]
    return safe("\n".join(lines))  # paths, kernelspec names and config text: no terminal controls


def store_report(settings: Settings) -> list[str]:
    """Which store the server would use, and whether it opens: its URL with the password redacted, and any error
    scrubbed of it (the store's own messages are)."""
    import anyio

    from kernelexec.store import StoreError, open_store, redacted
    from kernelexec.store.interface import SCHEMA_VERSION, scrubbed

    url = settings.store.get_secret_value() if settings.store is not None else None
    where = redacted(url) if url else f"sqlite:///{settings.state_dir / 'kernelexec.db'} (the default)"

    async def check() -> str:
        store = await open_store(url, settings.state_dir)
        try:
            return f"opens; schema version {SCHEMA_VERSION}"
        finally:
            await store.close()

    try:
        status = anyio.run(check)
    except StoreError as exc:
        status = f"CANNOT OPEN: {exc}"
    except Exception as exc:  # noqa: BLE001 - a report line, never a traceback with the URL in it
        status = f"CANNOT OPEN: {type(exc).__name__}: {scrubbed(str(exc), url) if url else exc}"
    return [f"  {where}", f"  {status}"]


# --- Claude Code: is kernelexec registered twice in this project? ------------------------------------------

#: The marketplace's plugins that start the kernelexec server (kept in step with kernelexec.hook.PLUGIN_NAMES).
CLAUDE_PLUGINS = ("kernelexec", "kernelexec-code-only")
_MAX_CONFIG_BYTES = 32 * 1024 * 1024


def _read_json(path: Path) -> Any:
    """A config file's JSON, or None when it is missing, unreadable, too big or not JSON. Never writes."""
    try:
        if not path.is_file() or path.stat().st_size > _MAX_CONFIG_BYTES:
            return None
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, UnicodeDecodeError, RecursionError):
        return None


def _runs_kernelexec(name: str, entry: Any) -> bool:
    """An MCP server entry that starts kernelexec: its command, or ``uvx``/``pipx run`` of it, or its name."""
    if not isinstance(entry, dict):
        return False
    args = entry.get("args")
    words = [w for w in [entry.get("command"), *(args if isinstance(args, list) else [])] if isinstance(w, str)]
    return name == "kernelexec" or any(Path(w).name == "kernelexec" for w in words)


def _servers(config: Any) -> list[str]:
    servers = config.get("mcpServers") if isinstance(config, dict) else None
    if not isinstance(servers, dict):
        return []
    return [str(name) for name, entry in servers.items() if _runs_kernelexec(str(name), entry)]


def claude_code_registrations(project: Path | None = None, home: Path | None = None) -> tuple[list[str], list[str]]:
    """Where Claude Code would start kernelexec for ``project``: (MCP server registrations, enabled plugins).

    Reads, never writes: the project's ``.mcp.json``; ``~/.claude.json`` (``claude mcp add``'s local
    scope under ``projects[<dir>]``, its user scope at the top); ``enabledPlugins`` in
    ``~/.claude/settings.json``, ``.claude/settings.json`` and ``.claude/settings.local.json`` (later
    ones override earlier). Missing or malformed files count as empty. ``--plugin-dir`` is not seen.
    """
    project = (project or Path.cwd()).resolve()
    home = home or Path(os.environ.get("HOME") or Path.home())
    registrations = [f"{name} in {project / '.mcp.json'}" for name in _servers(_read_json(project / ".mcp.json"))]
    user_config = _read_json(home / ".claude.json")
    if isinstance(user_config, dict):
        projects = user_config.get("projects")
        local = projects.get(str(project)) if isinstance(projects, dict) else None
        registrations += [f"{name} in ~/.claude.json (local scope, claude mcp add)" for name in _servers(local)]
        registrations += [f"{name} in ~/.claude.json (user scope)" for name in _servers(user_config)]
    enabled: dict[str, tuple[bool, str]] = {}
    for path, shown in ((home / ".claude" / "settings.json", "~/.claude/settings.json"),
                        (project / ".claude" / "settings.json", ".claude/settings.json"),
                        (project / ".claude" / "settings.local.json", ".claude/settings.local.json")):
        settings = _read_json(path)
        plugins = settings.get("enabledPlugins") if isinstance(settings, dict) else None
        if isinstance(plugins, dict):
            for plugin_id, on in plugins.items():
                if isinstance(plugin_id, str) and plugin_id.split("@", 1)[0] in CLAUDE_PLUGINS:
                    enabled[plugin_id] = (on is True, shown)
    plugins_on = [f"{plugin_id} ({shown})" for plugin_id, (on, shown) in enabled.items() if on]
    return registrations, plugins_on


def claude_code_report(project: Path | None = None, home: Path | None = None) -> list[str]:
    """doctor's lines on Claude Code: each registration of kernelexec, and a warning when there are two."""
    registrations, plugins = claude_code_registrations(project, home)
    lines = ["Claude Code (this project):"]
    lines += [f"  MCP server: {r}" for r in registrations] or ["  MCP server: none outside plugins"]
    lines += [f"  plugin:     {p}" for p in plugins] or ["  plugin:     none enabled"]
    if len(registrations) + len(plugins) > 1:
        lines.append(
            "  WARNING: kernelexec is configured more than once here. Claude Code then starts or shows only "
            "one of them (a plugin server that duplicates a configured one is dropped silently), so tool names "
            "change (mcp__kernelexec__execute_code vs mcp__plugin_kernelexec_kernelexec__execute_code). Keep "
            "one: remove the .mcp.json entry or `claude mcp remove kernelexec`, or `claude plugin disable "
            "<plugin>`. (Servers added with --plugin-dir are not seen here.)"
        )
    return lines
