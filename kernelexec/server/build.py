"""The MCP face of kernelexec: an ``MCPServer`` with the tools (tools.py, over app.py's App) and the session
resources (resources.py) over one SessionManager.

Built by ``build_server(settings, sessions)``; nothing happens at import.
"""

import logging
from collections.abc import Awaitable, Callable

from mcp.server.mcpserver import MCPServer
from mcp.server.request_state import RequestStateSecurity
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response

from kernelexec import __version__
from kernelexec.config import Settings, state_keys
from kernelexec.sandbox.policy import describe
from kernelexec.server import durable, file_transfer, resources, session_header, tasks, tools, view
from kernelexec.server.app import App, code_mode_listing
from kernelexec.server.auth import StaticTokenVerifier, auth_settings, load_tokens, principal_id
from kernelexec.server.drain import Drain
from kernelexec.server.metrics import Metrics, endpoint
from kernelexec.session.manager import SessionManager

INSTRUCTIONS = """\
kernelexec runs Python in a persistent IPython kernel. Variables, imports and functions persist
between calls in the same session. The answer's `result` is the value of a variable named
`result` if your code assigns it, otherwise the value of the last expression. Print for logs.
Plots: matplotlib figures are returned as PNG images (and SVG files). Every answer names its
`session`; pass it back to keep working in the same kernel, or call new_session for a fresh one.
Long-running code is interrupted at `timeout` seconds; if it cannot be interrupted the kernel is
restarted and its variables are lost (the answer says so). Profile: {profile} ({what})."""


CAPABILITY_PATHS = ("/secret/", "/upload/")  # a URL whose path is the capability: never written to a log


class _MaskCapabilityPaths(logging.Filter):
    """uvicorn's access log line with a capability URL's key masked (``/upload/***``): whoever reads the log
    live must not be able to race the human or the uploader to an unused key."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple) and len(args) >= 3 and isinstance(args[2], str):
            for prefix in CAPABILITY_PATHS:
                if args[2].startswith(prefix):
                    record.args = (*args[:2], prefix + "***", *args[3:])
        return True


def mask_capability_paths() -> None:
    """Install the mask on uvicorn's access logger (once; uvicorn's own logging config keeps logger filters)."""
    access = logging.getLogger("uvicorn.access")
    if not any(isinstance(f, _MaskCapabilityPaths) for f in access.filters):
        access.addFilter(_MaskCapabilityPaths())


def healthz(drain: Drain) -> Callable[[Request], Awaitable[Response]]:
    """A load balancer's health check (deploy/haproxy.cfg): no token needed, so it says nothing but that this
    process answers HTTP, or (503) that it is draining (server/drain.py: stopped, finishing what it has); cheap, it
    touches no session, kernel or store."""

    async def check(request: Request) -> Response:
        drain.checked = True
        if drain.draining:
            return PlainTextResponse("draining\n", status_code=503, headers={"Cache-Control": "no-store"})
        return PlainTextResponse("ok\n", headers={"Cache-Control": "no-store"})

    return check


def build_server(settings: Settings, sessions: SessionManager, app: App | None = None, metrics: Metrics | None = None,
                 drain: Drain | None = None) -> MCPServer:
    """Create the MCP server. ``sessions`` must be running (``SessionManager.running()``) while it serves.
    ``app``: the one its tools work over, when the caller keeps it (the red team reads its renderers).
    ``metrics``: the Prometheus metrics it counts into, when the caller serves them elsewhere too (--metrics-port);
    over HTTP they are served at /metrics (metrics.py: behind the bearer token when there are tokens).
    ``drain``: the one the HTTP server's signal handling begins (server/drain.py), when the caller serves over HTTP."""
    profile = settings.effective_profile
    tokens = load_tokens(settings) if settings.transport == "http" else []
    app = app or App(settings, sessions)
    if drain is not None:
        app.drain = drain
    sessions.runs.observers.append(durable.observer(app))  # runs recorded in the session store (a restart keeps them)
    apps = tools.run_view(app)  # the MCP Apps extension of the run view (view.py), where execute_code is exposed
    long_calls = tasks.extension(app)  # MCP Tasks (tasks.py) for long execute_code / install_packages calls
    files = file_transfer.extension(app)  # SEP-2631's files/authorizeUpload over the upload URLs (HTTP only)
    keys = state_keys(settings)  # a fleet's shared keys: a retry sealed by one replica opens on any (same name: audience)
    mcp = MCPServer(
        "kernelexec",
        request_state_security=RequestStateSecurity(keys=keys) if keys is not None else None,
        version=__version__,
        instructions=INSTRUCTIONS.format(profile=profile, what=describe(profile)),
        token_verifier=StaticTokenVerifier(tokens) if tokens else None,
        auth=auth_settings(settings) if tokens else None,
        extensions=[e for e in (apps, long_calls, files) if e is not None] or None,
    )
    metrics = metrics or Metrics()  # its own registry, never prometheus-client's global one
    metrics.watch(sessions)
    mcp.middleware.append(metrics.middleware)  # each tool call timed (the outermost of ours: the whole call)
    if settings.transport == "http":
        mcp.custom_route("/metrics", methods=["GET"], include_in_schema=False)(endpoint(metrics, tokens))
        mcp.custom_route("/healthz", methods=["GET", "HEAD"], include_in_schema=False)(healthz(app.drain))
    tools.register(mcp, app)
    session_header.install(mcp)  # Mcp-Param-Session checked when sent, never required
    if settings.transport == "http":  # getpass() pages at the server's own origin (secret_page.py); the path is the key
        mask_capability_paths()  # their keys never in the access log
        mcp.custom_route("/secret/{key}", methods=["GET", "POST"], include_in_schema=False)(app.pages.endpoint)
        # upload URLs (uploads.py): the path is the capability; a token other than the owner's finds nothing
        app.uploads.principals = {t.encode(): principal_id(t) for t in tokens}
        mcp.custom_route("/upload/{key}", methods=["PUT"], include_in_schema=False)(app.uploads.endpoint)
    if apps is not None:
        mcp.middleware.append(view.hide_app_only)  # app-only tools: listed and callable only for Apps clients
    if sessions.broker is not None:  # code mode: the callable tools in execute_code's description
        mcp.middleware.append(code_mode_listing(sessions.broker))  # type: ignore[arg-type]
    resources.register(mcp, sessions)
    metrics.tool_names = frozenset(tool.name for tool in mcp._tool_manager.list_tools())  # no public sync listing
    return mcp
