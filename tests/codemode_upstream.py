"""A real upstream MCP server for code mode's tests and benchmark, written with the SDK.

``python codemode_upstream.py stdio NAME`` serves over stdio; ``python codemode_upstream.py http NAME PORT``
over streamable HTTP on 127.0.0.1:PORT/mcp. NAME goes into answers, so tests can tell two servers apart.
With UPSTREAM_CALL_LOG set, ``transfer`` appends each call it runs to that file; with UPSTREAM_META_LOG set,
``traced`` appends the request's ``_meta`` it received (a JSON line: the traceparent, tests/test_traces.py).
"""

from __future__ import annotations

import base64
import json
import os
import sys
import time

from mcp.server import MCPServer
from mcp.server.mcpserver import Context, Image
from mcp.server.mcpserver.exceptions import ToolError
from pydantic import BaseModel, Field

# a 1x1 PNG
PNG = base64.b64decode("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg==")

NAME = sys.argv[2] if len(sys.argv) > 2 else "upstream"
mcp = MCPServer(NAME)


class Forecast(BaseModel):
    city: str
    high_c: float
    server: str


@mcp.tool()
def forecast(city: str = Field(description="City name"), days: int = Field(1, description="How many days")) -> Forecast:
    """Tomorrow's forecast for a city."""
    return Forecast(city=city, high_c=20.5 + days, server=NAME)


@mcp.tool()
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@mcp.tool(structured_output=False)
def shout(text: str) -> str:
    """Upper-case a text (a plain text result)."""
    return text.upper() + "!"


@mcp.tool()
def pixel() -> Image:
    """A 1x1 PNG image."""
    return Image(data=PNG, format="png")


@mcp.tool()
def fail(why: str = "no reason") -> str:
    """Always raises."""
    raise ToolError(f"upstream refused: {why}")


@mcp.tool()
def slow(seconds: float) -> float:
    """Sleep, then answer."""
    time.sleep(seconds)
    return seconds


@mcp.tool()
def pid() -> int:
    """This server process's id."""
    return os.getpid()


@mcp.tool()
def crash() -> str:
    """Exit the server process at once."""
    os._exit(3)


@mcp.tool()
def secret() -> str:
    """A tool the tests' --tools-allow refuses."""
    return "leaked"


@mcp.tool()
def transfer(amount: int) -> str:
    """A tool the tests' --tools-approve asks about."""
    log = os.environ.get("UPSTREAM_CALL_LOG")
    if log:  # the upstream's own record of the calls it ran (tests/test_question_ids.py judges by it)
        with open(log, "a", encoding="utf-8") as fh:
            fh.write(f"transfer {amount}\n")
    return f"sent {amount}"


@mcp.tool()
def traced(ctx: Context) -> str:
    """Log the request's _meta (its W3C trace context) to UPSTREAM_META_LOG."""
    meta = ctx.request_context.meta
    log = os.environ.get("UPSTREAM_META_LOG")
    if log:
        with open(log, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(meta.model_dump(by_alias=True, mode="json") if hasattr(meta, "model_dump") else dict(meta or {})) + "\n")
    return "traced"


@mcp.tool()
def counter(n: int) -> int:
    """Return n plus a value from the environment (LIVE_OFFSET), so a live replay can differ."""
    return n + int(os.environ.get("LIVE_OFFSET", "0"))


SECRET = os.environ.get("UPSTREAM_SECRET", "")  # the secret its config gives it (env): it tries to send it back


@mcp.tool(structured_output=False)
def leak_error() -> str:
    """Fails with its secret in the message (an isError result)."""
    raise ToolError(f"upstream failed while using key {SECRET}")


@mcp.tool(structured_output=False)
def leak_text() -> str:
    """Its secret in a plain text result."""
    return f"the key is {SECRET}"


@mcp.tool()
def leak_structured() -> dict[str, object]:
    """Its secret deep in structured content, keys included."""
    return {"nested": {"list": ["ok", f"key={SECRET}"], SECRET: 1}}


STATE: list[str] = []  # what this server (one process per stdio connection) was asked to remember


def _log_state(line: str) -> None:
    path = os.environ.get("STATE_LOG")
    if path:
        with open(path, "a") as log:
            log.write(f"{os.getpid()} {line}\n")


@mcp.tool()
def remember(value: str) -> int:
    """Keep a value in this server's state; the number of values kept."""
    STATE.append(value)
    _log_state(f"remember {value}")
    return len(STATE)


@mcp.tool()
def recall() -> list[str]:
    """Every value this server's state holds."""
    _log_state(f"recall {','.join(STATE)}")
    return list(STATE)


if __name__ == "__main__":
    if sys.argv[1] == "http":
        mcp.run(transport="streamable-http", host="127.0.0.1", port=int(sys.argv[3]))
    else:
        mcp.run()
