"""Claude Code hooks: ``kernelexec hook pre-tool-use``, code-only mode.

Claude Code runs a PreToolUse hook before every tool call. It writes one JSON object to the hook's
stdin (``hook_event_name``, ``tool_name``, ``tool_input``, ``session_id``, ``cwd``, ...). A hook that
exits 0 and prints nothing expresses no opinion: the call goes through Claude Code's normal
permission flow (the user's own allow/ask/deny rules and prompts). To block, it prints::

    {"hookSpecificOutput": {"hookEventName": "PreToolUse",
                            "permissionDecision": "deny",
                            "permissionDecisionReason": "..."}}

and the reason is shown to the model, so it says what to do instead.

Code-only mode lets a tool through (no decision: never ``"allow"``, which would skip the user's
permission rules) when it is a tool of the kernelexec MCP server, ``ToolSearch`` (Claude Code needs
it to load deferred MCP tool schemas) or a tool named with ``--allow``, and denies everything else.
Our server's tools are ``mcp__<server>__<tool>`` (``claude mcp add kernelexec`` or a project
``.mcp.json``; ``--server`` names another registration) and ``mcp__plugin_<plugin>_<server>__<tool>``
from the ``kernelexec`` and ``kernelexec-code-only`` plugins. It fails closed: unreadable or
malformed input, a missing field, or any error is a deny with the reason.

The ``kernelexec-code-only`` plugin runs this hook with ``--code-only`` (always on). Elsewhere, e.g.
a hook in your own settings.json, it decides only with ``--code-only`` or when ``KERNELEXEC_CODE_ONLY``
is set to something other than ``0``/``false``/``no``/``off``/empty; otherwise it prints nothing.

This runs before every tool call, so it is stdlib only: it never imports mcp, jupyter_client or
pydantic. The deny reason lists the server's tools read from ``server/tools.py``'s source (``ast``, only
when denying), so there is no second list to keep in step.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from collections.abc import Iterable, Mapping
from functools import cache
from pathlib import Path
from typing import Any, Literal

#: ``None`` is "no decision": print nothing, Claude Code's normal permission flow applies.
Decision = Literal["deny"] | None

#: Claude Code's own tools that code-only mode lets through: ToolSearch only loads tool schemas.
HARNESS_TOOLS = frozenset({"ToolSearch"})
#: The server's name in the plugins' .mcp.json (and in ``claude mcp add kernelexec``).
PLUGIN_NAME = "kernelexec"
#: The marketplace's plugins that start the server (tools ``mcp__plugin_<plugin>_kernelexec__*``).
PLUGIN_NAMES = ("kernelexec", "kernelexec-code-only")
ENV_VAR = "KERNELEXEC_CODE_ONLY"
_OFF = {"", "0", "false", "no", "off"}
_TOOL_PART = re.compile(r"[A-Za-z0-9-]+(?:_[A-Za-z0-9-]+)*")
_TOOLS_SOURCE = Path(__file__).parent / "server" / "tools.py"


def code_only_enabled(environ: Mapping[str, str] | None = None) -> bool:
    """Whether ``KERNELEXEC_CODE_ONLY`` turns code-only mode on; an unrecognised value counts as on."""
    value = (os.environ if environ is None else environ).get(ENV_VAR)
    return value is not None and value.strip().lower() not in _OFF


@cache
def server_tools(source: Path = _TOOLS_SOURCE) -> tuple[str, ...]:
    """Every tool the server can expose, read from ``register()`` in ``server/tools.py`` without importing it.

    ``register`` builds one ``tools = {"execute_code": (...), ...}`` dict and adds the preset's
    part of it; its string keys are the tool names. Empty if the source is missing or changed shape
    (tests/test_hook.py checks this against a live server's tools/list).
    """
    try:
        import ast

        from kernelexec.syntax import parse

        tree = parse(source.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef) and node.name == "register":
                for stmt in ast.walk(node):
                    target = stmt.target if isinstance(stmt, ast.AnnAssign) else (
                        stmt.targets[0] if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 else None)
                    value = getattr(stmt, "value", None)
                    if isinstance(target, ast.Name) and target.id == "tools" and isinstance(value, ast.Dict):
                        return tuple(k.value for k in value.keys if isinstance(k, ast.Constant) and isinstance(k.value, str))
    except Exception:
        pass
    return ()


def is_kernelexec_tool(name: str, servers: Iterable[str] = (PLUGIN_NAME,)) -> bool:
    """True for ``mcp__<server>__<tool>`` and ``mcp__plugin_<our plugin>_<server>__<tool>``.

    Any tool of our server counts, so tools added to the server later keep working; the tool part
    must be a plain name (letters, digits, ``-``, single ``_``), so another server whose name only
    starts like ours (``kernelexec__x``) does not.
    """
    for server in servers:
        prefixes = [f"mcp__{server}__", *(f"mcp__plugin_{plugin}_{server}__" for plugin in PLUGIN_NAMES)]
        for prefix in prefixes:
            if name.startswith(prefix) and _TOOL_PART.fullmatch(name[len(prefix):]):
                return True
    return False


def _shown(name: str) -> str:
    """The tool name for a reason: quoted and escaped, at most about 100 characters."""
    return repr(name if len(name) <= 100 else name[:100] + "...")


def _denied(why: str) -> tuple[Decision, str]:
    return "deny", f"kernelexec code-only hook: {why}; denying."


def decide(event: Any, *, servers: Iterable[str] = (PLUGIN_NAME,), allow: Iterable[str] = ()) -> tuple[Decision, str]:
    """Code-only decision for one parsed PreToolUse input: ``(None, why)`` lets it through, else a deny."""
    if not isinstance(event, dict):
        return _denied(f"expected a JSON object on stdin, got {type(event).__name__}")
    missing = [key for key in ("hook_event_name", "tool_name", "tool_input") if key not in event]
    if missing:
        return _denied(f"hook input lacks {', '.join(missing)}")
    if event["hook_event_name"] != "PreToolUse":
        return _denied(f"it handles PreToolUse only, got {_shown(str(event['hook_event_name']))}")
    name = event["tool_name"]
    if not isinstance(name, str) or not name:
        return _denied("tool_name is not a non-empty string")
    if not isinstance(event["tool_input"], dict):
        return _denied("tool_input is not an object")
    servers = tuple(servers)
    extra = set(allow)
    if is_kernelexec_tool(name, servers):
        return None, "a kernelexec tool"
    if name in HARNESS_TOOLS or name in extra:
        return None, f"{_shown(name)} is let through"
    tools = server_tools()
    listed = ", ".join(tools) if tools else "execute_code and the others the server lists"
    others = sorted(HARNESS_TOOLS | extra)
    return "deny", (
        f"kernelexec code-only mode: the tool {_shown(name)} is blocked. Allowed: the kernelexec MCP tools "
        f"({listed}), under whatever prefix Claude Code gives them, and {', '.join(_shown(t) for t in others)}. "
        "Do the work in Python with execute_code instead: read and write files with open()/pathlib, "
        "compute, and plot there."
    )


def render(decision: Decision, reason: str) -> str:
    """The hook's stdout: nothing for no decision, else one JSON object escaped by json.dumps."""
    if decision is None:
        return ""
    output = {"hookEventName": "PreToolUse", "permissionDecision": decision, "permissionDecisionReason": reason}
    return json.dumps({"hookSpecificOutput": output}, ensure_ascii=True)


# Written as-is if building the real answer fails: still a valid deny.
_FALLBACK = (
    '{"hookSpecificOutput": {"hookEventName": "PreToolUse", "permissionDecision": "deny", '
    '"permissionDecisionReason": "kernelexec code-only hook failed internally; denying."}}'
)


def pre_tool_use(raw: bytes, *, servers: Iterable[str] = (PLUGIN_NAME,), allow: Iterable[str] = ()) -> str:
    """Decide on raw stdin bytes and return what to print ("" for no decision). Never raises."""
    try:
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            return render(*_denied("stdin is not UTF-8"))
        if not text.strip():
            return render(*_denied("no input on stdin"))
        try:
            event = json.loads(text)
        except (ValueError, RecursionError) as exc:
            return render(*_denied(f"stdin is not valid JSON ({str(exc)[:200]})"))
        return render(*decide(event, servers=servers, allow=allow))
    except Exception:
        return _FALLBACK


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``hook`` subcommand's arguments (called by ``kernelexec.cli.build_parser``)."""
    parser.add_argument("event", choices=["pre-tool-use"], help="the Claude Code hook event to handle")
    parser.add_argument(
        "--code-only", action="store_true",
        help=f"enforce code-only mode even when {ENV_VAR} is unset (the kernelexec-code-only plugin passes it)",
    )
    parser.add_argument(
        "--server", dest="servers", action="append", default=None, metavar="NAME",
        help=f"the name kernelexec is registered under in Claude Code (repeatable; default: {PLUGIN_NAME})",
    )
    parser.add_argument(
        "--allow", dest="allow", action="append", default=[], metavar="TOOL",
        help="another tool to let through in code-only mode (repeatable), e.g. TodoWrite",
    )


def run(args: argparse.Namespace) -> int:
    """Handle ``kernelexec hook``: read stdin, print a deny (or nothing: no decision, or the mode is off)."""
    try:
        raw = sys.stdin.buffer.read()
    except Exception:
        raw = b""
    if not (args.code_only or code_only_enabled()):
        return 0  # mode off: no opinion, Claude Code's normal permissions apply
    try:
        out = pre_tool_use(raw, servers=args.servers or [PLUGIN_NAME], allow=args.allow)
        if out:
            sys.stdout.write(out + "\n")
            sys.stdout.flush()
    except Exception:
        # stdout unusable: exit 2 makes Claude Code block the call and show stderr to the model
        sys.stderr.write("kernelexec code-only hook could not write its decision; denying.\n")
        return 2
    return 0


__all__ = ["decide", "pre_tool_use", "run", "server_tools"]
