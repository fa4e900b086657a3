"""A local, scripted stand-in for the OpenAI Chat Completions API (stdlib only).

OpenCode (and any client of an "OpenAI-compatible" endpoint) can be pointed at it
through a provider whose ``options.baseURL`` is ``api.base_url``; only the model's
replies are scripted, everything else (tools, permissions, sessions) is the real
program.

    with MockChatAPI([tool_call_reply("bash", {"command": "ls", "description": "list"}),
                      text_reply("done")]) as api:
        ...run opencode with baseURL=api.base_url...
        assert "README" in conversation_text(api.main_requests[-1])   # ls output reached the model

Routes: ``POST /v1/chat/completions`` (streamed as SSE when the body says
``"stream": true``, else one JSON object) and ``GET /v1/models``. A list of replies is
played by conversation position (see ``ScriptedConversation``), so retries and resumed
sessions do not shift the script. Side requests (OpenCode's session-title call, see
``is_side_request``) never touch the script.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import threading
import time
import typing as t
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

__all__ = [
    "MockChatAPI",
    "Reply",
    "ScriptedConversation",
    "assistant_turns",
    "conversation_text",
    "default_side_reply",
    "delayed",
    "error_reply",
    "is_side_request",
    "stalled_reply",
    "text_reply",
    "tool_call_reply",
    "tool_calls_reply",
    "with_headers",
]

_ids = itertools.count(1)


def _next_id(prefix: str) -> str:
    return f"{prefix}_mock{next(_ids):06d}"


@dataclass(frozen=True)
class Reply:
    """One scripted answer to one request.

    ``text`` is the assistant content; ``tool_calls`` are ``(id, name, arguments)``
    triples (arguments already a JSON string, as on the wire). A reply with ``status``
    other than 200 is sent as an OpenAI JSON error. A ``stall`` reply holds the
    connection ``stall_seconds`` (None: until the server closes) and then drops it
    without sending anything; ``stall_after_headers`` sends the 200 headers and the
    first chunk, then goes silent instead. ``headers`` are extra response headers;
    ``delay_seconds`` waits before answering normally (see ``delayed``).
    """

    text: str | None = None
    tool_calls: tuple[tuple[str, str, str], ...] = ()
    finish_reason: str = "stop"
    status: int = 200
    error_type: str | None = None
    error_message: str | None = None
    error_code: str | None = None
    stall: bool = False
    stall_seconds: float | None = None
    stall_after_headers: bool = False
    headers: tuple[tuple[str, str], ...] = ()
    completion_tokens: int | None = None
    delay_seconds: float = 0.0

    @property
    def is_error(self) -> bool:
        return self.status != 200


def text_reply(text: str) -> Reply:
    """A plain assistant answer that ends the turn (finish_reason ``stop``)."""
    return Reply(text=text)


def tool_calls_reply(
    calls: t.Iterable[tuple[str, dict[str, t.Any]] | tuple[str, dict[str, t.Any], str]],
    *,
    text: str | None = None,
) -> Reply:
    """Several tool calls in one assistant message: ``[(name, args[, call_id]), ...]``."""
    triples: list[tuple[str, str, str]] = []
    for call in calls:
        name, args = call[0], call[1]
        call_id = call[2] if len(call) > 2 else _next_id("call")  # type: ignore[misc]
        triples.append((call_id, name, json.dumps(dict(args))))
    return Reply(text=text, tool_calls=tuple(triples), finish_reason="tool_calls")


def tool_call_reply(
    name: str,
    args: dict[str, t.Any],
    *,
    text: str | None = None,
    call_id: str | None = None,
) -> Reply:
    """One tool call (finish_reason ``tool_calls``), optionally preceded by text."""
    call = (name, args, call_id) if call_id else (name, args)
    return tool_calls_reply([call], text=text)


def error_reply(status: int, message: str, error_type: str = "api_error", code: str | None = None) -> Reply:
    """An HTTP error in OpenAI's shape: ``{"error":{"message","type","param","code"}}``."""
    return Reply(status=status, error_type=error_type, error_message=message, error_code=code)


def stalled_reply(seconds: float | None = None, *, after_headers: bool = False) -> Reply:
    """A hung upstream: hold the connection ``seconds`` (None: until the server closes).

    By default nothing at all is sent, not even headers. With ``after_headers`` the
    200 status, the SSE headers and one role chunk go out first, then silence.
    """
    return Reply(stall=True, stall_seconds=seconds, stall_after_headers=after_headers)


def delayed(reply: Reply, seconds: float) -> Reply:
    """The same reply, sent only after ``seconds`` (released early when the server closes)."""
    return dataclasses.replace(reply, delay_seconds=seconds)


def with_headers(reply: Reply, **headers: str) -> Reply:
    """The same reply with extra response headers (``retry_after="2"`` -> ``retry-after: 2``)."""
    extra = tuple((name.replace("_", "-"), value) for name, value in headers.items())
    return dataclasses.replace(reply, headers=reply.headers + extra)


# --------------------------------------------------------------------------- requests


def _text_of(content: t.Any) -> list[str]:
    if isinstance(content, str):
        return [content]
    parts: list[str] = []
    if isinstance(content, list):
        for part in content:
            if isinstance(part, dict) and part.get("type") == "text":
                parts.append(str(part.get("text", "")))
    return parts


def conversation_text(request_body: dict[str, t.Any]) -> str:
    """All text of ``messages`` except system prompts: user/assistant/tool contents and tool arguments."""
    parts: list[str] = []
    for message in request_body.get("messages", []) or []:
        if message.get("role") == "system":
            continue
        parts.extend(_text_of(message.get("content")))
        for call in message.get("tool_calls") or []:
            function = call.get("function") or {}
            parts.append(f"{function.get('name', '')} {function.get('arguments', '')}")
    return "\n".join(parts)


def is_side_request(request_body: dict[str, t.Any], headers: t.Mapping[str, str] | None = None) -> bool:
    """True for requests that are not the agent's conversation.

    Measured with opencode 1.18.33 (tests/fixtures/OPENCODE_PROBE_NOTES.md): the main
    conversation always offers ``tools``; the session-title call offers none and its
    system prompt starts "You are a title generator". A request without tools that is
    not a title call (a plain SDK client) is treated as a conversation.
    """
    if request_body.get("tools"):
        return False
    for message in request_body.get("messages", []) or []:
        if message.get("role") == "system" and "title generator" in "\n".join(_text_of(message.get("content"))):
            return True
    return False


def assistant_turns(request_body: dict[str, t.Any]) -> int:
    """How many assistant messages the conversation already holds (its script position)."""
    return sum(1 for m in request_body.get("messages", []) or [] if m.get("role") == "assistant")


class ScriptedConversation:
    """Replies chosen by conversation position, not by request count.

    ``replies[n]`` answers a request whose ``messages`` already hold ``n`` assistant
    messages, so a retried request, a resumed session (history re-sent) or an extra
    request gets the answer that belongs to its place in the conversation. An entry
    may itself be a list of replies: successive requests at that same position get
    them in order and the last one repeats (``[error_reply(503, ...), text_reply("ok")]``
    answers the first attempt with 503 and the retry with text). Past the end of the
    script the answer is ``text_reply("(script finished)")``.
    """

    FINISHED = "(script finished)"

    def __init__(self, replies: t.Sequence[Reply | t.Sequence[Reply]]) -> None:
        self._entries: list[tuple[Reply, ...]] = []
        for entry in replies:
            if isinstance(entry, Reply):
                self._entries.append((entry,))
            else:
                attempts = tuple(entry)
                if not attempts or not all(isinstance(r, Reply) for r in attempts):
                    raise TypeError("a script entry is a Reply or a non-empty list of Replies")
                self._entries.append(attempts)
        self._attempts: dict[int, int] = {}
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    def __call__(self, request_body: dict[str, t.Any]) -> Reply:
        position = assistant_turns(request_body)
        if position >= len(self._entries):
            return text_reply(self.FINISHED)
        attempts = self._entries[position]
        with self._lock:
            seen = self._attempts.get(position, 0)
            self._attempts[position] = seen + 1
        return attempts[min(seen, len(attempts) - 1)]


def default_side_reply(request_body: dict[str, t.Any]) -> Reply:
    """A harmless answer to a side request (the title call wants one short line)."""
    return text_reply("Mock session")


# --------------------------------------------------------------------------- server


def _estimate_tokens(request_body: dict[str, t.Any]) -> int:
    """A rough, non-zero prompt token count so the client's accounting has something to add."""
    size = len(json.dumps(request_body.get("messages", []))) + len(json.dumps(request_body.get("tools", [])))
    return max(1, size // 4)


def _usage(reply: Reply, prompt_tokens: int) -> dict[str, int]:
    completion = reply.completion_tokens
    if completion is None:
        size = len(reply.text or "") + sum(len(name) + len(args) for _, name, args in reply.tool_calls)
        completion = max(1, size // 4)
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion, "total_tokens": prompt_tokens + completion}


def _completion_json(reply: Reply, model: str, prompt_tokens: int) -> dict[str, t.Any]:
    message: dict[str, t.Any] = {"role": "assistant", "content": reply.text}
    if reply.tool_calls:
        message["tool_calls"] = [
            {"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}
            for call_id, name, args in reply.tool_calls
        ]
    return {
        "id": _next_id("chatcmpl"),
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": reply.finish_reason, "logprobs": None}],
        "usage": _usage(reply, prompt_tokens),
    }


def _chunks(text: str, size: int) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)] or [""]


def _sse_chunks(reply: Reply, model: str, prompt_tokens: int, include_usage: bool) -> t.Iterator[dict[str, t.Any]]:
    base = {"id": _next_id("chatcmpl"), "object": "chat.completion.chunk", "created": int(time.time()), "model": model}

    def chunk(delta: dict[str, t.Any], finish: str | None = None) -> dict[str, t.Any]:
        return dict(base, choices=[{"index": 0, "delta": delta, "finish_reason": finish}])

    yield chunk({"role": "assistant", "content": ""})
    if reply.text:
        for piece in _chunks(reply.text, 40):
            yield chunk({"content": piece})
    for index, (call_id, name, args) in enumerate(reply.tool_calls):
        yield chunk(
            {
                "tool_calls": [
                    {"index": index, "id": call_id, "type": "function", "function": {"name": name, "arguments": ""}}
                ]
            }
        )
        for piece in _chunks(args, 40):
            yield chunk({"tool_calls": [{"index": index, "function": {"arguments": piece}}]})
    final = chunk({}, reply.finish_reason)
    usage = _usage(reply, prompt_tokens)
    if include_usage:
        yield final
        yield dict(base, choices=[], usage=usage)
    else:  # still report usage on the last chunk, as several compatible servers do
        yield dict(final, usage=usage)


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: t.Any) -> None:
        """Quiet: tests read ``api.requests`` instead of the access log."""

    def _send_json(self, status: int, body: dict[str, t.Any], extra: t.Iterable[tuple[str, str]] = ()) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("x-request-id", _next_id("req"))
        for name, value in extra:
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)

    def _send_error(
        self,
        status: int,
        message: str,
        error_type: str,
        code: str | None = None,
        extra: t.Iterable[tuple[str, str]] = (),
    ) -> None:
        body = {"error": {"message": message, "type": error_type, "param": None, "code": code}}
        self._send_json(status, body, extra)

    def _drain_body(self) -> bytes:
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def do_HEAD(self) -> None:
        self.server.api._note_probe(self.command, self.path)
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_GET(self) -> None:
        self._drain_body()
        path = self.path.split("?", 1)[0].rstrip("/")
        self.server.api._note_probe(self.command, self.path)
        if path == "/v1/models":
            models = [{"id": m, "object": "model", "created": 0, "owned_by": "mock"} for m in self.server.api.models]
            self._send_json(200, {"object": "list", "data": models})
            return
        self._send_error(404, f"mock: no route for GET {self.path}", "invalid_request_error", "not_found")

    def do_POST(self) -> None:
        raw = self._drain_body()
        path = self.path.split("?", 1)[0]
        if path != "/v1/chat/completions":
            self.server.api._note_probe(self.command, self.path)
            self._send_error(404, f"mock: no route for POST {self.path}", "invalid_request_error", "not_found")
            return
        try:
            body = json.loads(raw or b"{}")
        except json.JSONDecodeError as exc:
            self._send_error(400, f"mock: body is not JSON: {exc}", "invalid_request_error")
            return
        reply = self.server.api._answer(body, dict(self.headers.items()))
        model = str(body.get("model") or "mock-model")
        if reply.stall and not reply.stall_after_headers:
            self.server.api._stall(reply.stall_seconds)
            self.close_connection = True
            return
        if reply.delay_seconds > 0:
            self.server.api._stall(reply.delay_seconds)
        if reply.is_error:
            self._send_error(
                reply.status,
                reply.error_message or "mock error",
                reply.error_type or "api_error",
                reply.error_code,
                reply.headers,
            )
            return
        prompt_tokens = _estimate_tokens(body)
        if body.get("stream"):
            include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
            self._stream(reply, model, prompt_tokens, include_usage)
        else:
            self._send_json(200, _completion_json(reply, model, prompt_tokens), reply.headers)

    def _stream(self, reply: Reply, model: str, prompt_tokens: int, include_usage: bool) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("x-request-id", _next_id("req"))
        self.send_header("Connection", "close")
        for name, value in reply.headers:
            self.send_header(name, value)
        self.end_headers()
        self.close_connection = True
        try:
            for data in _sse_chunks(reply, model, prompt_tokens, include_usage):
                self.wfile.write(f"data: {json.dumps(data)}\n\n".encode())
                self.wfile.flush()
                if reply.stall:  # stall_after_headers: the role chunk is out, now go silent
                    self.server.api._stall(reply.stall_seconds)
                    return
            self.wfile.write(b"data: [DONE]\n\n")
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            pass


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    api: MockChatAPI


@dataclass
class _Probe:
    method: str
    path: str


class MockChatAPI:
    """A Chat Completions API on 127.0.0.1 (port chosen by the OS), run in a daemon thread.

    ``responder`` is a callable ``(request_body) -> Reply`` or a list of replies
    (played by ``ScriptedConversation``). Side requests (``is_side_request``) go to
    ``side_responder`` or get a harmless default and never reach ``responder``.

    ``requests`` holds every POST /v1/chat/completions body in arrival order, each with
    a ``_headers`` dict (lower-case names), a ``_side`` flag and ``_time`` (monotonic
    arrival time); ``main_requests`` / ``side_requests`` split them. ``probes`` lists
    every other request (GET /v1/models and unknown routes). ``base_url`` ends in
    ``/v1``: it is what an OpenAI-compatible client takes as its base URL.
    """

    def __init__(
        self,
        responder: t.Callable[[dict[str, t.Any]], Reply] | t.Sequence[Reply | t.Sequence[Reply]],
        *,
        side_responder: t.Callable[[dict[str, t.Any]], Reply] | None = None,
        models: t.Sequence[str] = ("mock-model",),
    ) -> None:
        if callable(responder):
            self._responder: t.Callable[[dict[str, t.Any]], Reply] = responder
        else:
            self._responder = ScriptedConversation(responder)
        self._side_responder = side_responder or default_side_reply
        self.models = tuple(models)
        self.requests: list[dict[str, t.Any]] = []
        self.probes: list[_Probe] = []
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle
    def start(self) -> MockChatAPI:
        if self._server is not None:
            return self
        server = _Server(("127.0.0.1", 0), _Handler)
        server.api = self
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.05}, name="mock-chat-api", daemon=True
        )
        self._thread.start()
        return self

    def __enter__(self) -> t.Self:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop serving; stalled replies are released and their connections dropped."""
        self._closing.set()
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("MockChatAPI is not running (use it as a context manager)")
        return int(self._server.server_address[1])

    @property
    def root_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        return f"{self.root_url}/v1"

    # -- views
    @property
    def main_requests(self) -> list[dict[str, t.Any]]:
        with self._lock:
            return [r for r in self.requests if not r["_side"]]

    @property
    def side_requests(self) -> list[dict[str, t.Any]]:
        with self._lock:
            return [r for r in self.requests if r["_side"]]

    def wait_for_requests(self, count: int, timeout: float = 10.0) -> bool:
        """Poll until at least ``count`` main requests arrived (True) or ``timeout`` passes."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if len(self.main_requests) >= count:
                return True
            time.sleep(0.02)
        return len(self.main_requests) >= count

    # -- called from handler threads
    def _note_probe(self, method: str, path: str) -> None:
        with self._lock:
            self.probes.append(_Probe(method, path))

    def _answer(self, body: dict[str, t.Any], headers: dict[str, str]) -> Reply:
        side = is_side_request(body, headers)
        record = dict(body)
        record["_headers"] = {k.lower(): v for k, v in headers.items()}
        record["_side"] = side
        record["_time"] = time.monotonic()
        with self._lock:
            self.requests.append(record)
        try:
            reply = (self._side_responder if side else self._responder)(body)
        except Exception as exc:  # noqa: BLE001 - a broken script must show up, not hang the client
            return error_reply(500, f"mock responder raised {exc!r}")
        if not isinstance(reply, Reply):
            return error_reply(500, f"mock responder returned {type(reply).__name__}, not Reply")
        return reply

    def _stall(self, seconds: float | None) -> None:
        self._closing.wait(timeout=seconds)
