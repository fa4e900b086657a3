"""Quota windows: one per provider, shared by every agent that talks to it.

A rate or usage limit that the runtime will not retry by itself closes the
provider's window until its reset time (when the runtime said when), else for a
backoff that doubles with each limit in a row (``quota.backoff_initial`` up to
``quota.backoff_max``). A successful turn on the provider forgets the backoff.

Every agent of the provider parks with the window (``park_provider``), each a little
later than the one before (``quota.stagger``), so that they do not all call the API
again in the same second; the watchdog, or the agent's own loop, un-parks each one
when its time comes (``lifecycle.unpark`` with ``due_at``). Agents in the middle of
a turn are left to finish it: their next turn is refused while the window is closed.
"""

from __future__ import annotations

import typing as t

from overstory.clock import iso, now_ms
from overstory.records import Record
from overstory.store import lifecycle, sessions
from overstory.store.db import write_transaction
from overstory.store.sessions import Session
from overstory.store.sqlite_module import sqlite3

IDLE_STATES = ("booting", "between_turns")


class Window(Record):
    """A provider's usage limit window: no new turns until it ends."""

    __slots__ = ("provider", "until_ms", "level", "reset_known", "reason")

    provider: str
    until_ms: int
    level: int
    reset_known: bool
    reason: str | None

    def describe(self) -> str:
        how = "its reset time" if self.reset_known else f"backoff step {self.level}"
        return f"quota: {self.provider} limited until {iso(self.until_ms)} ({how})"


def _window(row: sqlite3.Row) -> Window:
    return Window(row["provider"], row["until_ms"], row["level"], bool(row["reset_known"]), row["reason"])


def current(conn: sqlite3.Connection, provider: str | None, *, now: int | None = None) -> Window | None:
    """The provider's window while it is closed, else None."""
    if not provider:
        return None
    row = conn.execute("SELECT * FROM quota_windows WHERE provider = ? AND until_ms > ?",
                       (provider, now_ms() if now is None else now)).fetchone()
    return _window(row) if row else None


def close_window(conn: sqlite3.Connection, provider: str, *, reset_at_ms: int | None, reason: str,
                 backoff_initial: float, backoff_max: float, now: int | None = None) -> Window:
    """Record a limit hit on ``provider``; returns the window every agent of it now waits for.

    A reset time wins. Without one, a window still closed (another agent hit the limit a
    moment ago) is shared as it is; otherwise the next backoff step starts now.
    """
    now = now_ms() if now is None else now
    with write_transaction(conn):
        row = conn.execute("SELECT * FROM quota_windows WHERE provider = ?", (provider,)).fetchone()
        level = row["level"] if row else 0
        if reset_at_ms is not None:
            until, known = max(reset_at_ms, now), 1
        elif row is not None and row["until_ms"] > now:
            until, known = row["until_ms"], row["reset_known"]
        else:
            level += 1
            until, known = now + int(min(backoff_initial * 2 ** (level - 1), backoff_max) * 1000), 0
        conn.execute(
            "INSERT INTO quota_windows(provider, until_ms, level, reset_known, reason, opened_at, updated_at) "
            "VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT(provider) DO UPDATE SET until_ms = excluded.until_ms, "
            "level = excluded.level, reset_known = excluded.reset_known, reason = excluded.reason, "
            "updated_at = excluded.updated_at", (provider, until, level, known, reason[:500], now, now))
        found = conn.execute("SELECT * FROM quota_windows WHERE provider = ?", (provider,)).fetchone()
    return _window(found)


def forget(conn: sqlite3.Connection, provider: str | None) -> None:
    """A turn on the provider succeeded: the next limit starts the backoff from the first step."""
    if provider:
        conn.execute("DELETE FROM quota_windows WHERE provider = ? AND until_ms <= ?", (provider, now_ms()))


def parked_count(conn: sqlite3.Connection, provider: str) -> int:
    row = conn.execute("SELECT count(*) FROM sessions WHERE provider = ? AND state = 'parked' AND park_kind = 'quota'",
                       (provider,)).fetchone()
    return int(row[0])


def park_agent(conn: sqlite3.Connection, agent: Session, window: Window, *, actor: str, stagger: float,
               detail: str = "", expect: t.Collection[str] | None = None) -> sessions.Outcome:
    """Park ``agent`` until the window opens, after the agents of its provider already waiting."""
    slot = parked_count(conn, window.provider)
    until = window.until_ms + int(slot * stagger * 1000)
    reason = window.describe() + (f": {detail}" if detail else "")
    return lifecycle.park(conn, agent, "quota", reason[:300], actor=actor, until_ms=until, escalate=False,
                          expect=expect)


def park_provider(conn: sqlite3.Connection, window: Window, *, actor: str, stagger: float,
                  except_agent: str | None = None) -> list[str]:
    """Park the provider's idle agents with its window; returns their names.

    Agents in a turn are not interrupted: their next turn meets the closed window.
    """
    marks = ",".join("?" * len(IDLE_STATES))
    rows = conn.execute(f"SELECT name FROM sessions WHERE provider = ? AND state IN ({marks}) "
                        "ORDER BY created_at, name", (window.provider, *IDLE_STATES)).fetchall()
    parked = []
    for row in rows:
        if row["name"] == except_agent:
            continue
        agent = sessions.get(conn, row["name"])
        if agent is None or agent.state not in IDLE_STATES or agent.mode != "headless":
            continue
        outcome = park_agent(conn, agent, window, actor=actor, stagger=stagger,
                             detail="another agent of this provider hit the limit", expect=IDLE_STATES)
        if outcome.ok:
            parked.append(agent.name)
    return parked


def due_for_unpark(conn: sqlite3.Connection, *, now: int | None = None) -> list[Session]:
    """Parked agents whose ``park_until`` has passed (quota parks, and any other timed park)."""
    rows = conn.execute("SELECT name FROM sessions WHERE state = 'parked' AND park_until IS NOT NULL "
                        "AND park_until <= ? ORDER BY park_until", (now_ms() if now is None else now,)).fetchall()
    found = [sessions.get(conn, row["name"]) for row in rows]
    return [agent for agent in found if agent is not None]
