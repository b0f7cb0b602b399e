"""The floor under the per-call bar: the thinnest MCP server the SDK allows around jupyter_client.

    python -m benchmarks.sdk_floor STATE_DIR      (a stdio MCP server; benchmarks/overhead.py starts it)

One tool, ``execute_code(code)``, that sends the code to a plain ipykernel (the raw row's own: ``raw_kernel``, ipc,
no history) with jupyter_client's ``AsyncKernelClient``, waits for its IOPub ``idle`` and its shell reply
(``raw_execute``), and answers a two-field dict. No sandbox, no record, no session, no output caps: what any server
built on the MCP SDK and jupyter_client pays per call before it does anything of its own. ``overhead.py`` times it
over stdio beside ``kernelexec serve``, so the distance between the two rows is kernelexec's own share of a call, and
this row's ratio is the lowest the SDK's own client over stdio can show against a raw round trip.
"""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # ``python benchmarks/sdk_floor.py``
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from mcp.server.mcpserver import MCPServer

from benchmarks.common import raw_execute, raw_kernel


def serve(state_dir: Path) -> None:
    kernel: dict[str, Any] = {}

    @asynccontextmanager
    async def lifespan(_app: MCPServer) -> AsyncIterator[None]:
        state_dir.mkdir(parents=True, exist_ok=True)
        async with raw_kernel(state_dir) as (_km, kc):
            kernel["kc"] = kc
            yield

    app = MCPServer("sdk-floor", lifespan=lifespan)

    @app.tool()
    async def execute_code(code: str) -> dict[str, Any]:
        """Run ``code`` in the kernel; answer whether it succeeded."""
        reply = await raw_execute(kernel["kc"], code)
        return {"success": reply["status"] == "ok", "execution_count": reply.get("execution_count")}

    app.run()


if __name__ == "__main__":
    serve(Path(sys.argv[1]))
