"""Who may call the daemon's HTTP API: one ASGI middleware, in front of every route.

With `server.api_key` set, every route but `/healthz` needs `Authorization: Bearer <key>`.
Liveness alone stays open: it says nothing but "a process answers", which a supervisor needs
without a secret; `/readyz` names the model, adapter and queue, so it is keyed like the rest. A
browser that opens `/dashboard` without the key gets a login page instead of the JSON error
(dashboard.login_page; SECURITY.md says why the key never travels in a URL or a cookie).

Without a key the daemon is bound to loopback (config refuses anything else), and "anyone on this
machine" must not grow into "any web page this machine's browser opens". A page on another site
can make the browser send a POST to 127.0.0.1 (rolling an adapter back, writing a skill), and a
DNS-rebinding page can even read the answers. So a keyless daemon answers only requests addressed
to a loopback name, and refuses any that a browser marks as coming from another origin. Behind a
reverse proxy that passes on another Host, set a key: the key is then the guard.
"""
from __future__ import annotations

import hmac
import ipaddress
from urllib.parse import urlsplit

from starlette.responses import JSONResponse, Response

from . import dashboard
from ..errors import RequestError

OPEN = ("/healthz",)


def _header(scope, name: bytes) -> bytes:
    return next((v for k, v in scope["headers"] if k == name), b"")


def _refuse(status: int, message: str, code: str, **headers) -> Response:
    err = RequestError(message, status=status, type="authentication_error"
                       if status == 401 else "permission_error", code=code)
    return JSONResponse(err.body(), status_code=status, headers=headers)


def _split(url: str):
    try:
        return urlsplit(url)
    except ValueError:       # malformed, such as an unclosed "[": matches nothing
        return urlsplit("")


def _is_loopback(hostname: str | None) -> bool:
    if hostname is None:
        return False
    if hostname == "localhost" or hostname.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(hostname).is_loopback
    except ValueError:
        return False


class ApiKeyMiddleware:
    def __init__(self, app, api_key: str):
        self.app = app
        self.expected = api_key.encode("utf-8") if api_key else b""

    def allowed(self, scope) -> bool:
        scheme, _, token = _header(scope, b"authorization").partition(b" ")
        # The scheme is case-insensitive (RFC 9110); the key is compared in constant time so that
        # response timing says nothing about how much of a guess was right.
        return scheme.lower() == b"bearer" and hmac.compare_digest(token.strip(), self.expected)

    def refusal(self, scope) -> Response | None:
        if scope["path"] in OPEN:
            return None
        if self.expected:
            if self.allowed(scope):
                return None
            if scope["path"] == "/dashboard" and b"text/html" in _header(scope, b"accept"):
                return dashboard.login_page()
            return _refuse(401, "missing or wrong API key: send 'Authorization: Bearer "
                           "<server.api_key>'", "invalid_api_key", **{"WWW-Authenticate": "Bearer"})
        host = _header(scope, b"host").decode("latin-1").lower()
        if not _is_loopback(_split(f"//{host}").hostname):
            return _refuse(403, f"this daemon has no API key, so it answers only requests "
                           f"addressed to a loopback name (127.0.0.1, localhost), not {host!r}; "
                           "set server.api_key to reach it by another name", "loopback_only")
        origin = _header(scope, b"origin").decode("latin-1").lower()
        if origin and _split(origin).netloc != host:
            return _refuse(403, f"refused a request from the web page at {origin!r}: this daemon "
                           "has no API key, and pages of other origins may not call it",
                           "cross_origin")
        return None

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and (refusal := self.refusal(scope)) is not None:
            await refusal(scope, receive, send)
            return
        await self.app(scope, receive, send)
