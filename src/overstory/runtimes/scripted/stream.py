"""The scripted runtime's stdout: claude's stream-json (``runtimes.claude.stream``), plus one extension.

A scenario's ``usage: {cost_usd: X}`` action puts its dollar figure on the assistant event it
prints (``cost_usd``), so ov counts it toward the turn's live estimate as it arrives, the way it
prices a real model's tokens: a scripted budget test can cross a limit in the middle of a turn.
"""

from __future__ import annotations

import typing as t
from dataclasses import dataclass

from overstory.runtimes.claude.stream import TurnStream


@dataclass
class ScriptedTurnStream(TurnStream):
    """Claude's stream, plus the dollar figure a scenario's ``usage: {cost_usd: X}`` puts on its message."""

    stop_after_refusal = False  # the player keeps no session that a kill could lose, and prints on at once
    reported_cost: float = 0.0

    def _note_assistant(self, event: dict[str, t.Any]) -> None:
        super()._note_assistant(event)
        cost = event.get("cost_usd")
        if isinstance(cost, (int, float)) and not isinstance(cost, bool) and cost > 0:
            self.reported_cost += float(cost)
            self.live_reports += 1

    def live_cost_usd(self) -> float:
        return self.reported_cost
