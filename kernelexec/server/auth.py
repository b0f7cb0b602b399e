"""Bearer-token authentication for streamable HTTP, through the SDK's own resource-server support.

Tokens come from ``--auth-token`` / ``KERNELEXEC_AUTH_TOKEN`` or a file (one token per line).
Each token is a principal: sessions it creates are bound to it, and a handle minted under one
token is unknown to every other. The SDK's bearer middleware answers 401 before any tool runs.
"""

from __future__ import annotations

import hashlib
import hmac
from pathlib import Path

from mcp.server.auth.middleware.auth_context import get_access_token
from mcp.server.auth.provider import AccessToken
from mcp.server.auth.settings import AuthSettings

from kernelexec.config import Settings
from kernelexec.errors import InvalidRequest

LOOPBACK = {"127.0.0.1", "localhost", "::1"}


def principal_id(token: str) -> str:
    """A stable, non-secret name for a token (what sessions are bound to and logs may show)."""
    return "token-" + hashlib.sha256(token.encode()).hexdigest()[:16]


def load_tokens(settings: Settings) -> list[str]:
    tokens = []
    if settings.auth_token is not None:
        tokens.append(settings.auth_token.get_secret_value())
    if settings.auth_token_file is not None:
        try:
            text = Path(settings.auth_token_file).read_text()
        except OSError as exc:
            raise InvalidRequest(f"cannot read --auth-token-file: {exc}") from exc
        tokens += [line.strip() for line in text.splitlines() if line.strip() and not line.startswith("#")]
    short = [t for t in tokens if len(t) < 16]
    if short:
        raise InvalidRequest("auth tokens must be at least 16 characters (use e.g. `python -c 'import secrets; print(secrets.token_urlsafe(32))'`)")
    return tokens


class StaticTokenVerifier:
    """The SDK's TokenVerifier protocol over a fixed set of tokens (constant-time comparison)."""

    def __init__(self, tokens: list[str]) -> None:
        self._tokens = [(t.encode(), principal_id(t)) for t in tokens]

    async def verify_token(self, token: str) -> AccessToken | None:
        offered = token.encode()
        match = None
        for known, principal in self._tokens:
            if hmac.compare_digest(offered, known):
                match = principal
        return None if match is None else AccessToken(token=token, client_id=match, scopes=[])


def auth_settings(settings: Settings) -> AuthSettings:
    base = f"http://{settings.host}:{settings.port}"
    # static tokens, none issued for a resource: the verifier is the whole check (unset, the SDK warns at every start)
    return AuthSettings(issuer_url=base, resource_server_url=f"{base}/mcp", required_scopes=None, validate_token_resource=False)


def current_principal() -> str | None:
    """The authenticated caller of the current request, or None (stdio, in-memory, no auth)."""
    token = get_access_token()
    return None if token is None else token.client_id
