"""Parsing Qwen Code's ``--output-format stream-json`` stdout: Claude Code's events, Qwen's details.

Facts from tests/fixtures/QWEN_PROBE_NOTES.md (qwen-code 0.24.4): the events are Claude's
(``system/init``, ``assistant`` with ``tool_use`` blocks and per-message ``usage``, ``user``
with ``tool_result`` blocks, one closing ``result``), so ``TurnStream`` reads them. What differs:

- a failed shell call's result is text with an ``Exit Code: N`` line, and ``is_error`` is true for
  a non-zero exit (the receipt's exit code is read from that line); a successful one is its
  output alone;
- an API error the CLI gave up on ends in ``result`` ``subtype: error_during_execution`` whose
  ``error.message`` is ``[API Error: <status> <message>]`` (no ``api_error_status`` field);
- no dollars: the turn is priced from ov's price table.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from overstory.runtimes.base import RESUME_FAILED, TRANSIENT, ParsedEvent
from overstory.runtimes.claude.stream import TurnStream
from overstory.runtimes.common import kind_of_status

SHELL_TOOL = "run_shell_command"
_EXIT_LINE = re.compile(r"^Exit Code: (-?\d+)\s*$", re.MULTILINE)
_API_STATUS = re.compile(r"API Error: (\d{3})\b")
_NO_SESSION = re.compile(r"no (saved )?session|session .*not found|could not (find|load) session", re.IGNORECASE)
_DROPPED = re.compile(r"connection|socket|timed? ?out|terminated|ECONN|fetch failed", re.IGNORECASE)


@dataclass
class QwenTurnStream(TurnStream):
    exit_code_seen: int | None = None
    stderr_tail: str = ""

    def feed(self, line: str, *, now: float | None = None) -> list[ParsedEvent]:
        parsed = super().feed(line, now=now)
        for event in parsed:
            if event.kind == "tool_end" and event.tool == SHELL_TOOL and event.data is not None:
                match = _EXIT_LINE.search(str(event.data.get("output") or ""))
                # A command that exited 0 reports only its output, with no "Exit Code" line (measured).
                event.data["exit_code"] = int(match.group(1)) if match else None if event.data.get("is_error") else 0
        return parsed

    def finish(self, exit_code: int | None, stderr_tail: str) -> None:
        self.exit_code_seen = exit_code
        self.stderr_tail = stderr_tail

    def _error_text(self) -> str:
        if self.result is None:
            return ""
        error = self.result.get("error")
        message = error.get("message") if isinstance(error, dict) else error
        return " ".join(str(x) for x in (message, self.result.get("result")) if x)

    def _failure_kind(self, *, resumed: bool) -> str:
        if self.result is None:
            if resumed and _NO_SESSION.search(self.stderr_tail):
                return RESUME_FAILED
            return TRANSIENT  # killed or crashed mid-turn: retry with the same mail
        text = self._error_text()
        status = _API_STATUS.search(text)
        if status:
            return kind_of_status(int(status.group(1)))
        if resumed and _NO_SESSION.search(text):
            return RESUME_FAILED
        if _DROPPED.search(text):
            return TRANSIENT
        return super()._failure_kind(resumed=resumed)

    def failure_reason(self) -> str:
        if self.result is None:
            lines = [x.strip() for x in self.stderr_tail.splitlines() if x.strip()]
            return (lines[-1][:300] if lines else "") or "qwen exited without a result (killed or crashed)"
        return (self._error_text() or super().failure_reason())[:300]
