"""One gateway's settings and REST calls, never through ``GatewayClient.instance()``.

jupyter_server reads its gateway settings from the process-wide singleton; here every request and
WebSocket uses a ``GatewayClient`` built for one URL and token (``gateway_client``), so two servers in
one process do not fight over it (and ``JUPYTER_GATEWAY_*`` variables still supply the other options:
headers, TLS client certificates, ``validate_cert``, timeouts). ``gateway_request`` is one REST call
with that client's options; its failures are ``GatewayError`` with a hint of what to check.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
from typing import Any

try:
    from jupyter_server.gateway.gateway_client import GatewayClient, RetryableHTTPClient
except ImportError as exc:  # pragma: no cover - depends on the install
    raise ImportError(f"--kernel-gateway needs jupyter_server (pip install 'kernelexec[gateway]'): {exc}") from exc
from tornado.escape import json_decode
from tornado.httpclient import HTTPClientError

# --- the gateway's settings, per URL and token (never the process-wide singleton) ------------------
_clients: dict[tuple[str, str], GatewayClient] = {}
_clients_lock = threading.Lock()


def gateway_client(url: str, token: str | None) -> GatewayClient:
    """The ``GatewayClient`` (settings, auth header, cookies) for one gateway. One per URL and token,
    shared by that gateway's kernels; ``GatewayClient.instance()`` is left alone."""
    key = (url.rstrip("/"), token or "")
    with _clients_lock:
        client = _clients.get(key)
        if client is None:
            ws_url = os.environ.get(GatewayClient.ws_url_env) or "ws" + key[0][4:]  # http(s)://… → ws(s)://…
            client = GatewayClient(url=key[0], ws_url=ws_url, auth_token=key[1])
            _clients[key] = client
        return client


class GatewayError(RuntimeError):
    """The gateway refused or failed a request (the message says which and what to check)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


def failure_hint(status: int | None) -> str:
    """What to check, for a failed request's HTTP status (None: no answer at all)."""
    if status == 401:
        return " (check --kernel-gateway-token)"
    if status == 403:  # Enterprise Gateway also refuses users it does not authorize (root, by default)
        return (" (check --kernel-gateway-token, and that the gateway lets this user start kernels: Enterprise Gateway "
                "reads KERNEL_USERNAME, which kernelexec passes on from its own environment)")
    if status == 404:
        return " (no such kernel or kernel name; check --kernel-gateway and the gateway's kernelspecs)"
    if status in (None, 599):
        return " (is the gateway running and reachable?)"
    return ""


async def gateway_request(gateway: GatewayClient, url: str, method: str, body: Any = None) -> Any:
    """One REST call with ``gateway``'s headers, TLS options and timeouts; returns the decoded JSON
    body (None for an empty one). Raises ``GatewayError``."""
    headers = {"Content-Type": "application/json"} if body is not None else {}
    kwargs = gateway.load_connection_args(method=method, headers=headers)
    if body is not None:
        kwargs["body"] = json.dumps(body)
    try:
        response = await RetryableHTTPClient().fetch(url, **kwargs)
    except HTTPClientError as exc:
        reason = exc.message
        if exc.response is not None and exc.response.body:
            with contextlib.suppress(ValueError, UnicodeDecodeError):
                payload = json.loads(exc.response.body)
                reason = payload.get("message") or payload.get("reason") or reason
        raise GatewayError(f"gateway {method} {url} failed: {exc.code} {reason}{failure_hint(exc.code)}", exc.code) from exc
    except OSError as exc:
        raise GatewayError(f"gateway {method} {url} failed: {exc}{failure_hint(None)}") from exc
    if gateway.accept_cookies:
        gateway.update_cookies(response.headers)
    return json_decode(response.body) if response.body else None


__all__ = ["GatewayError", "gateway_client", "gateway_request"]
