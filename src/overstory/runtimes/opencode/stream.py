"""Parsing ``opencode run --format json`` stdout into ov events, one line at a time.

Pure logic, tested against captured output of the real CLI (tests/fixtures/stream/opencode-*.jsonl).
Facts from tests/fixtures/OPENCODE_PROBE_NOTES.md: every line carries ``sessionID`` and there
is no start or result event; a turn is a run of steps, each ending in ``step_finish`` (with
its tokens and cost: the turn's live usage, priced as each step ends), and the last one's
``reason`` is not ``tool-calls``; tool calls are
printed once, finished; an API failure after opencode's own retries is one ``error`` line;
an unknown session to resume prints nothing and says ``Session not found`` on stderr.
"""

from __future__ import annotations

import re
import time
import typing as t
from dataclasses import dataclass, field

from overstory.runtimes.base import (
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
from overstory.runtimes.prices import Tokens

_ENDED = ("stop", "length")  # a final step's reasons that mean the model finished its answer
_SESSION_GONE = re.compile(r"session not found", re.IGNORECASE)
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


@dataclass
class OpenCodeTurnStream(TurnParser):
    session_id: str | None = None
    model: str | None = None
    events_seen: int = 0
    tool_calls: int = 0
    current_tool: str | None = None
    steps: int = 0
    final_reason: str | None = None
    error: dict[str, t.Any] | None = None
    input_tokens: int = 0
    output_tokens: int = 0
    cost: float = 0.0
    malformed: int = 0
    exit_code: int | None = None
    stderr_tail: str = ""
    _announced: bool = field(default=False)
    _live_tokens: Tokens = field(default=Tokens())  # steps that reported no cost: ov prices their tokens
    _live_cost: float = 0.0                         # steps that reported their cost (a model with a price)

    def feed(self, line: str, *, now: float | None = None) -> list[ParsedEvent]:
        now = time.monotonic() if now is None else now
        event = parse_json_line(line)
        if event is None:
            return []
        if isinstance(event, ParsedEvent):
            self.malformed += 1
            return [event]
        self.events_seen += 1
        parsed: list[ParsedEvent] = []
        if not self._announced and isinstance(event.get("sessionID"), str):
            self._announced = True
            self.session_id = event["sessionID"]
            parsed.append(ParsedEvent("turn_start", summary=f"session {self.session_id}",
                                      data={"session_id": self.session_id}))
        kind = event.get("type")
        part = event.get("part") if isinstance(event.get("part"), dict) else {}
        if kind == "step_start":
            self.steps += 1
            self.final_reason = None
            parsed.append(ParsedEvent("runtime_event", summary=f"step {self.steps}", data={"type": kind}))
        elif kind == "text":
            text = self.last_text = str(part.get("text") or "")
            parsed.append(ParsedEvent("assistant_text", summary=trim(text, 200), data={"text": trim(text, TEXT_LIMIT)}))
        elif kind == "reasoning":
            parsed.append(ParsedEvent("thinking", summary=trim(part.get("text"), 200)))
        elif kind == "tool_use":
            parsed += self._tool(part)
        elif kind == "step_finish":
            parsed += self._step_finish(part)
        elif kind == "error":
            error = event.get("error") if isinstance(event.get("error"), dict) else {}
            self.error = error
            data = error.get("data") if isinstance(error.get("data"), dict) else {}
            message = str(data.get("message") or error.get("name") or "error")
            parsed.append(ParsedEvent("turn_result", summary=f"error: {trim(message, 200)}", data={
                "subtype": "error", "is_error": True, "result": trim(message, TEXT_LIMIT),
                "status_code": data.get("statusCode"), "retryable": data.get("isRetryable"),
                "input_tokens": self.input_tokens, "output_tokens": self.output_tokens,
                "total_cost_usd": self.cost}))
        else:
            parsed.append(ParsedEvent("runtime_event", summary=str(kind), data={"type": kind}))
        return parsed

    def _tool(self, part: dict[str, t.Any]) -> list[ParsedEvent]:
        """opencode prints a tool call once, when it has finished: a start and an end for ov."""
        name = str(part.get("tool"))
        state = part.get("state") if isinstance(part.get("state"), dict) else {}
        call_id = str(part.get("callID"))
        args = describe_args(state.get("input"))
        self.tool_calls += 1
        timing = state.get("time") if isinstance(state.get("time"), dict) else {}
        duration = int(timing["end"] - timing["start"]) if {"start", "end"} <= set(timing) else None
        metadata = state.get("metadata") if isinstance(state.get("metadata"), dict) else {}
        is_error = state.get("status") == "error" or metadata.get("exit") not in (None, 0)
        output = str(state.get("output") if state.get("status") != "error" else state.get("error") or "")
        return [
            ParsedEvent("tool_start", tool=name, summary=args, data={"tool_use_id": call_id, "input": args}),
            ParsedEvent("tool_end", tool=name, summary=("error: " if is_error else "") + (trim(output, 200) or ""),
                        data={"tool_use_id": call_id, "is_error": is_error, "exit_code": metadata.get("exit"),
                              "duration_ms": duration, "output": trim(output, TEXT_LIMIT)}),
        ]

    def _step_finish(self, part: dict[str, t.Any]) -> list[ParsedEvent]:
        tokens = part.get("tokens") if isinstance(part.get("tokens"), dict) else {}
        cache = tokens.get("cache") if isinstance(tokens.get("cache"), dict) else {}
        # opencode reports input without the cached part, and reasoning apart from output.
        step = Tokens(int(tokens.get("input") or 0), int(tokens.get("output") or 0) + int(tokens.get("reasoning") or 0),
                      int(cache.get("read") or 0), int(cache.get("write") or 0))
        cost = float(part.get("cost") or 0.0)
        self.input_tokens += step.input + step.cache_read + step.cache_write
        self.output_tokens += step.output
        self.cost += cost
        if cost > 0:
            self._live_cost += cost
        else:
            self._live_tokens += step
        self.live_reports += 1
        reason = str(part.get("reason") or "")
        self.final_reason = reason
        if reason == "tool-calls":
            return [ParsedEvent("runtime_event", summary="step finished: tool calls", data={"type": "step_finish"})]
        ok = reason in _ENDED
        return [ParsedEvent("turn_result", summary=reason if ok else f"ended: {reason}", data={
            "subtype": "success" if ok else reason, "is_error": not ok, "num_turns": self.steps,
            "input_tokens": self.input_tokens, "output_tokens": self.output_tokens, "total_cost_usd": self.cost})]

    # ---- after the turn -----------------------------------------------------

    def finish(self, exit_code: int | None, stderr_tail: str) -> None:
        self.exit_code = exit_code
        self.stderr_tail = _ANSI.sub("", stderr_tail)

    @property
    def finished(self) -> bool:
        return self.error is not None or (self.final_reason is not None and self.final_reason != "tool-calls")

    @property
    def succeeded(self) -> bool:
        return self.error is None and self.final_reason in _ENDED and self.exit_code in (None, 0)

    def failure(self, *, resumed: bool) -> TurnFailure:
        if self.error is None:
            if resumed and _SESSION_GONE.search(self.stderr_tail):
                return TurnFailure(RESUME_FAILED, "opencode could not find the session to resume")
            if self.exit_code not in (None, 0) and self.exit_code > 0 and not self.events_seen:
                line = _last_line(self.stderr_tail) or f"opencode exited {self.exit_code} before starting the turn"
                return TurnFailure(PERMANENT, line)
            if self.final_reason is not None and self.final_reason not in _ENDED + ("tool-calls",):
                # content-filter, error, other...: the same request would end the same way
                return TurnFailure(UNKNOWN, f"the model's answer ended with {self.final_reason!r}")
            return TurnFailure(TRANSIENT, "opencode exited without finishing the turn (killed or crashed)")
        data = self.error.get("data") if isinstance(self.error.get("data"), dict) else {}
        message = str(data.get("message") or self.error.get("name") or "error")
        status = data.get("statusCode")
        if isinstance(status, int):
            kind = kind_of_status(status)
        elif data.get("isRetryable"):
            kind = TRANSIENT
        else:  # an APIError opencode will not retry, or an error ov does not recognise
            kind = PERMANENT if self.error.get("name") == "APIError" else UNKNOWN
        reset = None
        if kind == RATE_LIMIT:
            headers = data.get("responseHeaders") if isinstance(data.get("responseHeaders"), dict) else {}
            seconds = retry_seconds(" ".join(f"{k}: {v}" for k, v in headers.items()) + " " + message)
            reset = reset_after(seconds)
        return TurnFailure(kind, trim(message, 300) or "error", reset)

    def usage(self) -> Usage:
        return Usage(self.input_tokens, self.output_tokens, self.cost)

    def live_usage(self) -> dict[str, Tokens]:
        """The tokens of the steps so far that reported no cost; the stream does not name the model ('')."""
        return {"": self._live_tokens} if self._live_tokens.total else {}

    def live_cost_usd(self) -> float:
        return self._live_cost


def _last_line(stderr: str) -> str | None:
    lines = [line.strip() for line in stderr.strip().splitlines() if line.strip()]
    return trim(lines[-1], 300) if lines else None
