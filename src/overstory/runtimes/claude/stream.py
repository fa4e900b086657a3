"""Parsing Claude Code's stream-json stdout into ov events, one line at a time.

Pure logic: no I/O, so it is tested against captured output of the real CLI.
Unknown event types are kept raw; a malformed line is an event, never an error.

One process can print several ``result`` events (2.1.330): a background sub-agent that
finishes starts another turn in the same process for its notification, with a second
``init`` and a ``result`` with ``result_index`` 1. The turn runner reads to EOF, and
``TurnStream`` keeps every result (see ``succeeded`` and ``usage`` for which counts).
"""

from __future__ import annotations

import re
import time
import typing as t
from dataclasses import dataclass, field

from overstory import jsontext
from overstory.runtimes.base import (
    AUTH,
    PERMANENT,
    RATE_LIMIT,
    RESUME_FAILED,
    TRANSIENT,
    UNKNOWN,
    ModelCost,
    ParsedEvent,
    TurnFailure,
    TurnParser,
    Usage,
)
from overstory.runtimes.prices import Tokens

ARG_LIMIT = 300
TEXT_LIMIT = 2000

PERMANENT_PATTERN = re.compile(
    r"authenticat|\b401\b|\b403\b|invalid.?(x-)?api.?key|permission_error|invalid_request|\b400\b|"
    r"prompt is too long|credit balance|not_found_error|model.*not (found|exist)",
    re.IGNORECASE,
)
RESUME_PATTERN = re.compile(r"no conversation found|session.*(not found|does not exist|expired)|unknown session",
                            re.IGNORECASE)
# "Not logged in · Please run /login": no key and no login (measured on 2.1.197; no request is made).
AUTH_PATTERN = re.compile(r"authenticat|\b401\b|invalid.?(x-)?api.?key|not logged in|run /login", re.IGNORECASE)
# The assistant event's ``error`` when the CLI gave up on credentials (401, 403, no login; 2.1.330).
AUTH_ERROR = "authentication_failed"
USAGE_LIMIT = "usage_limit_reached"
COARSE_KIND = {RATE_LIMIT: TRANSIENT, AUTH: PERMANENT}
EXIT_CODE = re.compile(r"^Exit code (-?\d+)")  # how a failed Bash call's result begins


@dataclass
class TurnStream(TurnParser):
    """What one turn's stdout has said so far."""

    stop_after_refusal = True  # measured: a turn killed at a call's announcement leaves no session to resume
    session_id: str | None = None
    events_seen: int = 0
    assistant_blocks: int = 0
    tool_calls: int = 0
    current_tool: str | None = None
    result: dict[str, t.Any] | None = None  # the last result so far
    results: list[dict[str, t.Any]] = field(default_factory=list)
    api_retries: list[dict[str, t.Any]] = field(default_factory=list)
    malformed: int = 0
    model: str | None = None
    rate_limit: dict[str, t.Any] | None = None      # the last rejected rate_limit_info (OAuth logins)
    api_error_event: dict[str, t.Any] | None = None  # the last synthetic assistant event of an API error
    _tool_started: dict[str, tuple[str, float]] = field(default_factory=dict)
    _message_usage: dict[str, tuple[str, Tokens]] = field(default_factory=dict)

    def feed(self, line: str, *, now: float | None = None) -> list[ParsedEvent]:
        now = time.monotonic() if now is None else now
        line = line.strip()
        if not line:
            return []
        try:
            event = jsontext.loads(line)
        except ValueError:
            self.malformed += 1
            return [ParsedEvent("malformed_line", summary=line[:200], data={"line": line[:TEXT_LIMIT]})]
        if not isinstance(event, dict):
            self.malformed += 1
            return [ParsedEvent("malformed_line", summary=line[:200], data={"line": line[:TEXT_LIMIT]})]
        self.events_seen += 1
        if self.session_id is None and isinstance(event.get("session_id"), str):
            self.session_id = event["session_id"]
        kind, subtype = event.get("type"), event.get("subtype")
        if kind == "system" and subtype == "init":
            self.model = self.model or (str(event["model"]) if event.get("model") else None)
            return [ParsedEvent("turn_start", summary=f"model {event.get('model')}",
                                data={k: event.get(k) for k in ("session_id", "model", "cwd", "permissionMode",
                                                                 "claude_code_version")})]
        if kind == "system" and subtype == "api_retry":
            info = {k: event.get(k) for k in ("attempt", "max_retries", "retry_delay_ms", "error_status", "error")}
            self.api_retries.append(info)
            return [ParsedEvent("api_retry", summary=f"attempt {info['attempt']} after {info['error_status']}",
                                data=info)]
        if kind == "rate_limit_event":
            info = event.get("rate_limit_info") if isinstance(event.get("rate_limit_info"), dict) else {}
            if info.get("status") == "rejected":
                self.rate_limit = info
            return [ParsedEvent("rate_limit", summary=f"{info.get('status')} {info.get('rateLimitType') or ''}".strip(),
                                data={k: info.get(k) for k in ("status", "resetsAt", "rateLimitType", "utilization")})]
        if kind == "assistant":
            self._note_assistant(event)
            return self._assistant(event, now)
        if kind == "user":
            return self._tool_results(event, now)
        if kind == "result":
            self.result = event
            self.results.append(event)
            self.current_tool = None
            usage = event.get("usage") or {}
            data = {
                "result_index": event.get("result_index", len(self.results) - 1),
                "subtype": subtype, "is_error": bool(event.get("is_error")),
                "result": _trim(event.get("result"), TEXT_LIMIT), "num_turns": event.get("num_turns"),
                "duration_ms": event.get("duration_ms"), "total_cost_usd": event.get("total_cost_usd") or 0.0,
                "input_tokens": _input_tokens(usage), "output_tokens": int(usage.get("output_tokens") or 0),
                "permission_denials": event.get("permission_denials") or [],
            }
            summary = f"{subtype} ${data['total_cost_usd']:.4f}"
            return [ParsedEvent("turn_result", summary=summary, data=data)]
        return [ParsedEvent("runtime_event", summary=f"{kind}/{subtype}" if subtype else str(kind),
                            data={"type": kind, "subtype": subtype, "raw": _trim(line, TEXT_LIMIT)})]

    def _assistant(self, event: dict[str, t.Any], now: float) -> list[ParsedEvent]:
        parsed = []
        for block in (event.get("message") or {}).get("content") or []:
            if not isinstance(block, dict):
                continue
            self.assistant_blocks += 1
            block_type = block.get("type")
            if block_type == "tool_use":
                name = str(block.get("name"))
                self.tool_calls += 1
                self.current_tool = name
                self._tool_started[str(block.get("id"))] = (name, now)
                args = describe_tool_input(name, block.get("input"))
                parsed.append(ParsedEvent("tool_start", tool=name, summary=args,
                                          data={"tool_use_id": block.get("id"), "input": args}))
            elif block_type == "text":
                text = str(block.get("text") or "")
                self.last_text = text
                parsed.append(ParsedEvent("assistant_text", summary=_trim(text, 200), data={"text": _trim(text, TEXT_LIMIT)}))
            elif block_type == "thinking":
                parsed.append(ParsedEvent("thinking", summary=_trim(block.get("thinking"), 200)))
            else:
                parsed.append(ParsedEvent("runtime_event", summary=f"assistant/{block_type}", data={"block": block}))
        return parsed

    def _tool_results(self, event: dict[str, t.Any], now: float) -> list[ParsedEvent]:
        parsed = []
        content = (event.get("message") or {}).get("content")
        if not isinstance(content, list):
            return [ParsedEvent("user_message", summary=_trim(content, 200))]
        for block in content:
            if not isinstance(block, dict) or block.get("type") != "tool_result":
                continue
            tool_use_id = str(block.get("tool_use_id"))
            name, started = self._tool_started.pop(tool_use_id, (None, now))
            self.current_tool = None
            is_error = bool(block.get("is_error"))
            output = _flatten(block.get("content"))
            data = {"tool_use_id": tool_use_id, "is_error": is_error, "duration_ms": int((now - started) * 1000),
                    "output": _trim(output, TEXT_LIMIT)}
            if name == "Bash":
                data["exit_code"] = _bash_exit_code(output, is_error, event.get("tool_use_result"))
            parsed.append(ParsedEvent(
                "tool_end", tool=name, summary=("error: " if is_error else "") + _trim(output, 200), data=data))
        return parsed

    def _note_assistant(self, event: dict[str, t.Any]) -> None:
        """Usage per API message (the CLI repeats one message's usage on each of its blocks) and API errors."""
        if event.get("is_api_error_message") or event.get("error"):
            self.api_error_event = event
        message = event.get("message") or {}
        usage = message.get("usage")
        if not isinstance(usage, dict):
            return
        tokens = Tokens(int(usage.get("input_tokens") or 0), int(usage.get("output_tokens") or 0),
                        int(usage.get("cache_read_input_tokens") or 0), int(usage.get("cache_creation_input_tokens") or 0))
        if not tokens.total:
            return
        key = str(message.get("id") or f"anonymous-{len(self._message_usage)}")
        model = str(message.get("model") or self.model or "")
        seen = self._message_usage.get(key)
        if seen is not None:
            tokens = Tokens(*(max(a, b) for a, b in zip(seen[1], tokens)))
            if tokens == seen[1]:
                return  # the same message's usage repeated on its next block: nothing new to price
        self._message_usage[key] = (model, tokens)
        self.live_reports += 1

    def final_text(self) -> str:
        """The last result's text (the turn's final answer, untrimmed), else the last assistant text."""
        result = self.result.get("result") if self.result else None
        return result if isinstance(result, str) and result else self.last_text

    def live_usage(self) -> dict[str, Tokens]:
        by_model: dict[str, Tokens] = {}
        for model, tokens in self._message_usage.values():
            by_model[model] = by_model.get(model, Tokens()) + tokens
        return by_model

    def model_costs(self) -> dict[str, ModelCost]:
        """Per model, from the last result's ``modelUsage`` (the turn runner checks it adds up to the cost)."""
        if not self.result or not isinstance(self.result.get("modelUsage"), dict):
            return {}
        found = {}
        for model, entry in self.result["modelUsage"].items():
            if not isinstance(entry, dict):
                continue
            tokens = Tokens(int(entry.get("inputTokens") or 0), int(entry.get("outputTokens") or 0),
                            int(entry.get("cacheReadInputTokens") or 0), int(entry.get("cacheCreationInputTokens") or 0))
            cost = entry.get("costUSD")
            found[str(model)] = ModelCost(tokens, float(cost) if isinstance(cost, (int, float)) else None)
        return found

    def early_failure(self) -> TurnFailure | None:
        """The CLI retries a rejected API key (401) about ten times over three minutes: stop at the first."""
        if self.result is None and self.api_retries and self.api_retries[-1].get("error") == AUTH_ERROR:
            status = self.api_retries[-1].get("error_status")
            return TurnFailure(AUTH, f"the API rejected the credentials ({status or 'no status'} authentication_failed)")
        return None

    def _reset_at_ms(self) -> int | None:
        """When a usage limit ends: the rate_limit_event's ``resetsAt``, or the error event's copy of it."""
        sources = [self.rate_limit]
        if self.api_error_event:
            params = self.api_error_event.get("api_error_params") or {}
            sources.append(params.get("rate_limit_info") if isinstance(params, dict) else None)
        for info in sources:
            if isinstance(info, dict) and isinstance(info.get("resetsAt"), (int, float)):
                return int(info["resetsAt"] * 1000)
        return None

    # ---- after the turn -----------------------------------------------------

    @property
    def finished(self) -> bool:
        return self.result is not None

    @property
    def succeeded(self) -> bool:
        """The LAST result decides (and ``failure`` classifies it).

        A later result is a turn the same process ran after the earlier ones (a background
        sub-agent's notification), so it is the state the session was left in: if the model
        could not act on the notification, the turn is not done. The CLI agrees: it exits 1
        when the last result is an error, even after a successful first one.
        """
        return self.result is not None and not self.result.get("is_error")

    def failure_kind(self, *, resumed: bool) -> str:
        """'resume_failed', 'permanent', 'transient' or 'unknown' (rate limits count as transient, auth as
        permanent)."""
        kind = self.failure(resumed=resumed).kind
        return COARSE_KIND.get(kind, kind)

    def failure(self, *, resumed: bool) -> TurnFailure:
        """Classify a turn that did not succeed (see ``runtimes.base`` for the kinds)."""
        early = self.early_failure()
        if early is not None:
            return early
        kind = self._failure_kind(resumed=resumed)
        return TurnFailure(kind, self.failure_reason(), reset_at_ms=self._reset_at_ms() if kind == RATE_LIMIT else None)

    def _failure_kind(self, *, resumed: bool) -> str:
        if self.result is None:
            return TRANSIENT  # killed or crashed mid-turn: retry with the same mail
        if self.result.get("api_error") == USAGE_LIMIT or (self.rate_limit and self.result.get("api_error_status") == 429):
            return RATE_LIMIT
        if self.api_error_event is not None and self.api_error_event.get("error") == AUTH_ERROR:
            return AUTH
        text = " ".join(str(x) for x in (self.result.get("result"), self.result.get("subtype"),
                                         self.result.get("errors"), self.result.get("error")) if x)
        if resumed and (RESUME_PATTERN.search(text) or (self.assistant_blocks == 0 and not self.api_retries
                                                         and self.result.get("subtype") == "error_during_execution")):
            return RESUME_FAILED
        if str(self.result.get("terminal_reason") or "").startswith("aborted"):
            return TRANSIENT  # interrupted mid-request or mid-tool (aborted_streaming, aborted_tools): go again
        status = self.result.get("api_error_status")
        if status is not None:
            return _kind_of_status(status)
        statuses = [r.get("error_status") for r in self.api_retries if r.get("error_status")]
        if statuses and all(_is_transient_status(s) for s in statuses) and not PERMANENT_PATTERN.search(text):
            return RATE_LIMIT if str(statuses[-1]) == "429" else TRANSIENT
        if AUTH_PATTERN.search(text):
            return AUTH
        if PERMANENT_PATTERN.search(text):
            return PERMANENT
        return UNKNOWN  # an error result ov does not recognise (no API status, no known message)

    def failure_reason(self) -> str:
        if self.result is None:
            return "the runtime exited without a result (killed or crashed)"
        return _trim(str(self.result.get("result") or self.result.get("subtype") or "error"), 300) or "error"

    def usage(self) -> Usage:
        """Tokens summed over the results, cost the largest ``total_cost_usd`` seen.

        Each result's ``usage`` covers only its own turn's main-thread requests, so they add
        up. ``total_cost_usd`` is the process's running total (sub-agents included; every
        result repeats it), so adding would count it twice; the largest is the latest total,
        and an API-error result that reports 0 cannot lower it.
        """
        if not self.results:
            return Usage()
        input_tokens = sum(_input_tokens(r.get("usage") or {}) for r in self.results)
        output_tokens = sum(int((r.get("usage") or {}).get("output_tokens") or 0) for r in self.results)
        cost = max(float(r.get("total_cost_usd") or 0.0) for r in self.results)
        return Usage(input_tokens, output_tokens, cost)


def _kind_of_status(status: t.Any) -> str:
    try:
        code = int(status)
    except (TypeError, ValueError):
        return UNKNOWN
    if code == 429:
        return RATE_LIMIT
    if code in (401, 403):
        return AUTH
    return TRANSIENT if _is_transient_status(code) else PERMANENT


def _is_transient_status(status: t.Any) -> bool:
    try:
        code = int(status)
    except (TypeError, ValueError):
        return True
    return code in (408, 409, 425, 429) or code >= 500


def _input_tokens(usage: dict[str, t.Any]) -> int:
    return sum(int(usage.get(k) or 0) for k in ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens"))


def describe_tool_input(name: str, tool_input: t.Any) -> str:
    """A short, human-readable rendering of a tool call's arguments."""
    if isinstance(tool_input, dict):
        for key in ("command", "file_path", "path", "pattern", "url", "description", "prompt"):
            if key in tool_input:
                return _trim(str(tool_input[key]), ARG_LIMIT)
        return _trim(jsontext.dumps(tool_input, ensure_ascii=False), ARG_LIMIT)
    return _trim(str(tool_input), ARG_LIMIT)


def _bash_exit_code(output: str, is_error: bool, summary: t.Any) -> int | None:
    """A Bash call's exit code as the CLI reports it: a failure's result starts "Exit code N"; a success
    is 0 unless it was interrupted (``tool_use_result.interrupted``, the PostToolUse hook's ``tool_response``)."""
    if is_error:
        match = EXIT_CODE.match(output)
        return int(match.group(1)) if match else None
    return None if isinstance(summary, dict) and summary.get("interrupted") else 0


def _flatten(content: t.Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(str(part.get("text", "")) if isinstance(part, dict) else str(part) for part in content)
    return "" if content is None else str(content)


def _trim(text: t.Any, limit: int) -> str | None:
    if text is None:
        return None
    text = str(text)
    return text if len(text) <= limit else text[: limit - 1] + "…"
