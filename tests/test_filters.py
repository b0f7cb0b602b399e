"""One filter per direction (issue 30, invariant 4), attacked from outside.

Toward the human: a cell's hostile text (terminal escapes, a right-to-left override, line/paragraph separators,
zero-width characters, a screenful of blank lines) reaches the client's elicitation dialog, progress
notifications, the running / awaiting_input answers and the final answer only made visible (display.py).
Toward the kernel and the record: an upstream that sends its configured secret back — in an isError result, a
text result, structured content — never gets it into the cell, the answer, the journal or the notebook.
"""

from __future__ import annotations

import json
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client
from mcp_types import ElicitResult

from kernelexec.server.build import build_server
from kernelexec.session.manager import SessionManager

from .conftest import make_settings, serving

pytestmark = pytest.mark.anyio

UPSTREAM = Path(__file__).resolve().parent / "codemode_upstream.py"

# the hostile text, written as Python escapes in the cell (the code itself stays plain)
HOSTILE = r"'cr\r\x1b]0;pwned\x07\x1b[2J \u202eevil\u2066 zero\u200bwidth\u2028sep\u2029para\x85nel' + '\n' * 40 + 'END'"
RAW = ["\x1b", "\x07", "\u202e", "\u2066", "\u200b", "\u2028", "\u2029", "\x85", "\r"]


def assert_defanged(text: str, where: str) -> None:
    found = [hex(ord(c)) for c in RAW if c in text]
    assert not found, f"{where}: raw {found} in {text!r}"
    assert "\n\n\n" not in text, f"{where}: a run of blank lines in {text!r}"


def assert_visible(text: str, where: str) -> None:
    assert "\\u202e" in text and "\\x1b" in text and "END" in text, f"{where}: the hostile text is not shown: {text!r}"


class Human:
    def __init__(self) -> None:
        self.asked: list[str] = []

    async def __call__(self, context: Any, params: Any) -> ElicitResult:
        self.asked.append(params.message)
        return ElicitResult(action="accept", content={"answer": "fine"})


# --- the rule itself ------------------------------------------------------------------------------------------
def test_display_makes_every_hiding_or_acting_character_visible_and_bounds_the_text() -> None:
    from kernelexec.display import display

    shown = display("a\x1b[31mb\u202ec\u2028d\r\ne\x00f\x85g\U000e0041h\ud800\u00e9\tz" + "\n" * 40 + "end")
    assert shown == "a\\x1b[31mb\\u202ec\nd\ne\\x00f\ngh".replace("gh", "g\\U000e0041h\\ud800\u00e9\tz\n\nend"), shown
    assert display("plain text\n\tindented") == "plain text\n\tindented"
    long = display("x" * 10_000, 1_000)
    assert len(long) < 1_100 and "characters cut" in long
    assert display(display("\u202e\x1b" + "\n" * 9)) == display("\u202e\x1b" + "\n" * 9)  # idempotent


def test_an_approval_question_shows_an_upstreams_hostile_tool_name_escaped() -> None:
    from kernelexec.codemode.broker import approval_message

    question = approval_message("srv", "pay\u202e\u2028", {"to": "\u2066x\u2028"}, "*")
    assert question is not None
    assert_defanged(question, "approval")
    assert "\\u202e" in question


def test_the_run_views_table_cells_are_escaped() -> None:
    from kernelexec.server.view import parse_page

    page = json.dumps({"columns": ["a\u202e"], "rows": [["\x1b[2J" + "\n" * 40 + "x"]], "total": 1, "index_name": "\u2028"})
    found = parse_page(repr(page))
    assert_defanged(json.dumps(found, ensure_ascii=False), "view")


# --- from outside: what the client receives -------------------------------------------------------------------
async def test_an_input_prompt_reaches_the_elicitation_dialog_made_visible(short_tmp: Path) -> None:
    settings = make_settings(short_tmp, pool_size=0, restart_spares=0)
    human = Human()
    async with SessionManager(settings).running() as sessions:
        async with Client(build_server(settings, sessions), mode="legacy", elicitation_callback=human) as client:
            r: Any = (await client.call_tool("execute_code", {"code": f"input({HOSTILE})"})).structured_content
            assert r["result"] == "fine", r
    assert len(human.asked) == 1
    assert_defanged(human.asked[0], "elicitation message")
    assert_visible(human.asked[0], "elicitation message")


async def test_progress_running_and_final_answers_show_hostile_output_made_visible(short_tmp: Path) -> None:
    async with serving(make_settings(short_tmp, yield_after=2, pool_size=0, restart_spares=0)) as h:
        # the kernel started first: the 2 s before the call yields are the cell's, not a cold start's on a busy machine
        warm: Any = (await h.client.call_tool("execute_code", {"code": "import time"})).structured_content
        if warm["ending"] == "running":
            await h.client.call_tool("get_run", {"run_id": warm["run_id"], "wait_s": 60})
        progress: list[str] = []

        async def on_progress(done: float, total: float | None, message: str | None) -> None:
            progress.append(message or "")

        code = f"import time\nprint({HOSTILE}, flush=True)\ntime.sleep(0.8)\nprint('more', flush=True)\ntime.sleep(3)\n'done'"
        first = await h.client.call_tool("execute_code", {"code": code}, progress_callback=on_progress)
        s: Any = first.structured_content
        assert s["ending"] == "running", s
        told = [m for m in progress if "END" in m]
        assert told, progress
        for message in progress:
            assert_defanged(message, "progress notification")
        running = first.content[0].text + json.dumps(s, ensure_ascii=False)  # type: ignore[union-attr]
        assert_defanged(running, "running answer")
        assert_visible(running, "running answer")
        final = await h.client.call_tool("get_run", {"run_id": s["run_id"], "wait_s": 30})
        assert final.structured_content["result"] == "done", final  # type: ignore[index]
        text = final.content[0].text  # type: ignore[union-attr]
        assert_defanged(text, "final answer's text")
        assert "\\u202e" in text and "END" in text, text  # (the collector drops ANSI escapes from the record itself)


async def test_an_awaiting_input_answer_shows_the_prompt_made_visible(short_tmp: Path) -> None:
    async with serving(make_settings(short_tmp, pool_size=0, restart_spares=0)) as h:
        asked = await h.client.call_tool("execute_code", {"code": f"input({HOSTILE})"})
        s: Any = asked.structured_content
        assert s["ending"] == "awaiting_input", s
        shown = asked.content[0].text + json.dumps(s, ensure_ascii=False)  # type: ignore[union-attr]
        assert_defanged(shown, "awaiting_input answer")
        assert "\\u202e" in shown
        await h.client.call_tool("send_input", {"run_id": s["run_id"], "cancel": True})


# --- toward the kernel and the record: the upstream's secret ---------------------------------------------------
SECRET = "kx-upstream-secret-7f3a91"


@pytest.fixture(scope="module")
def leaky_config() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="kxleak") as folder:
        path = Path(folder) / "tools.json"
        path.write_text(json.dumps({"mcpServers": {"local": {
            "command": sys.executable, "args": [str(UPSTREAM), "stdio", "local"], "env": {"UPSTREAM_SECRET": SECRET}}}}))
        yield path


async def test_an_upstreams_secret_never_reaches_the_cell_the_answer_or_the_record(short_tmp: Path, leaky_config: Path) -> None:
    settings = make_settings(short_tmp, pool_size=0, restart_spares=0, tools_config=str(leaky_config))
    code = ("import mcp_tools\nout = []\n"
            "try:\n    mcp_tools.local.leak_error()\nexcept Exception as exc:\n    out.append(str(exc))\n"
            "out.append(mcp_tools.local.leak_text())\n"
            "out.append(mcp_tools.local.leak_structured())\n"
            "print(out)\nout")
    async with serving(settings) as h:
        answer = await h.client.call_tool("execute_code", {"code": code})
        s: Any = answer.structured_content
        assert s["success"], repr(answer.content[0].text)  # type: ignore[union-attr]
        everything = json.dumps(s) + answer.content[0].text  # type: ignore[union-attr]
        assert "***" in everything and "upstream failed while using key" in everything, everything  # the calls were made
        assert SECRET not in everything, everything
        session_dir = Path(s["notebook"]).parent
        journal = (session_dir / "journal.jsonl").read_text()
        assert "leak_structured" in journal  # the calls are recorded
        leaked = [str(p) for p in session_dir.rglob("*") if p.is_file() and SECRET.encode() in p.read_bytes()]
        assert leaked == [], leaked
    await anyio.sleep(0)
