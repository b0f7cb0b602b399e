"""A fleet's relay (issue 33): what a call on one replica asks of a run another replica holds reaches that replica
through a row of the store it polls (kernelexec/server/relay.py). Real ``kernelexec serve`` replicas with bearer
tokens on one real PostgreSQL, one real Jupyter Server as their gateway, real MCP SDK clients over HTTP.

What it shows: an ``input()`` asked through replica A is answered by ``send_input`` on B, and by a 2026-07-28 retry
on B carrying the request state A sealed; another token cannot answer it (an unknown run, whatever the replica), a
question id the run did not ask is refused, and an answer is taken once across the fleet (a replayed retry or a
second send_input on another replica is refused; the cell got one answer).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp_types import CallToolResult, ElicitResult, InputRequiredResult

from kernelexec.session.runs import MAX_INPUT_CHARS

from .fleet_parts import LEASE_TTL, Fleet, gateway, new_fleet
from .pg import Postgres, postgres

__all__ = ["gateway", "postgres"]  # fixtures

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

ALICE = "alice-token-" + "a" * 32
BOB = "bob-token-" + "b" * 32


@pytest.fixture(scope="module")
def fleet(short_tmp: Path, postgres: Postgres, gateway: Any) -> Iterator[Fleet]:
    """Two replicas, each with the same two tokens (alice's and bob's)."""
    found = new_fleet(short_tmp, postgres, gateway, "relay")
    tokens = found.base / "tokens"
    tokens.write_text(f"{ALICE}\n{BOB}\n")
    try:
        for name in ("a", "b"):
            found.start(name, "--auth-token-file", str(tokens), "--yield-after", "5")  # questions within it, on a busy machine
        yield found
    finally:
        found.stop_all()


def client(url: str, token: str, **options: Any) -> Client:
    return Client(streamable_http_client(url, http_client=httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"},
                                                                             timeout=60)), **options)


def text(result: Any) -> str:
    return "".join(getattr(c, "text", "") for c in result.content)


async def asked_input(on: Client, code: str) -> tuple[str, str]:
    """Start ``code`` (it calls input()) and follow it past a kernel's start until it waits: its run and question ids."""
    asked = await on.call_tool("execute_code", {"code": code})
    while asked.structured_content is not None and asked.structured_content["ending"] == "running":  # a kernel starting
        asked = await on.call_tool("get_run", {"run_id": asked.structured_content["run_id"], "wait_s": 30})
    waiting = asked.structured_content
    assert waiting is not None and waiting["ending"] == "awaiting_input", text(asked)
    return waiting["run_id"], waiting["question_id"]


async def never_asked(context: object, params: object) -> ElicitResult:  # a 2026-07-28 client: the test retries by hand
    raise AssertionError("answered by the test itself")


async def test_send_input_on_another_replica_answers_the_input_asked_through_the_first(fleet: Fleet) -> None:
    a, b = fleet.replicas[0].url, fleet.replicas[1].url
    code = "name = input('Your name? ')\nf'hello {name}'"
    async with client(a, ALICE) as on_a:  # no elicitation: the question comes back as awaiting_input
        run_id, question_id = await asked_input(on_a, code)

    async with client(b, BOB) as bob_on_b:  # another token: no such run, on any replica
        refused = await bob_on_b.call_tool("send_input", {"run_id": run_id, "question_id": question_id, "text": "Mallory"})
        assert refused.is_error and "unknown run" in text(refused), text(refused)
        peek = await bob_on_b.call_tool("get_run", {"run_id": run_id, "wait_s": 0})
        assert peek.is_error and "unknown run" in text(peek), text(peek)
    async with client(b, ALICE) as on_b:
        seen = await on_b.call_tool("get_run", {"run_id": run_id, "wait_s": 0})  # B shows the question A's run waits on
        assert seen.structured_content is not None and seen.structured_content["question_id"] == question_id, text(seen)
        wrong = await on_b.call_tool("send_input", {"run_id": run_id, "question_id": "q-not-asked", "text": "Eve"})
        assert wrong.is_error and "asked no question" in text(wrong), text(wrong)
        done = await on_b.call_tool("send_input", {"run_id": run_id, "question_id": question_id, "text": "Ada", "wait_s": 30})
        assert not done.is_error and done.structured_content is not None, text(done)
        assert done.structured_content["result"] == "hello Ada", text(done)
    async with client(a, ALICE) as on_a:  # once across the fleet: the same answer again, on A, is refused
        again = await on_a.call_tool("send_input", {"run_id": run_id, "question_id": question_id, "text": "Ada"})
        assert again.is_error and ("already answered" in text(again) or "not waiting" in text(again)), text(again)
        got = await on_a.call_tool("get_run", {"run_id": run_id, "wait_s": 5})
        assert got.structured_content is not None and got.structured_content["result"] == "hello Ada", text(got)


async def test_an_answer_refused_on_the_holder_does_not_use_the_question_up_across_the_fleet(fleet: Fleet) -> None:
    """send_input on the replica holding the run with a text too long is refused; that refusal must not mark the
    question answered in the store (Relay.claim), or the user's next, valid answer is refused as "already answered
    (through another replica)" and the run waits on input() until its timeout. Before the fix: refused so."""
    a = fleet.replicas[0].url
    async with client(a, ALICE) as on_a:
        run_id, question_id = await asked_input(on_a, "name = input('Name? ')\nf'hey {name}'")
        too_long = await on_a.call_tool("send_input", {"run_id": run_id, "question_id": question_id,
                                                       "text": "x" * (MAX_INPUT_CHARS + 1)})
        assert too_long.is_error and "at most" in text(too_long), text(too_long)
        done = await on_a.call_tool("send_input", {"run_id": run_id, "question_id": question_id, "text": "Ada", "wait_s": 30})
        assert not done.is_error and done.structured_content is not None, text(done)
        assert done.structured_content["result"] == "hey Ada", text(done)


async def test_send_input_on_another_replica_with_wait_s_0_says_what_it_did(fleet: Fleet) -> None:
    """wait_s=0 ("just look") on a replica that does not hold the run: the answer is relayed and the call says so, not
    "unknown run" (its one look at the run's record was cancelled before it was made), and it never hands back the
    question it has just answered as the one the run waits on."""
    a, b = fleet.replicas[0].url, fleet.replicas[1].url
    async with client(a, ALICE) as on_a:
        run_id, question_id = await asked_input(on_a, "name = input('Name? ')\nf'hi {name}'")
    async with client(b, ALICE) as on_b:
        sent = await on_b.call_tool("send_input", {"run_id": run_id, "question_id": question_id, "text": "Ada", "wait_s": 0})
        assert not sent.is_error and "input sent" in text(sent), text(sent)
        said = sent.structured_content or {}
        assert said.get("question_id") != question_id, text(sent)  # never the answered question again
    async with client(a, ALICE) as on_a:
        got = await on_a.call_tool("get_run", {"run_id": run_id, "wait_s": 30})
        assert got.structured_content is not None and got.structured_content["result"] == "hi Ada", text(got)


async def test_send_input_for_the_run_of_a_killed_replica_says_it_was_lost(fleet: Fleet) -> None:
    """An input() asked through a replica that is then SIGKILLed: send_input on another replica, once the dead one's
    leases ran out, says the run was lost (as get_run does), within its wait, not that the answer went to a run that
    goes on (the relayed answer has no holder left to take it)."""
    c = fleet.start("c", "--auth-token-file", str(fleet.base / "tokens"), "--yield-after", "5")
    async with client(c.url, ALICE) as on_c:
        asked = await on_c.call_tool("execute_code", {"code": "name = input('Name? ')\nf'hi {name}'"})
        while asked.structured_content is not None and asked.structured_content["ending"] == "running":  # a kernel starting
            asked = await on_c.call_tool("get_run", {"run_id": asked.structured_content["run_id"], "wait_s": 30})
    waiting = asked.structured_content
    assert waiting is not None and waiting["ending"] == "awaiting_input", text(asked)
    c.proc.kill()
    c.proc.wait(30)
    await anyio.sleep(LEASE_TTL + 2)  # its replica's and its session's leases ran out
    async with client(fleet.replicas[1].url, ALICE) as on_b:
        stopped = await on_b.call_tool("interrupt", {"session": waiting["session"]})  # nobody to send it to
        assert "interrupt sent" not in text(stopped), text(stopped)
        began = anyio.current_time()
        sent = await on_b.call_tool("send_input", {"run_id": waiting["run_id"], "question_id": waiting["question_id"],
                                                   "text": "Ada", "wait_s": 20})
        assert "was lost" in text(sent), text(sent)
        assert anyio.current_time() - began < 15, text(sent)


async def test_a_retry_on_another_replica_answers_with_the_state_the_first_sealed_once(fleet: Fleet) -> None:
    a, b = fleet.replicas[0].url, fleet.replicas[1].url
    arguments = {"code": "first = input('First? ')\nsecond = input('Second? ')\n[first, second]"}
    async with client(a, ALICE, elicitation_callback=never_asked) as on_a:
        handle = (await on_a.call_tool("execute_code", {"code": "1"})).structured_content["session"]  # type: ignore[index]
        arguments["session"] = handle  # its kernel started: the question comes within --yield-after
        first = await on_a.session.call_tool("execute_code", arguments, allow_input_required=True)
    assert isinstance(first, InputRequiredResult), first
    assert "First?" in first.input_requests["input"].params.message  # type: ignore[union-attr]
    answer = {"input": ElicitResult(action="accept", content={"answer": "one"})}
    async with client(b, ALICE, elicitation_callback=never_asked) as on_b:  # the retry lands on B
        second = await on_b.session.call_tool("execute_code", arguments, input_responses=answer,
                                              request_state=first.request_state, allow_input_required=True)
        assert isinstance(second, InputRequiredResult), second  # the run's next question, relayed back from A
        assert "Second?" in second.input_requests["input"].params.message  # type: ignore[union-attr]
        replayed = await on_b.session.call_tool("execute_code", arguments, input_responses=answer,
                                                request_state=first.request_state, allow_input_required=True)
        assert isinstance(replayed, CallToolResult) and replayed.is_error, replayed  # taken once: never for "Second?"
        assert "already answered" in text(replayed), text(replayed)
    async with client(b, BOB, elicitation_callback=never_asked) as bob_on_b:  # the sealed state is alice's (the SDK's binding)
        with pytest.raises(MCPError, match="requestState"):
            await bob_on_b.session.call_tool("execute_code", arguments, input_responses=answer,
                                             request_state=second.request_state, allow_input_required=True)
    async with client(a, ALICE, elicitation_callback=never_asked) as on_a:  # back on A, the second answer
        done = await on_a.session.call_tool("execute_code", arguments, input_responses={
            "input": ElicitResult(action="accept", content={"answer": "two"})}, request_state=second.request_state,
            allow_input_required=True)
    assert isinstance(done, CallToolResult) and not done.is_error, done
    assert done.structured_content is not None and done.structured_content["result"] == ["one", "two"], done


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def form_token(page: httpx2.Response) -> str:
    assert page.status_code == 200, page.status_code
    return page.text.split('name=token value="', 1)[1].split('"', 1)[0]


async def test_a_secret_page_opened_on_one_replica_is_served_and_used_once_on_any(fleet: Fleet) -> None:
    """A getpass() page minted by A (the run's holder): served by B from the store's grant, its POST on B relayed
    sealed to A; a forged form token, a guessed key, a replay and a concurrent second POST on the other replica
    answer nothing; a page whose question ended is gone on every replica."""
    a, b = fleet.replicas[0].url, fleet.replicas[1].url
    origin_a, origin_b = a.removesuffix("/mcp"), b.removesuffix("/mcp")
    code = ("import getpass, hashlib\nsha = lambda s: hashlib.sha256(s.encode()).hexdigest()\n"
            "[sha(getpass.getpass('Key 1: ')), sha(getpass.getpass('Key 2: '))]")
    async with client(a, ALICE, elicitation_callback=never_asked) as on_a, httpx2.AsyncClient(timeout=30) as browser:
        handle = (await on_a.call_tool("execute_code", {"code": "1"})).structured_content["session"]  # type: ignore[index]
        arguments = {"code": code, "session": handle, "timeout": 120}
        first = await on_a.session.call_tool("execute_code", arguments, allow_input_required=True)
        assert isinstance(first, InputRequiredResult), first
        page_a = first.input_requests["input"].params.url  # type: ignore[union-attr]
        assert page_a.startswith(origin_a + "/secret/"), page_a
        page_b = origin_b + page_a.removeprefix(origin_a)  # what a balancer does: the same path, another replica

        assert (await browser.get(origin_b + "/secret/" + "x" * 43)).status_code == 404  # a guessed key
        token_b = form_token(await browser.get(page_b))  # B serves A's page from the store
        forged = await browser.post(page_b, data={"token": token_b.split(".")[0] + ".AAAA", "secret": "evil"})
        assert forged.status_code == 403
        sent = await browser.post(page_b, data={"token": token_b, "secret": "one"})
        assert sent.status_code == 200, sent.text
        assert (await browser.post(page_b, data={"token": token_b, "secret": "again"})).status_code == 404  # replay
        assert (await browser.post(page_a, data={"token": token_b, "secret": "again"})).status_code == 404  # on A too

        second = await on_a.session.call_tool("execute_code", arguments, input_responses={"input": ElicitResult(action="accept")},
                                              request_state=first.request_state, allow_input_required=True)
        assert isinstance(second, InputRequiredResult), second  # the first secret reached A's cell: it asks the second
        page2_a = second.input_requests["input"].params.url  # type: ignore[union-attr]
        page2_b = origin_b + page2_a.removeprefix(origin_a)
        tokens = [form_token(await browser.get(page2_a)), form_token(await browser.get(page2_b))]
        statuses: list[int] = []

        async def post(page: str, token: str, secret: str) -> None:
            statuses.append((await browser.post(page, data={"token": token, "secret": secret})).status_code)

        async with anyio.create_task_group() as tg:  # the same page used at once on both replicas
            tg.start_soon(post, page2_a, tokens[0], "two")
            tg.start_soon(post, page2_b, tokens[1], "two")
        assert sorted(statuses) == [200, 404], statuses
        done = await on_a.session.call_tool("execute_code", arguments, input_responses={"input": ElicitResult(action="accept")},
                                            request_state=second.request_state, allow_input_required=True)
        assert isinstance(done, CallToolResult) and not done.is_error, done
        assert done.structured_content is not None and done.structured_content["result"] == [sha("one"), sha("two")], done

        short = {"code": "import getpass\ngetpass.getpass('Key: ')", "session": handle, "timeout": 3}
        asked = await on_a.session.call_tool("execute_code", short, allow_input_required=True)
        assert isinstance(asked, InputRequiredResult), asked
        late_b = origin_b + asked.input_requests["input"].params.url.removeprefix(origin_a)  # type: ignore[union-attr]
        late_token = form_token(await browser.get(late_b))
        await anyio.sleep(4)  # the cell's timeout: its question ends, its page with it (on every replica)
        assert (await browser.post(late_b, data={"token": late_token, "secret": "late"})).status_code == 404
    for replica in fleet.replicas:
        assert "one" not in [w for line in replica.output().splitlines() for w in line.split()], replica.name


async def test_a_secret_too_long_is_refused_on_any_replica_and_the_page_stays(fleet: Fleet) -> None:
    """A secret longer than an answer may be (MAX_INPUT_CHARS), POSTed on the page of A's run through B: refused there
    ("Too long", nothing sent) before the page's grant is used, as it is on A, so the page still takes a good one.
    (B said "Sent" and used the grant up; A's run refused the relayed text, and its cell kept waiting.)"""
    from kernelexec.session.runs import MAX_INPUT_CHARS

    a, b = fleet.replicas[0].url, fleet.replicas[1].url
    origin_a, origin_b = a.removesuffix("/mcp"), b.removesuffix("/mcp")
    code = "import getpass, hashlib\nhashlib.sha256(getpass.getpass('Key: ').encode()).hexdigest()"
    async with client(a, ALICE, elicitation_callback=never_asked) as on_a, httpx2.AsyncClient(timeout=30) as browser:
        handle = (await on_a.call_tool("execute_code", {"code": "1"})).structured_content["session"]  # type: ignore[index]
        arguments = {"code": code, "session": handle, "timeout": 120}
        first = await on_a.session.call_tool("execute_code", arguments, allow_input_required=True)
        assert isinstance(first, InputRequiredResult), first
        page_a = first.input_requests["input"].params.url  # type: ignore[union-attr]
        for page in (page_a, origin_b + page_a.removeprefix(origin_a)):  # on the holder, then through another replica
            too_long = await browser.post(page, data={"token": form_token(await browser.get(page)),
                                                       "secret": "x" * (MAX_INPUT_CHARS + 1)})
            assert too_long.status_code == 413 and "Nothing was sent" in too_long.text, (page, too_long.status_code)
        sent = await browser.post(page, data={"token": form_token(await browser.get(page)), "secret": "one"})
        assert sent.status_code == 200, sent.text
        done = await on_a.session.call_tool("execute_code", arguments, input_responses={"input": ElicitResult(action="accept")},
                                            request_state=first.request_state, allow_input_required=True)
    assert isinstance(done, CallToolResult) and not done.is_error, done
    assert done.structured_content is not None and done.structured_content["result"] == sha("one"), done


async def test_an_upload_url_minted_on_one_replica_is_used_once_on_any(fleet: Fleet) -> None:
    """An upload URL minted by A: a PUT on B lands in the session's kernel (under its lease); another token's PUT is
    404, a replay 410, the same URL PUT at once on A and B lands once, an expired URL is 410 on B."""
    a, b = fleet.replicas[0].url, fleet.replicas[1].url
    origin_a, origin_b = a.removesuffix("/mcp"), b.removesuffix("/mcp")
    put_headers = {"Content-Type": "application/octet-stream"}
    async with client(a, ALICE) as on_a, httpx2.AsyncClient(timeout=60) as http:
        handle = (await on_a.call_tool("execute_code", {"code": "1"})).structured_content["session"]  # type: ignore[index]

        async def mint(name: str, expires_s: int = 600) -> tuple[str, str]:
            granted = await on_a.call_tool("upload_url", {"filename": name, "session": handle, "expires_s": expires_s})
            assert not granted.is_error and granted.structured_content is not None, text(granted)
            url = granted.structured_content["uploadUrl"]
            assert url.startswith(origin_a + "/upload/"), url
            return url, origin_b + url.removeprefix(origin_a)

        _, on_b = await mint("one.txt")
        bob = await http.put(on_b, content=b"bob's", headers={**put_headers, "Authorization": f"Bearer {BOB}"})
        assert bob.status_code == 404, bob.text  # another token: as unknown (and nothing used up)
        landed = await http.put(on_b, content=b"first file", headers={**put_headers, "Authorization": f"Bearer {ALICE}"})
        assert landed.status_code == 201, landed.text
        assert landed.json()["sha256"] == hashlib.sha256(b"first file").hexdigest()
        assert (await http.put(on_b, content=b"again", headers=put_headers)).status_code == 410  # replay on B

        both_a, both_b = await mint("two.txt")
        statuses: list[int] = []

        async def put(url: str, body: bytes) -> None:
            statuses.append((await http.put(url, content=body, headers=put_headers)).status_code)

        async with anyio.create_task_group() as tg:  # the same URL at once on both replicas
            tg.start_soon(put, both_a, b"from A")
            tg.start_soon(put, both_b, b"from B")
        assert sorted(statuses) == [201, 410], statuses

        _, late = await mint("late.txt", expires_s=1)
        await anyio.sleep(2)
        assert (await http.put(late, content=b"late", headers=put_headers)).status_code == 410  # expired, on B
        files = await on_a.call_tool("execute_code", {"code": "import os\n[open('one.txt').read(), open('two.txt').read() "
                                                      "in ('from A', 'from B'), os.path.exists('late.txt')]", "session": handle})
    assert files.structured_content is not None and files.structured_content["result"] == ["first file", True, False], text(files)


async def test_upload_urls_used_on_another_replica_leave_the_minting_replicas_budget(fleet: Fleet) -> None:
    """--max-upload-urls-per-token counts the URLs a replica minted that are still unused: one PUT on another replica
    (a balancer's round robin) is used too, and its place is free again on the replica that minted it (it stayed
    counted there until it expired: TooManyUploads for a token whose URLs were all used)."""
    u = fleet.start("u", "--auth-token-file", str(fleet.base / "tokens"), "--max-upload-urls-per-token", "2")
    origin_u, origin_b = u.url.removesuffix("/mcp"), fleet.replicas[1].url.removesuffix("/mcp")
    async with client(u.url, ALICE) as on_u, httpx2.AsyncClient(timeout=60) as http:
        handle = (await on_u.call_tool("execute_code", {"code": "1"})).structured_content["session"]  # type: ignore[index]
        for n in range(3):  # a third within a budget of two: the first two were used (on B)
            granted = await on_u.call_tool("upload_url", {"filename": f"f{n}.txt", "session": handle})
            assert not granted.is_error and granted.structured_content is not None, text(granted)
            url = origin_b + granted.structured_content["uploadUrl"].removeprefix(origin_u)
            landed = await http.put(url, content=b"x", headers={"Content-Type": "application/octet-stream"})
            assert landed.status_code == 201, landed.text


async def test_an_answer_relayed_then_one_on_the_holder_one_of_them_is_refused(fleet: Fleet) -> None:
    """The same question answered through B (relayed, not yet taken by A's poll) and then on A itself: one answer per
    question across the fleet, so one of the two calls must say it was not used."""
    a, b = fleet.replicas[0].url, fleet.replicas[1].url
    both: list[tuple[str, str]] = []
    async with client(a, ALICE) as on_a, client(b, ALICE) as on_b:
        handle = (await on_a.call_tool("execute_code", {"code": "1"})).structured_content["session"]  # type: ignore[index]
        for _ in range(3):  # a race with the holder's poll (every 0.25 s): tried a few times
            asked = await on_a.call_tool("execute_code", {"code": "name = input('Name? ')\nf'hi {name}'", "session": handle})
            waiting = asked.structured_content
            assert waiting is not None and waiting["ending"] == "awaiting_input", text(asked)
            answer = {"run_id": waiting["run_id"], "question_id": waiting["question_id"]}
            via_b = await on_b.call_tool("send_input", {**answer, "text": "Ada", "wait_s": 0})
            via_a = await on_a.call_tool("send_input", {**answer, "text": "Eve", "wait_s": 10})
            if not via_b.is_error and not via_a.is_error:
                both.append((text(via_b), text(via_a)))
    assert not both, both
