"""Budgets during a turn: the live cost estimate and the checks that can stop the turn.

The turn runner gives every parsed batch of stream events to ``TurnMeter.poll``. The
meter prices the usage the stream has reported so far (``overstory.prices``), writes
the estimate to the agent's budget row (so the run's total and `ov status` see it),
and checks the agent's and its run's limits: dollars, wall clock, and tool calls the
guard refused past a limit. It also notices when someone else parked the agent (its
run crossed a limit). Checks run when the stream reports new usage or a tool call,
and at least every ``CHECK_SECONDS`` otherwise.
"""

from __future__ import annotations

import sqlite3
import time
import typing as t
from dataclasses import dataclass

from overstory.prices import PriceTable
from overstory.store import budgets
from overstory.store.budgets import Crossing

if t.TYPE_CHECKING:
    from overstory.config import Config
    from overstory.runtimes.base import ParsedEvent, TurnParser
    from overstory.store.sessions import Session

CHECK_SECONDS = 1.0
LIVE_WRITE_STEP = 0.0001  # dollars: smaller changes of the estimate are not worth a write


@dataclass(frozen=True)
class Stop:
    """Why the meter wants the turn stopped: a limit was crossed, or the agent was parked."""

    status: str            # budget | parked
    reason: str
    crossing: Crossing | None = None


class TurnMeter:
    def __init__(self, state: sqlite3.Connection, agent: Session, config: Config) -> None:
        self.state = state
        self.agent = agent
        self.prices = PriceTable(config.prices)
        budget = budgets.get_agent(state, agent.name, agent.generation)
        self.enabled = budget is not None
        self.refused_at_start = budget.refused_tool_calls if budget else 0
        self.estimate = 0.0
        self.notes: list[str] = []
        self._written = 0.0
        self._next_check = 0.0
        self.stopped_by: Stop | None = None

    def price(self, stream: TurnParser) -> float:
        cost, notes = self.prices.cost(stream.live_usage())
        for note in notes:
            if note not in self.notes:
                self.notes.append(note)
        self.estimate = cost
        return cost

    def poll(self, stream: TurnParser, parsed: t.Sequence[ParsedEvent], now: float | None = None) -> Stop | None:
        """Check the limits if something relevant happened or the interval passed."""
        if not self.enabled:
            return None
        now = time.monotonic() if now is None else now
        relevant = any(p.kind in ("tool_start", "tool_end") for p in parsed)
        if parsed and stream.live_usage():
            before = self.estimate
            relevant = relevant or self.price(stream) != before
        if not relevant and now < self._next_check:
            return None
        self._next_check = now + CHECK_SECONDS
        return self.check()

    def check(self) -> Stop | None:
        try:
            if abs(self.estimate - self._written) >= LIVE_WRITE_STEP:
                budgets.set_live(self.state, self.agent.name, self.agent.generation, self.estimate)
                self._written = self.estimate
            row = self.state.execute("SELECT state, state_reason, generation FROM sessions WHERE name = ?",
                                     (self.agent.name,)).fetchone()
            if row is not None and row["generation"] == self.agent.generation and row["state"] == "parked":
                return Stop("parked", row["state_reason"] or "parked")
            crossing = budgets.check(self.state, self.agent.name, self.agent.generation,
                                     refused_since=self.refused_at_start)
        except sqlite3.OperationalError:
            return None  # a busy database: the next poll checks again
        return Stop("budget", crossing.reason, crossing) if crossing is not None else None
