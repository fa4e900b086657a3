"""Budgets during a turn: the live cost estimate and the checks that can stop the turn.

The turn runner gives every parsed batch of stream events to ``TurnMeter.poll``. The
meter prices the usage the stream has reported so far (``overstory.runtimes.prices``, plus any
dollar figure the runtime reported itself), writes the estimate to the agent's budget
row (so the run's total, `ov status` and `ov guard` see it), and checks the agent's and
its run's limits: dollars, wall clock, and tool calls the guard refused past a limit. It
also notices when someone else parked the agent (its run crossed a limit). Every batch
that carries a new usage report is priced as it arrives, whatever else the batch holds
(tool calls included); the limits are checked when the estimate changed or a tool call
started or ended, and at least every ``CHECK_SECONDS`` otherwise.

``ToolCallGate`` closes the last gap: a runtime prints a model message (with its bill) to
stdout before it asks ov's hook about that message's tool calls, but the hook is answered
in another thread of the agent's loop (its endpoint). The gate makes the hook wait until
the turn runner has read, priced and checked the stream up to the moment the hook asked,
so no tool call runs after the message whose bill crossed a limit.

OpenCode (and Kilo) print their events from an in-process event subscription, so a step's
bill can reach stdout after the next step's tool call asked. Their hook says how many bills
it has seen (``reports``, counted by ov's plugin from the same event bus) and the gate waits
until the turn runner has read that many from the stream.
"""

from __future__ import annotations

import os
import threading
import time
import typing as t

from overstory.records import Record
from overstory.runtimes.prices import PriceTable, Tokens
from overstory.store import budgets, sessions
from overstory.store.budgets import Crossing
from overstory.store.sqlite_module import sqlite3

if t.TYPE_CHECKING:
    from overstory.config.model import Config
    from overstory.runtimes.base import ParsedEvent, TurnParser
    from overstory.store.sessions import Session

CHECK_SECONDS = 1.0
LIVE_WRITE_STEP = 0.0001  # dollars: smaller changes of the estimate are not worth a write
# How long a tool call waits for the turn runner to catch up with the stream. Past it the call is
# decided by `ov guard`'s own count, which also refuses a call once the written estimate crossed.
GATE_WAIT_SECONDS = 10.0
TOOL_EVENTS = ("tool_start", "tool_end")


class Stop(Record):
    """Why the meter wants the turn stopped: a limit was crossed, or the agent was parked."""

    __slots__ = ("status", "reason", "crossing")
    _defaults = {"crossing": None}

    status: str            # budget | parked
    reason: str
    crossing: Crossing | None


class TurnMeter:
    def __init__(self, state: sqlite3.Connection, agent: Session, config: Config, *,
                 model: str | None = None) -> None:
        self.state = state
        self.agent = agent
        self.prices = PriceTable(config.prices)
        self.model = model  # the model the turn was started with: for usage the stream does not name
        budget = budgets.get_agent(state, agent.name, agent.generation)
        self.enabled = budget is not None
        self.refused_at_start = budget.refused_tool_calls if budget else 0
        run = budgets.get_run(state, budget.run_id) if budget is not None and budget.run_id else None
        # Whether a dollar limit applies to this turn (the agent's or its run's): only then do tool calls
        # wait at the gate for the stream to be priced.
        self.watches_usd = any(b is not None and b.max_usd is not None for b in (budget, run))
        self.estimate = 0.0
        self.notes: list[str] = []
        self._written = 0.0
        self._next_check = 0.0
        self._priced_reports = 0
        self.stopped_by: Stop | None = None

    def usage_of(self, stream: TurnParser) -> dict[str, Tokens]:
        """The stream's live tokens per model, the usage it does not name under the turn's own model."""
        usage: dict[str, Tokens] = {}
        for model, tokens in stream.live_usage().items():
            key = model or self.model or ""
            usage[key] = usage.get(key, Tokens()) + tokens
        return usage

    def price(self, stream: TurnParser) -> float:
        cost, notes = self.prices.cost(self.usage_of(stream))
        for note in notes:
            if note not in self.notes:
                self.notes.append(note)
        self.estimate = cost + stream.live_cost_usd()
        return self.estimate

    def poll(self, stream: TurnParser, parsed: t.Sequence[ParsedEvent], now: float | None = None, *,
             force: bool = False) -> Stop | None:
        """Price what the stream reported; check the limits if something relevant happened, the interval
        passed, or ``force`` (a tool call waits at the gate)."""
        if not self.enabled:
            return None
        now = time.monotonic() if now is None else now
        relevant = force or any(p.kind in TOOL_EVENTS for p in parsed)
        if stream.live_reports != self._priced_reports:  # a new bill: priced whatever else the batch holds
            self._priced_reports = stream.live_reports
            before = self.estimate
            if self.price(stream) != before:
                relevant = True
        if not relevant and now < self._next_check:
            return None
        self._next_check = now + CHECK_SECONDS
        return self.check()

    def check(self) -> Stop | None:
        try:
            if abs(self.estimate - self._written) >= LIVE_WRITE_STEP:
                budgets.set_live(self.state, self.agent.name, self.agent.generation, self.estimate)
                self._written = self.estimate
            row = sessions.live_row(self.state, self.agent.name)
            if row is not None and row["generation"] == self.agent.generation and row["state"] == "parked":
                return Stop("parked", row["state_reason"] or "parked")
            crossing = budgets.check(self.state, self.agent.name, self.agent.generation,
                                     refused_since=self.refused_at_start)
        except sqlite3.OperationalError:
            return None  # a busy database: the next poll checks again
        return Stop("budget", crossing.reason, crossing) if crossing is not None else None


class ToolCallGate:
    """Where a tool call of the agent's current turn waits until the turn runner has read, priced and
    checked the stream up to the moment the call asked (see the module's docstring).

    One per agent loop (its wake-up pipe lives as long as the loop). ``ask`` runs in the endpoint's
    threads: it wakes the turn runner (a byte in the pipe its reader also selects on) and waits for
    the answer. The runner ``take``s the tickets asked so far, reads everything the stream's pipe holds
    at that moment, polls the meter and ``answer``s them. Between turns, and in a turn without a dollar
    limit, nothing waits. After a turn that was stopped, its hooks are refused until the next turn.
    """

    def __init__(self) -> None:
        self._read_fd, self._write_fd = os.pipe()
        os.set_blocking(self._read_fd, False)
        os.set_blocking(self._write_fd, False)
        self._cond = threading.Condition()
        self._asked = 0
        self._answered = 0
        self._open = False
        self._closed = False
        self.stop: Stop | None = None
        self.reports_needed = 0  # the most bills a waiting call said the runtime had made (see ``ask``)

    def fileno(self) -> int:
        return self._read_fd

    # ---- the endpoint's side
    def ask(self, timeout: float = GATE_WAIT_SECONDS, *, reports: int = 0) -> str | None:
        """The reason to refuse the tool call that asks now, or None to let `ov guard` decide. ``reports``:
        the bills the runtime had made when it asked; the answer waits until the stream has shown them."""
        with self._cond:
            if not self._open:
                return self._refusal()
            self.reports_needed = max(self.reports_needed, reports)
            self._asked += 1
            ticket = self._asked
            try:
                os.write(self._write_fd, b"\0")
            except BlockingIOError:
                pass  # the pipe is full: the runner is woken already
            self._cond.wait_for(lambda: self._answered >= ticket or not self._open, timeout)
            return self._refusal()

    def _refusal(self) -> str | None:
        if self.stop is None:
            return None
        return (f"ov: {self.stop.reason}. ov is stopping this turn and parking the agent; this call was not "
                "run. End your turn now.")

    # ---- the turn runner's side
    def open_turn(self, *, watch: bool) -> None:
        """A turn starts: its tool calls wait at the gate when ``watch`` (a dollar limit applies)."""
        with self._cond:
            if not self._closed:
                self._drain()
            self._asked = self._answered = self.reports_needed = 0
            self.stop = None
            self._open = watch and not self._closed

    def take(self) -> int:
        """The tickets asked so far (call before reading the stream, then ``answer`` them)."""
        with self._cond:
            self._drain()
            return self._asked

    def answer(self, upto: int, stop: Stop | None) -> None:
        with self._cond:
            if stop is not None and self.stop is None:
                self.stop = stop
            self._answered = max(self._answered, upto)
            self._cond.notify_all()

    def close_turn(self, stop: Stop | None) -> None:
        """The turn's stream is over: every waiting call is answered (refused when ``stop``)."""
        with self._cond:
            if stop is not None and self.stop is None:
                self.stop = stop
            self._open = False
            self._cond.notify_all()

    def close(self) -> None:
        with self._cond:
            self._open = False
            self._closed = True
            self._cond.notify_all()
            os.close(self._read_fd)
            os.close(self._write_fd)

    def _drain(self) -> None:
        try:
            while os.read(self._read_fd, 4096):
                pass
        except BlockingIOError:
            pass
