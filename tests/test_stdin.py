"""input() and getpass() in a cell, answered by the human through MCP elicitation (a real client's callback),
worded by the server; declined or unaskable → EOFError in the cell, the kernel usable after."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from mcp import Client
from mcp_types import ElicitResult

from kernelexec.server import build_server
from kernelexec.sessions import SessionManager

from .conftest import make_settings

pytestmark = pytest.mark.anyio


class Human:
    """An elicitation callback that records what it was asked and answers from a script."""

    def __init__(self, *answers: tuple[str, str | None]) -> None:
        self.answers = list(answers)
        self.asked: list[str] = []

    async def __call__(self, context: Any, params: Any) -> ElicitResult:
        self.asked.append(params.message)
        action, value = self.answers.pop(0)
        return ElicitResult(action=action, content={"answer": value} if value is not None else None)  # type: ignore[arg-type]


@pytest.mark.parametrize("profile", ["standard", "strict"])
async def test_input_and_getpass_are_asked_of_the_human_and_recorded(profile: str, short_tmp: Path) -> None:
    settings = make_settings(short_tmp, profile=profile, pool_size=0, restart_spares=0)
    human = Human(("accept", "Ada"), ("accept", "s3cret"), ("decline", None))
    async with SessionManager(settings).running() as sessions:
        async with Client(build_server(settings, sessions), mode="legacy", elicitation_callback=human) as client:
            r: Any = (await client.call_tool("execute_code", {"code": "name = input('Your name? ')\nname"})).structured_content
            assert r["result"] == "Ada", r
            r = (await client.call_tool("execute_code", {"code": "import getpass\np = getpass.getpass('Token: ')\nlen(p)"})).structured_content
            assert r["result"] == 6, r
            r = (await client.call_tool("execute_code", {"code": "input('again? ')"})).structured_content
            assert not r["success"] and r["error_type"] == "EOFError", r
            r = (await client.call_tool("execute_code", {"code": "1 + 1"})).structured_content
            assert r["result"] == 2, r  # the kernel stays usable
            notebook = json.loads(Path(r["notebook"]).read_text())
    assert "session" in human.asked[0] and "not from the assistant" in human.asked[0] and "Your name?" in human.asked[0]
    assert "password" in human.asked[1] and "***" in human.asked[1]
    recorded = [c["metadata"]["kernelexec"].get("inputs") for c in notebook["cells"] if c["cell_type"] == "code"]
    assert recorded[0][0]["answer"] == "Ada" and recorded[1][0]["answer"] == "***", recorded
    assert "s3cret" not in json.dumps(notebook)


async def test_a_client_without_elicitation_gets_a_clear_eof(short_tmp: Path) -> None:
    settings = make_settings(short_tmp, pool_size=0, restart_spares=0)
    async with SessionManager(settings).running() as sessions:
        async with Client(build_server(settings, sessions), mode="legacy") as client:
            r: Any = (await client.call_tool("execute_code", {"code": "input('x? ')"})).structured_content
    assert not r["success"] and r["error_type"] in ("StdinNotImplementedError", "EOFError"), r
