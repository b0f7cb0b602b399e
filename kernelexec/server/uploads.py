"""Files in, without the model carrying bytes: ``upload_url`` mints a one-time upload URL for a session (HTTP only);
a ``PUT`` of the bytes to it lands in the session's working directory **through the kernel** (so a remote kernel
gets them too).

The result follows the draft SEP-2631 ``files/authorizeUpload`` shape (``uploadUrl``, ``method``, ``headers``,
``expiresAt``, ``maxBytes``). The installed SDK has neither that method nor the SEP's extension, so it is a tool,
listed over HTTP only (under stdio the working directory already is the user's); the SEP's method, behind its
extension id where a client declares it, is not served yet.

The URL is the capability, like a getpass() page (secret_page.py): ``/upload/<32 random bytes>``, unguessable,
bound to the session and the token that asked, capped, expiring. A PUT needs no bearer token; one that carries a
token other than its owner's is answered 404, as for an unknown URL. It is used once: the first PUT claims it
(whatever then happens), a later or concurrent one gets 410, as does one after it expired. A body over the cap
is refused 413 (by its Content-Length before anything is written, else while streaming), and the partial file is
removed. The name is one plain file name (no ``/``, ``\\``, ``..``, NUL, control characters, device names).

Kernel side: the bytes go in base64 chunks of ``CHUNK`` bytes through silent user expressions (``Kernel.evaluate``,
in turn with the session's cells, never recorded) that append to a temporary file the kernel created with
``O_CREAT|O_EXCL|O_NOFOLLOW`` and opens each time with ``O_NOFOLLOW``; at the end it is renamed onto the name
(``rename`` replaces a link planted there, never follows it).
"""

from __future__ import annotations

import ast
import base64
import hashlib
import hmac
import json
import secrets
import time
import unicodedata
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import anyio
from starlette.requests import Request
from starlette.responses import JSONResponse

from kernelexec.errors import InvalidRequest
from kernelexec.session.session import Session

PATH = "/upload/{key}"
CHUNK = 256 * 1024
MAX_BYTES = 256 * 1024 * 1024  # the largest cap a URL may have
DEFAULT_MAX_BYTES = 64 * 1024 * 1024
DEFAULT_TTL_S = 600
REMEMBER_S = 3600  # a used or expired URL answers 410 this long after it expired, then 404 as unknown
DEVICES = {"con", "prn", "aux", "nul", *(f"com{i}" for i in range(10)), *(f"lpt{i}" for i in range(10))}
HEADERS = {"Cache-Control": "no-store", "X-Content-Type-Options": "nosniff"}


def check_name(name: str) -> str:
    """One plain file name, or InvalidRequest."""
    if not name or name in (".", "..") or len(name.encode("utf-8", "surrogatepass")) > 255:
        raise InvalidRequest("filename must be one file name (1 to 255 bytes), not '.' or '..'")
    if any(c in "/\\" or unicodedata.category(c) in ("Cc", "Cf", "Cs", "Zl", "Zp") for c in name):
        raise InvalidRequest("filename must be one plain file name: no '/', '\\', NUL or control characters")
    if name.split(".")[0].strip().lower() in DEVICES or name != name.strip() or name.endswith("."):
        raise InvalidRequest(f"filename {name!r} is a device name or ends in a space or dot")
    return name


@dataclass
class Grant:
    session: Session
    owner: str | None
    filename: str
    max_bytes: int
    expires: float  # time.time()
    used: bool = False


class _Refused(OSError):
    """The kernel would not place the file there (its policy, a directory of that name)."""


def _answer(status: int, **fields: Any) -> JSONResponse:
    return JSONResponse(fields, status_code=status, headers=HEADERS)


class Uploads:
    """The open upload URLs of one server, by their path's key."""

    def __init__(self) -> None:
        self._grants: dict[str, Grant] = {}
        self.principals: dict[bytes, str] = {}  # token → principal (build.py fills it over HTTP)

    def mint(self, session: Session, owner: str | None, filename: str, max_bytes: int, ttl_s: float,
             origin: str) -> dict[str, Any]:
        now = time.time()
        for key in [k for k, g in self._grants.items() if g.expires + REMEMBER_S <= now]:  # long gone: forgotten
            del self._grants[key]
        key = secrets.token_urlsafe(32)
        grant = self._grants[key] = Grant(session, owner, check_name(filename), max_bytes, now + ttl_s)
        return {
            "uploadUrl": f"{origin.rstrip('/')}/upload/{key}",
            "method": "PUT",
            "headers": {"Content-Type": "application/octet-stream"},
            "expiresAt": datetime.fromtimestamp(grant.expires, UTC).isoformat().replace("+00:00", "Z"),
            "maxBytes": max_bytes,
            "session": session.handle,
            "filename": grant.filename,
        }

    def _caller(self, request: Request) -> tuple[bool, str | None]:
        """(whether a token was offered, its principal or None when it is no known token)."""
        header = request.headers.get("authorization")
        if header is None:
            return False, None
        offered = header.removeprefix("Bearer ").strip().encode()
        match = None
        for known, principal in self.principals.items():
            if hmac.compare_digest(offered, known):
                match = principal
        return True, match

    async def endpoint(self, request: Request) -> JSONResponse:
        key = str(request.path_params.get("key", ""))
        grant = self._grants.get(key)
        offered, principal = self._caller(request)
        if grant is None or (offered and principal != grant.owner):
            return _answer(404, error="unknown upload URL")
        if grant.used:
            return _answer(410, error="this upload URL was used already")
        grant.used = True  # single use: this request claims it, whatever happens next (no await before: no race)
        if grant.expires <= time.time():
            return _answer(410, error="this upload URL expired")
        if grant.session.closed:
            return _answer(410, error="this upload URL's session is closed")
        try:
            declared = int(request.headers.get("content-length", "0"))
        except ValueError:
            return _answer(400, error="bad Content-Length")
        if declared > grant.max_bytes:
            return _answer(413, error=f"over this URL's cap of {grant.max_bytes} bytes")
        return await self._receive(request, grant)

    async def _receive(self, request: Request, grant: Grant) -> JSONResponse:
        session = grant.session
        where = await _evaluate(session, CREATE.format(tmp=repr(f".kernelexec-upload-{secrets.token_hex(8)}.part")))
        if not isinstance(where, list) or len(where) != 2 or not all(isinstance(p, str) for p in where):
            return _answer(500, error=f"the kernel could not create the file: {where}")
        cwd, tmp = where
        size, digest, buffer = 0, hashlib.sha256(), bytearray()
        try:
            async for piece in request.stream():
                size += len(piece)
                if size > grant.max_bytes:
                    await session.evaluate(REMOVE.format(tmp=repr(tmp)))
                    return _answer(413, error=f"over this URL's cap of {grant.max_bytes} bytes; nothing was kept")
                digest.update(piece)
                buffer += piece
                while len(buffer) >= CHUNK:
                    await self._append(session, tmp, bytes(buffer[:CHUNK]))
                    del buffer[:CHUNK]
            if buffer:
                await self._append(session, tmp, bytes(buffer))
            done = await _evaluate(session, RENAME.format(tmp=repr(tmp), name=repr(grant.filename)))
            if not isinstance(done, str):
                raise _Refused(f"the kernel could not place the file (nothing was kept): {done}")
        except BaseException as exc:
            with anyio.CancelScope(shield=True), anyio.move_on_after(30):  # a client gone or a cancel: still removed
                await session.evaluate(REMOVE.format(tmp=repr(tmp)))
            if not isinstance(exc, Exception):
                raise
            return _answer(409 if isinstance(exc, _Refused) else 500, error=str(exc)[:500])
        return _answer(201, path=done, size=size, sha256=digest.hexdigest(), session=session.handle, cwd=cwd)

    @staticmethod
    async def _append(session: Session, tmp: str, data: bytes) -> None:
        answer = await _evaluate(session, APPEND.format(tmp=repr(tmp), data=repr(base64.b64encode(data).decode())))
        if answer != len(data):
            raise OSError(f"the kernel could not write: {answer}")


async def _evaluate(session: Session, expression: str) -> Any:
    """One expression of the kernel side: its JSON answer (untrusted), or the kernel's error as it came."""
    answer = await session.evaluate(f"__import__('json').dumps({expression})")
    if isinstance(answer, str) and len(answer) < 10_000:
        try:
            return json.loads(ast.literal_eval(answer))  # text/plain: the repr of the JSON string
        except (ValueError, SyntaxError):
            pass
    return answer


# the kernel side: user expressions (each evaluated alone; stdlib only); paths absolute from the first one
CREATE = ("(lambda os: (lambda p: (os.close(os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW "
          "| os.O_CLOEXEC, 0o600)), [os.getcwd(), p])[1])(os.path.join(os.getcwd(), {tmp})))(__import__('os'))")
APPEND = ("(lambda os, b: (lambda f: (f.write(b), f.close())[0])(open(os.open({tmp}, os.O_WRONLY | os.O_APPEND "
          "| os.O_NOFOLLOW | os.O_CLOEXEC), 'ab')))(__import__('os'), __import__('base64').b64decode({data}))")
RENAME = ("(lambda os: (lambda d: (os.rename({tmp}, d), d)[1])(os.path.join(os.path.dirname({tmp}), {name})))"
          "(__import__('os'))")
REMOVE = "(lambda os: os.unlink({tmp}) if os.path.lexists({tmp}) else None)(__import__('os'))"
