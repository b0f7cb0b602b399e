"""The MCP face of kernelexec: an ``MCPServer`` with the tools (tools.py) and the session
resources (resources.py) over one SessionManager.

Built by ``build_server(settings, sessions)``; nothing happens at import.
"""

from mcp.server.mcpserver import MCPServer

from . import __version__, resources, tools, view
from .auth import StaticTokenVerifier, auth_settings, load_tokens
from .config import Settings
from .policy import describe
from .sessions import SessionManager

INSTRUCTIONS = """\
kernelexec runs Python in a persistent IPython kernel. Variables, imports and functions persist
between calls in the same session. The answer's `result` is the value of a variable named
`result` if your code assigns it, otherwise the value of the last expression. Print for logs.
Plots: matplotlib figures are returned as PNG images (and SVG files). Every answer names its
`session`; pass it back to keep working in the same kernel, or call new_session for a fresh one.
Long-running code is interrupted at `timeout` seconds; if it cannot be interrupted the kernel is
restarted and its variables are lost (the answer says so). Profile: {profile} ({what})."""


def build_server(settings: Settings, sessions: SessionManager) -> MCPServer:
    """Create the MCP server. ``sessions`` must be running (``SessionManager.running()``) while it serves."""
    profile = settings.effective_profile
    tokens = load_tokens(settings) if settings.transport == "http" else []
    app = tools.App(settings, sessions)
    apps = tools.run_view(app)  # the MCP Apps extension of the run view (view.py), where execute_code is exposed
    mcp = MCPServer(
        "kernelexec",
        version=__version__,
        instructions=INSTRUCTIONS.format(profile=profile, what=describe(profile)),
        token_verifier=StaticTokenVerifier(tokens) if tokens else None,
        auth=auth_settings(settings) if tokens else None,
        extensions=[apps] if apps is not None else None,
    )
    tools.register(mcp, app)
    if apps is not None:
        mcp.middleware.append(view.hide_app_only)  # app-only tools: listed and callable only for Apps clients
    if sessions.broker is not None:  # code mode: the callable tools in execute_code's description
        mcp.middleware.append(tools.code_mode_listing(sessions.broker))  # type: ignore[arg-type]
    resources.register(mcp, sessions)
    return mcp
