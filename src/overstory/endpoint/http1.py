"""The little HTTP/1.1 an agent's endpoint speaks, on socketserver's request handlers.

``http.server`` would do, but it brings ``http.client``, ``email``, ``ssl`` and
``mimetypes`` into every agent loop (about 8 MiB of resident memory each, bench figure 6)
to parse a request line, three headers and a body. The endpoint needs only that: POST
with a ``Content-Length`` body, optional keep-alive, and an answer written in one piece
(one write with TCP_NODELAY keeps the hooks' latency low; see ``endpoint.hooks``).
"""

from __future__ import annotations

import socketserver
import typing as t

from overstory import jsontext

if t.TYPE_CHECKING:
    from typing import NamedTuple
else:  # typing's, without typing (deferred in an agent loop) and without compiling each field's annotation
    from overstory.records import NamedTuple

MAX_HEADER_LINE = 8192
MAX_HEADERS = 64
REASONS = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 403: "Forbidden", 404: "Not Found",
           405: "Method Not Allowed", 409: "Conflict", 413: "Payload Too Large", 500: "Internal Server Error",
           503: "Service Unavailable"}


class BadRequest(Exception):
    """A request that cannot be read: answered 400 and the connection is closed."""


class Request(NamedTuple):
    method: str
    path: str
    headers: dict[str, str]  # names in lower case
    keep_alive: bool


def read_head(rfile: t.BinaryIO) -> Request | None:
    """The request line and headers; None when the client closed the connection between requests."""
    line = rfile.readline(MAX_HEADER_LINE + 1)
    while line in (b"\r\n", b"\n"):  # tolerated before a request line
        line = rfile.readline(MAX_HEADER_LINE + 1)
    if not line:
        return None
    if len(line) > MAX_HEADER_LINE:
        raise BadRequest("request line too long")
    parts = line.decode("latin-1").split()
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        raise BadRequest("malformed request line")
    method, path, version = parts
    headers: dict[str, str] = {}
    for _ in range(MAX_HEADERS + 1):
        raw = rfile.readline(MAX_HEADER_LINE + 1)
        if raw in (b"\r\n", b"\n", b""):
            break
        if len(raw) > MAX_HEADER_LINE:
            raise BadRequest("header line too long")
        name, sep, value = raw.decode("latin-1").partition(":")
        if not sep:
            raise BadRequest("malformed header line")
        headers[name.strip().lower()] = value.strip()
    else:
        raise BadRequest("too many headers")
    connection = headers.get("connection", "").lower()
    keep_alive = connection == "keep-alive" if version == "HTTP/1.0" else connection != "close"
    return Request(method.upper(), path, headers, keep_alive)


def content_length(request: Request) -> int:
    if "transfer-encoding" in request.headers:
        raise BadRequest("chunked bodies are not accepted: send Content-Length")
    try:
        length = int(request.headers.get("content-length") or 0)
    except ValueError:
        raise BadRequest("bad Content-Length") from None
    if length < 0:
        raise BadRequest("bad Content-Length")
    return length


def response(status: int, body: bytes, *, keep_alive: bool) -> bytes:
    """Status line, headers and body as one buffer."""
    closing = "" if keep_alive else "Connection: close\r\n"
    head = (f"HTTP/1.1 {status} {REASONS.get(status, 'Error')}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n{closing}\r\n")
    return head.encode("latin-1") + body


class Handler(socketserver.StreamRequestHandler):
    """Serves requests on one connection until it closes (or a request asks to): ``answer`` decides."""

    keep_alive_allowed = False
    close_after = False  # set while answering: this answer is the connection's last

    def answer(self, request: Request, body: bytes) -> tuple[int, bytes]:
        raise NotImplementedError

    def max_body(self) -> int:
        return 1 << 20

    def handle(self) -> None:
        while True:
            try:
                request = read_head(self.rfile)
                if request is None:
                    return
                length = content_length(request)
                if length > self.max_body():
                    self._send_last(response(413, b'{"error":"request too large"}', keep_alive=False))
                    return
                body = self.rfile.read(length) if length else b""
            except BadRequest as exc:
                self._send_last(response(400, jsontext.dumps({"error": str(exc)}).encode(), keep_alive=False))
                return
            except OSError:
                return
            status, document = self.answer(request, body)
            keep = self.keep_alive_allowed and request.keep_alive and not self.close_after
            try:
                self.wfile.write(response(status, document, keep_alive=keep))
            except OSError:
                return
            if not keep:
                return

    def _send_last(self, data: bytes) -> None:
        try:
            self.wfile.write(data)
        except OSError:
            pass  # the client is gone: nothing to tell it
