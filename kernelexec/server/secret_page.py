"""A cell's getpass() on a one-time page: the secret goes from the human's browser to the kernel, never through
the MCP client, the model, an answer, a log or the record (URL-mode elicitation, SEP-1036).

``SecretPages.open(run, question, origin)`` makes one page for one question, at an unguessable path
(``/secret/<32 random bytes>``), for as long as the question is asked: over streamable HTTP a route of the server's
own app (``route``, mounted by build.py) at its own origin; under stdio (``origin`` None) a listener opened for
that question alone, on 127.0.0.1 and a random port, closed with it. A GET is harmless: it shows the form, with a
token of its own, and consumes nothing, so a chat client's link preview (or a reload) never uses the page up; at
most ``MAX_FORMS`` forms are given out (then 429). The page is used once: the first POST carrying the token of a form
it gave answers the question through ``Run.answer`` (``by_page``) and the page is gone (404); a POST with any other
token is refused (403) and answers nothing. The
page is a plain HTML form: no script, a strict Content-Security-Policy, not framable, not cached, no referrer.
It names, escaped, the session whose code asks and the code's prompt.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import html
import logging
import secrets
import socket
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs

import anyio
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse
from starlette.routing import Route

from kernelexec.errors import KernelexecError
from kernelexec.server.questions import typed
from kernelexec.session.runs import MAX_INPUT_CHARS, Question, Run
from kernelexec.store import GrantRecord, Store

if TYPE_CHECKING:
    from kernelexec.server.relay import Relay

PATH = "/secret/{key}"
MAX_BODY = 4 * MAX_INPUT_CHARS  # form-encoded: a character may take up to 9 bytes; more is refused unread
HEADERS = {
    "Content-Security-Policy": ("default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; "
                                "frame-ancestors 'none'; base-uri 'none'"),
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}
STYLE = "body{font-family:sans-serif;max-width:40em;margin:3em auto;line-height:1.4}pre{white-space:pre-wrap}"

logger = logging.getLogger(__name__)


MAX_FORMS = 16  # forms (GETs) one page gives out: previews and reloads, not a flood of tokens


@dataclass
class Page:
    run: Run
    question: Question
    tokens: list[str] = field(default_factory=list)  # the tokens of the forms given out: a POST needs one of them
    granted: bool = False  # also a grant in the store (a fleet's page on its HTTP route): a POST uses it up there


def _page(title: str, body: str, status: int) -> HTMLResponse:
    text = (f"<!doctype html><html><head><meta charset=utf-8><title>{html.escape(title)}</title>"
            f"<style>{STYLE}</style></head><body><h1>{html.escape(title)}</h1>{body}</body></html>")
    return HTMLResponse(text, status_code=status, headers=HEADERS)


GONE = "<p>This page was used already, or its question is no longer asked. Nothing was sent.</p>"


def digest(key: str) -> str:
    """What the store keeps of a page's key (a fleet's grant): its SHA-256, never the key."""
    return hashlib.sha256(key.encode()).hexdigest()


class SecretPages:
    """The open pages of one server, by their path's key. In a fleet (``relay`` set, its store shared) each page is
    also a grant in the store, so any replica serves it: the form from the grant, a POST used once by the store
    (``use_grant``) and its secret relayed to the replica whose run asks (relay.py, sealed)."""

    def __init__(self) -> None:
        self._pages: dict[str, Page] = {}
        self.relay: Relay | None = None  # App sets it

    @property
    def _store(self) -> Store | None:
        return self.relay.store if self.relay is not None else None

    @contextlib.asynccontextmanager
    async def open(self, run: Run, question: Question, origin: str | None) -> AsyncIterator[str]:
        """The question's page while the block runs; its URL. ``origin``: the HTTP server's own (the page is a route
        of its app); None: a listener on 127.0.0.1 for this page alone."""
        key = secrets.token_urlsafe(32)
        store = self._store if origin is not None else None
        self._pages[key] = Page(run, question, granted=store is not None)
        try:
            if store is not None and self.relay is not None:
                self.relay.watch()  # its POST may land on another replica: this one polls for the relayed secret
                await store.put_grant(GrantRecord(
                    digest(key), "secret", run.session.owner, run.session.handle,
                    time.time() + max(0.0, run.deadline - time.monotonic()),
                    {"run_id": run.id, "question_id": question.id, "prompt": question.prompt.strip()[:500]}))
            if origin is not None:
                yield f"{origin.rstrip('/')}/secret/{key}"
            else:
                async with self._listener() as here:
                    yield f"{here}/secret/{key}"
        finally:
            self._pages.pop(key, None)
            if store is not None:  # no replica serves it any more
                with anyio.CancelScope(shield=True):
                    try:
                        await store.use_grant(digest(key))
                    except KernelexecError as exc:
                        logger.warning("closing a secret page's grant: %s", exc)

    @property
    def route(self) -> Route:
        return Route(PATH, self.endpoint, methods=["GET", "POST"])

    async def endpoint(self, request: Request) -> HTMLResponse:
        key = str(request.path_params.get("key", ""))
        listener = request.scope.get("kernelexec_listener")
        if listener is not None and request.headers.get("host") != listener:  # DNS rebinding onto the loopback port
            return _page("Not found", GONE, 404)
        page = self._pages.get(key)
        if page is None and self._store is not None and listener is None:
            return await self._elsewhere(request, key)
        if page is None or page.question.closed is not None:
            self._pages.pop(key, None)
            return _page("Not found", GONE, 404)
        if request.method == "GET":  # harmless (a link preview, a reload): a form of its own, nothing consumed
            if len(page.tokens) >= MAX_FORMS:
                return _page("Opened too often", "<p>This page was opened too many times. If that was not you, decline "
                             "the question in your client.</p>", 429)
            page.tokens.append(self._form_token(key))
            return self._form(page.run.session.handle, page.question.prompt, key, page.tokens[-1])
        fields = await _posted(request)
        if isinstance(fields, HTMLResponse):
            return fields
        token = (fields.get("token") or [""])[0]
        if not (any(hmac.compare_digest(token.encode(), given.encode()) for given in page.tokens) or self._signed(key, token)):
            return _page("Refused", "<p>This form was not the one this page gave. Nothing was sent.</p>", 403)
        del self._pages[key]  # single use, whatever happens next
        store = self._store if page.granted else None
        if store is not None and await store.use_grant(digest(key)) is None:  # used on another replica meanwhile
            return _page("Not found", GONE, 404)
        try:
            secret = (fields.get("secret") or [""])[0]
            if self.relay is not None:
                await self.relay.claim(page.run, page.question.id, page.run.session.owner, secret, by_human=True, by_page=True)
            page.run.answer(page.question.id, secret, by_human=True, by_page=True)
        except KernelexecError:
            return _page("Not sent", GONE, 410)
        await typed(page.question)
        return _page("Sent", "<p>The secret went to the code. You can close this page.</p>", 200)

    async def _elsewhere(self, request: Request, key: str) -> HTMLResponse:
        """A page another replica of the fleet opened (its run is that replica's): served from its grant."""
        store, relay = self._store, self.relay
        assert store is not None and relay is not None
        grant = await store.get_grant(digest(key))
        if grant is None or grant.kind != "secret" or grant.used or grant.expires <= time.time():
            return _page("Not found", GONE, 404)
        if request.method == "GET":
            return self._form(grant.session, str(grant.caps.get("prompt", "")), key, self._form_token(key))
        fields = await _posted(request)
        if isinstance(fields, HTMLResponse):
            return fields
        if not self._signed(key, (fields.get("token") or [""])[0]):
            return _page("Refused", "<p>This form was not the one this page gave. Nothing was sent.</p>", 403)
        used = await store.use_grant(grant.digest)  # single use across the fleet: one POST wins
        if used is None:
            return _page("Not found", GONE, 404)
        try:
            await relay.answer_page(used, (fields.get("secret") or [""])[0])
        except KernelexecError:
            return _page("Not sent", GONE, 410)
        return _page("Sent", "<p>The secret went to the code. You can close this page.</p>", 200)

    def _form_token(self, key: str) -> str:
        """A form's token: random, or in a fleet one any replica can check (signed with the fleet's key)."""
        nonce = secrets.token_urlsafe(16)
        signature = self.relay.sign(f"secret form {key} {nonce}") if self.relay is not None else None
        return f"{nonce}.{signature}" if signature is not None else secrets.token_urlsafe(32)

    def _signed(self, key: str, token: str) -> bool:
        nonce, _, signature = token.partition(".")
        return self.relay is not None and bool(signature) and self.relay.signed(f"secret form {key} {nonce}", signature)

    @staticmethod
    def _form(session: str, asked: str, key: str, token: str) -> HTMLResponse:
        handle = html.escape(session)
        prompt = html.escape(asked.strip()[:500]) or "(no prompt)"
        body = (f"<p>Code running in kernelexec session <b>{handle}</b> asks for a password or secret through "
                f"getpass(). The question comes from the code, not from the assistant or kernelexec. Its prompt:</p>"
                f"<pre>{prompt}</pre><p>What you type here goes to that code only: not to the assistant, and the "
                f"notebook records it as ***. The secret can be sent once.</p>"
                f"<form method=post action=\"/secret/{html.escape(key)}\" autocomplete=off>"
                f"<input type=hidden name=token value=\"{html.escape(token)}\">"
                f"<label>Secret <input type=password name=secret autofocus autocomplete=off></label> "
                f"<button type=submit>Send to the code</button></form>")
        return _page(f"kernelexec session {session}: a secret", body, 200)

    @contextlib.asynccontextmanager
    async def _listener(self) -> AsyncIterator[str]:
        """Under stdio: an HTTP listener on 127.0.0.1 (a random port) serving this server's pages, for one page."""
        import uvicorn

        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        app = Starlette(routes=[self.route])
        here = f"127.0.0.1:{port}"

        async def only_here(scope: Any, receive: Any, send: Any) -> None:  # the one Host this listener answers
            await app({**scope, "kernelexec_listener": here}, receive, send)

        config = uvicorn.Config(only_here, log_level="warning", access_log=False, lifespan="off",
                                timeout_graceful_shutdown=2)
        server = _QuietServer(config)
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(server.serve, [sock])
                with anyio.fail_after(10):
                    while not server.started and not server.should_exit:
                        await anyio.sleep(0.01)
                try:
                    yield f"http://{here}"
                finally:
                    server.should_exit = True
        finally:
            sock.close()


async def _posted(request: Request) -> dict[str, list[str]] | HTMLResponse:
    """A POST's form fields, or the page refusing a body or a secret too long: before the page is used up here or
    elsewhere (a fleet's POST is relayed without waiting for the holder, which would refuse it; its page said Sent)."""
    too_long = _page("Too long", "<p>The secret is too long. Nothing was sent.</p>", 413)
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_BODY:
            return too_long
    try:
        fields = parse_qs(body.decode("utf-8", "replace"), keep_blank_values=True, max_num_fields=4)
    except ValueError:  # more fields than the form has
        return {}
    if any(len(secret) > MAX_INPUT_CHARS for secret in fields.get("secret") or []):
        return too_long
    return fields


class _QuietServer:
    """uvicorn's Server without its signal handlers (the MCP server's own stay in place)."""

    def __new__(cls, config: Any) -> Any:
        import uvicorn

        class Server(uvicorn.Server):
            @contextlib.contextmanager
            def capture_signals(self) -> Any:
                yield

        return Server(config)
