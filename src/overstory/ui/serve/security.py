"""Who may talk to `ov serve`: the token, the one-time login URL, same-origin writes, the Host check.

One ASGI middleware in front of every route (the page's files included), so a new
route cannot forget it:

- ``Host`` must name this machine when the server listens on loopback only, so a web
  page that rebinds its own DNS name to 127.0.0.1 gets nothing;
- ``GET /?token=T`` with the right token sets an HttpOnly, SameSite=Strict cookie and
  redirects to ``/`` (the token leaves the address bar); a wrong one is a 401;
- every other request carries the token as ``Authorization: Bearer T`` or that cookie,
  or gets a 401; tokens in other query strings are not accepted (they end up in logs);
- a request that changes state and authenticates by cookie must come from this
  origin (``Origin``, else ``Referer``); one that names a foreign origin is refused
  whatever its credentials. Scripts with the bearer header send neither and pass;
- every response carries a strict Content-Security-Policy (the page loads only its
  own files and never inline script) and is not cached.
"""

from __future__ import annotations

import hmac
import json
import typing as t
from urllib.parse import parse_qs, urlsplit

from starlette.datastructures import Headers, MutableHeaders
from starlette.requests import cookie_parser
from starlette.types import ASGIApp, Message, Receive, Scope, Send

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
LOOPBACK_NAMES = frozenset({"127.0.0.1", "localhost", "::1"})
COOKIE_MAX_AGE = 7 * 24 * 3600
SECURITY_HEADERS = {
    "content-security-policy": "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
                               "connect-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'",
    "x-content-type-options": "nosniff",
    "referrer-policy": "same-origin",
    "x-frame-options": "DENY",
}
SIGN_IN_PAGE = """<!doctype html><html><head><meta charset="utf-8"><title>ov serve: sign in</title>
<meta name="viewport" content="width=device-width, initial-scale=1"></head><body>
<h1>ov serve</h1><p>{message}</p><p>Open the address that <code>ov serve</code> printed when it started
(it ends in <code>/?token=…</code>); the token is also in <code>.overstory/serve-token</code>.</p></body></html>
"""


def host_name(host_header: str) -> str:
    """``127.0.0.1:7321`` -> ``127.0.0.1``; ``[::1]:7321`` -> ``::1``; lower-cased."""
    host = host_header.strip().lower()
    if host.startswith("["):
        return host[1:host.find("]")] if "]" in host else host
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def _origin_of(url: str) -> str | None:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}".lower() if parts.scheme and parts.netloc else None


class Gate:
    """The middleware. ``allowed_hosts`` None accepts any Host (the server listens beyond loopback)."""

    def __init__(self, app: ASGIApp, *, token: str, cookie_name: str,
                 allowed_hosts: t.Collection[str] | None = LOOPBACK_NAMES) -> None:
        self.app = app
        self.token = token.encode()
        self.cookie_name = cookie_name
        self.allowed_hosts = None if allowed_hosts is None else frozenset(h.lower() for h in allowed_hosts)

    def _valid(self, given: str | None) -> bool:
        return given is not None and hmac.compare_digest(given.encode(), self.token)

    def authenticate(self, headers: Headers) -> str | None:
        """'bearer', 'cookie', or None when the request carries no valid token."""
        scheme, _, credential = headers.get("authorization", "").partition(" ")
        if scheme.lower() == "bearer" and self._valid(credential.strip()):
            return "bearer"
        if self._valid(cookie_parser(headers.get("cookie", "")).get(self.cookie_name)):
            return "cookie"
        return None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self.app(scope, receive, send)
            return
        if scope["type"] != "http":  # no websockets here
            await send({"type": "websocket.close", "code": 1008})
            return
        send = _with_headers(send)
        headers = Headers(scope=scope)
        path, method = scope["path"], scope["method"]
        if self.allowed_hosts is not None and host_name(headers.get("host", "")) not in self.allowed_hosts:
            await _refuse(send, path, 421, "this server answers only to requests for this machine (Host header)")
            return
        if path == "/" and method in ("GET", "HEAD"):
            query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
            if "token" in query:
                if self._valid(query["token"][-1]):
                    await self._sign_in(send)
                else:
                    await _refuse(send, path, 401, "that sign-in link carries a wrong token")
                return
        how = self.authenticate(headers)
        if how is None:
            await _refuse(send, path, 401, "missing or wrong token")
            return
        if method not in SAFE_METHODS and not _same_origin(headers, scope, cookie=how == "cookie"):
            await _refuse(send, path, 403, "cross-origin request refused: state changes must come from this "
                                           "server's own page (Origin/Referer) or carry the bearer token")
            return
        await self.app(scope, receive, send)

    async def _sign_in(self, send: Send) -> None:
        cookie = (f"{self.cookie_name}={self.token.decode()}; Path=/; HttpOnly; SameSite=Strict; "
                  f"Max-Age={COOKIE_MAX_AGE}")
        await send({"type": "http.response.start", "status": 303,
                    "headers": [(b"location", b"/"), (b"set-cookie", cookie.encode()), (b"content-length", b"0")]})
        await send({"type": "http.response.body", "body": b""})


def _same_origin(headers: Headers, scope: Scope, *, cookie: bool) -> bool:
    """The request's Origin (or Referer) is this server; without either, only bearer requests pass."""
    claimed = headers.get("origin")
    if claimed is None or claimed == "null":
        referer = headers.get("referer")
        claimed = _origin_of(referer) if referer else None
    if claimed is None:
        return not cookie
    own = f"{scope.get('scheme', 'http')}://{headers.get('host', '')}".lower()
    return claimed.lower().rstrip("/") == own


def _with_headers(send: Send) -> Send:
    async def wrapped(message: Message) -> None:
        if message["type"] == "http.response.start":
            headers = MutableHeaders(scope=message)
            for name, value in SECURITY_HEADERS.items():
                headers.setdefault(name, value)
            headers.setdefault("cache-control", "no-store")
        await send(message)

    return wrapped


async def _refuse(send: Send, path: str, status: int, message: str) -> None:
    """A JSON error for the API and the stream, a small HTML page for the page's own addresses."""
    if path.startswith(("/api", "/events")):
        body = json.dumps({"error": message}).encode()
        media = b"application/json"
    else:
        body = SIGN_IN_PAGE.format(message=message).encode()
        media = b"text/html; charset=utf-8"
    headers = [(b"content-type", media), (b"content-length", str(len(body)).encode())]
    if status == 401:
        headers.append((b"www-authenticate", b'Bearer realm="ov serve"'))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
