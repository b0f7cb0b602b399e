"""Being a good MCP citizen: short instructions and tool listings, and resources a client can list.

Every tools/list answer costs the model context on every turn, so it has a budget. Resources: besides
the two templates, each live session's notebook and output files are listed as concrete resources,
but only to the client they belong to.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from mcp import Client

from .conftest import Harness, make_settings, serving
from .conftest import http_server as serve_http

pytestmark = pytest.mark.anyio

# Measured at 4.5k characters for 8 tools, 6.55k for 10 (send_input and get_run's waiting questions added;
# name, title, description and input schema: what clients put in front of the model); the bound leaves
# room for a few more arguments, not for essays. 7.24k for 11 (fork_session; send_input's question_id;
# restart_session's restore), after every description was cut to one line.
MODEL_VISIBLE_BUDGET = 7_600
# Output schemas too (clients validate with them; most do not show them to the model). Measured at 21k, 34k
# since send_input (a third tool with ExecuteResult's output schema); 51.4k with fork_session and every answer's
# restore report, cost and question id (ExecuteResult 4.6k -> 5.7k of its own, three times over). 43.7k once the
# results' schemas were lean (lean_schema.py: no pydantic titles or defaults, every field and description kept);
# the rest is descriptions a client shows, ExecuteResult three times and SessionInfo six (no sharing across tools).
FULL_LISTING_BUDGET = 44_500
INSTRUCTIONS_BUDGET = 1_500
DESCRIPTION_BUDGET = 300


@pytest.fixture(scope="module")
async def fresh(short_tmp: Path) -> AsyncIterator[Harness]:
    """Its own server, so the resource listing starts empty."""
    async with serving(make_settings(short_tmp)) as h:
        yield h


async def test_instructions_are_short_and_say_the_essentials(fresh: Harness) -> None:
    instructions = fresh.client.instructions
    assert instructions and len(instructions) < INSTRUCTIONS_BUDGET
    for essential in ("persist", "`result`", "last expression", "session", "timeout", "Profile: standard"):
        assert essential in instructions, essential


async def test_tools_list_stays_within_its_budget(fresh: Harness) -> None:
    tools = (await fresh.client.list_tools()).tools
    visible = [{"name": t.name, "title": t.title, "description": t.description, "inputSchema": t.input_schema} for t in tools]
    visible_chars = len(json.dumps(visible))
    full_chars = len(json.dumps([t.model_dump(by_alias=True, mode="json", exclude_none=True) for t in tools]))
    assert visible_chars < MODEL_VISIBLE_BUDGET, f"{visible_chars} characters of tool listing shown to the model"
    assert full_chars < FULL_LISTING_BUDGET, f"{full_chars} characters of tools/list"
    for tool in tools:
        assert tool.description and len(tool.description) < DESCRIPTION_BUDGET, tool.name
        assert tool.title, tool.name
        for name, prop in tool.input_schema.get("properties", {}).items():
            assert prop.get("description"), f"{tool.name}.{name} has no description"


async def test_resource_templates_are_listed(fresh: Harness) -> None:
    templates = {t.uri_template for t in (await fresh.client.list_resource_templates()).resource_templates}
    assert templates >= {"kernelexec://sessions/{session}/files/{name}", "kernelexec://sessions/{session}/notebook.ipynb"}


def session_resources(listing: Any) -> list[Any]:
    """The listed resources that belong to sessions (not the run view's static ui:// page)."""
    return [r for r in listing.resources if str(r.uri).startswith("kernelexec://sessions/")]


async def test_each_live_sessions_notebook_and_files_are_listed_and_readable(fresh: Harness) -> None:
    assert session_resources(await fresh.client.list_resources()) == []  # no session yet (the run view's ui:// is static)
    first = await fresh.run("import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nresult = 'x' * 8000")
    other = await fresh.new_session()
    await fresh.run("print('hi')", session=other)

    listed = {str(r.uri): r for r in (await fresh.client.list_resources()).resources}
    for session in (first["session"], other):
        notebook = f"kernelexec://sessions/{session}/notebook.ipynb"
        assert listed[notebook].mime_type == "application/x-ipynb+json"
    produced = [out["uri"] for out in first["outputs"]] + [f"kernelexec://sessions/{first['session']}/files/{Path(first['result_file']).name}"]
    for uri in produced:
        assert uri in listed, uri
        assert listed[uri].size == Path(Path(first["notebook"]).parent / "outputs" / Path(uri).name).stat().st_size
    assert {listed[u].mime_type for u in produced} >= {"image/png"}

    for uri, _resource in listed.items():
        read = await fresh.client.read_resource(uri)
        assert read.contents, uri
    notebook = json.loads((await fresh.client.read_resource(f"kernelexec://sessions/{other}/notebook.ipynb")).contents[0].text)
    assert ["".join(c["source"]) for c in notebook["cells"]] == ["print('hi')"]


async def test_a_closed_session_is_no_longer_listed(fresh: Harness) -> None:
    gone = await fresh.new_session()
    await fresh.run("1", session=gone)
    assert any(gone in str(r.uri) for r in (await fresh.client.list_resources()).resources)
    await fresh.call("close_session", session=gone)
    assert not any(gone in str(r.uri) for r in (await fresh.client.list_resources()).resources)


@pytest.fixture(scope="module")
def http_server(short_tmp: Path) -> Iterator[str]:
    with serve_http(short_tmp / "citizen") as url:
        yield url


async def test_over_http_a_client_lists_only_its_own_sessions_resources(http_server: str) -> None:
    async with Client(http_server, mode="legacy") as alice, Client(http_server, mode="legacy") as bob, Client(http_server) as modern:
        a = (await alice.call_tool("execute_code", {"code": "1"})).structured_content["session"]
        b = (await bob.call_tool("execute_code", {"code": "2"})).structured_content["session"]
        m = (await modern.call_tool("execute_code", {"code": "3"})).structured_content["session"]
        alices = {str(r.uri) for r in (await alice.list_resources()).resources}
        assert f"kernelexec://sessions/{a}/notebook.ipynb" in alices
        assert not any(b in uri or m in uri for uri in alices)
        # a stateless (2026-07-28) client cannot be told apart from others, so it is shown no handles
        assert session_resources(await modern.list_resources()) == []


async def test_files_the_code_writes_are_listed_and_readable_but_planted_links_are_not(harness: Harness) -> None:
    s = await harness.new_session()
    await harness.run("open('report.csv', 'w').write('a,b\\n1,2\\n')", session=s)
    uris = [str(r.uri) for r in (await harness.client.list_resources()).resources]
    uri = f"kernelexec://sessions/{s}/work/report.csv"
    assert uri in uris
    assert (await harness.client.read_resource(uri)).contents[0].text == "a,b\n1,2\n"
    # a symlink the kernel plants must not make the server (root) read what it points at
    work = harness.sessions.sessions[s].dirs.work
    (work / "leak.txt").symlink_to("/etc/hostname")
    assert f"kernelexec://sessions/{s}/work/leak.txt" not in [str(r.uri) for r in (await harness.client.list_resources()).resources]
    from mcp.shared.exceptions import MCPError

    with pytest.raises(MCPError):
        await harness.client.read_resource(f"kernelexec://sessions/{s}/work/leak.txt")
