"""A real third-party MCP client: the MCP Inspector's CLI, over stdio and over streamable HTTP.

``.ci/run`` installs the pinned Inspector into ``.ci/node`` with npm. Without it these tests fail in
CI (``CI`` set) or wherever npm is present, and skip only on a machine without npm, saying how to
install it. ``tools/list`` runs with the
Inspector's ``--strict`` schema-portability check, and the tests assert it found nothing at all
(no finding of any severity in ``schemaFindings``, no report on stderr), not merely no
error-severity one (exit 6); a control server with a JSON-Schema ``type`` array shows the check is
live. Every schema is also checked against the JSON Schema meta-schema here; a real answer is
validated against ``execute_code``'s output schema.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft202012Validator

from kernelexec.hook import server_tools

from .conftest import clean_env, http_server, kernelexec_cmd

REPO = Path(__file__).resolve().parent.parent
INSPECTOR_VERSION = "2.12.0"  # keep in step with .ci/run
INSTALL = f"npm install --prefix .ci/node @modelcontextprotocol/inspector@{INSPECTOR_VERSION}"


@pytest.fixture(scope="module")
def inspector() -> str:
    local = REPO / ".ci" / "node" / "node_modules" / ".bin" / "mcp-inspector"
    found = str(local) if local.exists() else shutil.which("mcp-inspector")
    if found is None or shutil.which("node") is None:
        message = f"the MCP Inspector CLI is not installed; run `{INSTALL}` in the repository (needs node and npm)"
        if shutil.which("npm") is None and not os.environ.get("CI"):
            pytest.skip(message)  # only without npm; .ci/run installs it
        pytest.fail(message)
    return found


@pytest.fixture(scope="module")
def inspector_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The Inspector keeps a catalog under ~/.mcp-inspector: give it a throwaway HOME."""
    return tmp_path_factory.mktemp("inspector-home")


#: The lines of the Inspector's --strict report on stderr (a finding's Issue/Suggestion, the summary).
LINT_REPORT = re.compile(r"^\s*(Issue|Suggestion|Path):|\d+ errors?, \d+ warnings? across|Schema portability", re.M)

CONTROL_SERVER = """
from typing import Any
from pydantic import BaseModel, Field
from mcp.server.mcpserver import MCPServer

class Answer(BaseModel):
    result: Any = Field(None, json_schema_extra={"type": ["string", "number", "null"]})

mcp = MCPServer("control")

@mcp.tool()
def value() -> Answer:
    \"\"\"A tool whose output schema uses a JSON-Schema type array, as kernelexec's did.\"\"\"
    return Answer(result=1)

mcp.run()
"""


def run_inspector(inspector: str, home: Path, *args: str, target: list[str]) -> subprocess.CompletedProcess[str]:
    env = clean_env(HOME=str(home))
    cmd = [inspector, "--cli", "--format", "json", *args, *target]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=180, env=env, stdin=subprocess.DEVNULL)


def inspect(inspector: str, home: Path, *args: str, target: list[str]) -> dict[str, Any]:
    """Run one Inspector CLI request and return its JSON result (``--format json``).

    With ``--strict`` the Inspector puts every schema-portability finding (warnings too) in the
    envelope's ``schemaFindings`` and reports them on stderr: there must be none.
    """
    proc = run_inspector(inspector, home, *args, target=target)
    assert proc.returncode == 0, f"inspector exited {proc.returncode}\nstdout: {proc.stdout[-2000:]}\nstderr: {proc.stderr[-4000:]}"
    answer = json.loads(proc.stdout)
    assert "result" in answer, answer
    if "--strict" in args:
        assert "schemaFindings" not in answer, json.dumps(answer["schemaFindings"], indent=1)[:4000]
        assert not LINT_REPORT.search(proc.stderr), proc.stderr[-4000:]
    return answer["result"]


def stdio_target(state: Path) -> list[str]:
    return ["--", *kernelexec_cmd("serve", "--state-dir", str(state))]


def check_tools(result: dict[str, Any], http: bool = False) -> dict[str, dict[str, Any]]:
    tools = {t["name"]: t for t in result["tools"]}
    expected = set(server_tools()) - (set() if http else {"upload_url"})  # upload_url: HTTP only
    assert set(tools) == expected  # every tool, and the list the code-only hook names
    for tool in tools.values():
        assert tool["description"]
        Draft202012Validator.check_schema(tool["inputSchema"])
        assert tool["inputSchema"]["type"] == "object"
        if "outputSchema" in tool:
            Draft202012Validator.check_schema(tool["outputSchema"])
    return tools


def check_execute_answer(result: dict[str, Any], output_schema: dict[str, Any] | None = None) -> dict[str, Any]:
    assert result.get("isError") is not True, result
    structured = result["structuredContent"]
    if output_schema is not None:
        Draft202012Validator(output_schema).validate(structured)
    assert structured["success"] is True, structured
    text = "".join(block.get("text", "") for block in result["content"] if block["type"] == "text")
    assert "<kernelexec-result>" in text
    return structured


@pytest.fixture(scope="module")
def stdio_tools(inspector: str, inspector_home: Path, short_tmp: Path) -> dict[str, dict[str, Any]]:
    """tools/list over stdio, with the Inspector's --strict check: exit 0 means no error-severity problem."""
    result = inspect(inspector, inspector_home, "--method", "tools/list", "--strict", target=stdio_target(short_tmp / "insp-stdio"))
    return check_tools(result)


def test_stdio_tools_list_passes_the_inspectors_strict_check(stdio_tools: dict[str, dict[str, Any]]) -> None:
    assert set(stdio_tools["execute_code"]["inputSchema"]["required"]) == {"code"}
    assert "success" in stdio_tools["execute_code"]["outputSchema"]["properties"]


def test_stdio_tools_call_execute_code(inspector: str, inspector_home: Path, short_tmp: Path, stdio_tools: dict[str, dict[str, Any]]) -> None:
    # key=value, as a person types it on the command line
    result = inspect(
        inspector, inspector_home, "--method", "tools/call", "--tool-name", "execute_code",
        "--tool-arg", "code=result = 6 * 7", target=stdio_target(short_tmp / "insp-stdio"),
    )
    assert check_execute_answer(result, stdio_tools["execute_code"]["outputSchema"])["result"] == 42


@pytest.fixture(scope="module")
def http_url(short_tmp: Path) -> Iterator[str]:
    with http_server(short_tmp / "insp-http") as url:
        yield url


def test_http_tools_list_passes_the_inspectors_strict_check(inspector: str, inspector_home: Path, http_url: str) -> None:
    result = inspect(
        inspector, inspector_home, "--method", "tools/list", "--strict", "--protocol-era", "modern",
        target=["--transport", "http", "--server-url", http_url],
    )
    check_tools(result, http=True)


@pytest.mark.parametrize("era", ["legacy", "modern"])
def test_http_tools_call_execute_code_in_each_protocol_era(inspector: str, inspector_home: Path, http_url: str, era: str) -> None:
    # a whole JSON object, for code with newlines and quotes
    code = 'import math, sys\nprint("hello from", sys.implementation.name)\nresult = {"comb": math.comb(10, 3)}'
    result = inspect(
        inspector, inspector_home, "--method", "tools/call", "--tool-name", "execute_code",
        "--tool-args-json", json.dumps({"code": code}), "--protocol-era", era,
        target=["--transport", "http", "--server-url", http_url],
    )
    structured = check_execute_answer(result)
    assert structured["result"] == {"comb": 120} and structured["stdout"] == "hello from cpython\n"
    assert structured["session"]


def test_the_pinned_inspector_version_is_the_one_installed(inspector: str, inspector_home: Path) -> None:
    """Its package.json asks for node >= 22.19; its CLI works on this machine's node 20, which these tests prove."""
    proc = subprocess.run([inspector, "--cli", "--version"], capture_output=True, text=True, timeout=60, env=clean_env(HOME=str(inspector_home)))
    assert INSPECTOR_VERSION in proc.stdout + proc.stderr, (proc.stdout, proc.stderr)


def test_the_strict_check_is_live_a_type_array_is_reported(inspector: str, inspector_home: Path, tmp_path: Path) -> None:
    """The control: the same --strict run against a server whose output schema has a ``type`` array
    exits 0 (it is only a warning) but reports it, so the zero-findings assertions above can fail."""
    script = tmp_path / "control_server.py"
    script.write_text(CONTROL_SERVER)
    proc = run_inspector(inspector, inspector_home, "--method", "tools/list", "--strict", target=["--", sys.executable, str(script)])
    assert proc.returncode == 0, proc.stderr[-4000:]
    (finding,) = json.loads(proc.stdout)["schemaFindings"]
    assert finding["toolName"] == "value" and finding["findings"][0]["rule"] == "type-union", finding
    assert LINT_REPORT.search(proc.stderr), proc.stderr
