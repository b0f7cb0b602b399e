"""A cell's getpass() never as a form (SEP-1036): with a client that declares URL-mode elicitation it is a one-time
page the server serves, which a real headless Chromium opens, reads and submits (``tests/secret_browser.mjs``); the
cell gets exactly what was typed (it prints a hash), and the secret is in no byte the MCP client received, no log
line, no file of the state directory (journal, notebook, store). Without URL mode the cell's getpass() raises a
clear EOFError and nobody is asked. ``--secret NAME=@file`` gives every kernel a secret the model never sees.

Over stdio the server is a real ``kernelexec serve`` child whose stdout is teed to a file (the client's bytes) and
whose stderr is its log; over HTTP a real ``kernelexec serve --transport http`` whose responses the client's own
transport records. Needs Debian's ``chromium`` and npm's ``playwright-core`` in ``.ci/node`` (``.ci/run``
installs both); without them the browser tests skip, except in CI, where they fail.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp_types import ElicitRequestURLParams, ElicitResult

from kernelexec.session.runs import Question, Run

from .support import clean_env, free_port, kernelexec_cmd, stop, wait_for_port
from .zygote import ForkedServer

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parents[1]
PLAYWRIGHT = ROOT / ".ci" / "node" / "node_modules" / "playwright-core"
DRIVER = Path(__file__).with_name("secret_browser.mjs")
SECRET = "hunter2-ÄÖ-correct horse <b>&amp;"  # markup and non-ASCII: typed and hashed as they are
PROMPT = "API key for <b>prod</b>: "
CELL = (f"import getpass, hashlib\nvalue = getpass.getpass({PROMPT!r})\n"
        "print('sha', hashlib.sha256(value.encode()).hexdigest())")


def _browser_missing() -> str | None:
    if not Path("/usr/bin/chromium").exists():
        return "Debian's chromium is not installed (apt-get install chromium; .ci/run does it)"
    if not PLAYWRIGHT.is_dir() or shutil.which("node") is None:
        return "npm's playwright-core is not in .ci/node (.ci/run installs it)"
    return None


def _need_browser() -> None:
    missing = _browser_missing()
    if missing:
        if os.environ.get("CI"):
            pytest.fail(missing)
        pytest.skip(missing)


async def _browse(url: str, secret: str, profile: Path) -> dict[str, Any]:
    """The human: Chromium opens ``url``, types ``secret`` and submits; the driver's steps by name."""
    options = {"url": url, "secret": secret, "playwright": str(PLAYWRIGHT), "userDataDir": str(profile),
               "shots": os.environ.get("KERNELEXEC_ARTIFACTS")}
    proc = await anyio.run_process(["node", str(DRIVER), json.dumps(options)], check=False)
    steps = {s["step"]: s for s in (json.loads(line) for line in proc.stdout.decode().splitlines() if line.startswith("{"))}
    assert "done" in steps, (steps.get("error"), proc.stderr.decode()[-2000:])
    return steps


class Human:
    """A client's elicitation callback for URL mode: says yes, then (as a client opens the URL for its user) a
    browser opens the page in the background; form-mode requests are recorded and refused."""

    def __init__(self, tg: Any, profile: Path, secret: str = SECRET, browse: bool = True) -> None:
        self.tg, self.profile, self.secret, self.browse = tg, profile, secret, browse
        self.asked: list[Any] = []
        self.steps: dict[str, Any] | None = None

    async def __call__(self, context: Any, params: Any) -> ElicitResult:
        self.asked.append(params)
        if not isinstance(params, ElicitRequestURLParams):
            return ElicitResult(action="decline")
        if self.browse:
            async def open_page() -> None:
                self.steps = await _browse(params.url, self.secret, self.profile)

            self.tg.start_soon(open_page)
        return ElicitResult(action="accept")


def _leaks(secret: str, *places: Path | bytes | str) -> list[str]:
    """Where ``secret`` (as UTF-8, or JSON-escaped) shows up: files (walked), bytes, text."""
    needles = [secret.encode(), json.dumps(secret)[1:-1].encode(), json.dumps(secret, ensure_ascii=False)[1:-1].encode()]
    found = []
    for place in places:
        if isinstance(place, Path):
            files = [place] if place.is_file() else [p for p in place.rglob("*") if p.is_file() and not p.is_symlink()]
            for f in files:
                try:
                    data = f.read_bytes()
                except OSError:
                    continue
                if any(n in data for n in needles):
                    found.append(str(f))
        else:
            data = place.encode() if isinstance(place, str) else place
            if any(n in data for n in needles):
                found.append(repr(data[:80]))
    return found


def _digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def _stdio(state: Path, out: Path, log: Path, *flags: str) -> StdioServerParameters:
    """``kernelexec serve`` over stdio, its stdout (every byte the client reads) teed to ``out``, stderr to ``log``."""
    cmd = kernelexec_cmd("serve", "--state-dir", str(state), "--pool-size", "0", "--restart-spares", "0", *flags)
    script = 'out="$1"; log="$2"; shift 2; "$@" 2>"$log" | tee "$out"'
    return StdioServerParameters(command="bash", args=["-c", script, "sh", str(out), str(log), *cmd], env=clean_env())


def _checked_page(steps: dict[str, Any], handle: str) -> None:
    assert steps["preview"] == {"step": "preview", "status": 200, "form": True}, steps["preview"]  # a GET is harmless:
    opened = steps["opened"]
    assert opened["status"] == 200, opened  # the human opens the page after the preview, and it works
    headers = opened["headers"]
    assert headers["x-frame-options"] == "DENY" and "frame-ancestors 'none'" in headers["content-security-policy"], headers
    assert "default-src 'none'" in headers["content-security-policy"] and headers["cache-control"] == "no-store", headers
    assert headers["referrer-policy"] == "no-referrer", headers
    assert opened["scripts"] == 0, opened
    assert handle in opened["text"] and PROMPT.strip() in opened["text"], opened["text"]  # escaped: shown as text
    assert "not from the assistant" in opened["text"], opened["text"]
    assert steps["forged"]["status"] == 403, steps["forged"]
    assert steps["sent"]["status"] == 200 and "went to the code" in steps["sent"]["text"], steps["sent"]
    assert steps["again"]["status"] in (None, 404, 410), steps["again"]  # used once (stdio: the listener is gone)
    assert not steps["done"]["consoleErrors"], steps["done"]


async def test_getpass_over_stdio_is_a_page_typed_in_chromium_and_reaches_only_the_kernel(tmp_path: Path,
                                                                                           short_tmp: Path) -> None:
    """2025-11-25 (a back-channel): elicitation/create in URL mode; the page on a 127.0.0.1 listener of its own;
    notifications/elicitation/complete once the secret is in."""
    _need_browser()
    state, out, log = short_tmp / "state", tmp_path / "stdout.bin", tmp_path / "server.log"
    notes: list[Any] = []

    async def heard(message: Any) -> None:
        notes.append(message)

    async with anyio.create_task_group() as tg:
        human = Human(tg, tmp_path / "chromium")
        async with Client(_stdio(state, out, log), mode="legacy", elicitation_callback=human, message_handler=heard) as client:
            with anyio.fail_after(120):
                result = await client.call_tool("execute_code", {"code": CELL, "timeout": 90})
            r: Any = result.structured_content
            assert r["success"] and r["ending"] == "completed", r
            assert f"sha {_digest(SECRET)}" in r["stdout"], r
            again: Any = (await client.call_tool("execute_code", {"code": "1 + 1", "session": r["session"]})).structured_content
            assert again["result"] == 2
            notebook = json.loads(Path(r["notebook"]).read_text())
    assert len(human.asked) == 1 and isinstance(human.asked[0], ElicitRequestURLParams), human.asked
    asked = human.asked[0]
    assert asked.url.startswith("http://127.0.0.1:") and "/secret/" in asked.url and len(asked.url.rsplit("/", 1)[1]) >= 40
    assert r["session"] in asked.message and "not from the assistant" in asked.message
    assert human.steps is not None
    _checked_page(human.steps, r["session"])
    completes = [n for n in notes if getattr(n, "method", None) == "notifications/elicitation/complete"]
    assert [c.params.elicitation_id for c in completes] == [asked.elicitation_id], notes
    inputs = [c["metadata"]["kernelexec"].get("inputs") for c in notebook["cells"] if c["cell_type"] == "code"][0]
    assert inputs == [{"prompt": PROMPT, "password": True, "answered": True, "answer": "***"}], inputs
    assert out.stat().st_size > 0 and b"elicitation/create" in out.read_bytes()  # the tee saw the conversation
    assert _leaks(SECRET, out, log, state, result.model_dump_json().encode()) == []


@contextmanager
def _http_server(state: Path, log: Path, *flags: str) -> Iterator[str]:
    port = free_port()
    with open(log, "wb") as err, open(os.devnull, "wb") as null:  # forked from the zygote (tests/zygote.py)
        proc = ForkedServer(["serve", "--transport", "http", "--port", str(port), "--state-dir", str(state),
                             "--pool-size", "0", "--restart-spares", "0", *flags],
                            env=clean_env(), stdout=null, stderr=err)
        try:
            wait_for_port(port, proc)
            yield f"http://127.0.0.1:{port}/mcp"
        finally:
            stop(proc)


class _Recording(httpx2.AsyncHTTPTransport):
    """The MCP client's own HTTP transport, keeping every byte it sends and receives."""

    def __init__(self) -> None:
        super().__init__()
        self.seen = bytearray()

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        self.seen += await request.aread()
        response = await super().handle_async_request(request)
        seen, stream = self.seen, response.stream

        class Tee(httpx2.AsyncByteStream):
            async def __aiter__(self) -> AsyncIterator[bytes]:
                async for chunk in stream:  # type: ignore[union-attr]
                    seen.extend(chunk)
                    yield chunk

            async def aclose(self) -> None:
                await stream.aclose()  # type: ignore[union-attr]

        return httpx2.Response(response.status_code, headers=response.headers, stream=Tee(), extensions=response.extensions,
                               request=request)


@asynccontextmanager
async def _http_client(url: str, **kwargs: Any) -> AsyncIterator[tuple[Client, _Recording]]:
    recording = _Recording()
    async with Client(streamable_http_client(url, http_client=httpx2.AsyncClient(transport=recording, timeout=120)),
                      **kwargs) as client:
        yield client, recording


async def test_getpass_over_http_2026_is_a_page_at_the_servers_origin_typed_in_chromium(tmp_path: Path, short_tmp: Path) -> None:
    """2026-07-28 (no back-channel): the URL-mode elicitation embedded in an InputRequiredResult; the page is a route of
    the server's own app; the client's retry (accept) waits for the page, and the answer is the cell's."""
    _need_browser()
    state, log = short_tmp / "state", tmp_path / "server.log"
    with _http_server(state, log) as url:
        async with anyio.create_task_group() as tg:
            human = Human(tg, tmp_path / "chromium")
            async with _http_client(url, elicitation_callback=human) as (client, recording):
                assert client.protocol_version >= "2026-07-28"
                with anyio.fail_after(120):
                    result = await client.call_tool("execute_code", {"code": CELL, "timeout": 90})
                r: Any = result.structured_content
                assert r["success"] and f"sha {_digest(SECRET)}" in r["stdout"], r
                notebook = json.loads(Path(r["notebook"]).read_text())
    assert len(human.asked) == 1 and isinstance(human.asked[0], ElicitRequestURLParams), human.asked
    origin = url.removesuffix("/mcp")
    assert human.asked[0].url.startswith(origin + "/secret/"), (human.asked[0].url, origin)
    assert human.steps is not None
    _checked_page(human.steps, r["session"])
    inputs = [c["metadata"]["kernelexec"].get("inputs") for c in notebook["cells"] if c["cell_type"] == "code"][0]
    assert inputs[0]["answer"] == "***" and inputs[0]["answered"] is True, inputs
    assert b'"mode":"url"' in recording.seen.replace(b" ", b"")  # the recording saw the elicitation go by
    assert _leaks(SECRET, bytes(recording.seen), log, state) == []
    key = human.asked[0].url.rsplit("/", 1)[1]  # the page's key is its capability: never in the server's log
    assert key.encode() not in log.read_bytes()


def test_the_access_log_masks_the_key_of_a_page_or_an_upload_url() -> None:
    """uvicorn's access logger, as uvicorn calls it (client, method, path, version, status): with the server's
    mask (build.mask_capability_paths) a /secret/ or /upload/ key never reaches a handler; other paths do."""
    import io
    import logging

    from kernelexec.server.build import mask_capability_paths

    access = logging.getLogger("uvicorn.access")
    seen = io.StringIO()
    handler = logging.StreamHandler(seen)
    access.addHandler(handler)
    level = access.level
    access.setLevel(logging.INFO)
    try:
        mask_capability_paths()
        for path in ("/secret/" + "k" * 43, "/upload/" + "u" * 43, "/mcp"):
            access.info('%s - "%s %s HTTP/%s" %d', "127.0.0.1:5", "PUT", path, "1.1", 201)
    finally:
        access.removeHandler(handler)
        access.setLevel(level)
    text = seen.getvalue()
    assert "k" * 43 not in text and "u" * 43 not in text, text
    assert "/secret/***" in text and "/upload/***" in text and "/mcp" in text, text


async def test_a_page_expires_with_its_question_and_answers_nothing_after(tmp_path: Path, short_tmp: Path) -> None:
    """The client accepts but nobody types: at the cell's timeout the cell gets EOFError and the page is gone (404);
    the model's send_input cannot answer a page's question either (its awaiting answer names none)."""
    state, log = short_tmp / "state", tmp_path / "server.log"
    with _http_server(state, log, "--yield-after", "2") as url:
        async with anyio.create_task_group() as tg:
            human = Human(tg, tmp_path / "chromium", browse=False)
            async with _http_client(url, mode="legacy", elicitation_callback=human) as (client, _):
                # the kernel started first: the 2 s before the call yields are the question's, not a cold start's on a
                # busy machine (else the call answers before the page is asked for, with no page to open)
                warm: Any = (await client.call_tool("execute_code", {"code": "0"})).structured_content
                if warm["ending"] == "running":
                    await client.call_tool("get_run", {"run_id": warm["run_id"], "wait_s": 60})
                first = await client.call_tool("execute_code", {"code": "import getpass\ngetpass.getpass('Key: ')",
                                                                "timeout": 6})
                r: Any = first.structured_content
                assert r["ending"] == "running" and r.get("question_id") is None, r  # the model is given nothing to answer
                assert "own page" in first.content[0].text  # type: ignore[union-attr]
                page = human.asked[0].url
                async with httpx2.AsyncClient() as browser:
                    shown = await browser.get(page)
                    assert shown.status_code == 200
                    with anyio.fail_after(30):
                        done: Any = (await client.call_tool("get_run", {"run_id": r["run_id"], "wait_s": 20})).structured_content
                    assert not done["success"] and done["error_type"] == "EOFError", done
                    token = shown.text.split('name=token value="', 1)[1].split('"', 1)[0]
                    late = await browser.post(page, data={"token": token, "secret": "late"})
                    assert late.status_code == 404, late.status_code
                    assert (await browser.get(origin_of(url) + "/secret/" + "x" * 43)).status_code == 404


def origin_of(url: str) -> str:
    return url.removesuffix("/mcp")


async def test_run_answer_takes_a_page_question_only_from_its_page() -> None:
    """Run.answer: a page question refuses text from any other channel (send_input, a retry, a task), takes a decline
    from any, and one answer from its page; another question's id answers nothing."""
    from kernelexec.errors import InvalidRequest

    run = Run(id="run-x", session=None)  # type: ignore[arg-type]
    page_q = run.opened(Question("Key: ", True, url="http://127.0.0.1:1/secret/k"))
    other = run.opened(Question("name? ", False))
    for by_human in (False, True):
        with pytest.raises(InvalidRequest, match="own page"):
            run.answer(page_q.id, "typed elsewhere", by_human=by_human)
    assert not page_q.answered.is_set()
    run.answer(other.id, "Ada", by_page=True)  # the page flag does not make another question a page's
    with pytest.raises(InvalidRequest, match="already answered"):
        run.answer(other.id, "again", by_page=True)
    run.answer(page_q.id, "s3cret", by_human=True, by_page=True)
    assert page_q.answer == "s3cret"
    with pytest.raises(InvalidRequest, match="already answered"):
        run.answer(page_q.id, "again", by_human=True, by_page=True)
    declined = run.opened(Question("Key2: ", True, url="http://127.0.0.1:1/secret/k2"))
    run.answer(declined.id, None)  # send_input(cancel=true) may decline it
    assert declined.answered.is_set() and declined.answer is None


async def test_without_url_mode_getpass_raises_in_the_cell_and_nobody_is_asked(tmp_path: Path, short_tmp: Path) -> None:
    """A client with no elicitation at all (SDK, both protocols), and one that declares form mode only (a plain
    JSON-RPC client over stdio): the cell's getpass() raises EOFError naming --secret; no elicitation is sent, no
    awaiting_input for send_input; input() keeps its form."""
    state = short_tmp / "state"
    for mode in ("legacy", "auto"):
        async with Client(_stdio(state, tmp_path / f"{mode}.bin", tmp_path / f"{mode}.log"), mode=mode) as client:
            r: Any = (await client.call_tool("execute_code", {"code": "import getpass\ngetpass.getpass('Key: ')"})).structured_content
        assert r["ending"] == "completed" and r["error_type"] == "EOFError", r
        assert "URL-mode elicitation" in r["error"] and "--secret NAME=@" in r["error"], r
    # form mode only, by hand: initialize, then the calls; any elicitation/create from the server is a failure
    proc = await anyio.open_process(["bash", "-c", 'exec "$@" 2>/dev/null', "sh", *kernelexec_cmd(
        "serve", "--state-dir", str(short_tmp / "form"), "--pool-size", "0", "--restart-spares", "0")], env=clean_env())
    assert proc.stdin is not None and proc.stdout is not None
    buffer = b""

    async def send(message: dict[str, Any]) -> None:
        assert proc.stdin is not None
        await proc.stdin.send((json.dumps(message) + "\n").encode())

    async def reply(request_id: int) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        nonlocal buffer
        others = []
        with anyio.fail_after(120):
            while True:
                while b"\n" not in buffer:
                    assert proc.stdout is not None
                    buffer += await proc.stdout.receive()
                line, buffer = buffer.split(b"\n", 1)
                message = json.loads(line)
                if message.get("id") == request_id and "method" not in message:
                    return message, others
                others.append(message)
                if message.get("method") == "elicitation/create":  # input(): the form it keeps
                    await send({"jsonrpc": "2.0", "id": message["id"],
                                "result": {"action": "accept", "content": {"answer": "Ada"}}})

    try:
        await send({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {"elicitation": {"form": {}}},
            "clientInfo": {"name": "form-only", "version": "0"}}})
        await reply(1)
        await send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        await send({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {
            "name": "execute_code", "arguments": {"code": "import getpass\ngetpass.getpass('Key: ')"}}})
        refused, during = await reply(2)
        await send({"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {
            "name": "execute_code", "arguments": {"code": "input('Name? ')"}}})
        named, asked = await reply(3)
    finally:
        proc.terminate()
        await proc.wait()
    assert [m for m in during if m.get("method") == "elicitation/create"] == [], during
    structured = refused["result"]["structuredContent"]
    assert structured["error_type"] == "EOFError" and "--secret NAME=@" in structured["error"], structured
    assert [m["params"]["mode"] for m in asked if m.get("method") == "elicitation/create"] == ["form"], asked
    assert named["result"]["structuredContent"]["result"] == "Ada", named


async def test_secret_flag_gives_every_kernel_the_value_and_shows_it_nowhere(tmp_path: Path, short_tmp: Path) -> None:
    value = "sk-live-0123456789abcdef-ÄÖ"
    key = tmp_path / "api.key"
    key.write_text(value + "\n")
    state, out, log = short_tmp / "state", tmp_path / "stdout.bin", tmp_path / "server.log"
    code = "import os, hashlib\nprint('sha', hashlib.sha256(os.environ['API_KEY'].encode()).hexdigest())"
    async with Client(_stdio(state, out, log, "--secret", f"API_KEY=@{key}"), mode="legacy") as client:
        r: Any = (await client.call_tool("execute_code", {"code": code})).structured_content
        other: Any = (await client.call_tool("new_session", {})).structured_content
        r2: Any = (await client.call_tool("execute_code", {"code": code, "session": other["session"]})).structured_content
    assert f"sha {_digest(value)}" in r["stdout"] and f"sha {_digest(value)}" in r2["stdout"], (r, r2)
    shown = [subprocess.run([*kernelexec_cmd(command, "--state-dir", str(short_tmp / "c"), "--secret", f"API_KEY=@{key}")],
                            capture_output=True, env=clean_env(), timeout=120) for command in ("config", "doctor")]
    assert all(s.returncode == 0 for s in shown), [s.stderr[-500:] for s in shown]
    assert b"API_KEY=@" in shown[0].stdout
    assert _leaks(value, out, log, state, *(s.stdout + s.stderr for s in shown)) == []
    bad = subprocess.run(kernelexec_cmd("serve", "--state-dir", str(short_tmp / "b"), "--secret", f"PATH=@{key}"),
                         capture_output=True, env=clean_env(), timeout=60, stdin=subprocess.DEVNULL)
    assert bad.returncode != 0 and b"name" in bad.stderr and value.encode() not in bad.stderr, bad.stderr[-500:]


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-v"]))


async def test_the_stdio_listener_answers_only_its_own_host_and_refuses_a_malformed_form(short_tmp: Path) -> None:
    """The per-question listener: another Host (DNS rebinding onto the loopback port) gets 404 and does not use the
    page up; a POST with more fields than the form has, or without the token, is refused (403), not an error."""
    from kernelexec.server.build import build_server
    from kernelexec.session.manager import SessionManager

    from .support import make_settings

    settings = make_settings(short_tmp, pool_size=0, restart_spares=0)
    seen: dict[str, int] = {}

    async def browse(url: str) -> None:
        async with httpx2.AsyncClient() as browser:
            seen["rebound"] = (await browser.get(url, headers={"Host": "attacker.example:80"})).status_code
            page = await browser.get(url)
            seen["page"] = page.status_code
            token = page.text.split('name=token value="', 1)[1].split('"', 1)[0]
            seen["fields"] = (await browser.post(url, data={f"f{i}": "x" for i in range(6)} | {"token": token})).status_code
            seen["no_token"] = (await browser.post(url, data={"secret": "x"})).status_code
            seen["host"] = url.split("/")[2].startswith("127.0.0.1:")
            seen["sent"] = (await browser.post(url, data={"token": token, "secret": "ok"})).status_code

    async with anyio.create_task_group() as tg:
        async def human(context: Any, params: Any) -> ElicitResult:
            tg.start_soon(browse, params.url)  # as a client does: the user's yes first, then the page
            return ElicitResult(action="accept")

        async with SessionManager(settings).running() as sessions:
            async with Client(build_server(settings, sessions), mode="legacy", elicitation_callback=human) as client:
                with anyio.fail_after(60):
                    r: Any = (await client.call_tool("execute_code", {"code": "import getpass\ngetpass.getpass()"})).structured_content
    assert r["result"] == "ok", r
    assert seen == {"rebound": 404, "page": 200, "fields": 403, "no_token": 403, "host": True, "sent": 200}, seen


async def test_the_notice_that_a_page_was_typed_gives_up_on_a_stalled_client_and_frees_its_caller() -> None:
    """The elicitation/complete notice is shielded (a drain's cancel must not lose it) and is sent over the waiting
    call's stream, which a client that keeps it open without reading stalls: the relay's poll loop (every run's
    asks on the replica) and a drain then waited for ever. Bounded by ``TYPED_PATIENCE`` (5 s), and a cancel from outside
    (a drain) still ends it within that. Before: 20 s here (the stalled send's whole length)."""
    from kernelexec.server.questions import typed

    stalled = anyio.Event()
    question = Question("Key: ", True, url="http://127.0.0.1:1/secret/k")

    async def stuck() -> None:  # the stream's send waiting on a client that does not read
        stalled.set()
        await anyio.sleep(20)

    question.typed = stuck
    started = anyio.current_time()
    async with anyio.create_task_group() as tg:
        tg.start_soon(typed, question)
        await stalled.wait()
        tg.cancel_scope.cancel()  # a drain ending the task
    took = anyio.current_time() - started
    assert took < 10, f"the stalled notice held its caller {took:.1f} s"
