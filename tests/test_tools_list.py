"""The public surface pinned: ``tools/list`` of the server built with default settings, as a plain
MCP client sees it (names, titles, descriptions, input and output schemas, annotations, ``_meta``),
compared with the checked-in snapshot tests/snapshots/tools_list.json.

A change to a tool's surface is a deliberate act: rewrite the snapshot and commit it with the change,

    UPDATE_SNAPSHOTS=1 python -m pytest tests/test_tools_list.py

and review its diff (``git diff tests/snapshots/``) as the change clients will see. No kernel starts.
"""

from __future__ import annotations

import difflib
import json
import os
from pathlib import Path
from typing import Any

import pytest
from mcp import Client

from kernelexec.config import Settings
from kernelexec.server.build import build_server
from kernelexec.session.manager import SessionManager

pytestmark = pytest.mark.anyio

SNAPSHOT = Path(__file__).parent / "snapshots" / "tools_list.json"
SNAPSHOTS = {"stdio": SNAPSHOT, "http": SNAPSHOT.with_name("tools_list_http.json")}  # http adds upload_url
UPDATE = "UPDATE_SNAPSHOTS"


async def tools_list(state_dir: Path, transport: str = "stdio") -> list[dict[str, Any]]:
    settings = Settings(state_dir=state_dir, transport=transport)  # defaults: no flags; the environment is cleared by the test
    async with Client(build_server(settings, SessionManager(settings))) as client:
        listed = await client.list_tools()
    assert listed.next_cursor is None  # one page: the snapshot is the whole list
    return [tool.model_dump(mode="json", by_alias=True, exclude_none=True) for tool in listed.tools]


def as_text(tools: list[dict[str, Any]]) -> str:
    return json.dumps({"tools": tools}, indent=2, ensure_ascii=False) + "\n"


@pytest.mark.parametrize("transport", list(SNAPSHOTS))
async def test_tools_list_matches_the_snapshot(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, transport: str) -> None:
    for name in list(os.environ):
        if name.startswith("KERNELEXEC_"):  # a developer's own settings must not change the defaults' surface
            monkeypatch.delenv(name)
    snapshot = SNAPSHOTS[transport]
    actual = as_text(await tools_list(tmp_path, transport))
    assert str(tmp_path) not in actual  # nothing machine-specific in the surface

    if os.environ.get(UPDATE) == "1":
        snapshot.parent.mkdir(exist_ok=True)
        snapshot.write_text(actual, encoding="utf-8")
        return
    expected = snapshot.read_text(encoding="utf-8") if snapshot.exists() else ""
    if actual != expected:
        diff = "".join(difflib.unified_diff(expected.splitlines(keepends=True), actual.splitlines(keepends=True),
                                            f"tests/snapshots/{snapshot.name} (checked in)", "tools/list (this code)", n=2))
        pytest.fail(
            "tools/list differs from its snapshot: the tools' public surface (names, schemas, annotations) changed.\n"
            f"If the change is deliberate, rewrite the snapshot and commit it with the change:\n"
            f"    {UPDATE}=1 python -m pytest tests/test_tools_list.py\n"
            "then review `git diff tests/snapshots/` as what clients will see.\n\n" + diff[:20_000],
            pytrace=False,
        )


async def test_every_tool_has_a_title_a_description_annotations_and_an_object_input(tmp_path: Path) -> None:
    for tool in await tools_list(tmp_path, "http"):
        assert tool.get("title") and tool.get("description"), tool["name"]
        assert "annotations" in tool and tool["inputSchema"]["type"] == "object", tool["name"]
