"""A local, scripted stand-in for the OpenAI Responses API (stdlib only).

The real Codex CLI (``codex exec``) talks to it through a custom model provider in
``$CODEX_HOME/config.toml`` (``wire_api = "responses"``, ``base_url`` = ``api.base_url``;
see ``tests/codex_cli.py``). Only the model's replies are scripted; the tools, the
sandbox, the session files and resume are the real program.

    with MockResponsesAPI([shell_reply("echo hi > out.txt"), text_reply("done")]) as api:
        run_exec(CODEX_BIN, "write the file", cwd=repo, env=codex_env(api.base_url, tmp_path))
        assert function_outputs(api.requests[-1])   # the command's output reached the model

Codex 0.169 sends ``POST <base_url>/responses`` (``stream: true``) and reads SSE up to
``response.completed``; a stream that ends without it is an error that codex retries.

A list of replies is played by conversation position (``ScriptedConversation``), so
retries and resumed sessions (which re-send the whole history) do not shift the script.
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
    "MockResponsesAPI",
    "Reply",
    "ScriptedConversation",
    "calls_reply",
    "conversation_position",
    "conversation_text",
    "delayed",
    "error_reply",
    "failed_reply",
    "function_call_reply",
    "function_outputs",
    "input_messages",
    "shell_reply",
    "silent_stream_reply",
    "stalled_reply",
    "text_reply",
    "tool_names",
    "truncated_reply",
    "with_headers",
]

_ids = itertools.count(1)


def _next_id(prefix: str) -> str:
    return f"{prefix}_mock{next(_ids):06d}"


@dataclass(frozen=True)
class Reply:
    """One scripted answer to one request.

    ``items`` are Responses API output items (``message`` / ``function_call``). A reply
    with ``status`` other than 200 is sent as an OpenAI JSON error
    (``{"error": {"message", "type", "param", "code"}}``). ``failed`` sends a 200 stream
    that ends in ``response.failed`` carrying ``error_code`` / ``error_message``;
    ``truncated`` sends the items and closes the stream without ``response.completed``.
    A ``stall`` reply holds the connection ``stall_seconds`` (None: until the server
    closes) and drops it without sending a byte; with ``stall_after_created`` it first
    sends the 200 headers and ``response.created``. ``headers`` are extra response
    headers; ``delay_seconds`` waits before answering normally (see ``delayed``).
    """

    items: tuple[dict[str, t.Any], ...] = ()
    status: int = 200
    error_type: str | None = None
    error_code: str | None = None
    error_message: str | None = None
    failed: bool = False
    truncated: bool = False
    stall: bool = False
    stall_seconds: float | None = None
    stall_after_created: bool = False
    headers: tuple[tuple[str, str], ...] = ()
    output_tokens: int | None = None
    delay_seconds: float = 0.0

    @property
    def is_error(self) -> bool:
        return self.status != 200


def _message_item(text: str) -> dict[str, t.Any]:
    return {
        "type": "message",
        "id": _next_id("msg"),
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }


def _function_call_item(name: str, arguments: dict[str, t.Any] | str, call_id: str | None) -> dict[str, t.Any]:
    return {
        "type": "function_call",
        "id": _next_id("fc"),
        "call_id": call_id or _next_id("call"),
        "name": name,
        "arguments": arguments if isinstance(arguments, str) else json.dumps(arguments),
        "status": "completed",
    }


def text_reply(text: str) -> Reply:
    """A plain assistant message; with no tool call in it, codex ends the turn."""
    return Reply(items=(_message_item(text),))


def calls_reply(
    calls: t.Iterable[tuple[str, dict[str, t.Any] | str] | tuple[str, dict[str, t.Any] | str, str]],
    *,
    text: str | None = None,
) -> Reply:
    """Several ``function_call`` items in one response: ``[(name, arguments[, call_id]), ...]``,
    optionally preceded by a message (a "preamble")."""
    items: list[dict[str, t.Any]] = []
    if text is not None:
        items.append(_message_item(text))
    for call in calls:
        call_id = call[2] if len(call) > 2 else None  # type: ignore[misc]
        items.append(_function_call_item(call[0], call[1], call_id))
    return Reply(items=tuple(items))


def function_call_reply(
    name: str,
    arguments: dict[str, t.Any] | str,
    *,
    text: str | None = None,
    call_id: str | None = None,
) -> Reply:
    """One function call. ``arguments`` is sent JSON-encoded, as the API does."""
    call = (name, arguments, call_id) if call_id else (name, arguments)
    return calls_reply([call], text=text)


def shell_reply(
    cmd: str,
    *,
    workdir: str | None = None,
    yield_time_ms: int | None = None,
    text: str | None = None,
    call_id: str | None = None,
) -> Reply:
    """A call of codex 0.169's shell tool, ``exec_command`` (``{"cmd": ...}``).

    Codex runs ``cmd`` through the user's shell in the turn's cwd (or ``workdir``)
    and reports a ``command_execution`` item; the output goes back to the model as a
    ``function_call_output``. ``yield_time_ms`` (default 10000) is how long codex
    waits for the command before answering the model with a running session id.
    """
    arguments: dict[str, t.Any] = {"cmd": cmd}
    if workdir is not None:
        arguments["workdir"] = workdir
    if yield_time_ms is not None:
        arguments["yield_time_ms"] = yield_time_ms
    return function_call_reply("exec_command", arguments, text=text, call_id=call_id)


def error_reply(status: int, message: str, *, code: str | None = None, error_type: str | None = None) -> Reply:
    """An HTTP error with an OpenAI error body."""
    default_type = {401: "invalid_request_error", 429: "rate_limit_exceeded"}.get(status, "server_error")
    return Reply(status=status, error_type=error_type or default_type, error_code=code, error_message=message)


def failed_reply(code: str, message: str) -> Reply:
    """A 200 stream ending in ``response.failed`` (``context_length_exceeded``,
    ``insufficient_quota``, ``rate_limit_exceeded``, ``server_error``, ...)."""
    return Reply(failed=True, error_code=code, error_message=message)


def truncated_reply(text: str = "partial") -> Reply:
    """A 200 stream that sends a message and closes without ``response.completed``."""
    return Reply(items=(_message_item(text),), truncated=True)


def stalled_reply(seconds: float | None = None) -> Reply:
    """Hold the connection for ``seconds`` (None: until the server closes), then drop it.

    Nothing at all is sent, not even headers: this is what a hung upstream looks like.
    """
    return Reply(stall=True, stall_seconds=seconds)


def silent_stream_reply(seconds: float | None = None) -> Reply:
    """Send the 200 headers and ``response.created``, then nothing for ``seconds``
    (None: until the server closes), then drop the connection. Codex's
    ``stream_idle_timeout_ms`` applies here, unlike to ``stalled_reply``."""
    return Reply(stall=True, stall_seconds=seconds, stall_after_created=True)


def delayed(reply: Reply, seconds: float) -> Reply:
    """The same reply, sent only after ``seconds`` (released early when the server closes)."""
    return dataclasses.replace(reply, delay_seconds=seconds)


def with_headers(reply: Reply, **headers: str) -> Reply:
    """The same reply with extra response headers (``retry_after="2"`` -> ``retry-after: 2``)."""
    extra = tuple((name.replace("_", "-"), value) for name, value in headers.items())
    return dataclasses.replace(reply, headers=reply.headers + extra)


# --------------------------------------------------------------------------- requests

# Items the model produced (they come back in ``input`` on the next request).
_MODEL_ITEM_TYPES = frozenset(
    ["function_call", "custom_tool_call", "local_shell_call", "reasoning", "web_search_call", "image_generation_call"]
)


def _is_model_item(item: dict[str, t.Any]) -> bool:
    kind = item.get("type")
    if kind == "message":
        return item.get("role") == "assistant"
    return kind in _MODEL_ITEM_TYPES


def _input_items(request_body: dict[str, t.Any]) -> list[dict[str, t.Any]]:
    items = request_body.get("input") or []
    if isinstance(items, str):
        return [{"type": "message", "role": "user", "content": items}]
    return [i for i in items if isinstance(i, dict)]


def conversation_position(request_body: dict[str, t.Any]) -> int:
    """How many model responses the history already holds (the script position).

    Each response the model gave comes back in ``input`` as a run of consecutive
    model items (an assistant message and/or function calls); tool outputs and user
    or developer messages separate the runs. Measured with codex 0.169: a response
    holding a message and a call comes back as those two items, adjacent.
    """
    position = 0
    in_run = False
    for item in _input_items(request_body):
        if _is_model_item(item):
            if not in_run:
                position += 1
            in_run = True
        else:
            in_run = False
    return position


def _content_text(content: t.Any) -> list[str]:
    if isinstance(content, str):
        return [content]
    parts: list[str] = []
    if isinstance(content, list):
        for block in content:
            if isinstance(block, dict) and isinstance(block.get("text"), str):
                parts.append(block["text"])
    return parts


def input_messages(request_body: dict[str, t.Any], role: str) -> list[str]:
    """The text of every ``input`` message with ``role`` (user, developer, assistant)."""
    texts: list[str] = []
    for item in _input_items(request_body):
        if item.get("type") == "message" and item.get("role") == role:
            texts.append("\n".join(_content_text(item.get("content"))))
    return texts


def function_outputs(request_body: dict[str, t.Any]) -> dict[str, str]:
    """``call_id`` -> output text of every ``function_call_output`` in ``input``."""
    outputs: dict[str, str] = {}
    for item in _input_items(request_body):
        if item.get("type") in ("function_call_output", "custom_tool_call_output"):
            output = item.get("output")
            outputs[str(item.get("call_id"))] = output if isinstance(output, str) else "\n".join(_content_text(output))
    return outputs


def conversation_text(request_body: dict[str, t.Any]) -> str:
    """All text in ``input``: messages of every role, call arguments and tool outputs."""
    parts: list[str] = []
    for item in _input_items(request_body):
        kind = item.get("type")
        if kind == "message":
            parts.extend(_content_text(item.get("content")))
        elif kind == "function_call":
            parts.append(str(item.get("arguments", "")))
        elif kind in ("function_call_output", "custom_tool_call_output"):
            output = item.get("output")
            parts.extend([output] if isinstance(output, str) else _content_text(output))
    return "\n".join(parts)


def tool_names(request_body: dict[str, t.Any]) -> list[str]:
    """Names of the offered tools; tools inside a ``namespace`` are ``namespace.name``."""
    names: list[str] = []
    for tool in request_body.get("tools") or []:
        if tool.get("type") == "namespace":
            names.extend(f"{tool.get('name')}.{inner.get('name')}" for inner in tool.get("tools") or [])
        else:
            names.append(str(tool.get("name") or tool.get("type")))
    return names


class ScriptedConversation:
    """Replies chosen by conversation position, not by request count.

    ``replies[n]`` answers a request whose history already holds ``n`` model responses
    (``conversation_position``), so a retried request, a resumed session (history
    re-sent) or an extra request gets the answer that belongs to its place. An entry
    may itself be a list of replies: successive requests at that same position get
    them in order and the last one repeats (``[error_reply(500, ...), text_reply("ok")]``
    answers the first attempt with 500 and the retry with text). Past the end of the
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
        position = conversation_position(request_body)
        if position >= len(self._entries):
            return text_reply(self.FINISHED)
        attempts = self._entries[position]
        with self._lock:
            seen = self._attempts.get(position, 0)
            self._attempts[position] = seen + 1
        return attempts[min(seen, len(attempts) - 1)]


# --------------------------------------------------------------------------- server


def _usage(request_body: dict[str, t.Any], reply: Reply) -> dict[str, t.Any]:
    """A rough, non-zero token count so codex's usage accounting has something to add."""
    tokens_in = max(1, len(json.dumps(request_body.get("input", []))) // 4)
    tokens_out = reply.output_tokens or max(1, sum(len(json.dumps(i)) for i in reply.items) // 4)
    details = {"input_tokens_details": {"cached_tokens": 0}, "output_tokens_details": {"reasoning_tokens": 0}}
    return {"input_tokens": tokens_in, "output_tokens": tokens_out, "total_tokens": tokens_in + tokens_out, **details}


def _chunks(text: str, size: int) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)] or [""]


def _sse_events(reply: Reply, request_body: dict[str, t.Any]) -> t.Iterator[dict[str, t.Any]]:
    response_id = _next_id("resp")
    model = str(request_body.get("model") or "mock-model")
    shell = {"id": response_id, "object": "response", "created_at": int(time.time()), "model": model}
    yield {"type": "response.created", "response": dict(shell, status="in_progress", output=[])}
    for index, item in enumerate(reply.items):
        if item["type"] == "message":
            yield {
                "type": "response.output_item.added",
                "output_index": index,
                "item": dict(item, status="in_progress", content=[]),
            }
            text = item["content"][0]["text"]
            for piece in _chunks(text, 40):
                yield {
                    "type": "response.output_text.delta",
                    "item_id": item["id"],
                    "output_index": index,
                    "content_index": 0,
                    "delta": piece,
                }
        else:
            yield {
                "type": "response.output_item.added",
                "output_index": index,
                "item": dict(item, status="in_progress", arguments=""),
            }
        yield {"type": "response.output_item.done", "output_index": index, "item": item}
    if reply.truncated:
        return
    if reply.failed:
        error = {"code": reply.error_code, "message": reply.error_message or "mock failure"}
        yield {"type": "response.failed", "response": dict(shell, status="failed", error=error, output=[])}
        return
    yield {
        "type": "response.completed",
        "response": dict(shell, status="completed", output=list(reply.items), usage=_usage(request_body, reply)),
    }


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: t.Any) -> None:
        """Quiet: tests read ``api.requests`` instead of the access log."""

    def _drain_body(self) -> bytes:
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

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

    def _send_error(self, reply: Reply) -> None:
        message, kind = reply.error_message or "mock error", reply.error_type or "server_error"
        error = {"message": message, "type": kind, "param": None, "code": reply.error_code}
        self._send_json(reply.status, {"error": error}, reply.headers)

    def do_GET(self) -> None:
        self.server.api._note_probe(self.command, self.path)
        self._drain_body()
        self._send_json(404, {"error": {"message": f"mock: no route for GET {self.path}", "type": "not_found"}})

    def do_POST(self) -> None:
        raw = self._drain_body()
        path = self.path.split("?", 1)[0]
        if not path.endswith("/responses"):
            self.server.api._note_probe(self.command, self.path)
            self._send_json(404, {"error": {"message": f"mock: no route for POST {self.path}", "type": "not_found"}})
            return
        try:
            body = json.loads(raw or b"{}")
        except json.JSONDecodeError as exc:
            self._send_error(error_reply(400, f"mock: body is not JSON: {exc}", error_type="invalid_request_error"))
            return
        reply = self.server.api._answer(body, dict(self.headers.items()), path)
        if reply.stall and reply.stall_after_created:
            self._stream(reply, body)
            return
        if reply.stall:
            self.server.api._stall(reply.stall_seconds)
            self.close_connection = True
            return
        if reply.delay_seconds > 0:
            self.server.api._stall(reply.delay_seconds)
        if reply.is_error:
            self._send_error(reply)
            return
        self._stream(reply, body)

    def _stream(self, reply: Reply, body: dict[str, t.Any]) -> None:
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
            for event in _sse_events(reply, body):
                self.wfile.write(f"event: {event['type']}\ndata: {json.dumps(event)}\n\n".encode())
                self.wfile.flush()
                if reply.stall:  # stall_after_created: hold after the first event
                    self.server.api._stall(reply.stall_seconds)
                    return
        except (BrokenPipeError, ConnectionResetError):
            pass


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    api: MockResponsesAPI


class MockResponsesAPI:
    """A Responses API on 127.0.0.1 (port chosen by the OS), run in a daemon thread.

    ``responder`` is a callable ``(request_body) -> Reply`` or a list of replies (played
    by ``ScriptedConversation``). ``base_url`` ends in ``/v1``: codex appends
    ``/responses``.

    ``requests`` holds every ``POST .../responses`` body in arrival order, each with a
    ``_headers`` dict (lower-case names), ``_path`` and ``_received_at``
    (``time.monotonic()``). Anything else that arrives is listed in ``probes`` as
    ``(method, path)``.
    """

    def __init__(
        self,
        responder: t.Callable[[dict[str, t.Any]], Reply] | t.Sequence[Reply | t.Sequence[Reply]],
    ) -> None:
        if callable(responder):
            self._responder: t.Callable[[dict[str, t.Any]], Reply] = responder
        else:
            self._responder = ScriptedConversation(responder)
        self.requests: list[dict[str, t.Any]] = []
        self.probes: list[tuple[str, str]] = []
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle
    def start(self) -> MockResponsesAPI:
        if self._server is not None:
            return self
        server = _Server(("127.0.0.1", 0), _Handler)
        server.api = self
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.05}, name="mock-responses-api", daemon=True
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
            raise RuntimeError("MockResponsesAPI is not running (use it as a context manager)")
        return int(self._server.server_address[1])

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def wait_for_requests(self, count: int, timeout: float = 10.0) -> bool:
        """Poll until at least ``count`` requests arrived (True) or ``timeout`` passes."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                if len(self.requests) >= count:
                    return True
            time.sleep(0.02)
        with self._lock:
            return len(self.requests) >= count

    # -- called from handler threads
    def _note_probe(self, method: str, path: str) -> None:
        with self._lock:
            self.probes.append((method, path))

    def _answer(self, body: dict[str, t.Any], headers: dict[str, str], path: str) -> Reply:
        record = dict(body)
        record["_headers"] = {k.lower(): v for k, v in headers.items()}
        record["_path"] = path
        record["_received_at"] = time.monotonic()
        with self._lock:
            self.requests.append(record)
        try:
            reply = self._responder(body)
        except Exception as exc:  # noqa: BLE001 - a broken script must show up, not hang the CLI
            return error_reply(400, f"mock responder raised {exc!r}", error_type="invalid_request_error")
        if not isinstance(reply, Reply):
            return error_reply(
                400, f"mock responder returned {type(reply).__name__}, not Reply", error_type="invalid_request_error"
            )
        return reply

    def _stall(self, seconds: float | None) -> None:
        self._closing.wait(timeout=seconds)
