"""Files in (issue 34, point 5): upload_url mints a one-time URL; a PUT of the bytes lands in the session's working
directory through the kernel. Every upload here is an attack, against a real `kernelexec serve --transport http`."""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from .conftest import http_server

pytestmark = pytest.mark.anyio

ALICE = "alice-token-0123456789abcdef"
BOB = "bob-token-0123456789abcdef00"


@pytest.fixture(scope="module")
def server(short_tmp: Path) -> Iterator[str]:
    tokens = short_tmp / "tokens"
    tokens.write_text(f"{ALICE}\n{BOB}\n")
    # a warm pool as shipped: the owner of a pooled session is bound when one is taken
    with http_server(short_tmp / "upload", "--auth-token-file", str(tokens), "--pool-size", "1") as url:
        yield url


def client(url: str, token: str | None) -> Client:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return Client(streamable_http_client(url, http_client=httpx2.AsyncClient(headers=headers, timeout=60)))


async def grant(c: Client, handle: str, filename: str, **more: Any) -> Any:
    answer = await c.call_tool("upload_url", {"session": handle, "filename": filename, **more})
    return answer if answer.is_error else answer.structured_content


async def cell(c: Client, handle: str, code: str) -> Any:
    answer = await c.call_tool("execute_code", {"code": code, "session": handle})
    assert answer.structured_content["success"], answer.content[0].text[-1500:]
    return answer.structured_content["result"]


async def put(url: str, body: bytes | Any, **headers: str) -> httpx2.Response:
    async with httpx2.AsyncClient(timeout=60) as http:
        return await http.put(url, content=body, headers={"Content-Type": "application/octet-stream", **headers})


async def listing(c: Client, handle: str) -> list[str]:
    return await cell(c, handle, "import os; result = sorted(os.listdir('.'))")


async def test_the_bytes_land_through_the_kernel_and_equal_what_was_sent(server: str) -> None:
    body = os.urandom(600 * 1024 + 7)  # three chunks, the last short
    async with client(server, ALICE) as alice:
        handle = (await alice.call_tool("new_session", {})).structured_content["session"]
        g = await grant(alice, handle, "data.bin", max_bytes=1024 * 1024)
        assert g["method"] == "PUT" and g["maxBytes"] == 1024 * 1024 and g["expiresAt"].endswith("Z")
        assert g["uploadUrl"].startswith(server.removesuffix("/mcp") + "/upload/")
        done = await put(g["uploadUrl"], body, **g["headers"])  # no bearer token: the URL is the capability
        assert done.status_code == 201, done.text
        assert done.json()["sha256"] == hashlib.sha256(body).hexdigest() and done.json()["size"] == len(body)
        seen = await cell(alice, handle, "import hashlib; result = hashlib.sha256(open('data.bin','rb').read()).hexdigest()")
        assert seen == hashlib.sha256(body).hexdigest()
        assert await cell(alice, handle, "import os; result = oct(os.stat('data.bin').st_mode & 0o777)") == "0o600"
        again = await put(g["uploadUrl"], b"more")  # reused
        assert again.status_code == 410
        assert not [n for n in await listing(alice, handle) if n.startswith(".kernelexec-upload")]
        await cell(alice, handle, "import os; os.mkdir('adir'); result = 1")
        onto = await grant(alice, handle, "adir")  # a directory of that name: refused, nothing kept
        assert (await put(onto["uploadUrl"], b"x")).status_code == 409
        assert not [n for n in await listing(alice, handle) if n.startswith(".kernelexec-upload")]


@pytest.mark.parametrize("name", ["../evil", "/etc/passwd", "a/b", "a\\b", "nul\x00byte", "bell\x07", "line\nfeed",
                                  "..", ".", "", "CON", "nul.txt", "trailing.", " lead", "x" * 256])
async def test_names_that_are_not_one_plain_file_name_are_refused(server: str, name: str) -> None:
    async with client(server, ALICE) as alice:
        handle = (await alice.call_tool("new_session", {})).structured_content["session"]
        answer = await grant(alice, handle, name)
        assert getattr(answer, "is_error", False), answer
        await alice.call_tool("close_session", {"session": handle})


async def test_over_the_cap_is_413_while_streaming_and_nothing_is_left(server: str) -> None:
    async with client(server, ALICE) as alice:
        handle = (await alice.call_tool("new_session", {})).structured_content["session"]
        declared = await grant(alice, handle, "big.bin", max_bytes=1000)
        assert (await put(declared["uploadUrl"], b"x" * 1001)).status_code == 413  # by its Content-Length

        streamed = await grant(alice, handle, "big.bin", max_bytes=300 * 1024)

        async def lying() -> Any:  # chunked: no Content-Length, so the cap is met while streaming
            for _ in range(8):
                yield b"y" * (100 * 1024)

        refused = await put(streamed["uploadUrl"], lying())
        assert refused.status_code == 413
        names = await listing(alice, handle)
        assert "big.bin" not in names and not [n for n in names if n.startswith(".kernelexec-upload")]


async def test_a_planted_symlink_is_replaced_never_followed(server: str) -> None:
    async with client(server, ALICE) as alice:  # a cell plants links; the victim lies outside the working dir
        handle = (await alice.call_tool("new_session", {})).structured_content["session"]
        await cell(alice, handle, "import os; open('../home/victim.txt', 'w').write('untouched'); "
                                  "os.symlink('../home/victim.txt', 'link.txt'); os.symlink('/dev/null', 'dev'); result = 1")
        g = await grant(alice, handle, "link.txt")
        done = await put(g["uploadUrl"], b"payload")
        assert done.status_code == 201, done.text
        assert await cell(alice, handle, "import os; result = [os.path.islink('link.txt'), open('link.txt').read()]") == [
            False, "payload"]
        g = await grant(alice, handle, "dev")  # the kernel's policy will not write where it points: refused, nothing kept
        assert (await put(g["uploadUrl"], b"payload")).status_code == 409
        assert await cell(alice, handle, "import os; result = os.readlink('dev')") == "/dev/null"
        assert not [n for n in await listing(alice, handle) if n.startswith(".kernelexec-upload")]
        assert await cell(alice, handle, "result = open('../home/victim.txt').read()") == "untouched"


async def test_one_url_one_upload_even_concurrently(server: str) -> None:
    async with client(server, ALICE) as alice:
        handle = (await alice.call_tool("new_session", {})).structured_content["session"]
        g = await grant(alice, handle, "race.bin")
        statuses: list[int] = []

        async def one(i: int) -> None:
            statuses.append((await put(g["uploadUrl"], bytes([i]) * 1000)).status_code)

        async with anyio.create_task_group() as tg:
            for i in range(5):
                tg.start_soon(one, i)
        assert sorted(statuses) == [201, 410, 410, 410, 410]
        assert await cell(alice, handle, "result = len(set(open('race.bin','rb').read()))") == 1


async def test_expired_unknown_and_another_tokens_urls(server: str) -> None:
    async with client(server, ALICE) as alice:
        handle = (await alice.call_tool("new_session", {})).structured_content["session"]
        short = await grant(alice, handle, "late.bin", expires_s=1)
        time.sleep(1.5)
        assert (await put(short["uploadUrl"], b"late")).status_code == 410
        g = await grant(alice, handle, "mine.bin")
        assert (await put(g["uploadUrl"], b"bob", Authorization=f"Bearer {BOB}")).status_code == 404
        assert (await put(g["uploadUrl"], b"?", Authorization="Bearer not-a-token-at-all-000")).status_code == 404
        assert (await put(g["uploadUrl"] + "x", b"guess")).status_code == 404
        assert (await put(g["uploadUrl"], b"alice", Authorization=f"Bearer {ALICE}")).status_code == 201
        assert "late.bin" not in await listing(alice, handle)
    async with client(server, BOB) as bob:  # nor can bob mint one for alice's session
        answer = await bob.call_tool("upload_url", {"session": handle, "filename": "x.bin"})
        assert answer.is_error and "unknown session" in answer.content[0].text


async def test_a_closed_sessions_url_is_gone(server: str) -> None:
    async with client(server, ALICE) as alice:
        handle = (await alice.call_tool("new_session", {})).structured_content["session"]
        g = await grant(alice, handle, "after.bin")
        await alice.call_tool("close_session", {"session": handle})
        assert (await put(g["uploadUrl"], b"late")).status_code == 410


async def test_a_killed_uploads_temporary_file_is_swept_at_the_sessions_next_upload(server: str) -> None:
    """A SIGKILL mid-upload leaves ``.kernelexec-upload-*.part`` in the working directory: the next upload of the
    session removes the stale ones (untouched for STALE_PART_S), never a fresh one (another upload's, in progress)."""
    async with client(server, ALICE) as alice:
        handle = (await alice.call_tool("new_session", {})).structured_content["session"]
        await cell(alice, handle, "import os, time\n"
                                  "open('.kernelexec-upload-dead.part', 'wb').write(b'half')\n"
                                  "os.utime('.kernelexec-upload-dead.part', (time.time() - 7200,) * 2)\n"
                                  "open('.kernelexec-upload-live.part', 'wb').write(b'going')\nresult = 1")
        g = await grant(alice, handle, "next.bin")
        assert (await put(g["uploadUrl"], b"next")).status_code == 201
        names = await listing(alice, handle)
        assert ".kernelexec-upload-dead.part" not in names and ".kernelexec-upload-live.part" in names, names
        await cell(alice, handle, "import os; os.unlink('.kernelexec-upload-live.part'); result = 1")


@pytest.fixture(scope="module")
def tight(short_tmp: Path) -> Iterator[str]:
    """A server with small upload budgets: 2 URLs per token, 1 MiB being received at once."""
    tokens = short_tmp / "tight-tokens"
    tokens.write_text(f"{ALICE}\n")
    with http_server(short_tmp / "tight", "--auth-token-file", str(tokens), "--max-upload-urls-per-token", "2",
                     "--max-upload-spool-mb", "1") as url:
        yield url


def trickle(first: bytes, pause: float) -> Any:
    """A chunked body that sends ``first``, then stalls ``pause`` seconds before its last byte: a slow client."""
    async def body() -> Any:
        yield first
        await anyio.sleep(pause)
        yield b"."
    return body()


async def test_slow_puts_from_one_token_hold_neither_its_budget_nor_the_servers_spool(tight: str) -> None:
    """One token, many slow PUTs: a URL whose PUT is under way still counts against the token's budget, and the
    server receives at most --max-upload-spool-mb at once (503 past it, nothing kept)."""
    async with client(tight, ALICE) as alice:
        handle = (await alice.call_tool("new_session", {})).structured_content["session"]
        first, second = await grant(alice, handle, "one.bin"), await grant(alice, handle, "two.bin")
        async with anyio.create_task_group() as tg:
            done: dict[str, int] = {}

            async def slow(name: str, url: str, size: int, pause: float) -> None:
                done[name] = (await put(url, trickle(b"a" * size, pause))).status_code

            tg.start_soon(slow, "one", first["uploadUrl"], 700 * 1024, 4.0)
            await anyio.sleep(1.5)  # its first 700 KiB are spooled; the PUT is still under way
            third = await grant(alice, handle, "three.bin")
            assert getattr(third, "is_error", False), third  # the PUT under way still counts: 2 of 2
            assert "--max-upload-urls-per-token" in third.content[0].text
            tg.start_soon(slow, "two", second["uploadUrl"], 700 * 1024, 1.0)  # 1.4 MiB at once: over the spool budget
        assert done == {"one": 201, "two": 503}, done
        names = await listing(alice, handle)
        assert "one.bin" in names and "two.bin" not in names and not [n for n in names if n.startswith(".kernelexec-upload")]
        again = await grant(alice, handle, "four.bin")  # both PUTs over: the budget is free again
        assert not getattr(again, "is_error", False), again


async def test_a_body_that_has_not_arrived_when_its_url_expires_is_refused(tight: str) -> None:
    """A client trickling its body past the URL's expiry holds nothing longer: 408, nothing kept."""
    async with client(tight, ALICE) as alice:
        handle = (await alice.call_tool("new_session", {})).structured_content["session"]
        g = await grant(alice, handle, "late.bin", expires_s=2)
        started = time.monotonic()
        answer = await put(g["uploadUrl"], trickle(b"b" * 1024, 5.0))
        assert answer.status_code == 408, (answer.status_code, answer.text)
        assert time.monotonic() - started < 30
        names = await listing(alice, handle)
        assert "late.bin" not in names and not [n for n in names if n.startswith(".kernelexec-upload")]


async def test_not_listed_under_stdio(tmp_path: Path) -> None:
    from kernelexec.config import Settings
    from kernelexec.server.build import build_server
    from kernelexec.session.manager import SessionManager

    for transport, listed in (("stdio", False), ("http", True)):
        settings = Settings(state_dir=tmp_path / transport, transport=transport)
        async with Client(build_server(settings, SessionManager(settings))) as c:
            names = {t.name for t in (await c.list_tools()).tools}
        assert ("upload_url" in names) is listed, transport
