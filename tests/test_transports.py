"""The server as a separate process: over stdio and over streamable HTTP, through real MCP clients."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from mcp import Client, StdioServerParameters

from .conftest import clean_env, kernelexec_cmd
from .conftest import http_server as serve_http

pytestmark = pytest.mark.anyio


def stdio_params(state: Path, *args: str) -> StdioServerParameters:
    cmd = kernelexec_cmd("serve", "--state-dir", str(state), *args)
    return StdioServerParameters(command=cmd[0], args=cmd[1:], env=clean_env(KERNELEXEC_TEST_SECRET="hunter2"))


async def test_stdio_session_persists_and_fd_writes_do_not_corrupt_the_stream(short_tmp: Path) -> None:
    async with Client(stdio_params(short_tmp / "stdio")) as client:
        first = await client.call_tool("execute_code", {"code": "import os\nos.write(1, b'{not json}\\n' * 1000)\nx = 20"})
        assert first.structured_content["success"], first.structured_content
        second = await client.call_tool("execute_code", {"code": "x + 1"})
        assert second.structured_content["result"] == 21
        assert second.structured_content["session"] == first.structured_content["session"]
        env = await client.call_tool("execute_code", {"code": "import os\nresult = os.environ.get('KERNELEXEC_TEST_SECRET')"})
        assert env.structured_content["result"] is None


async def test_stdio_plugin_preset_exposes_only_execute_code_in_the_start_directory(short_tmp: Path) -> None:
    workdir = short_tmp / "project"
    workdir.mkdir()
    params = stdio_params(short_tmp / "plugin", "--preset", "plugin")
    params.cwd = str(workdir)
    async with Client(params) as client:
        tools = [t.name for t in (await client.list_tools()).tools]
        assert tools == ["execute_code"]
        r = await client.call_tool("execute_code", {"code": "import os\nresult = os.getcwd()"})
        assert r.structured_content["result"] == str(workdir.resolve())
        r = await client.call_tool("execute_code", {"code": "import subprocess\nsubprocess.run(['true']).returncode"})
        assert r.structured_content["result"] == 0  # the plugin's users ran trusted code


async def test_stdio_safe_executor_preset_exposes_only_run_python_under_strict(short_tmp: Path) -> None:
    async with Client(stdio_params(short_tmp / "safe", "--preset", "safe-executor")) as client:
        tools = [t.name for t in (await client.list_tools()).tools]
        assert tools == ["run_python"]
        ok = await client.call_tool("run_python", {"code": "import math\nmath.sqrt(16)"})
        assert ok.structured_content == {"result": 4.0, "logs": ""}
        refused = await client.call_tool("run_python", {"code": "import os"})
        assert refused.is_error and "Import of os is not allowed" in refused.content[0].text


@pytest.fixture(scope="module")
def http_server(short_tmp: Path) -> Iterator[str]:
    with serve_http(short_tmp / "http") as url:
        yield url


async def test_http_two_modern_clients_never_see_each_others_variables(http_server: str) -> None:
    async with Client(http_server) as alice, Client(http_server) as bob:
        a = await alice.call_tool("execute_code", {"code": "secret = 'alice'"})
        handle_a = a.structured_content["session"]
        b = await bob.call_tool("execute_code", {"code": "secret"})
        assert b.structured_content["error_type"] == "NameError"
        assert b.structured_content["session"] != handle_a
        again = await alice.call_tool("execute_code", {"code": "secret", "session": handle_a})
        assert again.structured_content["result"] == "alice"


async def test_http_legacy_client_keeps_its_session_without_a_handle(http_server: str) -> None:
    async with Client(http_server, mode="legacy") as legacy, Client(http_server, mode="legacy") as other:
        first = await legacy.call_tool("execute_code", {"code": "n = 7"})
        second = await legacy.call_tool("execute_code", {"code": "n * 6"})
        assert second.structured_content["result"] == 42
        assert first.structured_content["session"] == second.structured_content["session"]
        theirs = await other.call_tool("execute_code", {"code": "n"})
        assert theirs.structured_content["error_type"] == "NameError"
