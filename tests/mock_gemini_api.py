"""A local, scripted stand-in for the Gemini API (``generativelanguage``), stdlib only.

The real Gemini CLI reaches it through ``GOOGLE_GEMINI_BASE_URL`` (with the
``gemini-api-key`` auth type selected in settings; see ``tests/gemini_cli.py``).
Only the model's replies are scripted; tools, hooks and sessions are the real program.

    with MockGeminiAPI([call_reply("run_shell_command", {"command": "ls"}), text_reply("done")]) as api:
        run_headless_turn(GEMINI_BIN, "list the files", cwd=repo, env=gemini_env(api.base_url, tmp_path))
        assert "README" in conversation_text(api.main_requests[-1])   # the ls output reached the model

Routes: ``POST /v1beta/models/{model}:streamGenerateContent?alt=sse`` (the agent),
``:generateContent`` (the CLI's utility calls), ``:countTokens``, ``GET /v1beta/models``.

A list of replies is played by conversation position (``ScriptedConversation``: the
number of ``role: "model"`` entries in ``contents``), so retries and resumed sessions do
not shift the script. Side requests (``is_side_request``) never touch the script.
"""

from __future__ import annotations

import itertools
import json
import threading
import time
import typing as t
from dataclasses import dataclass, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

__all__ = [
    "MockGeminiAPI",
    "Reply",
    "ScriptedConversation",
    "call_reply",
    "calls_reply",
    "conversation_text",
    "default_side_reply",
    "delayed",
    "error_reply",
    "function_responses",
    "is_side_request",
    "model_turns",
    "quota_error_reply",
    "stalled_reply",
    "text_reply",
    "with_headers",
]

_ids = itertools.count(1)

# Google's canonical status names for the HTTP codes a test is likely to script.
_STATUS_NAMES = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    429: "RESOURCE_EXHAUSTED",
    500: "INTERNAL",
    503: "UNAVAILABLE",
}


@dataclass(frozen=True)
class Reply:
    """One scripted answer to one request.

    ``parts`` are Gemini ``Content.parts`` (``{"text": ...}``, ``{"functionCall": ...}``).
    A reply with ``status`` other than 200 is sent as a Google JSON error
    ``{"error": {"code", "message", "status", "details"}}``. A ``stall`` reply holds the
    connection ``stall_seconds`` (None: until the server closes) and then drops it; with
    ``stall_after_parts`` set, the response headers and that many streamed chunks go out
    first (a stream that hangs midway). ``headers`` are extra response headers;
    ``delay_seconds`` waits before answering normally.
    """

    parts: tuple[dict[str, t.Any], ...] = ()
    finish_reason: str = "STOP"
    status: int = 200
    error_message: str | None = None
    error_status: str | None = None
    error_details: tuple[dict[str, t.Any], ...] = ()
    stall: bool = False
    stall_seconds: float | None = None
    stall_after_parts: int | None = None
    headers: tuple[tuple[str, str], ...] = ()
    prompt_tokens: int | None = None
    output_tokens: int | None = None
    delay_seconds: float = 0.0

    @property
    def is_error(self) -> bool:
        return self.status != 200


def text_reply(text: str) -> Reply:
    """A plain model answer that ends the turn (``finishReason: STOP``)."""
    return Reply(parts=({"text": text},))


def calls_reply(
    calls: t.Iterable[tuple[str, dict[str, t.Any]] | tuple[str, dict[str, t.Any], str]],
    *,
    text: str | None = None,
) -> Reply:
    """Several ``functionCall`` parts in one model message: ``[(name, args[, call_id]), ...]``.

    Gemini ends a function-calling turn with ``finishReason: STOP`` too; the CLI runs the
    tools because the parts hold calls, not because of the finish reason.
    """
    parts: list[dict[str, t.Any]] = []
    if text is not None:
        parts.append({"text": text})
    for call in calls:
        name, args = call[0], call[1]
        call_id = call[2] if len(call) > 2 else f"call_mock{next(_ids):06d}"  # type: ignore[misc]
        parts.append({"functionCall": {"id": call_id, "name": name, "args": dict(args)}})
    return Reply(parts=tuple(parts))


def call_reply(name: str, args: dict[str, t.Any], *, text: str | None = None, call_id: str | None = None) -> Reply:
    """One function call, optionally preceded by a text part."""
    call = (name, args, call_id) if call_id else (name, args)
    return calls_reply([call], text=text)


def error_reply(
    status: int,
    message: str = "mock error",
    *,
    error_status: str | None = None,
    details: t.Iterable[dict[str, t.Any]] = (),
) -> Reply:
    """An HTTP error in Google's shape; ``error_status`` defaults to the canonical name."""
    return Reply(
        status=status,
        error_message=message,
        error_status=error_status or _STATUS_NAMES.get(status, "UNKNOWN"),
        error_details=tuple(details),
    )


def quota_error_reply(
    retry_delay: str | None = "2s", message: str = "Resource has been exhausted (mock quota)."
) -> Reply:
    """A 429 as the Gemini API sends it for quota, with a ``google.rpc.RetryInfo`` detail
    (``retry_delay`` like ``"2s"``; None leaves RetryInfo out) and a ``QuotaFailure``."""
    details: list[dict[str, t.Any]] = [
        {
            "@type": "type.googleapis.com/google.rpc.QuotaFailure",
            "violations": [
                {
                    "quotaMetric": "generativelanguage.googleapis.com/generate_content_free_tier_requests",
                    "quotaId": "GenerateRequestsPerMinutePerProjectPerModel-FreeTier",
                }
            ],
        }
    ]
    if retry_delay is not None:
        details.append({"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": retry_delay})
    return error_reply(429, message, details=details)


def stalled_reply(seconds: float | None = None, *, after_parts: int | None = None) -> Reply:
    """Hold the connection for ``seconds`` (None: until the server closes), then drop it.

    Without ``after_parts`` nothing at all is sent, not even headers (a hung upstream).
    With ``after_parts=N`` the 200 headers and N text chunks are streamed first.
    """
    parts: tuple[dict[str, t.Any], ...] = ()
    if after_parts:
        parts = tuple({"text": f"partial {i} "} for i in range(after_parts))
    return Reply(parts=parts, stall=True, stall_seconds=seconds, stall_after_parts=after_parts)


def delayed(reply: Reply, seconds: float) -> Reply:
    """The same reply, sent only after ``seconds`` (released early when the server closes)."""
    return replace(reply, delay_seconds=seconds)


def with_headers(reply: Reply, **headers: str) -> Reply:
    """The same reply with extra response headers (``retry_after="2"`` -> ``retry-after: 2``)."""
    extra = tuple((name.replace("_", "-"), value) for name, value in headers.items())
    return replace(reply, headers=reply.headers + extra)


# --------------------------------------------------------------------------- requests


def _part_text(part: dict[str, t.Any]) -> list[str]:
    if "text" in part and not part.get("thought"):
        return [str(part["text"])]
    if "functionCall" in part:
        call = part["functionCall"] or {}
        return [f"{call.get('name')} {json.dumps(call.get('args', {}), sort_keys=True)}"]
    if "functionResponse" in part:
        response = (part["functionResponse"] or {}).get("response", {})
        return [json.dumps(response, sort_keys=True) if not isinstance(response, str) else response]
    return []


def conversation_text(request_body: dict[str, t.Any]) -> str:
    """All text the model would see in ``contents``: text, call arguments and function responses."""
    parts: list[str] = []
    for content in request_body.get("contents", []) or []:
        for part in content.get("parts", []) or []:
            if isinstance(part, dict):
                parts.extend(_part_text(part))
    return "\n".join(parts)


def function_responses(request_body: dict[str, t.Any]) -> list[dict[str, t.Any]]:
    """Every ``functionResponse`` object in ``contents`` (``{"id", "name", "response"}``), in order."""
    found: list[dict[str, t.Any]] = []
    for content in request_body.get("contents", []) or []:
        for part in content.get("parts", []) or []:
            if isinstance(part, dict) and "functionResponse" in part:
                found.append(part["functionResponse"])
    return found


def _system_text(request_body: dict[str, t.Any]) -> str:
    system = request_body.get("systemInstruction") or {}
    if isinstance(system, str):
        return system
    return "\n".join(str(p.get("text", "")) for p in system.get("parts", []) or [] if isinstance(p, dict))


def is_side_request(request_body: dict[str, t.Any], *, streaming: bool = True) -> bool:
    """True for requests that are not the main agent's conversation.

    Measured with Gemini CLI 0.61.0 (tests/fixtures/GEMINI_PROBE_NOTES.md): the agent
    always calls ``streamGenerateContent`` with ``tools``; the CLI's utility calls
    (the ``auto`` model router's classifier, the next-speaker check, summaries) use the
    non-streaming ``generateContent`` and offer no tools.
    """
    return not streaming or not request_body.get("tools")


def model_turns(request_body: dict[str, t.Any]) -> int:
    """How many model messages the conversation already holds (its script position)."""
    return sum(1 for c in request_body.get("contents", []) or [] if c.get("role") == "model")


class ScriptedConversation:
    """Replies chosen by conversation position, not by request count.

    ``replies[n]`` answers a request whose ``contents`` already hold ``n`` model
    messages, so a retried request, a resumed session (history re-sent) or an extra
    request gets the answer that belongs to its place in the conversation. An entry may
    itself be a list of replies: successive requests at that same position get them in
    order and the last one repeats (``[error_reply(503), text_reply("ok")]`` answers the
    first attempt with 503 and the retry with text). Past the end of the script the
    answer is ``text_reply("(script finished)")``.
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
        position = model_turns(request_body)
        if position >= len(self._entries):
            return text_reply(self.FINISHED)
        attempts = self._entries[position]
        with self._lock:
            seen = self._attempts.get(position, 0)
            self._attempts[position] = seen + 1
        return attempts[min(seen, len(attempts) - 1)]


def default_side_reply(request_body: dict[str, t.Any]) -> Reply:
    """A harmless answer to a utility request.

    The router's classifier asks for ``{complexity_reasoning, complexity_score}`` (a low
    score keeps the flash model), the next-speaker check for ``{reasoning, next_speaker}``
    ("user": the turn is over). Any other JSON request gets ``{}``; plain text gets a line.
    """
    config = request_body.get("generationConfig") or {}
    schema = config.get("responseJsonSchema") or config.get("responseSchema") or {}
    props = set((schema.get("properties") or {}).keys())
    system = _system_text(request_body)
    if "complexity_score" in props or "complexity_score" in system:
        return text_reply(json.dumps({"complexity_reasoning": "mock: simple", "complexity_score": 10}))
    if "next_speaker" in props:
        return text_reply(json.dumps({"reasoning": "mock: the turn is complete", "next_speaker": "user"}))
    if config.get("responseMimeType") == "application/json" or schema:
        return text_reply("{}")
    return text_reply("(mock side reply)")


# --------------------------------------------------------------------------- server


def _estimate_tokens(request_body: dict[str, t.Any]) -> int:
    """A rough, non-zero prompt token count so the CLI's accounting has something to add."""
    size = len(json.dumps(request_body.get("contents", []))) + len(_system_text(request_body))
    return max(1, size // 4)


def _chunks(text: str, size: int) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)] or [""]


def _response_chunks(reply: Reply, model: str, prompt_tokens: int) -> list[dict[str, t.Any]]:
    """The reply as streamed ``GenerateContentResponse`` chunks: text split into pieces,
    each function call whole, usage and finish reason on the last chunk."""
    pieces: list[dict[str, t.Any]] = []
    for part in reply.parts:
        if "text" in part and len(part) == 1:
            pieces.extend({"text": piece} for piece in _chunks(str(part["text"]), 40))
        else:
            pieces.append(dict(part))
    if not pieces:
        pieces.append({"text": ""})
    output_tokens = reply.output_tokens
    if output_tokens is None:
        output_tokens = max(1, sum(len(json.dumps(p)) for p in reply.parts) // 4)
    prompt = reply.prompt_tokens if reply.prompt_tokens is not None else prompt_tokens
    response_id = f"resp_mock{next(_ids):06d}"
    chunks: list[dict[str, t.Any]] = []
    for index, piece in enumerate(pieces):
        candidate: dict[str, t.Any] = {"content": {"role": "model", "parts": [piece]}, "index": 0}
        chunk: dict[str, t.Any] = {"candidates": [candidate], "modelVersion": model, "responseId": response_id}
        if index == len(pieces) - 1:
            candidate["finishReason"] = reply.finish_reason
            chunk["usageMetadata"] = {
                "promptTokenCount": prompt,
                "candidatesTokenCount": output_tokens,
                "totalTokenCount": prompt + output_tokens,
            }
        chunks.append(chunk)
    return chunks


def _merged_response(reply: Reply, chunks: list[dict[str, t.Any]]) -> dict[str, t.Any]:
    """The non-streaming form: the reply's parts whole, in one candidate."""
    candidate = {
        "content": {"role": "model", "parts": [dict(p) for p in reply.parts]},
        "index": 0,
        "finishReason": reply.finish_reason,
    }
    return {**{k: v for k, v in chunks[-1].items() if k != "candidates"}, "candidates": [candidate]}


def _split_path(path: str) -> tuple[str, str, str]:
    """``/v1beta/models/gemini-2.5-flash:streamGenerateContent?alt=sse`` ->
    (``gemini-2.5-flash``, ``streamGenerateContent``, ``alt=sse``)."""
    route, _, query = path.partition("?")
    tail = route.rsplit("/models/", 1)[-1] if "/models/" in route else ""
    model, _, method = tail.partition(":")
    return model, method, query


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: t.Any) -> None:
        """Quiet: tests read ``api.requests`` instead of the access log."""

    def _send_json(self, status: int, body: t.Any, extra: t.Iterable[tuple[str, str]] = ()) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json; charset=UTF-8")
        self.send_header("Content-Length", str(len(data)))
        for name, value in extra:
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)

    def _send_error(self, reply: Reply) -> None:
        error = {
            "code": reply.status,
            "message": reply.error_message or "mock error",
            "status": reply.error_status or _STATUS_NAMES.get(reply.status, "UNKNOWN"),
        }
        if reply.error_details:
            error["details"] = [dict(d) for d in reply.error_details]
        self._send_json(reply.status, {"error": error}, reply.headers)

    def _drain_body(self) -> bytes:
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def do_GET(self) -> None:
        self.server.api._note_probe(self.command, self.path)
        route = self.path.split("?", 1)[0].rstrip("/")
        if route.endswith("/models"):  # 0.61.0 never asks; here for SDK users
            names = ("gemini-2.5-flash", "gemini-2.5-pro")
            self._send_json(200, {"models": [{"name": f"models/{n}", "displayName": n} for n in names]})
            return
        self._send_error(error_reply(404, f"mock: no route for GET {self.path}"))

    def do_POST(self) -> None:
        raw = self._drain_body()
        model, method, query = _split_path(self.path)
        if method not in ("streamGenerateContent", "generateContent", "countTokens"):
            self.server.api._note_probe(self.command, self.path)
            self._send_error(error_reply(404, f"mock: no route for POST {self.path}"))
            return
        try:
            body = json.loads(raw or b"{}")
        except json.JSONDecodeError as exc:
            self._send_error(error_reply(400, f"mock: body is not JSON: {exc}"))
            return
        if method == "countTokens":
            self.server.api._note_probe(self.command, self.path)
            self._send_json(200, {"totalTokens": _estimate_tokens(body)})
            return
        streaming = method == "streamGenerateContent"
        reply = self.server.api._answer(
            body, dict(self.headers.items()), model=model, streaming=streaming, path=self.path
        )
        if reply.stall and not reply.stall_after_parts:
            self.server.api._stall(reply.stall_seconds)
            self.close_connection = True
            return
        if reply.delay_seconds > 0:
            self.server.api._stall(reply.delay_seconds)
        if reply.is_error:
            self._send_error(reply)
            return
        chunks = _response_chunks(reply, model or "gemini-mock", _estimate_tokens(body))
        if streaming and "alt=sse" in query:
            self._stream(chunks, reply)
        elif streaming:  # without alt=sse the API answers with a JSON array of chunks
            self._send_json(200, chunks, reply.headers)
        else:
            self._send_json(200, _merged_response(reply, chunks), reply.headers)

    def _stream(self, chunks: list[dict[str, t.Any]], reply: Reply) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")
        for name, value in reply.headers:
            self.send_header(name, value)
        self.end_headers()
        self.close_connection = True
        try:
            for index, chunk in enumerate(chunks):
                if reply.stall and reply.stall_after_parts is not None and index >= reply.stall_after_parts:
                    break
                chunk_out = chunk
                if reply.stall:  # a stream cut midway never carries usage or a finish reason
                    chunk_out = {k: v for k, v in chunk.items() if k != "usageMetadata"}
                    chunk_out["candidates"] = [{k: v for k, v in chunk["candidates"][0].items() if k != "finishReason"}]
                self.wfile.write(f"data: {json.dumps(chunk_out)}\r\n\r\n".encode())
                self.wfile.flush()
            if reply.stall:
                self.server.api._stall(reply.stall_seconds)
        except (BrokenPipeError, ConnectionResetError):
            pass


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    api: MockGeminiAPI


@dataclass
class _Probe:
    method: str
    path: str


class MockGeminiAPI:
    """A Gemini API on 127.0.0.1 (port chosen by the OS), run in a daemon thread.

    ``responder`` is a callable ``(request_body) -> Reply`` or a list of replies (played
    by ``ScriptedConversation``). Side requests (``is_side_request``) go to
    ``side_responder`` or get ``default_side_reply`` and never reach ``responder``.

    ``requests`` holds every generateContent / streamGenerateContent body in arrival
    order, each with ``_headers`` (lower-case names), ``_path``, ``_model``,
    ``_streaming``, ``_side`` and ``_time`` (monotonic seconds); ``main_requests`` /
    ``side_requests`` split them. Other calls (countTokens, GETs, unknown routes) are
    listed in ``probes``.
    """

    def __init__(
        self,
        responder: t.Callable[[dict[str, t.Any]], Reply] | t.Sequence[Reply | t.Sequence[Reply]],
        *,
        side_responder: t.Callable[[dict[str, t.Any]], Reply] | None = None,
    ) -> None:
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
    def start(self) -> t.Self:
        if self._server is not None:
            return self
        server = _Server(("127.0.0.1", 0), _Handler)
        server.api = self
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.05}, name="mock-gemini-api", daemon=True
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
            raise RuntimeError("MockGeminiAPI is not running (use it as a context manager)")
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

    def _answer(
        self, body: dict[str, t.Any], headers: dict[str, str], *, model: str, streaming: bool, path: str
    ) -> Reply:
        side = is_side_request(body, streaming=streaming)
        record = dict(body)
        record["_headers"] = {k.lower(): v for k, v in headers.items()}
        record["_path"] = path
        record["_model"] = model
        record["_streaming"] = streaming
        record["_side"] = side
        record["_time"] = time.monotonic()
        with self._lock:
            self.requests.append(record)
        try:
            reply = (self._side_responder if side else self._responder)(body)
        except Exception as exc:  # noqa: BLE001 - a broken script must show up, not hang the CLI
            return error_reply(400, f"mock responder raised {exc!r}")
        if not isinstance(reply, Reply):
            return error_reply(400, f"mock responder returned {type(reply).__name__}, not Reply")
        return reply

    def _stall(self, seconds: float | None) -> None:
        self._closing.wait(timeout=seconds)
