"""Reading a turn's stream while its runtime runs: whole lines without blocking, each parsed, recorded and
priced as it comes, until the runtime ends or something stops the turn (a limit, a stall, a stop, a newer
generation). ``agents.turns`` runs the turn around it.
"""

from __future__ import annotations

import os
import select
import selectors
import time
import typing as t

from overstory.agents import ledger
from overstory.agents.session_lost import note_session
from overstory.agents.spending import ToolCallGate, TurnMeter
from overstory.clock import now_ms
from overstory.guards.mail_poll import EVENT_KIND as MAIL_POLLING
from overstory.guards.mail_poll import polls_mail
from overstory.runtimes.base import AUTH, RATE_LIMIT, UNKNOWN, ParsedEvent, TurnParser
from overstory.store import events as event_store
from overstory.store import sessions
from overstory.store.sessions import Session
from overstory.store.sqlite_module import sqlite3

ACTIVITY_WRITE_INTERVAL = 1.0
PERIODIC_SECONDS = 1.0
# The longest wait for a refused call's tool_end before a turn is stopped (``TurnParser.stop_after_refusal``).
REFUSED_CALL_GRACE = 3.0
# The turn statuses of failure kinds the loop parks for instead of retrying.
PARKING_STATUS = {RATE_LIMIT: "rate_limit", AUTH: "auth", UNKNOWN: "unknown"}


class _LineReader:
    """Read whole lines from a pipe without blocking past a deadline.

    With a ``gate`` (``spending.ToolCallGate``) it also wakes when a tool call asks the gate: it then
    takes the gate's tickets (``ticket``) and reads everything the pipe holds at that moment, so the
    turn runner can answer them once those lines are priced.
    """

    def hurry(self) -> None:
        """A pipe is read the moment it has a line: nothing to change."""

    DRY_READ_LIMIT = 4 << 20  # bytes read in one go for a waiting tool call (a flood must not starve the loop)

    def __init__(self, stream: t.IO[bytes], gate: ToolCallGate | None = None) -> None:
        self.fd = stream.fileno()
        self.buffer = b""
        self.eof = False
        self.gate = gate
        self.ticket = 0
        self.selector = selectors.DefaultSelector()
        self.selector.register(self.fd, selectors.EVENT_READ)
        if gate is not None:
            self.selector.register(gate.fileno(), selectors.EVENT_READ)

    def lines(self, timeout: float) -> list[bytes]:
        if self.eof:
            return []
        ready = self.selector.select(timeout)
        if not ready:
            return []
        if self.gate is not None and any(key.fd != self.fd for key, _ in ready):
            self.ticket = self.gate.take()  # before reading: what the runtime printed before it asked is in the pipe
            return self._read(dry=True)
        return self._read(dry=False)

    def _read(self, *, dry: bool) -> list[bytes]:
        read = 0
        while True:
            if dry and not select.select([self.fd], [], [], 0)[0]:
                break
            chunk = os.read(self.fd, 65536)
            if not chunk:
                self.eof = True
                rest, self.buffer = self.buffer, b""
                if rest.strip():
                    self.buffer = rest + b"\n"
                break
            self.buffer += chunk
            read += len(chunk)
            if not dry or read >= self.DRY_READ_LIMIT:
                break
        *complete, self.buffer = self.buffer.split(b"\n")
        return complete

    def close(self) -> None:
        self.selector.close()


if t.TYPE_CHECKING:  # for mypy only: typing is deferred in an agent loop (overstory.deferred)
    class Lines(t.Protocol):
        """What ``_pump`` reads: ``_LineReader`` over a pipe, or ``turn_exec.ExecutorLines`` over an executor."""

        eof: bool
        ticket: int
        gate: ToolCallGate | None

        def lines(self, timeout: float) -> list[bytes]: ...

        def hurry(self) -> None:
            """Read as soon as a line comes, from now to the turn's end: a refused call's answer is awaited."""

    class Process(t.Protocol):
        def poll(self) -> int | None: ...


def _pump(reader: Lines, raw_out: t.IO[bytes], proc: Process, stream: TurnParser,
          state: sqlite3.Connection, events: sqlite3.Connection, agent: Session, turn_id: str, meter: TurnMeter, *,
          stall_timeout: float, should_stop: t.Callable[[], bool],
          price: t.Callable[[dict[str, t.Any]], None] = lambda data: None,
          periodic: t.Callable[[], None] = lambda: None,
          stream_ledger: ledger.StreamLedger | None = None, asked_session: str | None = None) -> tuple[str, str]:
    """Read the stream until EOF; returns ('running', '') normally, or a stop status.

    ``periodic`` runs about every ``PERIODIC_SECONDS`` (bringing a writer's commits out of its
    sandbox as they happen, so its branch is current while the turn runs).
    """
    last_event = time.monotonic()
    last_periodic = last_event
    last_write = 0.0
    entered_turn = False
    exited_at: float | None = None
    saved_session: str | None = None
    refused_at: float | None = None
    while not reader.eof:
        lines = reader.lines(timeout=0.5)
        now = time.monotonic()
        batch: list[ParsedEvent] = []
        for raw in lines:
            raw_out.write(raw + b"\n")
            raw_out.flush()
            parsed = stream.feed(raw.decode("utf-8", errors="replace"), now=now)
            batch.extend(parsed)
            last_event = now
            for item in parsed:
                if item.kind == "turn_result" and item.data is not None:
                    price(item.data)
                event_store.record(events, item.kind, agent=agent.name, generation=agent.generation, turn_id=turn_id,
                                   tool=item.tool, summary=item.summary, data=item.data)
                if item.kind == "tool_start":
                    _note_mail_polling(events, agent, turn_id, item)
            if stream_ledger is not None:
                stream_ledger.feed(parsed)
            if not entered_turn and stream.events_seen:
                entered_turn = True
                outcome = sessions.transition(state, agent.name, agent.generation, "in_turn", actor="turn-runner",
                                              reason=f"turn {turn_id}", expect={"booting", "between_turns", "stalled"})
                if not outcome.ok:
                    return "aborted", f"agent can no longer take a turn ({_describe(outcome)})"
            if stream.session_id and stream.session_id != saved_session:
                # Saved the moment it is known: a turn killed from here on is retried in this session (and a
                # runtime that started a new session instead of resuming ``asked_session`` is said: note_session).
                saved_session = note_session(state, events, agent, turn_id, stream.session_id, asked=asked_session)
            if parsed and now - last_write >= ACTIVITY_WRITE_INTERVAL or any(p.kind in ("tool_start", "tool_end") for p in parsed):
                last_write = now
                written = sessions.update_fields(state, agent.name, agent.generation, last_activity=now_ms(),
                                                 current_tool=stream.current_tool)
                if not written:
                    return "aborted", "agent was replaced by a newer generation"
                _revive_if_stalled(state, agent)
        early = stream.early_failure()
        if early is not None:
            event_store.record(events, "auth_failed", agent=agent.name, generation=agent.generation, turn_id=turn_id,
                               summary=f"auth: {early.reason}"[:300], data={"reason": early.reason})
            return PARKING_STATUS.get(early.kind, early.kind), early.reason
        ticket, reader.ticket = reader.ticket, 0
        stop = meter.poll(stream, batch, now, force=bool(ticket))
        if ticket and stop is None and reader.gate is not None and stream.live_reports < reader.gate.reports_needed:
            reader.ticket, ticket = ticket, 0  # the runtime has billed more than it printed yet: wait for those lines
        if ticket and reader.gate is not None:
            reader.gate.answer(ticket, stop)  # the tool calls that asked: refused if this batch crossed a limit
        if refused_at is not None:  # the runtime took the refusal (its tool_end), or took too long: stop now
            # Killed between a tool call and its result, the runtime's session would hold a call that never
            # ran, and resuming it fails: so not while the batch left a call in flight (the model's next
            # message came with the refusal's result; that call is refused at the gate too, and taken fast).
            taken = (any(p.kind == "tool_end" for p in batch) and not stream.current_tool) \
                or now - refused_at > REFUSED_CALL_GRACE
            stop = meter.stopped_by if taken else None
        elif stop is not None and stream.stop_after_refusal and (ticket or stream.current_tool) and reader.gate:
            reader.gate.answer(0, stop)  # a call in flight is refused at the gate: stop once the refusal is taken
            meter.stopped_by, refused_at, stop = stop, now, None
            reader.hurry()  # the model may already be asking for its next (billed) message: stop at the refusal's end
        if stop is not None:
            return _stopped(events, agent, turn_id, meter, stop)
        if now - last_periodic >= PERIODIC_SECONDS:
            last_periodic = now
            periodic()
        if should_stop():
            return "aborted", "the agent was stopped"
        if now - last_event > stall_timeout:
            return "stalled", f"no output for {stall_timeout:g}s (stall timeout)"
        if exited_at is None and proc.poll() is not None:
            exited_at = now
        if exited_at is not None and not lines and now - exited_at > 5:
            break  # the runtime exited; a straggler child still holds its stdout open
    if refused_at is not None and meter.stopped_by is not None:
        return _stopped(events, agent, turn_id, meter, meter.stopped_by)
    return "running", ""


def _note_mail_polling(events: sqlite3.Connection, agent: Session, turn_id: str, item: ParsedEvent) -> None:
    """One ``mail_polling`` event for a tool call whose command polls for mail (``guards.mail_poll``): every
    runtime's stream passes here, and the guard's hot path pays nothing for it."""
    given = item.call_input.get("command") if isinstance(item.call_input, dict) else None
    command = given if isinstance(given, str) else item.summary or ""
    if polls_mail(command):
        event_store.record(events, MAIL_POLLING, agent=agent.name, generation=agent.generation, turn_id=turn_id,
                           tool=item.tool, summary=f"polls for mail in a shell loop (mail wakes it): {command}"[:300],
                           data={"command": command[:1000]})


def _stopped(events: sqlite3.Connection, agent: Session, turn_id: str, meter: TurnMeter, stop: t.Any) -> tuple[str, str]:
    meter.stopped_by = stop  # a limit stops the turn: its event, and the status the caller settles with
    event_store.record(events, "budget_crossed" if stop.status == "budget" else "turn_parked",
                       agent=agent.name, generation=agent.generation, turn_id=turn_id, summary=stop.reason[:300],
                       data={"estimate_usd": round(meter.estimate, 6),
                             **({"crossing": stop.crossing.as_dict()} if stop.crossing else {})})
    return stop.status, stop.reason


def _revive_if_stalled(state: sqlite3.Connection, agent: Session) -> None:
    """A turn the watchdog marked stalled that speaks again is back in its turn."""
    if sessions.state_of(state, agent.name, agent.generation) == "stalled":
        sessions.transition(state, agent.name, agent.generation, "in_turn", actor="turn-runner",
                            reason="activity resumed", expect={"stalled"})


def _describe(outcome: sessions.Outcome) -> str:
    if isinstance(outcome, sessions.IllegalTransition):
        return f"it is {outcome.prev}"
    if isinstance(outcome, sessions.StaleGeneration):
        return f"a newer generation {outcome.current} exists"
    return "it no longer exists"
