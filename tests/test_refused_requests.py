"""A refused request keeps nothing and says why: no session place held by a new_session that failed, no bare
"Error executing tool" for a handle or a file name too long for the file system (each red before its fix)."""

from __future__ import annotations

from pathlib import Path

import pytest

from .support import make_settings, serving

pytestmark = pytest.mark.anyio


async def test_new_session_with_a_bad_working_dir_gives_its_place_back(short_tmp: Path) -> None:
    """new_session(working_dir=<missing>) reserved a session (create) before open() refused the directory, and never
    gave it back: two typos on a --max-sessions 2 server and no client could open a session (until --idle-timeout)."""
    root = short_tmp / "rt49-root"
    (root / "sub").mkdir(parents=True, exist_ok=True)
    async with serving(make_settings(short_tmp, max_sessions=2, pool_size=0, work_roots=[str(root)])) as h:
        for bad in ("/nonexistent-rt49", str(root / "missing"), "/usr"):
            refused = await h.client.call_tool("new_session", {"working_dir": bad})
            assert refused.is_error and "working_dir" in refused.content[0].text, refused.content
        assert not h.sessions.sessions, list(h.sessions.sessions)
        made = await h.client.call_tool("new_session", {"working_dir": str(root / "sub")})
        assert not made.is_error and made.structured_content["working_dir"] == str((root / "sub").resolve()), made
        assert await h.new_session()


@pytest.mark.parametrize("tool", ["execute_code", "list_variables", "restart_session", "fork_session"])
async def test_a_session_handle_too_long_for_a_file_name_is_an_unknown_session(short_tmp: Path, tool: str) -> None:
    """A handle longer than a file name may be (255 bytes) reached ``(sessions_dir / handle).is_dir()`` in
    SessionManager.lookup, whose OSError (ENAMETOOLONG) left the call as a bare "Error executing tool X", no reason."""
    async with serving(make_settings(short_tmp)) as h:
        args = {"code": "1"} if tool == "execute_code" else {}
        refused = await h.client.call_tool(tool, {**args, "session": "a" * 300})
        assert refused.is_error and "unknown session" in refused.content[0].text, refused.content


async def test_a_resource_uri_with_a_name_too_long_is_not_found(short_tmp: Path) -> None:
    """resources/read of a session's notebook or files/ with a handle or name longer than a file name may be answered
    "Error creating resource from template …" (an OSError from is_dir/is_file), not that no such resource exists."""
    from mcp.shared.exceptions import MCPError

    async with serving(make_settings(short_tmp)) as h:
        handle = await h.new_session()
        for uri in (f"kernelexec://sessions/{'a' * 300}/notebook.ipynb", f"kernelexec://sessions/{handle}/files/{'a' * 300}"):
            with pytest.raises(MCPError) as refused:
                await h.client.read_resource(uri)
            assert "Error creating resource" not in str(refused.value) and ("unknown session" in str(refused.value)
                                                                            or "no file" in str(refused.value)), refused.value
