"""The run view and lean answers without a browser: lean content for the model, and the run view's MCP Apps surface.

Real in-memory MCP clients against the real server: one without the Apps extension (as Claude Code
and every host that does not render Apps), one that negotiates it (as a host that renders the view).
"""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from mcp import Client
from mcp.client import advertise
from mcp.server.apps import APP_MIME_TYPE, EXTENSION_ID

from kernelexec.server.build import build_server
from kernelexec.server.view import APP_ONLY, VIEW_URI, view_html

from .conftest import Harness

pytestmark = pytest.mark.anyio

# a plot in both forms: an SVG beside the PNG is linked, not embedded
PLOT = ("%config InlineBackend.figure_formats = ['png', 'svg']\n"
        "import matplotlib.pyplot as plt\nfig, ax = plt.subplots()\nax.plot([1, 3, 2])\nplt.show()")
FRAME = "import pandas as pd\ndf = pd.DataFrame({'x': range(50), 'y': [i * i for i in range(50)]})\ndf"


@pytest.fixture(scope="module")
async def apps_client(harness: Harness) -> AsyncIterator[Client]:
    """A second client on the same server that negotiates MCP Apps."""
    server = build_server(harness.settings, harness.sessions)
    async with Client(server, extensions=[advertise(EXTENSION_ID, {"mimeTypes": [APP_MIME_TYPE]})]) as client:
        yield client


async def test_plot_answer_has_the_image_and_a_link_not_the_svg_text(harness: Harness) -> None:
    result = await harness.client.call_tool("execute_code", {"code": PLOT})
    kinds = [c.type for c in result.content]
    assert kinds.count("image") == 1 and "resource" not in kinds
    image = next(c for c in result.content if c.type == "image")
    assert base64.b64decode(image.data).startswith(b"\x89PNG") and image.annotations.audience == ["user", "assistant"]
    link = next(c for c in result.content if c.type == "resource_link")
    svg = next(o for o in result.structured_content["outputs"] if o["mime_type"] == "image/svg+xml")
    assert (link.uri, link.mime_type, link.size) == (svg["uri"], "image/svg+xml", svg["size"])
    assert link.annotations.audience == ["user"]
    text = "".join(c.text for c in result.content if c.type == "text")
    assert "<svg" not in text and "<svg" not in json.dumps([c.model_dump(mode="json") for c in result.content if c.type != "image"])
    assert svg["uri"] in text  # the model still has the URI, and the whole file stays readable
    assert "<svg" in (await harness.client.read_resource(svg["uri"])).contents[0].text


async def test_dataframe_answer_has_its_text_and_no_embedded_html(harness: Harness) -> None:
    result = await harness.client.call_tool("execute_code", {"code": FRAME})
    assert [c.type for c in result.content] == ["text", "resource_link"]
    text = result.content[0].text
    assert "49  49  2401" in text and "<table" not in text and "<td>" not in text
    assert result.content[1].mime_type == "text/html"
    html = next(o for o in result.structured_content["outputs"] if o["mime_type"] == "text/html")
    assert "<table" in Path(html["path"]).read_text()  # structured content keeps everything
    displayed = await harness.client.call_tool("execute_code", {"code": "display(df)"})
    assert [c.type for c in displayed.content] == ["text", "resource_link"]
    assert "<kernelexec-display>" in displayed.content[0].text and "2401" in displayed.content[0].text


async def test_html_with_no_other_form_is_still_embedded_within_budget(harness: Harness) -> None:
    small = await harness.client.call_tool("execute_code", {"code": "from IPython.display import HTML\nHTML('<b>bold</b>')"})
    embedded = [c for c in small.content if c.type == "resource"]
    assert len(embedded) == 1 and embedded[0].resource.text == "<b>bold</b>"
    big = await harness.client.call_tool("execute_code", {"code": "HTML('<p>' + 'x' * 20000 + '</p>')"})
    assert [c.type for c in big.content] == ["text", "resource_link"]


async def test_print_answer_is_unchanged_text(harness: Harness) -> None:
    result = await harness.client.call_tool("execute_code", {"code": "print('plain')"})
    assert [c.type for c in result.content] == ["text"] and "<kernelexec-stdout>\nplain\n</kernelexec-stdout>" in result.content[0].text


async def test_app_only_tools_are_hidden_from_a_client_without_apps(harness: Harness) -> None:
    tools = {t.name: t for t in (await harness.client.list_tools()).tools}
    assert not set(APP_ONLY) & set(tools)
    assert tools["execute_code"].meta["ui"]["resourceUri"] == VIEW_URI  # hosts without Apps ignore it
    assert tools["get_run"].meta["ui"]["resourceUri"] == VIEW_URI
    handle = (await harness.run("x = 1"))["session"]
    refused = await harness.client.call_tool("view_restart", {"session": handle})
    assert refused.is_error and "Unknown tool" in refused.content[0].text
    assert (await harness.run("x", session=handle))["result"] == 1  # nothing was restarted


async def test_a_client_with_apps_gets_the_view_and_app_only_tools(harness: Harness, apps_client: Client) -> None:
    tools = {t.name: t for t in (await apps_client.list_tools()).tools}
    for name in APP_ONLY:
        assert tools[name].meta["ui"] == {"resourceUri": VIEW_URI, "visibility": ["app"]}
    read = (await apps_client.read_resource(VIEW_URI)).contents[0]
    assert read.mime_type == APP_MIME_TYPE and read.text == view_html()
    assert "Content-Security-Policy" in read.text and "connect-src 'none'" in read.text
    assert "<script src" not in read.text and "<link" not in read.text  # self-contained


async def test_view_table_pages_and_sorts_a_dataframe(harness: Harness, apps_client: Client) -> None:
    ran = await harness.run(FRAME)
    handle = ran["session"]
    page = (await apps_client.call_tool("view_table", {"session": handle, "name": "df", "page": 1, "page_size": 20})).structured_content
    assert (page["total_rows"], page["pages"], page["columns"]) == (50, 3, ["x", "y"])
    assert page["rows"][0] == ["20", "20", "400"] and len(page["rows"]) == 20
    last = (await apps_client.call_tool("view_table", {"session": handle, "name": "df", "page": 0, "page_size": 5,
                                                       "sort_column": 1, "descending": True})).structured_content
    assert last["rows"][0] == ["49", "49", "2401"]
    for bad in ({"name": "df.__class__"}, {"name": "pd"}, {"name": "nope"}):
        refused = await apps_client.call_tool("view_table", {"session": handle, **bad})
        assert refused.is_error
    assert (await harness.run("len(df)", session=handle))["execution_count"] == ran["execution_count"] + 1  # fetches are not cells
    variables = (await apps_client.call_tool("view_variables", {"session": handle})).structured_content["variables"]
    assert "df" in {v["name"] for v in variables}
