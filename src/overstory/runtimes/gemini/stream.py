"""Parsing Gemini CLI's ``--output-format stream-json`` stdout into ov events, one line at a time.

Pure logic, tested against captured output of the real CLI (tests/fixtures/stream/gemini-*.jsonl).
Facts from tests/fixtures/GEMINI_PROBE_NOTES.md: a turn succeeded only when a ``result`` line
says ``status: "success"`` (exit 0 alone means nothing: killed turns and empty replies exit 0
too); assistant text arrives as deltas, joined here into one ``assistant_text`` per run; API
failures end in ``result`` ``status: "error"`` whose message embeds the API's JSON body; some
failures (bad auth config, unknown session) print nothing and say so only in the exit status.
"""

from __future__ import annotations

import re
import time
import typing as t
from dataclasses import dataclass, field

from overstory.runtimes.base import (
    AUTH,
    PERMANENT,
    RATE_LIMIT,
    RESUME_FAILED,
    TRANSIENT,
    UNKNOWN,
    ParsedEvent,
    TurnFailure,
    TurnParser,
    Usage,
)
from overstory.runtimes.common import (
    TEXT_LIMIT,
    describe_args,
    kind_of_status,
    parse_json_line,
    reset_after,
    retry_seconds,
    trim,
)

_CODE = re.compile(r'"code"\s*:\s*(\d{3})')
_QUOTA = re.compile(r"quota|rate limit|resource.?exhausted|try again later", re.IGNORECASE)
# What the CLI says when the model's reply stayed empty after its own retries, or the stream dropped.
_TRANSIENT_TEXT = re.compile(r"empty response|stream (was )?(interrupted|disconnected|ended)|connection|timed? ?out",
                             re.IGNORECASE)
_AUTH_TEXT = re.compile(r"api.?key.?invalid|api key not valid|unauthenticated|permission.?denied", re.IGNORECASE)
# Exit statuses of failures that print nothing on stdout (measured with 0.61.0).
EXIT_AUTH_CONFIG = 41
EXIT_INPUT = 42         # unknown session to resume, session id in use
EXIT_TURN_LIMIT = 53
EXIT_UNTRUSTED = 55


@dataclass
class GeminiTurnStream(TurnParser):
    session_id: str | None = None
    model: str | None = None
    events_seen: int = 0
    tool_calls: int = 0
    current_tool: str | None = None
    result: dict[str, t.Any] | None = None
    errors: list[str] = field(default_factory=list)
    malformed: int = 0
    exit_code: int | None = None
    stderr_tail: str = ""
    _text: list[str] = field(default_factory=list)
    _started: dict[str, tuple[str, float]] = field(default_factory=dict)

    def feed(self, line: str, *, now: float | None = None) -> list[ParsedEvent]:
        now = time.monotonic() if now is None else now
        event = parse_json_line(line)
        if event is None:
            return []
        if isinstance(event, ParsedEvent):
            self.malformed += 1
            return [event]
        self.events_seen += 1
        kind = event.get("type")
        if kind == "message" and event.get("role") == "assistant":
            self._text.append(str(event.get("content") or ""))
            return []
        parsed = self._flush_text()
        if kind == "init":
            self.session_id = str(event.get("session_id") or "") or self.session_id
            self.model = str(event.get("model") or "") or None
            parsed.append(ParsedEvent("turn_start", summary=f"model {self.model}",
                                      data={"session_id": self.session_id, "model": self.model}))
        elif kind == "message":
            parsed.append(ParsedEvent("user_message", summary=trim(event.get("content"), 200)))
        elif kind == "tool_use":
            name = str(event.get("tool_name"))
            tool_id = str(event.get("tool_id"))
            self.tool_calls += 1
            self.current_tool = name
            self._started[tool_id] = (name, now)
            parameters = event.get("parameters")
            args = describe_args(parameters)
            parsed.append(ParsedEvent("tool_start", tool=name, summary=args,
                                      data={"tool_use_id": tool_id, "input": args},
                                      call_input=parameters if isinstance(parameters, dict) else None))
        elif kind == "tool_result":
            parsed.append(self._tool_result(event, now))
        elif kind == "error":
            message = str(event.get("message") or "")
            if event.get("severity") != "warning":
                self.errors.append(message)
            parsed.append(ParsedEvent("runtime_event", summary=f"{event.get('severity')}: {trim(message, 200)}",
                                      data={"type": "error", "severity": event.get("severity"),
                                            "message": trim(message, TEXT_LIMIT)}))
        elif kind == "result":
            self.result = event
            self.current_tool = None
            ok = event.get("status") == "success"
            error = event.get("error") if isinstance(event.get("error"), dict) else {}
            tokens_in, tokens_out = self._tokens()
            parsed.append(ParsedEvent("turn_result", summary="success" if ok else f"error: {trim(error.get('message'), 200)}",
                                      data={"subtype": event.get("status"), "is_error": not ok,
                                            "result": trim(error.get("message"), TEXT_LIMIT), "error_type": error.get("type"),
                                            "input_tokens": tokens_in, "output_tokens": tokens_out,
                                            "total_cost_usd": 0.0, "model": self.model,
                                            "duration_ms": (event.get("stats") or {}).get("duration_ms")}))
        else:
            parsed.append(ParsedEvent("runtime_event", summary=str(kind), data={"type": kind}))
        return parsed

    def _flush_text(self) -> list[ParsedEvent]:
        if not self._text:
            return []
        text, self._text = "".join(self._text), []
        self.last_text = text
        return [ParsedEvent("assistant_text", summary=trim(text, 200), data={"text": trim(text, TEXT_LIMIT)})]

    def _tool_result(self, event: dict[str, t.Any], now: float) -> ParsedEvent:
        tool_id = str(event.get("tool_id"))
        name, began = self._started.pop(tool_id, (tool_id.split("__", 1)[0], now))
        self.current_tool = None
        is_error = event.get("status") != "success"
        error = event.get("error") if isinstance(event.get("error"), dict) else {}
        output = str(event.get("output") or error.get("message") or "")
        return ParsedEvent("tool_end", tool=name, summary=("error: " if is_error else "") + (trim(output, 200) or ""),
                           data={"tool_use_id": tool_id, "is_error": is_error, "error_type": error.get("type"),
                                 "duration_ms": int((now - began) * 1000), "output": trim(output, TEXT_LIMIT)})

    def _tokens(self) -> tuple[int, int]:
        stats = (self.result or {}).get("stats") or {}
        return int(stats.get("input_tokens") or 0), int(stats.get("output_tokens") or 0)

    # ---- after the turn -----------------------------------------------------

    def finish(self, exit_code: int | None, stderr_tail: str) -> None:
        self.exit_code = exit_code
        self.stderr_tail = stderr_tail

    @property
    def finished(self) -> bool:
        return self.result is not None

    @property
    def succeeded(self) -> bool:
        return self.result is not None and self.result.get("status") == "success"

    def failure(self, *, resumed: bool) -> TurnFailure:
        if self.result is None:
            return self._silent_failure(resumed=resumed)
        error = self.result.get("error") if isinstance(self.result.get("error"), dict) else {}
        message = str(error.get("message") or "; ".join(self.errors) or "the turn ended with an error")
        error_type = str(error.get("type") or "")
        code = _CODE.search(message)
        if code:
            kind = kind_of_status(int(code.group(1)))
            if kind == PERMANENT and _AUTH_TEXT.search(message):
                kind = AUTH  # the real API answers 400 API_KEY_INVALID for a bad key
        elif _QUOTA.search(message):
            kind = RATE_LIMIT
        elif error_type.startswith("Fatal"):
            kind = PERMANENT
        elif _TRANSIENT_TEXT.search(message):
            kind = TRANSIENT  # an empty reply after the CLI's own retries, a dropped stream
        else:
            kind = UNKNOWN  # a blocked reply, anything ov does not recognise: parked, not retried at full price
        reset = reset_after(retry_seconds(message)) if kind == RATE_LIMIT else None
        return TurnFailure(kind, trim(message, 300) or "error", reset)

    def _silent_failure(self, *, resumed: bool) -> TurnFailure:
        said = _last_line(self.stderr_tail)
        code = self.exit_code
        if code == EXIT_AUTH_CONFIG:
            return TurnFailure(AUTH, said or "gemini rejected its auth settings (exit 41)")
        if code == EXIT_INPUT:
            if resumed:
                return TurnFailure(RESUME_FAILED, said or "gemini could not resume the session (exit 42)")
            return TurnFailure(PERMANENT, said or "gemini rejected its input (exit 42)")
        if code in (EXIT_TURN_LIMIT, EXIT_UNTRUSTED):
            return TurnFailure(PERMANENT, said or f"gemini refused to run (exit {code})")
        return TurnFailure(TRANSIENT, "gemini exited without a result (killed or crashed)")

    def usage(self) -> Usage:
        tokens_in, tokens_out = self._tokens()
        return Usage(tokens_in, tokens_out, 0.0)


def _last_line(stderr: str) -> str | None:
    lines = [line.strip() for line in stderr.strip().splitlines() if line.strip()]
    return trim(lines[-1], 300) if lines else None
