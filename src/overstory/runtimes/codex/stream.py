"""Parsing ``codex exec --json`` stdout into ov events, one line at a time.

Pure logic, tested against captured output of the real CLI (tests/fixtures/stream/codex-*.jsonl).
Shapes and outcomes are measured in tests/fixtures/CODEX_PROBE_NOTES.md: a turn succeeded only
when ``turn.completed`` arrived; ``turn.failed`` carries the one error message; ``error`` items
are non-fatal notices; a resume of an unknown session prints nothing and says so on stderr.
"""

from __future__ import annotations

import re
import shlex
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
from overstory.runtimes.common import TEXT_LIMIT, kind_of_status, parse_json_line, reset_after, retry_seconds, trim
from overstory.runtimes.prices import Tokens

# An item type -> the tool name ov records for it.
TOOL_ITEMS = {"command_execution": "shell", "file_change": "apply_patch", "web_search": "web_search"}
_STATUS = re.compile(r"(?:unexpected status|last status:)\s*(\d{3})", re.IGNORECASE)
_RESUME_GONE = re.compile(r"no rollout found|thread/resume failed|thread not found", re.IGNORECASE)
_PERMANENT_TEXT = re.compile(r"context window|quota exceeded|insufficient_quota|billing|"
                             r"error loading config|unknown model|model .*(not found|does not exist)", re.IGNORECASE)
_TRANSIENT_TEXT = re.compile(r"stream disconnected|idle timeout|high demand|reconnecting|timed out|connection",
                             re.IGNORECASE)


def shell_command(command: t.Any) -> str:
    """``/bin/bash -c '<cmd>'`` (how codex reports a command) -> ``<cmd>``."""
    text = str(command or "")
    try:
        words = shlex.split(text)
    except ValueError:
        return text
    if len(words) == 3 and words[0].rsplit("/", 1)[-1] in ("bash", "sh", "zsh") and words[1] in ("-c", "-lc"):
        return words[2]
    return text


def _item_tool(item: dict[str, t.Any]) -> str | None:
    kind = item.get("type")
    if kind == "mcp_tool_call":
        return f"{item.get('server')}.{item.get('tool')}"
    return TOOL_ITEMS.get(str(kind))


def _item_summary(item: dict[str, t.Any]) -> str:
    kind = item.get("type")
    if kind == "command_execution":
        return trim(shell_command(item.get("command")), 300) or ""
    if kind == "file_change":
        changes = item.get("changes") or []
        return trim(", ".join(f"{c.get('kind')} {c.get('path')}" for c in changes if isinstance(c, dict)), 300) or ""
    if kind == "web_search":
        return trim(item.get("query"), 300) or ""
    return trim(item.get("arguments") or "", 300) or ""


@dataclass
class CodexTurnStream(TurnParser):
    session_id: str | None = None
    model: str | None = None
    events_seen: int = 0
    tool_calls: int = 0
    current_tool: str | None = None
    completed: dict[str, t.Any] | None = None
    failed_message: str | None = None
    errors: list[str] = field(default_factory=list)
    retries: int = 0
    malformed: int = 0
    exit_code: int | None = None
    stderr_tail: str = ""
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
        if kind == "thread.started":
            self.session_id = str(event.get("thread_id") or "") or self.session_id
            return [ParsedEvent("turn_start", summary=f"thread {self.session_id}", data={"session_id": self.session_id})]
        if kind in ("item.started", "item.completed") and isinstance(event.get("item"), dict):
            return self._item(event["item"], started=kind == "item.started", now=now)
        if kind == "error":
            return [self._error(str(event.get("message") or ""))]
        if kind == "turn.completed":
            self.completed = event
            self.current_tool = None
            self.live_reports += 1  # the turn's only bill: priced with its cached part (``live_usage``)
            tokens_in, tokens_out = self._tokens()
            return [ParsedEvent("turn_result", summary="success", data={
                "subtype": "success", "is_error": False, "input_tokens": tokens_in, "output_tokens": tokens_out,
                "total_cost_usd": 0.0, "usage": event.get("usage") or {}})]
        if kind == "turn.failed":
            error = event.get("error") or {}
            self.failed_message = str(error.get("message") if isinstance(error, dict) else error)
            self.current_tool = None
            return [ParsedEvent("turn_result", summary=f"failed: {trim(self.failed_message, 200)}", data={
                "subtype": "failed", "is_error": True, "result": trim(self.failed_message, TEXT_LIMIT),
                "input_tokens": 0, "output_tokens": 0, "total_cost_usd": 0.0})]
        return [ParsedEvent("runtime_event", summary=str(kind), data={"type": kind})]

    def _item(self, item: dict[str, t.Any], *, started: bool, now: float) -> list[ParsedEvent]:
        kind = item.get("type")
        item_id = str(item.get("id"))
        tool = _item_tool(item)
        if tool is not None:
            summary = _item_summary(item)
            if started:
                self.tool_calls += 1
                self.current_tool = tool
                self._started[item_id] = (tool, now)
                # A command as the model sent it (and the hook saw it), without the `/bin/bash -lc '...'`.
                command: dict[str, t.Any] | None = ({"command": shell_command(item.get("command"))}
                                                    if kind == "command_execution" else None)
                if kind == "file_change":  # an apply_patch: its files, for the receipt of the hook's row (ledger)
                    command = {"paths": [str(c.get("path")) for c in item.get("changes") or [] if isinstance(c, dict)]}
                return [ParsedEvent("tool_start", tool=tool, summary=summary, data={"tool_use_id": item_id,
                                                                                      "input": summary},
                                    call_input=command)]
            opened = self._started.pop(item_id, None)
            if opened is None:  # a completed item codex never announced (e.g. file_change is usually both)
                self.tool_calls += 1
            name, began = opened or (tool, now)
            self.current_tool = None
            is_error = item.get("status") == "failed" or (item.get("exit_code") not in (None, 0))
            output = str(item.get("aggregated_output") or item.get("result") or "")
            return [ParsedEvent("tool_end", tool=name, summary=("error: " if is_error else "") + (trim(output, 200) or ""),
                                data={"tool_use_id": item_id, "is_error": is_error, "exit_code": item.get("exit_code"),
                                      "duration_ms": int((now - began) * 1000), "output": trim(output, TEXT_LIMIT)})]
        if started:
            return [ParsedEvent("runtime_event", summary=f"item.started/{kind}", data={"item_type": kind})]
        if kind == "agent_message":
            text = self.last_text = str(item.get("text") or "")
            return [ParsedEvent("assistant_text", summary=trim(text, 200), data={"text": trim(text, TEXT_LIMIT)})]
        if kind == "reasoning":
            return [ParsedEvent("thinking", summary=trim(item.get("text"), 200))]
        if kind == "error":
            return [self._error(str(item.get("message") or ""), notice=True)]
        return [ParsedEvent("runtime_event", summary=f"item/{kind}", data={"item_type": kind})]

    def _error(self, message: str, *, notice: bool = False) -> ParsedEvent:
        if message.startswith("Reconnecting"):
            self.retries += 1
            status = _STATUS.search(message)
            return ParsedEvent("api_retry", summary=trim(message, 200),
                               data={"attempt": self.retries, "error_status": int(status.group(1)) if status else None,
                                     "error": trim(message, TEXT_LIMIT)})
        if not notice:
            self.errors.append(message)
        return ParsedEvent("runtime_event", summary=("notice: " if notice else "error: ") + (trim(message, 200) or ""),
                           data={"type": "error", "message": trim(message, TEXT_LIMIT), "fatal": False})

    def live_usage(self) -> dict[str, Tokens]:
        """The finished turn's tokens by kind: codex counts cached input inside ``input_tokens``, and cached
        input costs a fraction of fresh input (its ``cached_input_tokens`` is priced at the cache-read rate)."""
        usage = (self.completed or {}).get("usage") or {}
        if not usage:
            return {}
        total_in = int(usage.get("input_tokens") or 0)
        cached = min(int(usage.get("cached_input_tokens") or 0), total_in)
        return {"": Tokens(total_in - cached, int(usage.get("output_tokens") or 0), cached, 0)}

    def _tokens(self) -> tuple[int, int]:
        usage = (self.completed or {}).get("usage") or {}
        # input_tokens already counts the cached ones (cached_input_tokens is a part of it).
        return int(usage.get("input_tokens") or 0), int(usage.get("output_tokens") or 0)

    # ---- after the turn -----------------------------------------------------

    def finish(self, exit_code: int | None, stderr_tail: str) -> None:
        self.exit_code = exit_code
        self.stderr_tail = stderr_tail

    @property
    def finished(self) -> bool:
        return self.completed is not None or self.failed_message is not None

    @property
    def succeeded(self) -> bool:
        return self.completed is not None

    def failure(self, *, resumed: bool) -> TurnFailure:
        if self.failed_message is None:
            if resumed and _RESUME_GONE.search(self.stderr_tail):
                return TurnFailure(RESUME_FAILED, "codex could not find the session to resume")
            if self.exit_code == 2 or (self.exit_code == 1 and not self.events_seen):
                # A usage or config error: codex said why on stderr, before any event.
                line = _last_error_line(self.stderr_tail) or f"codex exited {self.exit_code} before starting the turn"
                return TurnFailure(PERMANENT if not _TRANSIENT_TEXT.search(line) else TRANSIENT, line)
            return TurnFailure(TRANSIENT, "codex exited without finishing the turn (killed or crashed)")
        message = self.failed_message
        status = _STATUS.search(message)
        if status:
            kind = kind_of_status(int(status.group(1)))
        elif _PERMANENT_TEXT.search(message) or message.lstrip().startswith("{"):
            kind = PERMANENT
        elif _TRANSIENT_TEXT.search(message):
            kind = TRANSIENT
        else:
            kind = UNKNOWN  # a message ov does not recognise: parked, not retried at full price
        if kind == RATE_LIMIT and _PERMANENT_TEXT.search(message):
            kind = PERMANENT
        if kind in (TRANSIENT, UNKNOWN) and re.search(r"unauthori[sz]ed|invalid api key|incorrect api key", message,
                                                      re.IGNORECASE):
            kind = AUTH
        reset = reset_after(retry_seconds(message)) if kind == RATE_LIMIT else None
        return TurnFailure(kind, trim(message, 300) or "turn failed", reset)

    def usage(self) -> Usage:
        tokens_in, tokens_out = self._tokens()
        return Usage(tokens_in, tokens_out, 0.0)


def _last_error_line(stderr: str) -> str | None:
    for line in reversed(stderr.strip().splitlines()):
        if line.startswith("Error") or "error" in line.lower():
            return trim(line.strip(), 300)
    return None
