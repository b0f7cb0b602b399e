"""Claude Code hooks: ``kernelexec hook pre-tool-use``, the plugin's opt-in "code only" mode.

Claude Code runs a PreToolUse hook before every tool call. It writes one JSON object to the hook's
stdin (``hook_event_name``, ``tool_name``, ``tool_input``, ``session_id``, ``cwd``, ...) and reads the
decision from stdout when the hook exits 0::

    {"hookSpecificOutput": {"hookEventName": "PreToolUse",
                            "permissionDecision": "allow" | "deny",
                            "permissionDecisionReason": "..."}}

A deny reason is shown to the model, so it says what to do instead.

Code-only mode is opt-in. The plugin's ``hooks/hooks.json`` always registers this hook, but it
decides only when ``KERNELEXEC_CODE_ONLY`` is set to something other than ``0``/``false``/``no``/
``off``/empty (or when ``--code-only`` is given); otherwise it prints nothing and Claude Code's own
permission rules apply, so the plugin also works as a plain addition. When on, it allows the
tools of the kernelexec MCP server (``mcp__kernelexec__<tool>`` when added with ``claude mcp add
kernelexec``, ``mcp__plugin_kernelexec_kernelexec__<tool>`` from the plugin; ``--server`` names
another registration) and ``ToolSearch`` (Claude Code needs it to load deferred MCP tool
schemas), and denies everything else. It fails closed:
unreadable or malformed input, a missing field, or any error is a deny with the reason.

This runs before every tool call, so it is stdlib only: it never imports mcp, jupyter_client or
pydantic itself.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from collections.abc import Iterable, Mapping
from typing import Any, Literal

Decision = Literal["allow", "deny"]

#: The kernelexec server's tools named in deny reasons (presets expose a subset; the server may have more).
KERNELEXEC_TOOLS = frozenset(
    {"execute_code", "run_python", "list_variables", "new_session", "restart_session", "close_session"}
)
#: Claude Code's own tools that code-only mode lets through: ToolSearch only loads tool schemas.
HARNESS_TOOLS = frozenset({"ToolSearch"})
PLUGIN_NAME = "kernelexec"
ENV_VAR = "KERNELEXEC_CODE_ONLY"
_OFF = {"", "0", "false", "no", "off"}
_TOOL_PART = re.compile(r"[A-Za-z0-9-]+(?:_[A-Za-z0-9-]+)*")


def code_only_enabled(environ: Mapping[str, str] | None = None) -> bool:
    """Whether ``KERNELEXEC_CODE_ONLY`` turns code-only mode on; an unrecognised value counts as on."""
    value = (os.environ if environ is None else environ).get(ENV_VAR)
    return value is not None and value.strip().lower() not in _OFF


def is_kernelexec_tool(name: str, servers: Iterable[str] = (PLUGIN_NAME,)) -> bool:
    """True for ``mcp__<server>__<tool>`` and ``mcp__plugin_kernelexec_<server>__<tool>``.

    Any tool of our server counts, so tools added to the server later keep working; the tool part
    must be a plain name (letters, digits, ``-``, single ``_``), so another server whose name only
    starts like ours (``kernelexec__x``) does not.
    """
    for server in servers:
        for prefix in (f"mcp__{server}__", f"mcp__plugin_{PLUGIN_NAME}_{server}__"):
            if name.startswith(prefix) and _TOOL_PART.fullmatch(name[len(prefix):]):
                return True
    return False


def _shown(name: str) -> str:
    """The tool name for a reason: quoted and escaped, at most about 100 characters."""
    return repr(name if len(name) <= 100 else name[:100] + "...")


def decide(event: Any, *, servers: Iterable[str] = (PLUGIN_NAME,), allow: Iterable[str] = ()) -> tuple[Decision, str]:
    """Code-only decision for one parsed PreToolUse input. Anything unexpected is a deny."""
    if not isinstance(event, dict):
        return "deny", f"kernelexec code-only hook: expected a JSON object on stdin, got {type(event).__name__}; denying."
    missing = [key for key in ("hook_event_name", "tool_name", "tool_input") if key not in event]
    if missing:
        return "deny", f"kernelexec code-only hook: hook input lacks {', '.join(missing)}; denying."
    if event["hook_event_name"] != "PreToolUse":
        return "deny", f"kernelexec code-only hook handles PreToolUse only, got {_shown(str(event['hook_event_name']))}; denying."
    name = event["tool_name"]
    if not isinstance(name, str) or not name:
        return "deny", "kernelexec code-only hook: tool_name is not a non-empty string; denying."
    if not isinstance(event["tool_input"], dict):
        return "deny", "kernelexec code-only hook: tool_input is not an object; denying."
    servers = tuple(servers)
    if is_kernelexec_tool(name, servers):
        return "allow", "kernelexec tool (code-only mode)"
    if name in HARNESS_TOOLS or name in set(allow):
        return "allow", f"{_shown(name)} is allowed in kernelexec code-only mode"
    tools = ", ".join(sorted(KERNELEXEC_TOOLS))
    return "deny", (
        f"kernelexec code-only mode: the tool {_shown(name)} is blocked; only the kernelexec MCP tools "
        f"({tools}) may be used. Do the work in Python with execute_code instead: read and write files "
        "with open()/pathlib, compute, and plot there."
    )


def render(decision: Decision, reason: str) -> str:
    """The hook's stdout, escaped by json.dumps whatever the tool name holds."""
    output = {"hookEventName": "PreToolUse", "permissionDecision": decision, "permissionDecisionReason": reason}
    return json.dumps({"hookSpecificOutput": output}, ensure_ascii=True)


# Written as-is if building the real answer fails: still a valid deny.
_FALLBACK = (
    '{"hookSpecificOutput": {"hookEventName": "PreToolUse", "permissionDecision": "deny", '
    '"permissionDecisionReason": "kernelexec code-only hook failed internally; denying."}}'
)


def pre_tool_use(raw: bytes, *, servers: Iterable[str] = (PLUGIN_NAME,), allow: Iterable[str] = ()) -> str:
    """Decide on raw stdin bytes and return the JSON line to print. Never raises."""
    try:
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            return render("deny", "kernelexec code-only hook: stdin is not UTF-8; denying.")
        if not text.strip():
            return render("deny", "kernelexec code-only hook: no input on stdin; denying.")
        try:
            event = json.loads(text)
        except (ValueError, RecursionError) as exc:
            return render("deny", f"kernelexec code-only hook: stdin is not valid JSON ({str(exc)[:200]}); denying.")
        return render(*decide(event, servers=servers, allow=allow))
    except Exception:
        return _FALLBACK


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``hook`` subcommand's arguments (called by ``kernelexec.cli.build_parser``)."""
    parser.add_argument("event", choices=["pre-tool-use"], help="the Claude Code hook event to handle")
    parser.add_argument(
        "--code-only", action="store_true",
        help=f"enforce code-only mode even when {ENV_VAR} is unset (for a hook in your own settings.json)",
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
    """Handle ``kernelexec hook``: read stdin, print the decision (or nothing when the mode is off)."""
    try:
        raw = sys.stdin.buffer.read()
    except Exception:
        raw = b""
    if not (args.code_only or code_only_enabled()):
        return 0  # mode off: no opinion, Claude Code's normal permissions apply
    try:
        sys.stdout.write(pre_tool_use(raw, servers=args.servers or [PLUGIN_NAME], allow=args.allow) + "\n")
        sys.stdout.flush()
    except Exception:
        # stdout unusable: exit 2 makes Claude Code block the call and show stderr to the model
        sys.stderr.write("kernelexec code-only hook could not write its decision; denying.\n")
        return 2
    return 0


__all__ = ["decide", "pre_tool_use", "run"]
