"""A local, scripted stand-in for the Anthropic Messages API (stdlib only).

The real Claude Code CLI (and the ``anthropic`` SDK) can be pointed at it through
``ANTHROPIC_BASE_URL``; only the model's replies are scripted, everything else
(tools, hooks, sessions) is the real program.

    with MockMessagesAPI([tool_reply("Bash", {"command": "ls"}), text_reply("done")]) as api:
        run_headless_turn(CLAUDE_BIN, "list the files", cwd=repo, env=claude_env(api.base_url, tmp_path))
        assert "README" in conversation_text(api.main_requests[-1])   # the ls output reached the model

A list of replies is played by conversation position (see ``ScriptedConversation``),
so retries and resumed sessions do not shift the script. Side requests (the CLI's
title generation, sub-agent conversations; see ``is_side_request``) never touch the
script: they go to ``side_responder`` or get a harmless default.
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
    "MockMessagesAPI",
    "Reply",
    "ScriptedConversation",
    "TurnScript",
    "assistant_turns",
    "conversation_text",
    "default_side_reply",
    "delayed",
    "error_reply",
    "is_side_request",
    "stalled_reply",
    "text_reply",
    "tool_reply",
    "tools_reply",
    "with_headers",
    "with_usage",
]

_ids = itertools.count(1)


def _next_id(prefix: str) -> str:
    return f"{prefix}_mock{next(_ids):06d}"


@dataclass(frozen=True)
class Reply:
    """One scripted answer to one request.

    ``blocks`` are Messages API content blocks (``text`` / ``tool_use``). A reply with
    ``status`` other than 200 is sent as an Anthropic JSON error. A ``stall`` reply
    holds the connection ``stall_seconds`` (None: until the server closes) and then
    drops it without sending anything. ``headers`` are extra response headers;
    ``delay_seconds`` waits before answering normally (see ``delayed``).
    """

    blocks: tuple[dict[str, t.Any], ...] = ()
    stop_reason: str = "end_turn"
    status: int = 200
    error_type: str | None = None
    error_message: str | None = None
    stall: bool = False
    stall_seconds: float | None = None
    headers: tuple[tuple[str, str], ...] = ()
    output_tokens: int | None = None
    delay_seconds: float = 0.0
    input_tokens: int | None = None
    cache_read_input_tokens: int = 0
    cache_creation_input_tokens: int = 0

    @property
    def is_error(self) -> bool:
        return self.status != 200


def text_reply(text: str) -> Reply:
    """A plain assistant answer that ends the turn (stop_reason ``end_turn``)."""
    return Reply(blocks=({"type": "text", "text": text},))


def tools_reply(
    calls: t.Iterable[tuple[str, dict[str, t.Any]] | tuple[str, dict[str, t.Any], str]],
    *,
    text: str | None = None,
) -> Reply:
    """Several tool_use blocks in one assistant message: ``[(name, input[, tool_id]), ...]``."""
    blocks: list[dict[str, t.Any]] = []
    if text is not None:
        blocks.append({"type": "text", "text": text})
    for call in calls:
        name, tool_input = call[0], call[1]
        tool_id = call[2] if len(call) > 2 else _next_id("toolu")  # type: ignore[misc]
        blocks.append({"type": "tool_use", "id": tool_id, "name": name, "input": dict(tool_input)})
    return Reply(blocks=tuple(blocks), stop_reason="tool_use")


def tool_reply(
    name: str,
    input: dict[str, t.Any],  # noqa: A002 - mirrors the wire field name
    *,
    text: str | None = None,
    tool_id: str | None = None,
) -> Reply:
    """One tool call (stop_reason ``tool_use``), optionally preceded by a text block."""
    call = (name, input, tool_id) if tool_id else (name, input)
    return tools_reply([call], text=text)


def error_reply(status: int, error_type: str, message: str) -> Reply:
    """An HTTP error in Anthropic's shape: ``{"type":"error","error":{"type":..,"message":..}}``."""
    return Reply(status=status, error_type=error_type, error_message=message)


def stalled_reply(seconds: float | None = None) -> Reply:
    """Hold the connection for ``seconds`` (None: until the server closes), then drop it.

    Nothing at all is sent, not even headers: this is what a hung upstream looks like.
    """
    return Reply(stall=True, stall_seconds=seconds)


def delayed(reply: Reply, seconds: float) -> Reply:
    """The same reply, sent only after ``seconds`` (released early when the server closes)."""
    return dataclasses.replace(reply, delay_seconds=seconds)


def with_headers(reply: Reply, **headers: str) -> Reply:
    """The same reply with extra response headers (``retry_after="2"`` -> ``retry-after: 2``)."""
    extra = tuple((name.replace("_", "-"), value) for name, value in headers.items())
    return dataclasses.replace(reply, headers=reply.headers + extra)


def with_usage(reply: Reply, *, input_tokens: int | None = None, output_tokens: int | None = None,
               cache_read: int = 0, cache_write: int = 0) -> Reply:
    """The same reply reporting these token counts (a big bill without a big conversation).

    The input and cache counts go out in ``message_start`` (the CLI copies them into each
    streamed ``assistant`` event); the output count only in the final ``message_delta``.
    """
    return dataclasses.replace(reply, input_tokens=input_tokens,
                               output_tokens=output_tokens if output_tokens is not None else reply.output_tokens,
                               cache_read_input_tokens=cache_read, cache_creation_input_tokens=cache_write)


# --------------------------------------------------------------------------- requests


def _text_of(content: t.Any) -> list[str]:
    if isinstance(content, str):
        return [content]
    parts: list[str] = []
    if isinstance(content, list):
        for block in content:
            if not isinstance(block, dict):
                continue
            kind = block.get("type")
            if kind == "text":
                parts.append(str(block.get("text", "")))
            elif kind == "tool_result":
                parts.extend(_text_of(block.get("content", "")))
            elif kind == "tool_use":
                parts.append(json.dumps(block.get("input", {}), sort_keys=True))
            elif kind == "thinking":
                parts.append(str(block.get("thinking", "")))
    return parts


def conversation_text(request_body: dict[str, t.Any]) -> str:
    """All text the model would see in ``messages``: text, tool inputs and tool_result contents."""
    parts: list[str] = []
    for message in request_body.get("messages", []) or []:
        parts.extend(_text_of(message.get("content")))
    return "\n".join(parts)


def _system_text(request_body: dict[str, t.Any]) -> str:
    system = request_body.get("system")
    if isinstance(system, str):
        return system
    if isinstance(system, list):
        return "\n".join(str(b.get("text", "")) for b in system if isinstance(b, dict))
    return ""


def is_side_request(request_body: dict[str, t.Any], headers: t.Mapping[str, str] | None = None) -> bool:
    """True for requests that are not the main agent's conversation.

    Measured with Claude Code 2.1.197 and 2.1.330 (tests/fixtures/CLAUDE_PROBE_NOTES.md):
    - sub-agent conversations (the Task/Agent tool) carry an ``x-claude-code-agent-id`` header;
    - the CLI's own side calls (2.1.197's session title generation, which it skipped under
      CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1; 2.1.330 sends none) offer no ``tools`` while still
      carrying the CLI's marks (``user-agent: claude-cli/...``, ``x-app: cli``, a
      system block starting ``x-anthropic-billing-header``);
    - the main conversation always offers tools and has no agent id.
    A request without the CLI's marks (the ``anthropic`` SDK used directly) is a
    conversation, never a side request.
    """
    lowered = {k.lower(): v for k, v in (headers or {}).items()}
    if lowered.get("x-claude-code-agent-id"):
        return True
    if request_body.get("tools"):
        return False
    if lowered.get("user-agent", "").startswith("claude-cli/") or lowered.get("x-app") == "cli":
        return True
    system = _system_text(request_body)
    return "x-anthropic-billing-header" in system or "Claude Agent SDK" in system


def assistant_turns(request_body: dict[str, t.Any]) -> int:
    """How many assistant messages the conversation already holds (its script position)."""
    return sum(1 for m in request_body.get("messages", []) or [] if m.get("role") == "assistant")


class ScriptedConversation:
    """Replies chosen by conversation position, not by request count.

    ``replies[n]`` answers a request whose ``messages`` already hold ``n`` assistant
    messages, so a retried request, a resumed session (history re-sent) or an extra
    request gets the answer that belongs to its place in the conversation. An entry
    may itself be a list of replies: successive requests at that same position get
    them in order and the last one repeats (``[error_reply(529, ...), text_reply("ok")]``
    answers the first attempt with 529 and the retry with text). Past the end of the
    script the answer is ``text_reply("(script finished)")``. A turn killed mid-call and
    resumed moves the position on (Claude Code adds messages for the killed call): use
    ``TurnScript`` for those.
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


def _own_text(message: dict[str, t.Any]) -> str:
    """The text a message itself says (its text blocks), without tool results."""
    content = message.get("content")
    if isinstance(content, str):
        return content
    return "\n".join(str(b.get("text", "")) for b in content or () if isinstance(b, dict) and b.get("type") == "text")


class TurnScript:
    """Replies by position within the current turn: for tests that kill a turn and let ov retry it.

    ov retries a killed turn by resuming the same session and sending the same mail again as a
    new user message. The resumed history also holds what Claude Code 2.1.330 adds for the
    killed call: a synthetic ``tool_result`` ("[Tool call interrupted: the session ended before
    this call's result was recorded, so its outcome is unknown. …]", ``is_error``) and an
    assistant "No response requested.". So ``ScriptedConversation``'s whole-conversation
    position would move on; here the position counts the assistant messages after the last
    user message whose text holds ``marker`` (ov's rendered mail), so a retried turn plays the
    same calls again, as a model answering the same mail would. Tool ids are made fresh on
    every answer. Past the end: ``text_reply("(script finished)")``.
    """

    def __init__(self, replies: t.Sequence[Reply], marker: str = "=== BEGIN MESSAGE #") -> None:
        self.replies = list(replies)
        self.marker = marker

    def __call__(self, request_body: dict[str, t.Any]) -> Reply:
        messages = request_body.get("messages", []) or []
        starts = [i for i, m in enumerate(messages) if m.get("role") == "user" and self.marker in _own_text(m)]
        position = sum(1 for m in messages[starts[-1] if starts else 0:] if m.get("role") == "assistant")
        if position >= len(self.replies):
            return text_reply(ScriptedConversation.FINISHED)
        reply = self.replies[position]
        blocks = tuple({**b, "id": _next_id("toolu")} if b.get("type") == "tool_use" else b for b in reply.blocks)
        return dataclasses.replace(reply, blocks=blocks)


def default_side_reply(request_body: dict[str, t.Any]) -> Reply:
    """A harmless answer to a side request: JSON when the CLI asks for a JSON schema
    (the title call), else a short text that ends the sub-agent's turn."""
    output_format = (request_body.get("output_config") or {}).get("format") or {}
    if output_format.get("type") == "json_schema":
        return text_reply('{"title": "Mock session"}')
    return text_reply("(mock side reply)")


# --------------------------------------------------------------------------- server


def _estimate_tokens(request_body: dict[str, t.Any]) -> int:
    """A rough, non-zero input token count so the CLI's cost accounting has something to add."""
    size = len(json.dumps(request_body.get("messages", []))) + len(_system_text(request_body))
    return max(1, size // 4)


def _message_json(reply: Reply, model: str, input_tokens: int) -> dict[str, t.Any]:
    output_tokens = reply.output_tokens
    if output_tokens is None:
        output_tokens = max(1, sum(len(json.dumps(b)) for b in reply.blocks) // 4)
    return {
        "id": _next_id("msg"),
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [dict(b) for b in reply.blocks],
        "stop_reason": reply.stop_reason,
        "stop_sequence": None,
        "usage": {
            "input_tokens": reply.input_tokens if reply.input_tokens is not None else input_tokens,
            "output_tokens": output_tokens,
            "cache_creation_input_tokens": reply.cache_creation_input_tokens,
            "cache_read_input_tokens": reply.cache_read_input_tokens,
        },
    }


def _chunks(text: str, size: int) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)] or [""]


def _sse_events(message: dict[str, t.Any]) -> t.Iterator[tuple[str, dict[str, t.Any]]]:
    start = dict(message, content=[], stop_reason=None)
    start["usage"] = dict(message["usage"], output_tokens=1)
    yield "message_start", {"type": "message_start", "message": start}
    yield "ping", {"type": "ping"}
    for index, block in enumerate(message["content"]):
        if block["type"] == "text":
            yield "content_block_start", {
                "type": "content_block_start",
                "index": index,
                "content_block": {"type": "text", "text": ""},
            }
            for piece in _chunks(block["text"], 40):
                yield "content_block_delta", {
                    "type": "content_block_delta",
                    "index": index,
                    "delta": {"type": "text_delta", "text": piece},
                }
        elif block["type"] == "tool_use":
            yield "content_block_start", {
                "type": "content_block_start",
                "index": index,
                "content_block": {
                    "type": "tool_use",
                    "id": block["id"],
                    "name": block["name"],
                    "input": {},
                },
            }
            for piece in _chunks(json.dumps(block["input"]), 40):
                yield "content_block_delta", {
                    "type": "content_block_delta",
                    "index": index,
                    "delta": {"type": "input_json_delta", "partial_json": piece},
                }
        else:  # pragma: no cover - only text and tool_use are constructed above
            raise ValueError(f"unsupported block type {block['type']!r}")
        yield "content_block_stop", {"type": "content_block_stop", "index": index}
    yield "message_delta", {
        "type": "message_delta",
        "delta": {"stop_reason": message["stop_reason"], "stop_sequence": None},
        "usage": {"output_tokens": message["usage"]["output_tokens"]},
    }
    yield "message_stop", {"type": "message_stop"}


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: t.Any) -> None:  # noqa: A002
        """Quiet: tests read ``api.requests`` instead of the access log."""

    # -- helpers
    def _send_json(self, status: int, body: dict[str, t.Any], extra: t.Iterable[tuple[str, str]] = ()) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("request-id", _next_id("req"))
        for name, value in extra:
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)

    def _send_error(self, status: int, error_type: str, message: str, extra: t.Iterable[tuple[str, str]] = ()) -> None:
        self._send_json(status, {"type": "error", "error": {"type": error_type, "message": message}}, extra)

    # -- verbs
    def do_HEAD(self) -> None:
        self.server.api._note_probe(self.command, self.path)
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_GET(self) -> None:
        self.server.api._note_probe(self.command, self.path)
        self._drain_body()
        self._send_error(404, "not_found_error", f"mock: no route for GET {self.path}")

    def _drain_body(self) -> bytes:
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def do_POST(self) -> None:
        raw = self._drain_body()
        path = self.path.split("?", 1)[0]
        if path != "/v1/messages":
            self.server.api._note_probe(self.command, self.path)
            self._send_error(404, "not_found_error", f"mock: no route for POST {self.path}")
            return
        try:
            body = json.loads(raw or b"{}")
        except json.JSONDecodeError as exc:
            self._send_error(400, "invalid_request_error", f"mock: body is not JSON: {exc}")
            return
        reply = self.server.api._answer(body, dict(self.headers.items()))
        if reply.stall:
            self.server.api._stall(reply.stall_seconds)
            self.close_connection = True
            return
        if reply.delay_seconds > 0:
            self.server.api._stall(reply.delay_seconds)
        if reply.is_error:
            self._send_error(
                reply.status,
                reply.error_type or "api_error",
                reply.error_message or "mock error",
                reply.headers,
            )
            return
        message = _message_json(reply, str(body.get("model") or "claude-mock"), _estimate_tokens(body))
        if body.get("stream"):
            self._stream(message, reply.headers)
        else:
            self._send_json(200, message, reply.headers)

    def _stream(self, message: dict[str, t.Any], extra: t.Iterable[tuple[str, str]]) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("request-id", _next_id("req"))
        self.send_header("Connection", "close")
        for name, value in extra:
            self.send_header(name, value)
        self.end_headers()
        self.close_connection = True
        try:
            for event, data in _sse_events(message):
                self.wfile.write(f"event: {event}\ndata: {json.dumps(data)}\n\n".encode())
                self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            pass


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    api: MockMessagesAPI


@dataclass
class _Probe:
    method: str
    path: str


class MockMessagesAPI:
    """A Messages API on 127.0.0.1 (port chosen by the OS), run in a daemon thread.

    ``responder`` is a callable ``(request_body) -> Reply`` or a list of replies
    (played by ``ScriptedConversation``). Side requests (``is_side_request``) go to
    ``side_responder`` or get a harmless default and never reach ``responder``.

    ``authorize`` sees each request's headers (lower-case names) first; a Reply it returns
    (a 401, say) answers the request instead of the script.

    ``requests`` holds every POST /v1/messages body in arrival order, each with a
    ``_headers`` dict (lower-case names), a ``_side`` flag and ``_agent_id`` (the
    sub-agent's id, else None); ``main_requests`` / ``side_requests`` split them.
    """

    def __init__(
        self,
        responder: t.Callable[[dict[str, t.Any]], Reply] | t.Sequence[Reply | t.Sequence[Reply]],
        *,
        side_responder: t.Callable[[dict[str, t.Any]], Reply] | None = None,
        authorize: t.Callable[[dict[str, str]], Reply | None] | None = None,
    ) -> None:
        self._authorize = authorize
        if callable(responder):
            self._responder: t.Callable[[dict[str, t.Any]], Reply] = responder
        else:
            self._responder = ScriptedConversation(responder)
        self._side_responder = side_responder or default_side_reply
        self.requests: list[dict[str, t.Any]] = []
        self.probes: list[_Probe] = []
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle
    def start(self) -> MockMessagesAPI:
        if self._server is not None:
            return self
        server = _Server(("127.0.0.1", 0), _Handler)
        server.api = self
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.05}, name="mock-messages-api", daemon=True
        )
        self._thread.start()
        return self

    def __enter__(self) -> MockMessagesAPI:
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
            raise RuntimeError("MockMessagesAPI is not running (use it as a context manager)")
        return int(self._server.server_address[1])

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

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
        record["_agent_id"] = record["_headers"].get("x-claude-code-agent-id")
        with self._lock:
            self.requests.append(record)
        if self._authorize is not None:
            refused = self._authorize(record["_headers"])
            if refused is not None:
                return refused
        try:
            reply = (self._side_responder if side else self._responder)(body)
        except Exception as exc:  # a broken script must show up, not hang the CLI
            return error_reply(500, "api_error", f"mock responder raised {exc!r}")
        if not isinstance(reply, Reply):
            return error_reply(500, "api_error", f"mock responder returned {type(reply).__name__}, not Reply")
        return reply

    def _stall(self, seconds: float | None) -> None:
        self._closing.wait(timeout=seconds)
