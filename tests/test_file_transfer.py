"""SEP-2631's ``files/authorizeUpload`` (file_transfer.py) and the upload hardening (issue 34, point 5), against a real
``kernelexec serve --transport http``: real SDK clients over streamable HTTP send the raw request with the SDK's
generic ``send_request``, with and without the extension declared; the PUT lands through the kernel. Every upload
here is an attack: another token, reused, expired, too big, a lying size or digest, a busy session, a kernel that
lies about its steps, a flood of URLs."""

from __future__ import annotations

import base64
import hashlib
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import anyio
import httpx2
import pytest
from mcp import Client
from mcp.client import advertise
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp_types import Request, RequestParams
from pydantic import ConfigDict, TypeAdapter

from kernelexec.server.file_transfer import EXTENSION_ID

from .support import http_server, make_settings

pytestmark = pytest.mark.anyio

ALICE = "alice-token-0123456789abcdef"
BOB = "bob-token-0123456789abcdef00"
CAROL = "carol-token-0123456789abcdef"
BUDGET = 4


class Params(RequestParams):
    model_config = ConfigDict(extra="allow")


class AuthorizeUpload(Request[Params, Literal["files/authorizeUpload"]]):
    method: Literal["files/authorizeUpload"] = "files/authorizeUpload"


ANY = TypeAdapter(dict[str, Any])


@pytest.fixture(scope="module")
def server(short_tmp: Path) -> Iterator[str]:
    tokens = short_tmp / "tokens"
    tokens.write_text(f"{ALICE}\n{BOB}\n{CAROL}\n")
    with http_server(short_tmp / "files", "--auth-token-file", str(tokens), "--pool-size", "0", "--restart-spares", "0",
                     "--max-upload-urls-per-token", str(BUDGET)) as url:
        yield url


def client(url: str, token: str, *, declared: bool = True) -> Client:
    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=60)
    return Client(streamable_http_client(url, http_client=http), extensions=[advertise(EXTENSION_ID, {})] if declared else None)


def b64url(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


async def authorize(c: Client, handle: str | None, **params: Any) -> dict[str, Any]:
    meta = {EXTENSION_ID: {"session": handle}} if handle else {}
    meta[EXTENSION_ID] = {**meta.get(EXTENSION_ID, {}), **params.pop("ours", {})}
    request = AuthorizeUpload(params=Params(**params, _meta=meta))
    return await c.session.send_request(request, ANY)


async def new_session(c: Client) -> str:
    return str((await c.call_tool("new_session", {})).structured_content["session"])  # type: ignore[index]


async def cell(c: Client, handle: str, code: str) -> Any:
    answer = await c.call_tool("execute_code", {"code": code, "session": handle})
    assert answer.structured_content["success"], answer.content[0].text[-1500:]  # type: ignore[index, union-attr]
    return answer.structured_content["result"]  # type: ignore[index]


async def put(url: str, body: Any, **headers: str) -> httpx2.Response:
    async with httpx2.AsyncClient(timeout=60) as http:
        return await http.put(url, content=body, headers={"Content-Type": "application/octet-stream", **headers})


async def leftovers(c: Client, handle: str, *names: str) -> list[str]:
    """What an upload may have left in the working directory: temporary files, or the names given."""
    found = await cell(c, handle, "import os; result = sorted(os.listdir('.'))")
    return [n for n in found if n.startswith(".kernelexec-upload") or n in names]


async def test_declared_the_extension_is_advertised_and_the_put_lands_through_the_kernel(server: str) -> None:
    body = os.urandom(300 * 1024 + 3)  # two chunks
    async with client(server, ALICE) as alice:
        assert EXTENSION_ID in (alice.server_capabilities.extensions or {}), alice.server_capabilities
        handle = await new_session(alice)
        got = await authorize(alice, handle, name="report.bin", mimeType="application/octet-stream", size=len(body),
                              digest={"algorithm": "sha-256", "value": b64url(hashlib.sha256(body).digest())})
        file, upload = got["file"], got["upload"]
        assert file["uri"] == f"mcp-file://kernelexec/{handle}/report.bin" and file["name"] == "report.bin"
        assert file["size"] == len(body) and file["mimeType"] == "application/octet-stream"
        assert upload["transport"] == "https" and upload["method"] == "PUT" and upload["maxSize"] == len(body)
        assert upload["url"].startswith(server.removesuffix("/mcp") + "/upload/") and upload["expiresAt"].endswith("Z")
        done = await put(upload["url"], body, **upload["headers"])  # no bearer token: the URL is the capability
        assert done.status_code == 201, done.text
        # the answer says what the server knows, nothing the kernel wrote
        assert done.json() == {"name": "report.bin", "size": len(body), "sha256": hashlib.sha256(body).hexdigest(),
                               "session": handle}
        code = "import hashlib; result = hashlib.sha256(open('report.bin','rb').read()).hexdigest()"
        assert await cell(alice, handle, code) == hashlib.sha256(body).hexdigest()
        assert (await put(upload["url"], body)).status_code == 410  # reused
        assert await leftovers(alice, handle) == []


async def test_undeclared_the_method_is_refused_and_nothing_is_minted(server: str) -> None:
    async with client(server, ALICE) as alice, client(server, ALICE, declared=False) as plain:
        handle = await new_session(alice)
        with pytest.raises(MCPError) as refused:
            await authorize(plain, handle, name="x.bin", size=1)
        assert refused.value.error.code == -32021, refused.value.error  # the extension it must declare, named
        assert EXTENSION_ID in str(refused.value.error.data)


async def test_off_http_there_is_no_such_method(short_tmp: Path) -> None:
    from kernelexec.server.build import build_server
    from kernelexec.session.manager import SessionManager

    settings = make_settings(short_tmp, pool_size=0, restart_spares=0)  # stdio: the working directory is the user's
    async with SessionManager(settings).running() as sessions:
        async with Client(build_server(settings, sessions), extensions=[advertise(EXTENSION_ID, {})]) as c:
            assert EXTENSION_ID not in (c.server_capabilities.extensions or {})
            with pytest.raises(MCPError) as refused:
                await authorize(c, None, name="x.bin", size=1)
            assert refused.value.error.code == -32601, refused.value.error


async def test_other_tokens_expired_urls_and_foreign_sessions(server: str) -> None:
    async with client(server, ALICE) as alice, client(server, BOB) as bob:
        handle = await new_session(alice)
        with pytest.raises(MCPError) as foreign:  # bob cannot mint for alice's session
            await authorize(bob, handle, name="x.bin", size=1)
        assert foreign.value.error.code == -32602 and foreign.value.error.data["reason"] == "invalidSession"
        with pytest.raises(MCPError) as unnamed:  # stateless HTTP: no default session to guess
            await authorize(alice, None, name="x.bin", size=1)
        assert unnamed.value.error.data["reason"] == "invalidSession"
        url = (await authorize(alice, handle, name="mine.bin", size=3))["upload"]["url"]
        assert (await put(url, b"bob", Authorization=f"Bearer {BOB}")).status_code == 404
        assert (await put(url + "x", b"bob")).status_code == 404
        short = (await authorize(alice, handle, name="late.bin", size=4, ours={"expiresInS": 1}))["upload"]["url"]
        await anyio.sleep(1.5)
        assert (await put(short, b"late")).status_code == 410
        assert (await put(url, b"yes", Authorization=f"Bearer {ALICE}")).status_code == 201
        assert await leftovers(alice, handle, "late.bin") == []


async def test_too_big_or_not_what_was_declared_is_refused_and_nothing_is_kept(server: str) -> None:
    async with client(server, ALICE) as alice:
        handle = await new_session(alice)
        with pytest.raises(MCPError) as huge:
            await authorize(alice, handle, name="huge.bin", size=1 << 40)
        assert huge.value.error.code == -32602 and huge.value.error.data["reason"] == "maxSizeExceeded"
        with pytest.raises(MCPError) as md5:
            await authorize(alice, handle, name="x.bin", size=1, digest={"algorithm": "md5", "value": "AAAA"})
        assert md5.value.error.data["reason"] == "invalidDigest"
        for name in ("../up.bin", "a/b", "nul\x00"):
            with pytest.raises(MCPError) as bad:
                await authorize(alice, handle, name=name, size=1)
            assert bad.value.error.data["reason"] == "invalidName"
        over = (await authorize(alice, handle, name="over.bin", size=10))["upload"]["url"]
        assert (await put(over, b"x" * 11)).status_code == 413  # over the declared size
        short = (await authorize(alice, handle, name="short.bin", size=10))["upload"]["url"]
        assert (await put(short, b"x" * 9)).status_code == 422  # under it
        body = b"the real bytes"
        lied = (await authorize(alice, handle, name="lied.bin", size=len(body),
                                digest={"algorithm": "sha-256", "value": b64url(hashlib.sha256(b"other").digest())}))
        assert (await put(lied["upload"]["url"], body)).status_code == 422  # not the digest declared
        assert await leftovers(alice, handle, "over.bin", "short.bin", "lied.bin") == []


async def test_a_busy_session_is_409_and_nothing_is_written(server: str) -> None:
    async with client(server, ALICE) as alice:
        handle = await new_session(alice)
        url = (await authorize(alice, handle, name="busy.bin", size=4))["upload"]["url"]
        started = await alice.call_tool("execute_code", {"code": "import time; time.sleep(20)", "session": handle,
                                                          "background": True})
        assert started.structured_content["ending"] == "running"  # type: ignore[index]
        begun = time.monotonic()
        refused = await put(url, b"busy")
        assert refused.status_code == 409 and "busy" in refused.json()["error"], refused.text
        assert 9 < time.monotonic() - begun < 19  # waited its bounded time (10 s), not the whole cell
        assert await leftovers(alice, handle, "busy.bin") == []  # (this cell queues behind the sleeping one)


async def test_a_kernel_that_lies_about_creating_the_file_is_left_with_nothing(server: str) -> None:
    """The first kernel step creates the temporary file, then fails (the cell made os.close raise for it): the upload
    fails, and the temporary file it made is removed all the same; the kernel's words are not in the answer."""
    async with client(server, ALICE) as alice:
        handle = await new_session(alice)
        url = (await authorize(alice, handle, name="lied.bin", size=4))["upload"]["url"]
        await cell(alice, handle, LYING_CLOSE)
        refused = await put(url, b"data")
        assert refused.status_code == 409, refused.text
        assert "nonsense" not in refused.text
        await cell(alice, handle, "import os; os.close = _real_close; result = 1")
        assert await leftovers(alice, handle, "lied.bin") == []


LYING_CLOSE = """import os
_real_close = os.close
def _lying_close(fd):
    try:
        target = os.readlink(f'/proc/self/fd/{fd}')
    except OSError:
        target = ''
    _real_close(fd)
    if '.kernelexec-upload' in target:
        raise OSError('nonsense \x1b]0;from the kernel')
os.close = _lying_close
result = 1"""


async def test_one_token_holds_a_bounded_number_of_unused_urls(server: str) -> None:
    async with client(server, CAROL) as carol, client(server, BOB) as bob:
        handle = await new_session(carol)
        urls = [(await authorize(carol, handle, name=f"f{i}.bin", size=1))["upload"]["url"] for i in range(BUDGET - 1)]
        tool = await carol.call_tool("upload_url", {"session": handle, "filename": "t.bin"})  # the tool counts too
        assert not tool.is_error
        with pytest.raises(MCPError) as flood:
            await authorize(carol, handle, name="more.bin", size=1)
        assert flood.value.error.code == -32603 and flood.value.error.data["reason"] == "tooManyUploads"
        refused = await carol.call_tool("upload_url", {"session": handle, "filename": "more.bin"})
        assert refused.is_error and "--max-upload-urls-per-token" in refused.content[0].text  # type: ignore[union-attr]
        other = await new_session(bob)  # another token is not starved by carol's flood
        assert (await authorize(bob, other, name="b.bin", size=1))["upload"]["url"]
        assert (await put(urls[0], b"1")).status_code == 201  # a used URL gives its place back
        assert (await authorize(carol, handle, name="again.bin", size=1))["upload"]["url"]
