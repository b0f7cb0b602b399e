"""An answer names the question it answers (issue 30, invariant 3), attacked through every channel.

Each question — a cell's input(), a tool call's approval — has a single-use, unguessable id: a retried call's
request_state names it, send_input must name it, a task's input key is bound to it. Judged from outside: the
upstream MCP server's own log of the calls it ran (tests/codemode_upstream.py, UPSTREAM_CALL_LOG), and the value
the cell's input() returned.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client
from mcp_types import CallToolResult, ElicitResult, InputRequiredResult

from kernelexec.server.build import build_server
from kernelexec.session.manager import SessionManager

from .support import http_server, make_settings
from .test_tasks import Raw

pytestmark = pytest.mark.anyio

UPSTREAM = Path(__file__).resolve().parent / "codemode_upstream.py"
YES = {"input": ElicitResult(action="accept", content={"approve": True})}
NO = {"input": ElicitResult(action="accept", content={"approve": False})}
TWO_TRANSFERS = ("import mcp_tools\nresults = []\nfor n in (1, 2, 3):\n    try:\n"
                 "        results.append(mcp_tools.local.transfer(amount=n))\n"
                 "    except mcp_tools.ToolRefused:\n        results.append('refused')\nresults")


def upstream_settings(base: Path, log: Path) -> Any:
    folder = Path(tempfile.mkdtemp(prefix="kxq"))  # outside every work root: no kernel can write the config
    config = folder / "tools.json"
    config.write_text(json.dumps({"mcpServers": {"local": {
        "command": sys.executable, "args": [str(UPSTREAM), "stdio", "local"], "env": {"UPSTREAM_CALL_LOG": str(log)}}}}))
    return make_settings(base, pool_size=0, restart_spares=0, tools_config=str(config), tools_approve=["local.transfer"])


def ran(log: Path) -> list[str]:
    """What the upstream itself says it ran."""
    return log.read_text().splitlines() if log.exists() else []


async def human(context: Any, params: Any) -> ElicitResult:  # the client declares elicitation; tests answer by hand
    raise AssertionError("answered by the test itself")


async def ask(client: Client, arguments: dict[str, Any], responses: Any = None, state: str | None = None) -> Any:
    """One round of execute_code, its InputRequiredResult handed back (the test drives the retries itself)."""
    return await client.session.call_tool("execute_code", arguments, input_responses=responses, request_state=state,
                                          allow_input_required=True)


async def test_a_replayed_yes_for_one_call_does_not_approve_the_next_call(short_tmp: Path) -> None:
    """The human approves transfer(1); its retry, replayed while the cell waits on the approval of transfer(2), must
    not approve transfer(2): the SDK seals request_state to the call, not to the question, so it names the question."""
    log = short_tmp / f"calls-{time.monotonic_ns()}.log"
    settings = upstream_settings(short_tmp, log)
    async with SessionManager(settings).running() as sessions, \
            Client(build_server(settings, sessions), elicitation_callback=human) as client:
        assert client.protocol_version >= "2026-07-28"
        arguments = {"code": TWO_TRANSFERS}
        first = await ask(client, arguments)
        assert isinstance(first, InputRequiredResult), first
        assert '{"amount": 1}' in first.input_requests["input"].params.message  # type: ignore[union-attr]
        second = await ask(client, arguments, YES, first.request_state)  # the human's yes to transfer(1)
        assert isinstance(second, InputRequiredResult), second
        assert '{"amount": 2}' in second.input_requests["input"].params.message  # type: ignore[union-attr]
        assert ran(log) == ["transfer 1"]

        replayed = await ask(client, arguments, YES, first.request_state)  # the same retry, sent again
        assert ran(log) == ["transfer 1"], replayed  # transfer(2) was not run on the strength of transfer(1)'s yes
        assert isinstance(replayed, CallToolResult) and replayed.is_error, replayed
        assert "already answered" in replayed.content[0].text  # type: ignore[union-attr]

        third = await ask(client, arguments, NO, second.request_state)  # the human declines transfer(2)
        assert isinstance(third, InputRequiredResult), third
        assert '{"amount": 3}' in third.input_requests["input"].params.message  # type: ignore[union-attr]
        again = await ask(client, arguments, YES, first.request_state)  # and once more, at transfer(3)
        assert isinstance(again, CallToolResult) and again.is_error, again
        done = await ask(client, arguments, NO, third.request_state)
        assert isinstance(done, CallToolResult) and not done.is_error, done
        assert done.structured_content is not None and done.structured_content["result"] == ["sent 1", "refused", "refused"]
    assert ran(log) == ["transfer 1"]  # the upstream never ran a call the human did not approve


async def test_a_second_viewers_late_yes_does_not_approve_the_call_asked_after(short_tmp: Path) -> None:
    """A second viewer (get_run) is shown the approval of transfer(1); the human declines it through the first call;
    the viewer's yes, arriving while the cell waits on transfer(2), is refused: it never approves transfer(2)."""
    log = short_tmp / f"calls-{time.monotonic_ns()}.log"
    settings = upstream_settings(short_tmp, log)
    async with SessionManager(settings).running() as sessions, \
            Client(build_server(settings, sessions), elicitation_callback=human) as client:
        arguments = {"code": TWO_TRANSFERS}
        first = await ask(client, arguments)
        assert isinstance(first, InputRequiredResult), first
        (run,) = [r for r in sessions.runs._runs.values() if not r.done.is_set()]  # the viewer knows the run id
        viewing = {"run_id": run.id, "wait_s": 0}
        viewer = await client.session.call_tool("get_run", viewing, allow_input_required=True)
        assert isinstance(viewer, InputRequiredResult), viewer
        assert '{"amount": 1}' in viewer.input_requests["input"].params.message  # type: ignore[union-attr]
        second = await ask(client, arguments, NO, first.request_state)  # the human declines transfer(1)
        assert isinstance(second, InputRequiredResult), second
        assert '{"amount": 2}' in second.input_requests["input"].params.message  # type: ignore[union-attr]
        late = await client.session.call_tool("get_run", viewing, input_responses=YES, request_state=viewer.request_state,
                                              allow_input_required=True)
        assert ran(log) == [], late  # the viewer's yes (to transfer(1)) did not run transfer(2)
        assert isinstance(late, CallToolResult) and late.is_error, late
        assert "already declined" in late.content[0].text  # type: ignore[union-attr]
        third = await ask(client, arguments, NO, second.request_state)
        assert isinstance(third, InputRequiredResult), third
        done = await ask(client, arguments, NO, third.request_state)
        assert isinstance(done, CallToolResult) and done.structured_content is not None, done
        assert done.structured_content["result"] == ["refused", "refused", "refused"], done
    assert ran(log) == []


async def test_send_input_takes_one_answer_per_question_and_only_for_the_question_it_names(short_tmp: Path) -> None:
    """A second answer to an answered question, an old question's id, an id from another run, a made-up id: each
    refused, and none of them reaches the question the cell waits on now (the values input() returned say so)."""
    settings = make_settings(short_tmp, pool_size=0, restart_spares=0)
    async with SessionManager(settings).running() as sessions, \
            Client(build_server(settings, sessions), mode="legacy") as client:
        other: Any = (await client.call_tool("execute_code", {"code": "input('other? ')", "background": True})).structured_content
        other = (await client.call_tool("get_run", {"run_id": other["run_id"], "wait_s": 30})).structured_content
        assert other["ending"] == "awaiting_input", other
        handle = (await client.call_tool("new_session", {})).structured_content["session"]  # type: ignore[index]
        code = "a = input('First? ')\nb = input('Second? ')\n[a, b]"
        r: Any = (await client.call_tool("execute_code", {"code": code, "session": handle})).structured_content
        assert r["ending"] == "awaiting_input" and r["input_prompt"] == "First? ", r
        first_id, run_id = r.get("question_id"), r["run_id"]

        def send(question_id: Any, text: str | None = "x", **more: Any) -> Any:
            return client.call_tool("send_input", {"run_id": run_id, "question_id": question_id, "text": text, "wait_s": 15, **more})

        asked: Any = (await send(first_id, "Ada")).structured_content
        assert asked["ending"] == "awaiting_input" and asked["input_prompt"] == "Second? ", asked
        wrongs = ((first_id, "already answered"), (other.get("question_id"), "asked no question"),
                  ("q-made-up-id-000", "asked no question"), ("", "asked no question"))
        replies = [await send(wrong, "Mallory") for wrong, _ in wrongs]
        replies.append(await send(first_id, None, cancel=True))  # nor can an old id decline the new question
        looked: Any = (await client.call_tool("get_run", {"run_id": run_id, "wait_s": 0})).structured_content
        # the judge: the cell still waits in its second input(), which none of those answered
        assert looked["ending"] == "awaiting_input" and looked["input_prompt"] == "Second? ", looked
        assert looked["question_id"] == asked["question_id"] != first_id, looked
        assert first_id.startswith("q-") and len(first_id) >= 18  # unguessable
        for (wrong, why), refused in zip((*wrongs, (first_id, "already answered")), replies, strict=True):
            assert refused.is_error and why in refused.content[0].text, (wrong, refused.content)
        done: Any = (await send(asked["question_id"], "Lovelace")).structured_content
        assert done["result"] == ["Ada", "Lovelace"], done  # what input() returned: each question its own answer
        twice = await send(asked["question_id"], "again")
        assert twice.is_error and "already answered" in twice.content[0].text, twice.content
        await client.call_tool("send_input", {"run_id": other["run_id"], "question_id": other["question_id"], "cancel": True})


async def test_a_task_answer_under_a_stale_key_does_not_answer_the_next_question(short_tmp: Path) -> None:
    """tasks/update keys are bound to the question they were issued for: input-1's answer, sent again while the
    cell waits on its second question (input-2), is ignored; the cell gets each answer once, in its place."""
    token = "carol-token-0123456789abcdef"
    tokens = short_tmp / f"qid-tokens-{time.monotonic_ns()}"
    tokens.write_text(token + "\n")
    with http_server(short_tmp / f"qid-tasks-{time.monotonic_ns()}", "--auth-token-file", str(tokens), "--yield-after", "1",
                     "--restart-spares", "0") as url:
        carol = Raw(url, token)
        handle = (await carol.call("new_session"))["structuredContent"]["session"]
        created = await carol.call("execute_code", session=handle, code=(
            "import time\ntime.sleep(2)\na = input('First? ')\nb = input('Second? ')\n[a, b]"))
        assert created["resultType"] == "task", created
        task = created["taskId"]
        asked = await carol.until(task, "input_required")
        assert set(asked["inputRequests"]) == {"input-1"}, asked
        await carol.result("tasks/update", {"taskId": task, "inputResponses": {
            "input-1": {"action": "accept", "content": {"answer": "Ada"}}}})
        deadline = time.monotonic() + 30
        while True:
            second = await carol.result("tasks/get", {"taskId": task})
            if second["status"] == "input_required" and "input-2" in second["inputRequests"]:
                break
            assert time.monotonic() < deadline, second
            await anyio.sleep(0.2)
        stale = await carol.result("tasks/update", {"taskId": task, "inputResponses": {
            "input-1": {"action": "accept", "content": {"answer": "Mallory"}}}})
        assert stale["resultType"] == "complete"  # ignored, as an unknown key is
        await anyio.sleep(1)
        still = await carol.result("tasks/get", {"taskId": task})
        assert still["status"] == "input_required" and set(still["inputRequests"]) == {"input-2"}, still
        await carol.result("tasks/update", {"taskId": task, "inputResponses": {
            "input-2": {"action": "accept", "content": {"answer": "Lovelace"}}}})
        done = await carol.until(task, "completed")
        assert done["result"]["structuredContent"]["result"] == ["Ada", "Lovelace"], done


async def test_the_broker_makes_a_call_only_on_a_verdict_for_that_very_call(short_tmp: Path) -> None:
    """Whatever the approval path hands back, Broker.call checks the verdict is for the call it is about to make
    (server, tool, arguments as the question showed them): a yes for another call makes no call."""
    from kernelexec.codemode.broker import ApprovalCall, Broker, CallFailed, Verdict
    from kernelexec.codemode.config import Upstream

    log = short_tmp / f"calls-{time.monotonic_ns()}.log"
    upstream = Upstream("local", "stdio", "test", command=sys.executable, args=(str(UPSTREAM), "stdio", "local"),
                        env={"UPSTREAM_CALL_LOG": str(log)})
    asked: list[ApprovalCall] = []

    def saying(verdict_for: ApprovalCall | None) -> Any:
        async def approve(message: str, call: ApprovalCall) -> Verdict:
            asked.append(call)
            return Verdict(verdict_for or call, True)
        return approve

    async with Broker([upstream], approve=["local.transfer"]).running() as broker:
        other = ApprovalCall("local", "transfer", '{"amount": 1}')
        with pytest.raises(CallFailed, match="approval given was for another call"):
            await broker.call("local", "transfer", {"amount": 500}, saying(other))
        assert asked[-1] == ApprovalCall("local", "transfer", '{"amount": 500}')  # the question named the call asked
        assert ran(log) == []
        item = await broker.call("local", "transfer", {"amount": 1}, saying(None))
        assert item["value"] == "sent 1" and ran(log) == ["transfer 1"]
