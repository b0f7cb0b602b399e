"""The floor under the per-call bar: the thinnest MCP server the SDK allows around jupyter_client.

    python -m benchmarks.sdk_floor STATE_DIR      (a stdio MCP server; benchmarks/overhead.py starts it)

One tool, ``execute_code(code)``, that sends the code to a plain ipykernel (as the raw row's: ipc, no history) with
jupyter_client's ``AsyncKernelClient``, waits for its IOPub ``idle`` and its shell reply, and answers a two-field
dict. No sandbox, no record, no session, no output caps: what any server built on the MCP SDK and jupyter_client pays
per call before it does anything of its own. ``overhead.py`` times it over stdio beside ``kernelexec serve``, so the
distance between the two rows is kernelexec's own share of a call, and this row's ratio is the lowest the SDK's own
client over stdio can show against a raw round trip.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from mcp.server.mcpserver import MCPServer


def serve(state_dir: Path) -> None:
    from jupyter_client.manager import AsyncKernelManager

    app = MCPServer("sdk-floor")
    kernel: dict[str, Any] = {}

    async def client() -> Any:
        if "kc" not in kernel:
            state_dir.mkdir(parents=True, exist_ok=True)
            km = AsyncKernelManager(transport="ipc", connection_file=str(state_dir / "kernel.json"))
            km.ip = str(state_dir / "k")
            await km.start_kernel(extra_arguments=["--HistoryManager.enabled=False"], stdin=subprocess.DEVNULL,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=str(state_dir))
            kc = km.client()
            kc.start_channels()
            await kc.wait_for_ready(timeout=60)
            kernel.update(km=km, kc=kc)
        return kernel["kc"]

    @app.tool()
    async def execute_code(code: str) -> dict[str, Any]:
        """Run ``code`` in the kernel; answer whether it succeeded."""
        kc = await client()
        msg_id = kc.execute(code)
        deadline = time.monotonic() + 30
        idle = False
        while not idle:
            msg = await kc.get_iopub_msg(timeout=max(0.0, deadline - time.monotonic()))
            idle = (msg["parent_header"].get("msg_id") == msg_id and msg["msg_type"] == "status"
                    and msg["content"]["execution_state"] == "idle")
        while True:
            msg = await kc.get_shell_msg(timeout=max(0.0, deadline - time.monotonic()))
            if msg["parent_header"].get("msg_id") == msg_id:
                return {"success": msg["content"]["status"] == "ok", "execution_count": msg["content"].get("execution_count")}

    try:
        app.run()
    finally:  # the client closed stdin: the kernel goes with this process
        if "km" in kernel:
            kernel["kc"].stop_channels()
            provisioner = kernel["km"].provisioner
            if provisioner is not None and provisioner.process is not None:
                provisioner.process.kill()


if __name__ == "__main__":
    serve(Path(sys.argv[1]))
