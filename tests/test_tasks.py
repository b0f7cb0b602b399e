"""MCP Tasks (io.modelcontextprotocol/tasks, the 2026-07-28 extension) through a raw JSON-RPC client over
streamable HTTP against a real ``kernelexec serve`` (two bearer tokens, ``--yield-after 1``): each test asserts
the extension's wire shapes (specification/draft/tasks.md of modelcontextprotocol/ext-tasks)."""

from __future__ import annotations

import itertools
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from mcp import Client
from mcp.client import advertise

from kernelexec.server.build import build_server
from kernelexec.server.tasks import KEEP_AFTER
from kernelexec.session.manager import SessionManager

from .support import build_wheel, http_server, make_settings, package_index

pytestmark = pytest.mark.anyio

ALICE = "alice-token-0123456789abcdef"
BOB = "bob-token-0123456789abcdef00"
TASKS = "io.modelcontextprotocol/tasks"
VERSION = "2026-07-28"
TASK_KEYS = {"taskId", "status", "createdAt", "lastUpdatedAt", "ttlMs", "pollIntervalMs"}  # + statusMessage, optional
_ids = itertools.count(1)


@pytest.fixture(scope="module")
def server(short_tmp: Path) -> Iterator[str]:
    tokens = short_tmp / "tokens"
    tokens.write_text(f"{ALICE}\n{BOB}\n")
    with http_server(short_tmp / "tasks", "--auth-token-file", str(tokens), "--yield-after", "1",
                     "--restart-spares", "0", "--pool-size", "1") as url:  # pooled sessions, owners bound on taking
        yield url


class Raw:
    """A JSON-RPC client of the 2026-07-28 protocol: every request carries its envelope (protocol version,
    client capabilities, client info) in ``_meta`` and the MCP-Protocol-Version / Mcp-Method / Mcp-Name headers."""

    def __init__(self, url: str, token: str, *, tasks: bool = True, elicitation: bool = True, url_mode: bool = False) -> None:
        self.url, self.token = url, token
        self.capabilities: dict[str, Any] = {}
        if tasks:
            self.capabilities["extensions"] = {TASKS: {}}
        if elicitation:
            self.capabilities["elicitation"] = {"form": {}, **({"url": {}} if url_mode else {})}

    async def send(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        """The whole JSON-RPC response (``result`` or ``error``)."""
        rid = next(_ids)
        meta = {"io.modelcontextprotocol/protocolVersion": VERSION, "io.modelcontextprotocol/clientCapabilities": self.capabilities,
                "io.modelcontextprotocol/clientInfo": {"name": "raw-tasks-test", "version": "0"}}
        body = {"jsonrpc": "2.0", "id": rid, "method": method, "params": {**params, "_meta": meta}}
        headers = {"Authorization": f"Bearer {self.token}", "Accept": "application/json, text/event-stream",
                   "Content-Type": "application/json", "MCP-Protocol-Version": VERSION, "Mcp-Method": method}
        name = params.get("name") if method == "tools/call" else params.get("taskId")
        if name:
            headers["Mcp-Name"] = name
        async with httpx2.AsyncClient(timeout=60) as http:
            reply = await http.post(self.url, json=body, headers=headers)
        # a JSON-RPC error may come with an HTTP error status (the SDK answers -32021 with 400)
        assert reply.status_code == 200 or (400 <= reply.status_code < 500 and '"error"' in reply.text), \
            (reply.status_code, reply.text[:500])
        if reply.headers.get("content-type", "").startswith("text/event-stream"):
            messages = [json.loads(line[5:]) for line in reply.text.splitlines() if line.startswith("data:") and line[5:].strip()]
            found = [m for m in messages if m.get("id") == rid]
            assert found, messages
            return dict(found[0])
        message = reply.json()
        assert message["id"] == rid
        return dict(message)

    async def result(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        message = await self.send(method, params)
        assert "result" in message, message
        return dict(message["result"])

    async def call(self, tool: str, **arguments: Any) -> dict[str, Any]:
        return await self.result("tools/call", {"name": tool, "arguments": arguments})

    async def until(self, task_id: str, *statuses: str, within: float = 30) -> dict[str, Any]:
        deadline = time.monotonic() + within
        while True:
            task = await self.result("tasks/get", {"taskId": task_id})
            if task["status"] in statuses:
                return task
            assert time.monotonic() < deadline, f"task {task_id} still {task['status']} after {within} s: {task}"
            await anyio.sleep(0.2)


def assert_task(task: dict[str, Any], result_type: str, status: str) -> None:
    """The Task shape: its fields and nothing else but statusMessage, _meta and the status's own payload."""
    payload = {"working": set(), "cancelled": set(), "completed": {"result"}, "failed": {"error"},
               "input_required": {"inputRequests"}}[status]
    assert task["resultType"] == result_type and task["status"] == status, task
    assert TASK_KEYS | payload <= set(task) <= TASK_KEYS | payload | {"resultType", "statusMessage", "_meta"}, sorted(task)
    assert isinstance(task["taskId"], str) and len(task["taskId"]) >= 20  # unguessable
    for stamp in ("createdAt", "lastUpdatedAt"):
        assert task[stamp].endswith("Z") and time.strptime(task[stamp][:19], "%Y-%m-%dT%H:%M:%S")
    assert isinstance(task["ttlMs"], int) and task["ttlMs"] > 3_600_000 and isinstance(task["pollIntervalMs"], int)


async def session(client: Raw) -> str:
    return str((await client.call("new_session"))["structuredContent"]["session"])


async def test_server_discover_advertises_the_tasks_extension(server: str) -> None:
    found = await Raw(server, ALICE).result("server/discover", {})
    assert found["capabilities"]["extensions"][TASKS] == {}, found["capabilities"]


async def test_a_long_cell_answers_a_task_and_tasks_get_gives_the_result_the_call_would_have_given(server: str) -> None:
    alice = Raw(server, ALICE)
    handle = await session(alice)
    quick = await alice.call("execute_code", code="6 * 7", session=handle)
    assert quick.get("resultType", "complete") == "complete" and quick["structuredContent"]["result"] == 42  # no task for it
    created = await alice.call("execute_code", code="import time\nprint('begun', flush=True)\ntime.sleep(3)\nresult = 'done'",
                               session=handle, timeout=40)
    assert_task(created, "task", "working")
    assert created["ttlMs"] == (40 + KEEP_AFTER) * 1000, created  # the cell's timeout, then an hour to collect it
    working = await alice.result("tasks/get", {"taskId": created["taskId"]})
    assert_task(working, "complete", "working")
    assert working["createdAt"] == created["createdAt"]
    done = await alice.until(created["taskId"], "completed")
    assert_task(done, "complete", "completed")
    result = done["result"]
    assert result["isError"] is False and result["structuredContent"]["result"] == "done", result
    assert "begun" in result["structuredContent"]["stdout"]
    same = await alice.call("get_run", run_id=result["structuredContent"]["run_id"], wait_s=0)
    assert {k: v for k, v in same.items() if k != "_meta"} == result  # exactly get_run's answer (its serverInfo stamp aside)
    again = await alice.result("tasks/get", {"taskId": created["taskId"]})
    assert again["result"] == result and again["lastUpdatedAt"] == done["lastUpdatedAt"]


async def test_tasks_cancel_interrupts_an_endless_cell_within_5_s_and_the_session_goes_on(server: str) -> None:
    alice = Raw(server, ALICE)
    handle = await session(alice)
    await alice.call("execute_code", code="kept = 7", session=handle)
    created = await alice.call("execute_code", code="while True: pass", session=handle)
    assert_task(created, "task", "working")
    started = time.monotonic()
    ack = await alice.result("tasks/cancel", {"taskId": created["taskId"]})
    assert ack["resultType"] == "complete" and set(ack) <= {"resultType", "_meta"}, ack  # an empty acknowledgement
    cancelled = await alice.until(created["taskId"], "cancelled", within=5)
    assert time.monotonic() - started < 5
    assert_task(cancelled, "complete", "cancelled")
    after = await alice.call("execute_code", code="kept * 6", session=handle)
    assert after["structuredContent"]["result"] == 42, after  # variables kept, as the interrupt tool keeps them


async def test_a_cells_input_is_input_required_and_tasks_update_answers_it(server: str) -> None:
    alice = Raw(server, ALICE)
    handle = await session(alice)
    created = await alice.call("execute_code", session=handle, code=(
        "import time\ntime.sleep(2)\nname = input('Your name? ')\ntown = input('Your town? ')\nresult = f'hello {name} from {town}'"))
    assert_task(created, "task", "working")
    asked = await alice.until(created["taskId"], "input_required")
    assert_task(asked, "complete", "input_required")
    (key, request), = asked["inputRequests"].items()
    assert set(request) == {"method", "params"} and request["method"] == "elicitation/create"  # as a standalone request
    params = request["params"]
    assert set(params) == {"mode", "message", "requestedSchema"} and params["mode"] == "form", params
    assert key == "input-1"
    assert "Your name?" in params["message"] and "not from the assistant" in params["message"] and handle in params["message"]
    assert params["requestedSchema"]["type"] == "object" and "answer" in params["requestedSchema"]["properties"]
    again = await alice.result("tasks/get", {"taskId": created["taskId"]})
    assert again["inputRequests"] == asked["inputRequests"]  # the same key while it is outstanding
    ignored = await alice.result("tasks/update", {"taskId": created["taskId"], "inputResponses": {
        "no-such-key": {"action": "accept", "content": {"answer": "Mallory"}}}})
    assert ignored["resultType"] == "complete"
    ack = await alice.result("tasks/update", {"taskId": created["taskId"], "inputResponses": {
        key: {"action": "accept", "content": {"answer": "Ada"}}}})
    assert ack["resultType"] == "complete" and set(ack) <= {"resultType", "_meta"}, ack
    deadline = time.monotonic() + 30
    while True:  # the acknowledgement is eventually consistent: poll until the next question shows
        second = await alice.result("tasks/get", {"taskId": created["taskId"]})
        if second["status"] == "input_required" and set(second["inputRequests"]) != {key}:
            break
        assert time.monotonic() < deadline, second
        await anyio.sleep(0.2)
    assert set(second["inputRequests"]) == {"input-2"}, second  # a new key: keys are never reused within a task
    assert "Your town?" in second["inputRequests"]["input-2"]["params"]["message"]
    stale = await alice.result("tasks/update", {"taskId": created["taskId"], "inputResponses": {
        key: {"action": "accept", "content": {"answer": "again"}}}})  # the answered key: ignored
    assert stale["resultType"] == "complete"
    await alice.result("tasks/update", {"taskId": created["taskId"], "inputResponses": {
        "input-2": {"action": "accept", "content": {"answer": "London"}}}})
    done = await alice.until(created["taskId"], "completed")
    assert done["result"]["structuredContent"]["result"] == "hello Ada from London", done


async def test_a_cells_getpass_in_a_task_is_a_url_elicitation_answered_only_on_its_page(server: str) -> None:
    """The task's inputRequests carry the URL-mode elicitation (2026-07-28: no elicitationId); tasks/update's accept
    (even with form content) answers nothing; the page's POST does, and the task completes with what was typed."""
    import hashlib

    alice = Raw(server, ALICE, url_mode=True)
    handle = await session(alice)
    created = await alice.call("execute_code", session=handle, code=(
        "import time, getpass, hashlib\ntime.sleep(2)\nresult = hashlib.sha256(getpass.getpass('Key: ').encode()).hexdigest()"))
    assert_task(created, "task", "working")
    asked = await alice.until(created["taskId"], "input_required")
    (key, request), = asked["inputRequests"].items()
    params = request["params"]
    assert params["mode"] == "url" and set(params) == {"mode", "message", "url"}, params
    assert params["url"].startswith(server.removesuffix("/mcp") + "/secret/") and handle in params["message"], params
    await alice.result("tasks/update", {"taskId": created["taskId"], "inputResponses": {
        key: {"action": "accept", "content": {"answer": "from-the-model"}}}})
    waiting = await alice.result("tasks/get", {"taskId": created["taskId"]})
    assert waiting["status"] == "working" and "own page" in waiting["statusMessage"], waiting
    async with httpx2.AsyncClient(timeout=30) as browser:
        page = await browser.get(params["url"])
        token = page.text.split('name=token value="', 1)[1].split('"', 1)[0]
        assert (await browser.post(params["url"], data={"token": token, "secret": "typed-on-the-page"})).status_code == 200
    done = await alice.until(created["taskId"], "completed")
    typed = hashlib.sha256(b"typed-on-the-page").hexdigest()
    assert done["result"]["structuredContent"]["result"] == typed, done
    assert "typed-on-the-page" not in json.dumps(done)


async def test_a_client_that_did_not_declare_the_extension_gets_a_normal_result_and_no_tasks_methods(server: str) -> None:
    plain = Raw(server, ALICE, tasks=False)
    handle = await session(plain)
    first = await plain.call("execute_code", code="import time\ntime.sleep(3)\n'slow'", session=handle)
    assert first.get("resultType") == "complete" and "taskId" not in first, first
    assert first["structuredContent"]["ending"] == "running"  # the yield, as before
    refused = await plain.send("tasks/get", {"taskId": "anything"})
    assert refused["error"]["code"] == -32021, refused
    assert refused["error"]["data"]["requiredCapabilities"]["extensions"] == {TASKS: {}}


async def test_another_token_cannot_see_update_or_cancel_a_task(server: str) -> None:
    alice, bob = Raw(server, ALICE), Raw(server, BOB)
    handle = await session(alice)
    created = await alice.call("execute_code", code="import time\ntime.sleep(2)\nsecret = input('PIN? ')\n'ok'", session=handle)
    assert_task(created, "task", "working")
    await alice.until(created["taskId"], "input_required")
    for method, extra in (("tasks/get", {}), ("tasks/cancel", {}),
                          ("tasks/update", {"inputResponses": {"input-1": {"action": "accept", "content": {"answer": "0000"}}}})):
        refused = await bob.send(method, {"taskId": created["taskId"], **extra})
        assert refused["error"]["code"] == -32602 and "not found" in refused["error"]["message"], (method, refused)
    unknown = await bob.send("tasks/get", {"taskId": "no-such-task"})
    assert unknown["error"] == refused["error"] or unknown["error"]["code"] == -32602  # the same answer as for no task
    still = await alice.result("tasks/get", {"taskId": created["taskId"]})
    assert_task(still, "complete", "input_required")  # bob's update and cancel did nothing
    await alice.result("tasks/update", {"taskId": created["taskId"], "inputResponses": {
        "input-1": {"action": "decline"}}})
    done = await alice.until(created["taskId"], "completed")
    assert done["result"]["structuredContent"]["error_type"] == "EOFError", done  # declined: EOFError in the cell


@pytest.fixture(scope="module")
def installing(short_tmp: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A server whose calls yield after 0.05 s, installing from a real package index on 127.0.0.1 (kxtask 1.0)."""
    base = tmp_path_factory.mktemp("tasks-index")
    files = [build_wheel(base / "wheels", "kxtask", "1.0", "VALUE = 7\n")]
    tokens = short_tmp / "install-tokens"
    tokens.write_text(f"{ALICE}\n")
    with pytest.MonkeyPatch.context() as mp, package_index(base / "root", files) as index:
        mp.setenv("PIP_CONFIG_FILE", os.devnull)  # only the test's index is asked
        with http_server(short_tmp / "tasks-install", "--auth-token-file", str(tokens), "--yield-after", "0.05",
                         "--index-url", index, "--restart-spares", "0") as url:
            yield url


@pytest.mark.slow
async def test_a_long_install_packages_answers_a_task_whose_result_is_the_calls(installing: str) -> None:
    alice = Raw(installing, ALICE)
    handle = await session(alice)
    created = await alice.call("install_packages", packages=["kxtask"], session=handle)
    assert_task(created, "task", "working")
    done = await alice.until(created["taskId"], "completed", within=120)
    assert_task(done, "complete", "completed")
    result = done["result"]
    assert result["isError"] is False and result["resultType"] == "complete", result
    installed = result["structuredContent"]
    assert installed["session"] == handle and [(p["name"], p["version"]) for p in installed["installed"]] == [("kxtask", "1.0")]
    ran = await alice.call("execute_code", code="import kxtask\nkxtask.VALUE", session=handle)
    if ran.get("resultType") == "task":  # 0.05 s is short: the cell may be a task too
        ran = (await alice.until(ran["taskId"], "completed"))["result"]
    assert ran["structuredContent"]["result"] == 7, ran


async def test_a_2025_11_25_session_that_advertises_the_extension_never_gets_a_task(short_tmp: Path) -> None:
    """Tasks are a 2026-07-28 extension declared per request: a legacy session's initialize-time declaration
    (the SDK's in-memory client) gets the yield's normal answer."""
    settings = make_settings(short_tmp, pool_size=0, restart_spares=0, yield_after=1)
    async with SessionManager(settings).running() as sessions:
        async with Client(build_server(settings, sessions), mode="legacy", extensions=[advertise(TASKS, {})]) as client:
            first = await client.call_tool("execute_code", {"code": "import time\ntime.sleep(3)\n'slow'"})
            r: Any = first.structured_content
            assert r["ending"] == "running" and r["run_id"], r
            done: Any = (await client.call_tool("get_run", {"run_id": r["run_id"], "wait_s": 30})).structured_content
            assert done["result"] == "slow", done
