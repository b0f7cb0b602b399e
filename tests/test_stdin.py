"""input() and getpass() in a cell, answered by the human through MCP elicitation (a real client's callback),
worded by the server; declined or unaskable → EOFError in the cell, the kernel usable after. input() is a form;
getpass() only ever a URL-mode elicitation to its one-time page (typed here over plain HTTP; in Chromium in
tests/test_secret_page.py), and without URL mode an EOFError in the cell."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from mcp import Client
from mcp_types import ElicitRequestURLParams, ElicitResult

from kernelexec.server.build import build_server
from kernelexec.session.manager import SessionManager

from .conftest import make_settings

pytestmark = pytest.mark.anyio


async def type_on_page(url: str, secret: str) -> None:
    """A human at a getpass() page, over plain HTTP: open it once, send its form with the secret."""
    async with httpx2.AsyncClient() as browser:
        page = await browser.get(url)
        assert page.status_code == 200, page.status_code
        token = page.text.split('name=token value="', 1)[1].split('"', 1)[0]
        sent = await browser.post(url, data={"token": token, "secret": secret})
        assert sent.status_code == 200, sent.status_code


class Human:
    """An elicitation callback that records what it was asked and answers from a script; a URL-mode elicitation (a
    getpass() page) it accepts by typing the scripted value on the page, or declines."""

    def __init__(self, *answers: tuple[str, str | None]) -> None:
        self.answers = list(answers)
        self.asked: list[str] = []
        self.urls: list[str] = []

    async def __call__(self, context: Any, params: Any) -> ElicitResult:
        self.asked.append(params.message)
        action, value = self.answers.pop(0)
        if isinstance(params, ElicitRequestURLParams):
            self.urls.append(params.url)
            if action == "accept" and value is not None:
                await type_on_page(params.url, value)
            return ElicitResult(action=action)  # type: ignore[arg-type]
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
    assert "password" in human.asked[1] and "***" in human.asked[1] and len(human.urls) == 1  # getpass: its page
    recorded = [c["metadata"]["kernelexec"].get("inputs") for c in notebook["cells"] if c["cell_type"] == "code"]
    assert recorded[0][0]["answer"] == "Ada" and recorded[1][0]["answer"] == "***", recorded
    assert "s3cret" not in json.dumps(notebook)


async def test_a_client_without_elicitation_gets_awaiting_input_and_answers_with_send_input(short_tmp: Path) -> None:
    settings = make_settings(short_tmp, pool_size=0, restart_spares=0)
    async with SessionManager(settings).running() as sessions:
        async with Client(build_server(settings, sessions), mode="legacy") as client:
            first = await client.call_tool("execute_code", {"code": "print('before')\nname = input('Your name? ')\nf'hi {name}'"})
            r: Any = first.structured_content
            assert r["ending"] == "awaiting_input" and r["input_prompt"] == "Your name? " and r["input_password"] is False, r
            assert "send_input" in first.content[0].text and "not from the user" in first.content[0].text  # type: ignore[union-attr]
            looked: Any = (await client.call_tool("get_run", {"run_id": r["run_id"], "wait_s": 0})).structured_content
            assert looked["ending"] == "awaiting_input", looked  # the run waits, get_run says so
            assert r["question_id"] and r["question_id"] in first.content[0].text, r  # type: ignore[union-attr]
            sent = await client.call_tool("send_input", {"run_id": r["run_id"], "question_id": r["question_id"], "text": "Ada"})
            done: Any = sent.structured_content
            assert done["result"] == "hi Ada" and "before" in done["stdout"] and done["run_id"] == r["run_id"], done
            assert "input sent" in sent.content[0].text  # type: ignore[union-attr]
            again = await client.call_tool("send_input", {"run_id": r["run_id"], "question_id": r["question_id"], "text": "late"})
            assert again.is_error and "already answered" in again.content[0].text  # type: ignore[union-attr]

            # getpass() is never a question for the model: without URL-mode elicitation the cell's getpass raises
            done = (await client.call_tool("execute_code", {"code": "import getpass\ngetpass.getpass('Token: ')"})).structured_content
            assert done["ending"] == "completed" and done["error_type"] == "EOFError" and "--secret" in done["error"], done
            r = (await client.call_tool("execute_code", {"code": "input('again? ')", "background": True})).structured_content
            done = (await client.call_tool("get_run", {"run_id": r["run_id"], "wait_s": 30})).structured_content
            assert done["ending"] == "awaiting_input" and done["input_prompt"] == "again? ", done  # a background run asks too
            done = (await client.call_tool("send_input", {"run_id": r["run_id"], "question_id": done["question_id"],
                                                          "text": None})).structured_content
            assert done["error_type"] == "EOFError", done
            r = (await client.call_tool("execute_code", {"code": "1 + 1"})).structured_content
            assert r["result"] == 2, r  # the kernel stays usable
            notebook = json.loads(Path(r["notebook"]).read_text())
    recorded = [c["metadata"]["kernelexec"].get("inputs") for c in notebook["cells"] if c["cell_type"] == "code"]
    assert recorded[0] == [{"prompt": "Your name? ", "password": False, "answered": True, "answer": "Ada"}], recorded
    assert recorded[1][0]["answered"] is False and recorded[1][0]["password"] is True, recorded
    assert any("refused" in n for n in done_notes(notebook, 1)), notebook


def done_notes(notebook: dict[str, Any], index: int) -> list[str]:
    cells = [c for c in notebook["cells"] if c["cell_type"] == "code"]
    return list(cells[index]["metadata"]["kernelexec"].get("notes") or [])


async def test_an_unanswered_question_ends_at_the_cells_timeout(short_tmp: Path) -> None:
    settings = make_settings(short_tmp, pool_size=0, restart_spares=0)
    async with SessionManager(settings).running() as sessions:
        async with Client(build_server(settings, sessions), mode="legacy") as client:
            r: Any = (await client.call_tool("execute_code", {"code": "input('q? ')", "timeout": 3})).structured_content
            assert r["ending"] == "awaiting_input", r
            await anyio.sleep(3.5)  # nobody answers
            done: Any = (await client.call_tool("get_run", {"run_id": r["run_id"], "wait_s": 30})).structured_content
            assert not done["success"] and done["error_type"] == "EOFError", done
            assert any("timeout" in n for n in done["notes"]), done
            r = (await client.call_tool("execute_code", {"code": "2 + 2"})).structured_content
            assert r["result"] == 4, r


async def test_a_warm_kernels_question_unanswered_ends_its_cell_by_eof_error_before_the_timeout_interrupts(short_tmp: Path) -> None:
    """An unanswered question is declined QUESTION_MARGIN before the cell's timeout: the cell ends by the EOFError
    it is sent, not by the timeout's interrupt (on a warm kernel the two came within milliseconds, and a
    KeyboardInterrupt could land first). A cell that goes on past its EOFError is still stopped at its timeout."""
    settings = make_settings(short_tmp, pool_size=0, restart_spares=0)
    async with SessionManager(settings).running() as sessions:
        async with Client(build_server(settings, sessions), mode="legacy") as client:
            await client.call_tool("execute_code", {"code": "import time"})  # warm: the run starts as its cell is sent
            for _ in range(3):
                r: Any = (await client.call_tool("execute_code", {"code": "input('q? ')", "timeout": 2})).structured_content
                assert r["ending"] == "awaiting_input", r
                await anyio.sleep(1.5)  # nobody answers
                done: Any = (await client.call_tool("get_run", {"run_id": r["run_id"], "wait_s": 30})).structured_content
                assert done["error_type"] == "EOFError" and done["ending"] == "completed", done
                assert not done["timed_out"], done
            code = "try:\n    input('q? ')\nexcept EOFError:\n    time.sleep(30)"
            r = (await client.call_tool("execute_code", {"code": code, "timeout": 2})).structured_content
            await anyio.sleep(1.5)
            done = (await client.call_tool("get_run", {"run_id": r["run_id"], "wait_s": 30})).structured_content
            assert done["timed_out"] and done["ending"] == "interrupted" and done["duration_ms"] < 6_000, done
            r = (await client.call_tool("execute_code", {"code": "2 + 2"})).structured_content
            assert r["result"] == 4, r


async def test_interrupt_stops_a_cell_waiting_for_input(short_tmp: Path) -> None:
    settings = make_settings(short_tmp, pool_size=0, restart_spares=0)
    async with SessionManager(settings).running() as sessions:
        async with Client(build_server(settings, sessions), mode="legacy") as client:
            r: Any = (await client.call_tool("execute_code", {"code": "input('q? ')"})).structured_content
            assert r["ending"] == "awaiting_input", r
            await client.call_tool("interrupt", {"session": r["session"]})
            with anyio.fail_after(20):
                done: Any = (await client.call_tool("get_run", {"run_id": r["run_id"], "wait_s": 15})).structured_content
            assert not done["success"] and done["error_type"] in ("KeyboardInterrupt", "EOFError"), done
            r = (await client.call_tool("execute_code", {"code": "input('again? ')"})).structured_content
            assert r["ending"] == "awaiting_input", r  # no stale answer left behind
            done = (await client.call_tool("send_input", {"run_id": r["run_id"], "question_id": r["question_id"],
                                                          "text": "yes"})).structured_content
            assert done["result"] == "yes", done


async def test_the_plugin_preset_has_no_send_input_so_a_question_it_cannot_elicit_is_eof_at_once(short_tmp: Path) -> None:
    settings = make_settings(short_tmp, pool_size=0, restart_spares=0, preset="plugin")
    async with SessionManager(settings).running() as sessions:
        async with Client(build_server(settings, sessions), mode="legacy") as client:
            assert [t.name for t in (await client.list_tools()).tools] == ["execute_code"]
            with anyio.fail_after(30):
                r: Any = (await client.call_tool("execute_code", {"code": "input('x? ')"})).structured_content
    assert not r["success"] and r["error_type"] == "EOFError" and r["ending"] == "completed", r


async def test_run_python_keeps_its_contract_and_gets_eof_without_elicitation(short_tmp: Path) -> None:
    settings = make_settings(short_tmp, pool_size=0, restart_spares=0)
    async with SessionManager(settings).running() as sessions:
        async with Client(build_server(settings, sessions), mode="legacy") as client:
            r = await client.call_tool("run_python", {"code": "input('x? ')"})
    assert r.is_error and "EOFError" in r.content[0].text  # type: ignore[union-attr]


async def test_the_2026_protocol_asks_through_input_required_and_resumes_the_run(short_tmp: Path) -> None:
    """The SDK's default (2026-07-28) client: no back-channel, so the call returns an InputRequiredResult; the SDK
    client asks its elicitation callback and retries with input_responses + request_state; the cell is not run again."""
    settings = make_settings(short_tmp, pool_size=0, restart_spares=0)
    human = Human(("accept", "Ada"), ("accept", "s3cret"), ("decline", None))
    async with SessionManager(settings).running() as sessions:
        async with Client(build_server(settings, sessions), elicitation_callback=human) as client:
            assert client.protocol_version >= "2026-07-28"  # no server-to-client requests: ctx.elicit cannot work
            code = "import itertools\ncount = globals().setdefault('count', itertools.count())\nn = next(count)\nname = input('Your name? ')\n(n, name)"
            r: Any = (await client.call_tool("execute_code", {"code": code})).structured_content
            assert r["result"] == [0, "Ada"], r  # run once: the retry did not run the cell again
            r = (await client.call_tool("execute_code", {"code": "import getpass\nlen(getpass.getpass('Token: '))"})).structured_content
            assert r["result"] == 6, r
            r = (await client.call_tool("execute_code", {"code": "input('again? ')"})).structured_content
            assert not r["success"] and r["error_type"] == "EOFError", r
            r = (await client.call_tool("execute_code", {"code": "next(count)"})).structured_content
            assert r["result"] == 1, r
            notebook = json.loads(Path(r["notebook"]).read_text())
    assert len(human.asked) == 3
    assert "session" in human.asked[0] and "not from the assistant" in human.asked[0] and "Your name?" in human.asked[0]
    assert "password" in human.asked[1]
    assert "s3cret" not in json.dumps(notebook)


async def test_replay_feeds_the_recorded_answers_and_asks_on_its_terminal_with_ask(short_tmp: Path, tmp_path: Path) -> None:
    """Recorded live through a real client (answers Ada, a secret, then declined), replayed by `kernelexec replay`:
    the recorded answer is fed back (same output), the password (recorded as ***) cannot be (EOFError, a note),
    the declined one gets EOFError again; with --ask each question is asked on replay's own terminal."""
    import subprocess

    from .conftest import clean_env, kernelexec_cmd

    settings = make_settings(short_tmp, pool_size=0, restart_spares=0)
    human = Human(("accept", "Ada"), ("accept", "s3cret"), ("decline", None))
    async with SessionManager(settings).running() as sessions:
        async with Client(build_server(settings, sessions), mode="legacy", elicitation_callback=human) as client:
            r: Any = (await client.call_tool("execute_code", {"code": "name = input('Your name? ')\nprint('hi', name)"})).structured_content
            await client.call_tool("execute_code", {"code": "import getpass\nprint(len(getpass.getpass('Token: ')))"})
            await client.call_tool("execute_code", {"code": "try:\n    input('again? ')\nexcept EOFError:\n    print('no answer')"})
    notebook = tmp_path / "asked.ipynb"
    notebook.write_text(Path(r["notebook"]).read_text())
    env = clean_env()
    fed = subprocess.run(kernelexec_cmd("replay", str(notebook), "--state-dir", str(short_tmp / "rp1"), "-o", str(tmp_path / "fed.ipynb")),
                         capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env, stdin=subprocess.DEVNULL)
    assert fed.returncode == 1, (fed.stdout, fed.stderr)  # the getpass cell differs: its answer was never recorded
    lines = fed.stdout.splitlines()
    cell1 = next(line for line in lines if "name = input" in line)
    cell2 = next(i for i, line in enumerate(lines) if "import getpass" in line)
    assert "same" in cell1, fed.stdout
    assert "DIFFERENT" in lines[cell2] and "recorded as ***" in fed.stdout, fed.stdout
    assert "after a later cell's display update" not in fed.stdout, fed.stdout
    assert "no answer" not in "\n".join(lines[:cell2])
    assert "3 cells: 2 same, 1 different" in fed.stdout, fed.stdout
    # --ask: replay asks on its own terminal (stdin here: start_new_session drops any controlling tty, so getpass reads it too)
    asked = subprocess.run(kernelexec_cmd("replay", str(notebook), "--ask", "--state-dir", str(short_tmp / "rp2"), "-o",
                                          str(tmp_path / "asked-out.ipynb")),
                           input="Bob\nsecret\n", capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env,
                           start_new_session=True)
    assert "cell 1 asks through input(): Your name?" in asked.stdout, (asked.stdout, asked.stderr)
    assert "cell 2 asks through getpass(): Token:" in asked.stdout, asked.stdout
    out = json.loads((tmp_path / "asked-out.ipynb").read_text())
    code = [c for c in out["cells"] if c["cell_type"] == "code"]
    assert "hi Bob" in "".join(code[0]["outputs"][0]["text"]) and "6" in "".join(code[1]["outputs"][0]["text"]), code
    assert "no answer" in "".join(code[2]["outputs"][0]["text"])  # input ended: EOFError


async def test_an_elicitation_left_unanswered_ends_at_the_cells_timeout(short_tmp: Path) -> None:
    settings = make_settings(short_tmp, pool_size=0, restart_spares=0)

    async def away(context: Any, params: Any) -> ElicitResult:
        await anyio.sleep(3600)  # the human never answers
        raise AssertionError

    async with SessionManager(settings).running() as sessions:
        async with Client(build_server(settings, sessions), mode="legacy", elicitation_callback=away) as client:
            with anyio.fail_after(30):
                r: Any = (await client.call_tool("execute_code", {"code": "input('q? ')", "timeout": 3})).structured_content
            assert not r["success"] and r["error_type"] == "EOFError", r


async def test_the_2026_protocol_asks_two_questions_of_one_cell_in_two_rounds(short_tmp: Path) -> None:
    settings = make_settings(short_tmp, pool_size=0, restart_spares=0)
    human = Human(("accept", "Ada"), ("accept", "Lovelace"))
    async with SessionManager(settings).running() as sessions:
        async with Client(build_server(settings, sessions), elicitation_callback=human) as client:
            r: Any = (await client.call_tool("execute_code", {"code": "input('First? ') + ' ' + input('Last? ')"})).structured_content
    assert r["result"] == "Ada Lovelace", r
    assert "First?" in human.asked[0] and "Last?" in human.asked[1]


async def test_an_elicitation_in_flight_when_the_call_yields_waits_on_the_run_for_send_input(short_tmp: Path) -> None:
    """A legacy client's human has the question open when the call yields (--yield-after): the answer says
    awaiting_input with the prompt (not running), get_run says so too, and send_input answers it."""
    settings = make_settings(short_tmp, pool_size=0, restart_spares=0, yield_after=2)
    asked = anyio.Event()

    async def away(context: Any, params: Any) -> ElicitResult:
        asked.set()
        await anyio.sleep(3600)  # the human has not answered yet
        raise AssertionError

    async with SessionManager(settings).running() as sessions:
        async with Client(build_server(settings, sessions), mode="legacy", elicitation_callback=away) as client:
            await client.call_tool("execute_code", {"code": "0"})  # the kernel started: the 2 s are the question's
            with anyio.fail_after(30):
                first = await client.call_tool("execute_code", {"code": "name = input('Your name? ')\nf'hi {name}'"})
            r: Any = first.structured_content
            assert asked.is_set()
            assert r["ending"] == "awaiting_input" and r["input_prompt"] == "Your name? ", r
            assert "send_input" in first.content[0].text  # type: ignore[union-attr]
            looked: Any = (await client.call_tool("get_run", {"run_id": r["run_id"], "wait_s": 0})).structured_content
            assert looked["ending"] == "awaiting_input" and looked["question_id"] == r["question_id"], looked
            with anyio.fail_after(30):
                done: Any = (await client.call_tool("send_input", {"run_id": r["run_id"], "question_id": looked["question_id"],
                                                                   "text": "Ada"})).structured_content
            assert done["result"] == "hi Ada", done
            r = (await client.call_tool("execute_code", {"code": "1 + 1"})).structured_content
            assert r["result"] == 2, r
