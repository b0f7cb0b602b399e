"""Code mode's configuration: which MCP servers a cell may call through the broker (broker.py).

``--tools-config FILE`` is a JSON file in the ``mcpServers`` shape Claude Desktop and ``.mcp.json`` use:
a stdio server has ``command``/``args``/``env`` (and optionally ``cwd``), an HTTP one ``"type": "http"`` with
``url``/``headers``. ``--tools-config auto`` reads the project's ``.mcp.json`` (the working directory, or the
project root above it) and the user's Claude Code configuration (``~/.claude.json``: its top-level
``mcpServers`` and the project's entry), read-only; kernelexec's own entries are skipped.

A tools config starts commands on the host, so it is read only from a file no kernel can write (host.py's
rule): ``KernelReach.writes`` decides, counting the protected names bubblewrap binds read-only. A file a
kernel could have changed is refused with one line naming it.
"""

from __future__ import annotations

import fnmatch
import json
import logging
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

from kernelexec.errors import KernelexecError
from kernelexec.host import KernelReach, inside
from kernelexec.terminal import safe

logger = logging.getLogger(__name__)

MAX_CONFIG_BYTES = 1_000_000
RESERVED = frozenset({"list", "gather", "ToolError", "ToolRefused", "MARK", "PROMPT", "annotations"})  # mcp_tools' own names


class ToolsConfigError(KernelexecError):
    """A tools config that cannot be used: unreadable, malformed, or writable by a kernel."""


@dataclass(frozen=True)
class Upstream:
    """One configured MCP server the broker may connect to."""

    name: str  # as configured
    kind: Literal["stdio", "http"]
    source: str  # the file it came from
    command: str = ""
    args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    cwd: str | None = None
    url: str = ""
    headers: dict[str, str] = field(default_factory=dict)

    def secrets(self) -> list[str]:
        """This server's secrets, longest first: header and env values (of at least 4 characters), and the URL's
        credentials and query string, which may carry an API key."""
        found = [v for v in (*self.headers.values(), *self.env.values()) if len(v) >= 4]
        if self.url:
            parts = urlsplit(self.url)
            if parts.query or parts.username or parts.password:
                found.append(self.url)
                found.extend(s for s in (parts.query, parts.password or "", parts.username or "") if len(s) >= 4)
        return sorted(set(found), key=len, reverse=True)

    def scrub(self, value: Any) -> Any:
        """``value`` without this server's secrets (each ``***``): a string, or a structured value (dicts, keys
        included, lists, tuples) scrubbed all the way down; anything else as it is. The one scrub for what an
        upstream sends back (broker.Connection.request: results, errors, connect failures): it reaches the kernel,
        the answer, the log and the notebook record."""
        secrets = self.secrets()
        return _scrubbed(value, secrets) if secrets else value

    @property
    def attr(self) -> str:
        """Its name in the kernel: ``mcp_tools.<attr>`` (``_`` added to a name the module itself uses)."""
        return server_attr(self.name)


def _scrubbed(value: Any, secrets: list[str], depth: int = 0) -> Any:
    if isinstance(value, str):
        for secret in secrets:
            if secret in value:
                value = value.replace(secret, "***")
        return value
    if depth > 200:  # deeper than any JSON an SDK parses: nothing of it passes
        return "***"
    if isinstance(value, dict):
        return {_scrubbed(k, secrets, depth + 1): _scrubbed(v, secrets, depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_scrubbed(v, secrets, depth + 1) for v in value]
    return value


def python_name(name: str) -> str:
    """A configured server's or a tool's name as a Python identifier (``my-server`` -> ``my_server``)."""
    text = re.sub(r"\W", "_", name)
    if not text or text[0].isdigit():
        text = "_" + text
    return text if not text.startswith("__") else "x" + text


def server_attr(name: str) -> str:
    """A configured server's attribute of ``mcp_tools`` (``_`` added to a name the module itself uses)."""
    attr = python_name(name)
    return attr + "_" if attr in RESERVED else attr


def _strings(value: Any, what: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ToolsConfigError(f"{what} must be a list of strings")
    return tuple(value)


def _mapping(value: Any, what: str) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise ToolsConfigError(f"{what} must be an object of strings")
    return dict(value)


def is_kernelexec(name: str, entry: dict[str, Any]) -> bool:
    """An entry that starts kernelexec itself: never connected to (a server calling itself)."""
    words = [str(entry.get("command", "")), *(str(a) for a in entry.get("args") or [] if isinstance(a, str))]
    return name == "kernelexec" or any(Path(w).name == "kernelexec" for w in words)


def parse_servers(data: Any, source: str) -> list[Upstream]:
    """The ``mcpServers`` object of one config file, checked; kernelexec's own entries skipped."""
    if not isinstance(data, dict):
        raise ToolsConfigError(f"{source}: mcpServers must be an object")
    found: list[Upstream] = []
    for name, entry in data.items():
        where = f"{source}: server {name!r}"
        if not isinstance(entry, dict):
            raise ToolsConfigError(f"{where} must be an object")
        if is_kernelexec(name, entry):
            continue
        kind = entry.get("type", "http" if "url" in entry else "stdio")
        if kind in ("http", "streamable-http", "streamable_http"):
            url = entry.get("url")
            if not isinstance(url, str) or not url.startswith(("http://", "https://")):
                raise ToolsConfigError(f"{where}: url must be an http(s) URL")
            found.append(Upstream(name, "http", source, url=url, headers=_mapping(entry.get("headers"), f"{where}: headers")))
        elif kind == "stdio":
            command = entry.get("command")
            if not isinstance(command, str) or not command:
                raise ToolsConfigError(f"{where}: command must be a non-empty string")
            cwd = entry.get("cwd")
            if cwd is not None and not isinstance(cwd, str):
                raise ToolsConfigError(f"{where}: cwd must be a string")
            found.append(Upstream(name, "stdio", source, command=command, args=_strings(entry.get("args"), f"{where}: args"),
                                  env=_mapping(entry.get("env"), f"{where}: env"), cwd=cwd))
        else:
            raise ToolsConfigError(f"{where}: type {str(kind)[:40]!r} is not supported (stdio or http)")
    return found


def in_kernel_reach(path: str | os.PathLike[str], reach: KernelReach) -> bool:
    """A tools config starts commands on this host, so no file under a work root or a session directory is
    trusted, protected name or not: bubblewrap keeps ``.mcp.json`` read-only only where it existed when a
    kernel started, and a kernel that ran before it existed may have made it (nothing tells who did)."""
    return reach.writes(path) or inside(path, reach.write_roots)


def _refusal(path: Path) -> ToolsConfigError:
    return ToolsConfigError(
        f"refusing the tools config {path}: a kernel could have written it (it lies in a directory kernels may "
        "write: a work root or a session directory); it would start commands on this host. Copy it out of the "
        "work roots (e.g. ~/.config/kernelexec/tools.json), or add the servers with `claude mcp add` for auto")


def _read_json(path: Path, reach: KernelReach) -> Any:
    if in_kernel_reach(path, reach):
        raise _refusal(path)
    try:
        fd = os.open(path, os.O_RDONLY)
        opened = os.path.realpath(f"/proc/self/fd/{fd}")
        if in_kernel_reach(opened, reach):  # swapped under us between the check and the open
            os.close(fd)
            raise _refusal(path)
        with os.fdopen(fd, "rb") as fh:
            raw = fh.read(MAX_CONFIG_BYTES + 1)
    except OSError as exc:
        raise ToolsConfigError(f"cannot read the tools config {path}: {exc.strerror or exc}") from None
    if len(raw) > MAX_CONFIG_BYTES:
        raise ToolsConfigError(f"the tools config {path} is over {MAX_CONFIG_BYTES:,} bytes")
    try:
        return json.loads(raw)
    except ValueError as exc:
        raise ToolsConfigError(f"the tools config {path} is not JSON: {exc}") from None


def project_root(start: Path) -> Path:
    """The nearest directory at or above ``start`` with pyproject.toml, setup.py, .git or .mcp.json; else ``start``."""
    for folder in (start, *start.parents):
        if any((folder / marker).exists() for marker in ("pyproject.toml", "setup.py", ".git", ".mcp.json")):
            return folder
    return start


def load(spec: str, *, reach: KernelReach, working_dir: Path | None = None, home: Path | None = None) -> list[Upstream]:
    """The upstream servers ``--tools-config`` names (a file, or ``auto``). Raises ToolsConfigError."""
    if spec != "auto":
        path = Path(spec).expanduser()
        data = _read_json(path, reach)
        servers = data.get("mcpServers") if isinstance(data, dict) else None
        if servers is None:
            raise ToolsConfigError(f"the tools config {path} has no mcpServers object")
        return parse_servers(servers, str(path))
    found: dict[str, Upstream] = {}
    start = (working_dir or Path.cwd()).resolve()
    project = project_root(start) / ".mcp.json"
    if project.is_file() and in_kernel_reach(project, reach):
        # a project's .mcp.json in a work root may be a kernel's: not used (not fatal either, so a cell cannot
        # stop the next server from starting by planting one); ~/.claude.json's entries for it still are
        logger.warning("--tools-config auto: not using %s (kernels can write there); `claude mcp add` its servers, or "
                       "pass --tools-config a file outside the work roots", safe(str(project)))
    elif project.is_file():
        data = _read_json(project, reach)
        for up in parse_servers(data.get("mcpServers", {}) if isinstance(data, dict) else {}, str(project)):
            found.setdefault(up.name, up)
    user = (home or Path(os.path.expanduser("~"))) / ".claude.json"
    if user.is_file():
        data = _read_json(user, reach)
        if isinstance(data, dict):
            projects = data.get("projects")
            entry = projects.get(str(project.parent)) if isinstance(projects, dict) else None
            for servers in (entry.get("mcpServers") if isinstance(entry, dict) else None, data.get("mcpServers")):
                if servers:
                    for up in parse_servers(servers, str(user)):
                        found.setdefault(up.name, up)
    return list(found.values())


def matches(patterns: list[str], server: str, tool: str) -> str | None:
    """The first glob in ``patterns`` matching ``server.tool`` (either the configured or the Python name), else None."""
    for pattern in patterns:
        for candidate in (f"{server}.{tool}", f"{python_name(server)}.{python_name(tool)}"):
            if fnmatch.fnmatchcase(candidate, pattern):
                return pattern
    return None
