"""The draft SEP-2631 ("File Objects and Transfer") ``files/authorizeUpload`` request, behind the extension id
``EXTENSION_ID``: a client that declared the extension asks where to send a file's bytes before any tool call, and
gets an upload descriptor for the session's working directory. It is the ``upload_url`` tool's mechanism
(uploads.py: ``Uploads.grant``, the same minting, owner binding, budget, caps, one-time use and ``PUT /upload/<key>``
through the kernel), answered in the draft's shape.

The draft (modelcontextprotocol/modelcontextprotocol pull 2631, its ``files/authorizeUpload`` revision) puts a
``files`` capability in the core protocol and names no extension id; under SEP-2133 a feature outside the core is
an extension, so it is served here behind ``io.modelcontextprotocol/files`` (one constant to rename when the SEP
settles), over HTTP only, and only to a request whose client declared it (else -32021 with the capability it lacks;
a server without it answers -32601).

Params (the draft's): ``name`` (required here: the file's name in the working directory), ``mimeType``, ``size``
(the body must then be exactly this long; the URL's cap), ``digest`` (``sha-256``, unpadded base64url: the body must
hash to it). Which session: ``_meta[EXTENSION_ID].session``, else the connection's default session (legacy
streamable HTTP); over stateless HTTP a handle is required. ``_meta[EXTENSION_ID].expiresInS``: the URL's life
(default ``DEFAULT_TTL_S``, at most an hour). Result: ``file`` (a ``FileValue``: ``uri``
``mcp-file://kernelexec/<session>/<name>``, ``name``, ``mimeType``, ``size``, ``digest``) and ``upload`` (an HTTPS
``FileTransferDescriptor``: ``transport``, ``method`` PUT, ``url``, ``headers``, ``expiresAt``, and ``maxSize``).
Errors as the draft says: -32602 with ``data.reason`` (``maxSizeExceeded``, ``invalidDigest``, ``invalidName``,
``invalidSession``), -32603 ``tooManyUploads`` over the token's budget.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from mcp.server.context import ServerRequestContext
from mcp.server.extension import Extension, MethodBinding
from mcp.server.mcpserver import require_client_extension
from mcp.shared.exceptions import MCPError
from mcp_types import RequestParams
from mcp_types.jsonrpc import INTERNAL_ERROR, INVALID_PARAMS
from pydantic import BaseModel, Field

from kernelexec.errors import InvalidRequest, SessionError
from kernelexec.server.app import App
from kernelexec.server.uploads import DEFAULT_MAX_BYTES, DEFAULT_TTL_S, MAX_BYTES, MAX_TTL_S, PUT_HEADERS, TooManyUploads

EXTENSION_ID = "io.modelcontextprotocol/files"
METHOD = "files/authorizeUpload"


class FileDigest(BaseModel):
    algorithm: str = Field(max_length=32)
    value: str = Field(max_length=200)


class AuthorizeUploadParams(RequestParams):
    name: str | None = Field(None, max_length=1000)
    mime_type: str | None = Field(None, max_length=255)
    size: int | None = None
    digest: FileDigest | None = None


def _invalid(message: str, reason: str, **data: Any) -> MCPError:
    return MCPError(code=INVALID_PARAMS, message=message, data={"reason": reason, **data})


def _sha256(digest: FileDigest | None) -> bytes | None:
    """The declared digest's 32 bytes (sha-256 only, unpadded base64url), or -32602."""
    if digest is None:
        return None
    if digest.algorithm.lower() != "sha-256":
        raise _invalid("only sha-256 digests are supported", "invalidDigest", supported=["sha-256"])
    try:
        raw = base64.urlsafe_b64decode(digest.value + "=" * (-len(digest.value) % 4))
    except (binascii.Error, ValueError):
        raw = b""
    if len(raw) != 32 or "=" in digest.value:
        raise _invalid("digest.value must be a SHA-256 in unpadded base64url", "invalidDigest")
    return raw


@dataclass(frozen=True)
class _Request:
    """An extension method's HTTP headers, as App.resolve and App.origin read a tool's (app.Call)."""

    headers: Mapping[str, str] | None


class FileTransfer(Extension):
    """``files/authorizeUpload`` over the server's upload URLs (HTTP only)."""

    identifier = EXTENSION_ID

    def __init__(self, app: App) -> None:
        self.app = app

    def settings(self) -> dict[str, Any]:
        return {"upload": {"maxSize": MAX_BYTES}, "transports": {"https": {}}}

    def methods(self) -> Sequence[MethodBinding]:
        return (MethodBinding(METHOD, AuthorizeUploadParams, self.authorize_upload),)

    async def authorize_upload(self, ctx: ServerRequestContext[Any, Any], params: AuthorizeUploadParams) -> dict[str, Any]:
        require_client_extension(ctx, EXTENSION_ID)
        if params.size is not None and not 0 <= params.size <= MAX_BYTES:
            raise _invalid(f"size must be 0 to {MAX_BYTES} bytes", "maxSizeExceeded", maxSize=MAX_BYTES, actualSize=params.size)
        if not params.name:
            raise _invalid("name is required: the file's name in the session's working directory", "invalidName")
        sha256 = _sha256(params.digest)
        ours = (params.meta or {}).get(EXTENSION_ID)
        handle = ours.get("session") if isinstance(ours, dict) else None
        if handle is not None and not isinstance(handle, str):
            raise _invalid(f"_meta[{EXTENSION_ID!r}].session must be a session handle", "invalidSession")
        ttl = ours.get("expiresInS", DEFAULT_TTL_S) if isinstance(ours, dict) else DEFAULT_TTL_S
        if not isinstance(ttl, int) or isinstance(ttl, bool) or not 1 <= ttl <= MAX_TTL_S:
            raise _invalid(f"_meta[{EXTENSION_ID!r}].expiresInS must be 1 to {MAX_TTL_S} seconds", "invalidExpiry")
        call = _Request(getattr(ctx.request, "headers", None))
        origin = self.app.origin(call)
        if origin is None:  # registered over HTTP only; a request without headers cannot be given a URL
            raise MCPError(code=INTERNAL_ERROR, message="upload URLs need the HTTP transport")
        try:
            target = await self.app.resolve(call, handle)
        except (InvalidRequest, SessionError) as exc:
            raise _invalid(f"{exc} (name it in _meta[{EXTENSION_ID!r}].session)", "invalidSession") from None
        try:
            grant = await self.app.uploads.grant(target, self.app.owner(), params.name,
                                           DEFAULT_MAX_BYTES if params.size is None else params.size, ttl,
                                           origin, size=params.size, sha256=sha256)
        except InvalidRequest as exc:
            raise _invalid(str(exc), "invalidName") from None
        except TooManyUploads as exc:
            raise MCPError(code=INTERNAL_ERROR, message=str(exc), data={"reason": "tooManyUploads"}) from None
        file: dict[str, Any] = {"uri": f"mcp-file://kernelexec/{target.handle}/{quote(grant.filename, safe='')}",
                                "name": grant.filename}
        if params.mime_type is not None:
            file["mimeType"] = params.mime_type
        if params.size is not None:
            file["size"] = params.size
        if params.digest is not None:
            file["digest"] = {"algorithm": "sha-256", "value": params.digest.value}
        upload = {"transport": "https", "method": "PUT", "url": grant.url, "headers": dict(PUT_HEADERS),
                  "expiresAt": grant.expires_at, "maxSize": grant.max_bytes}
        return {"file": file, "upload": upload}


def extension(app: App) -> FileTransfer | None:
    """The extension for ``MCPServer(extensions=[...])`` (build.py); None off HTTP (no upload URLs there)."""
    return FileTransfer(app) if app.settings.transport == "http" else None
