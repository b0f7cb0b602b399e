"""The run view: an MCP App (``io.modelcontextprotocol/ui``) for ``execute_code`` and ``get_run``.

Hosts that render MCP Apps show ``ui://kernelexec/run.html`` (one self-contained HTML file built from
``ui/`` with the official ext-apps App SDK, shipped as ``kernelexec/ui/run.html``) next to a run:
status and timing, the code, its output, plots, a paged DataFrame table, the session's variables and
Interrupt / Restart buttons. The view reaches the server only through its host, and the kernel only
through the app-only tools here (``_meta.ui.visibility: ["app"]``):

- ``view_table``: one bounded page of a pandas DataFrame variable, sorted by one column if asked;
- ``view_variables``: the session's variables (as ``list_variables``);
- ``view_interrupt`` / ``view_restart``: the buttons.

They are hidden from the model: a client that did not negotiate the Apps extension does not see them
in ``tools/list`` and cannot call them; a host that did sees them marked app-only, for its views.
Hosts without Apps get exactly the text and images they got before.
"""

from __future__ import annotations

import json
from importlib import resources
from typing import Annotated, Any

from mcp.server.apps import Apps, ResourceCsp, Visibility, client_supports_apps
from mcp.server.mcpserver import Context
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import CallToolResult, TextContent, ToolAnnotations
from pydantic import BaseModel, Field

from kernelexec.display import display
from kernelexec.errors import KernelexecError
from kernelexec.server.app import App, SessionName, info, translated, variables_answer
from kernelexec.server.results import SessionInfo, VariablesResult
from kernelexec.syntax import literal

VIEW_URI = "ui://kernelexec/run.html"
VIEW_META: dict[str, Any] = {"ui": {"resourceUri": VIEW_URI}}
APP_ONLY = ("view_table", "view_variables", "view_interrupt", "view_restart")
MAX_PAGE_ROWS = 100
MAX_COLUMNS = 50
MAX_CELL_CHARS = 120
MAX_PAGE_CHARS = 1_000_000  # the kernel's answer for one page, at most (it is untrusted input)


def view_html() -> str:
    """The built view (``npm run build`` in ui/ writes it; CI checks the committed file is that build)."""
    return resources.files("kernelexec").joinpath("ui", "run.html").read_text(encoding="utf-8")


class TablePage(BaseModel):
    """One page of a DataFrame variable, as the run view shows it."""

    session: str
    name: str = Field(description="The DataFrame variable")
    columns: list[str] = Field(description=f"Column labels (the first {MAX_COLUMNS})")
    index_name: str = ""
    rows: list[list[str]] = Field(description="Each row: its index label, then its cells (each cut to "
                                  f"{MAX_CELL_CHARS} characters)")
    total_rows: int
    page: int
    page_size: int
    pages: int
    sort_column: int | None = None
    descending: bool = False


def page_expression(name: str, page: int, size: int, sort: int | None, descending: bool) -> str:
    """One expression the kernel evaluates: a JSON string for one page of ``name``, bounded in rows,
    columns and characters per cell. ``name`` is checked to be an identifier, the rest are ints/bools."""
    return (
        "(lambda _df, _json: _json.dumps({'error': 'not a DataFrame'}) if not (hasattr(_df, 'iloc') and hasattr(_df, 'columns'))"
        " else (lambda _s: _json.dumps({"
        f"'columns': [str(_c)[:{MAX_CELL_CHARS}] for _c in list(_df.columns[:{MAX_COLUMNS}])],"
        f"'index_name': str(_df.index.name or '')[:{MAX_CELL_CHARS}],"
        "'total': int(len(_df)),"
        f"'rows': [[str(_v)[:{MAX_CELL_CHARS}] for _v in _r] for _r in"
        f" _s.iloc[{page * size}:{(page + 1) * size}, :{MAX_COLUMNS}].itertuples(index=True, name=None)]}}))"
        f"(_df if {sort!r} is None else _df.sort_values(_df.columns[{sort if sort is not None else 0}], ascending={not descending!r},"
        " kind='stable')))"
        f"({name}, __import__('json'))"
    )


def parse_page(data: Any) -> dict[str, Any]:
    """The kernel's answer for a page: a repr of a JSON string (text/plain), untrusted; checked here."""
    if isinstance(data, dict) and "error" in data:
        raise ToolError(f"could not read the table: {data['error']}")
    if not isinstance(data, str) or len(data) > MAX_PAGE_CHARS:
        raise ToolError("could not read the table: the kernel's answer is not a bounded string")
    try:
        text = literal(data)
        found = json.loads(text) if isinstance(text, str) else None
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        found = None
    if not isinstance(found, dict):
        raise ToolError("could not read the table: the kernel's answer is not JSON")
    if "error" in found:
        raise ToolError(f"could not read the table: {str(found['error'])[:200]}")
    columns, rows, total = found.get("columns"), found.get("rows"), found.get("total")
    if not (isinstance(columns, list) and isinstance(rows, list) and isinstance(total, int)):
        raise ToolError("could not read the table: the kernel's answer has the wrong shape")
    return {"columns": [display(str(c)[:MAX_CELL_CHARS], MAX_CELL_CHARS) for c in columns[:MAX_COLUMNS]],
            "index_name": display(str(found.get("index_name") or "")[:MAX_CELL_CHARS], MAX_CELL_CHARS),
            "rows": [[display(str(v)[:MAX_CELL_CHARS], MAX_CELL_CHARS) for v in r[: MAX_COLUMNS + 1]]
                     for r in rows[:MAX_PAGE_ROWS] if isinstance(r, list)],
            "total": max(total, 0)}


def extension(app: App) -> Apps:
    """The MCP Apps extension: the view's resource and its app-only tools, for ``MCPServer(extensions=[...])``
    (server.build_server, which also adds ``hide_app_only``)."""

    apps = Apps()
    apps.add_html_resource(
        VIEW_URI, view_html(), name="run-view", title="kernelexec run",
        description="A live view of one execute_code run: output, plots, tables, variables, Interrupt / Restart",
        csp=ResourceCsp(connect_domains=[], resource_domains=[], frame_domains=[]), prefers_border=True,
    )
    app_only: list[Visibility] = ["app"]
    reading = ToolAnnotations(read_only_hint=True, idempotent_hint=True, open_world_hint=False)

    async def idle_session(ctx: Context, session: str) -> Any:
        target = await app.resolve(ctx, session)
        if target.busy:
            raise ToolError("the session is running code; try again when it finishes")
        return target

    @apps.tool(resource_uri=VIEW_URI, visibility=app_only, name="view_table", title="Table page (run view)", annotations=reading)
    @translated
    async def view_table(
        ctx: Context,
        session: SessionName,
        name: Annotated[str, Field(description="A DataFrame variable of the session")],
        page: Annotated[int, Field(ge=0, le=10_000_000)] = 0,
        page_size: Annotated[int, Field(ge=1, le=MAX_PAGE_ROWS)] = 20,
        sort_column: Annotated[int | None, Field(ge=0, lt=MAX_COLUMNS, description="Sort by this column (0-based)")] = None,
        descending: bool = False,
    ) -> TablePage:
        """One page of a DataFrame variable, for the run view."""
        if not name.isidentifier() or name.startswith("_"):
            raise ToolError(f"{name!r} is not a variable name")
        target = await idle_session(ctx, session)
        found = parse_page(await target.evaluate(page_expression(name, page, page_size, sort_column, descending)))
        total = found["total"]
        return TablePage(session=target.handle, name=name, columns=found["columns"], index_name=found["index_name"],
                         rows=found["rows"], total_rows=total, page=page, page_size=page_size,
                         pages=max(1, -(-total // page_size)), sort_column=sort_column, descending=descending)

    @apps.tool(resource_uri=VIEW_URI, visibility=app_only, name="view_variables", title="Variables (run view)", annotations=reading)
    @translated
    async def view_variables(ctx: Context, session: SessionName) -> Annotated[CallToolResult, VariablesResult]:
        """The session's variables, for the run view."""
        target = await idle_session(ctx, session)
        data = await target.variables()
        if isinstance(data, str):
            try:
                data = json.loads(data)
            except ValueError:
                raise ToolError("could not list variables: the kernel's answer is not JSON") from None
        return variables_answer(target.handle, data)

    @apps.tool(resource_uri=VIEW_URI, visibility=app_only, name="view_interrupt", title="Interrupt (run view)",
               annotations=ToolAnnotations(read_only_hint=False, destructive_hint=False, open_world_hint=False))
    @translated
    async def view_interrupt(ctx: Context, session: SessionName) -> SessionInfo:
        """The view's Interrupt button: SIGINT to the session's running code."""
        target = await app.resolve(ctx, session)
        return info(target, "interrupt sent" if await target.interrupt() else "nothing was running")

    @apps.tool(resource_uri=VIEW_URI, visibility=app_only, name="view_restart", title="Restart (run view)",
               annotations=ToolAnnotations(destructive_hint=True, open_world_hint=False))
    @translated
    async def view_restart(ctx: Context, session: SessionName) -> SessionInfo:
        """The view's Restart button: a fresh kernel, variables lost; the notebook record stays."""
        target = await app.resolve(ctx, session)
        await target.restart()
        return info(target, "restarted")

    return apps


def _tool_name(params: Any) -> Any:
    return params.get("name") if isinstance(params, dict) else getattr(params, "name", None)


async def hide_app_only(ctx: Any, call_next: Any) -> Any:
    """App-only tools exist only for clients that negotiated MCP Apps (their hosts keep them from the model)."""
    if ctx.method == "tools/call" and _tool_name(ctx.params) in APP_ONLY and not _supports(ctx):
        return CallToolResult(content=[TextContent(type="text", text=f"Unknown tool: {_tool_name(ctx.params)}")], is_error=True)
    result = await call_next(ctx)
    if ctx.method != "tools/list" or _supports(ctx):
        return result
    if isinstance(result, dict):
        return {**result, "tools": [t for t in result.get("tools", []) if _tool_name(t) not in APP_ONLY]}
    if hasattr(result, "tools"):
        return result.model_copy(update={"tools": [t for t in result.tools if t.name not in APP_ONLY]})
    return result


def _supports(ctx: Any) -> bool:
    try:
        return client_supports_apps(ctx)
    except (AttributeError, KernelexecError):
        return False
