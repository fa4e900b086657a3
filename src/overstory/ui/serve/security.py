"""Who may talk to `ov serve`: the token as a header, stream tickets, same-origin writes, the Host check.

No cookie carries a credential. Browsers send a cookie of 127.0.0.1 to every port of
127.0.0.1 (cookies are not separated by port), so a cookie would hand the operator's
token to any program an agent starts on another local port the moment the operator
opened it. Instead:

- the page (``/``), its files (``/static/...``) and the API's docs hold no data and are
  served to anyone who names this machine;
- the address `ov serve` prints is ``/#token=T``: a fragment never leaves the browser,
  the page moves it into ``sessionStorage`` (kept per origin, so per port, and per tab),
  takes it out of the address bar, and sends it as ``Authorization: Bearer T``;
- ``EventSource`` cannot send a header, so the page first asks ``POST /api/events/ticket``
  (with the header) for a ticket: random, single use, valid for ``TICKET_SECONDS``, good
  only for ``GET /events/stream?ticket=...``;
- an old sign-in link (``/?token=T``) gets a 410 page saying what to open instead, and
  a cookie that an older ov set is expired by any response to a request that carries it;
- ``Host`` must name this machine when the server listens on loopback only, so a web
  page that rebinds its own DNS name to 127.0.0.1 gets nothing;
- a request that changes state and names a foreign origin (``Origin``, else ``Referer``)
  is refused whatever its credentials;
- every response carries a strict Content-Security-Policy (the page loads only its
  own files and never inline script), sends no Referer to other origins, and is not cached.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
import time
import typing as t
from urllib.parse import parse_qs, urlsplit

from starlette.datastructures import Headers, MutableHeaders
from starlette.requests import cookie_parser
from starlette.types import ASGIApp, Message, Receive, Scope, Send

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
LOOPBACK_NAMES = frozenset({"127.0.0.1", "localhost", "::1"})
PUBLIC_PATHS = frozenset({"/", "/api/docs", "/api/openapi.json"})  # no data in them: the page signs itself in
PUBLIC_PREFIX = "/static/"
HOOKS_PREFIX = "/hooks/"  # webhook triggers: each route checks its own trigger's secret (``scheduler.receive_webhook``)
STREAM_PATH = "/events/stream"
TICKET_SECONDS = 30.0
TICKETS_KEPT = 256  # unredeemed tickets held at most (the oldest go first)
SECURITY_HEADERS = {
    "content-security-policy": "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
                               "connect-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'",
    "x-content-type-options": "nosniff",
    "referrer-policy": "same-origin",
    "x-frame-options": "DENY",
}
OLD_LINK_PAGE = """<!doctype html><html><head><meta charset="utf-8"><title>ov serve: old sign-in link</title>
<meta name="viewport" content="width=device-width, initial-scale=1"></head><body>
<h1>ov serve</h1><p>This sign-in link (<code>/?token=…</code>) is from an older ov and no longer signs in: a token
in the query string reached the server and became a cookie that the browser also sends to every other program
listening on this machine.</p><p>Open the address <code>ov serve</code> prints now (it ends in
<code>/#token=…</code>), or open <a href="/">the dashboard</a> and paste the token from
<code>.overstory/serve-token</code>.</p></body></html>
"""
SIGN_IN_PAGE = """<!doctype html><html><head><meta charset="utf-8"><title>ov serve: sign in</title>
<meta name="viewport" content="width=device-width, initial-scale=1"></head><body>
<h1>ov serve</h1><p>{message}</p><p>Open the address that <code>ov serve</code> printed when it started
(it ends in <code>/#token=…</code>); the token is also in <code>.overstory/serve-token</code>.</p></body></html>
"""


class Tickets:
    """Single-use, short-lived tickets for the event stream; only their hashes are kept."""

    def __init__(self, *, seconds: float = TICKET_SECONDS, kept: int = TICKETS_KEPT,
                 clock: t.Callable[[], float] = time.monotonic) -> None:
        self.seconds = seconds
        self.kept = kept
        self.clock = clock
        self._open: dict[bytes, float] = {}  # hash -> expiry, oldest first

    @staticmethod
    def _key(ticket: str) -> bytes:
        return hashlib.sha256(ticket.encode("utf-8", errors="replace")).digest()

    def issue(self) -> str:
        now = self.clock()
        for key in [k for k, expiry in self._open.items() if expiry <= now]:
            del self._open[key]
        while len(self._open) >= self.kept:
            del self._open[next(iter(self._open))]
        ticket = secrets.token_urlsafe(24)
        self._open[self._key(ticket)] = now + self.seconds
        return ticket

    def redeem(self, ticket: str) -> bool:
        """True once for a ticket issued less than ``seconds`` ago; it is spent either way."""
        expiry = self._open.pop(self._key(ticket), None)
        return expiry is not None and expiry > self.clock()


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
    """The middleware. ``allowed_hosts`` None accepts any Host (the server listens beyond loopback).

    ``cookie_name``: the cookie an older ov's sign-in link set; it is never accepted, only expired.
    """

    def __init__(self, app: ASGIApp, *, token: str, cookie_name: str, tickets: Tickets | None = None,
                 allowed_hosts: t.Collection[str] | None = LOOPBACK_NAMES) -> None:
        self.app = app
        self.token = token.encode()
        self.cookie_name = cookie_name
        self.tickets = tickets if tickets is not None else Tickets()
        self.allowed_hosts = None if allowed_hosts is None else frozenset(h.lower() for h in allowed_hosts)

    def _valid(self, given: str | None) -> bool:
        return given is not None and hmac.compare_digest(given.encode(), self.token)

    def authenticate(self, headers: Headers) -> bool:
        """The request carries ``Authorization: Bearer <token>``."""
        scheme, _, credential = headers.get("authorization", "").partition(" ")
        return scheme.lower() == "bearer" and self._valid(credential.strip())

    def _stream_ticket(self, scope: Scope, method: str) -> bool:
        if scope["path"] != STREAM_PATH or method not in ("GET", "HEAD"):
            return False
        given = parse_qs(scope.get("query_string", b"").decode("latin-1")).get("ticket") or []
        return bool(given) and self.tickets.redeem(given[-1])

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self.app(scope, receive, send)
            return
        if scope["type"] != "http":  # no websockets here
            await send({"type": "websocket.close", "code": 1008})
            return
        headers = Headers(scope=scope)
        send = _with_headers(send, expire=self.cookie_name if self.cookie_name in cookie_parser(
            headers.get("cookie", "")) else None)
        path, method = scope["path"], scope["method"]
        if self.allowed_hosts is not None and host_name(headers.get("host", "")) not in self.allowed_hosts:
            await _refuse(send, path, 421, "this server answers only to requests for this machine (Host header)")
            return
        if method in ("GET", "HEAD") and (path in PUBLIC_PATHS or path.startswith(PUBLIC_PREFIX)):
            if path == "/" and "token" in parse_qs(scope.get("query_string", b"").decode("latin-1"),
                                                   keep_blank_values=True):
                await _old_link(send)  # the token is not even looked at
                return
            await self.app(scope, receive, send)
            return
        if method == "POST" and path.startswith(HOOKS_PREFIX):  # from another service: no token, no Origin rule
            await self.app(scope, receive, send)
            return
        if not self.authenticate(headers) and not self._stream_ticket(scope, method):
            await _refuse(send, path, 401, "missing or wrong token")
            return
        if method not in SAFE_METHODS and not _same_origin(headers, scope):
            await _refuse(send, path, 403, "cross-origin request refused: state changes must come from this "
                                           "server's own page or a script (no foreign Origin/Referer)")
            return
        await self.app(scope, receive, send)


def _same_origin(headers: Headers, scope: Scope) -> bool:
    """The request names no origin (a script) or this server's own (Origin, else Referer)."""
    claimed = headers.get("origin")
    if claimed is None:
        referer = headers.get("referer")
        claimed = _origin_of(referer) if referer else None
    if claimed is None:
        return True
    own = f"{scope.get('scheme', 'http')}://{headers.get('host', '')}".lower()
    return claimed.lower().rstrip("/") == own


def _with_headers(send: Send, *, expire: str | None) -> Send:
    async def wrapped(message: Message) -> None:
        if message["type"] == "http.response.start":
            headers = MutableHeaders(scope=message)
            for name, value in SECURITY_HEADERS.items():
                headers.setdefault(name, value)
            headers.setdefault("cache-control", "no-store")
            if expire is not None:  # an older ov's sign-in cookie: the browser drops it
                headers.append("set-cookie", f"{expire}=; Path=/; Max-Age=0; HttpOnly; SameSite=Strict")
        await send(message)

    return wrapped


async def _old_link(send: Send) -> None:
    body = OLD_LINK_PAGE.encode()
    await send({"type": "http.response.start", "status": 410,
                "headers": [(b"content-type", b"text/html; charset=utf-8"),
                            (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


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
