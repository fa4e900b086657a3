"""The notification outbox in state.db: what to tell a person, written with the state change it announces.

Stdlib only (the guard enqueues an approval's notification inside its transaction).
``dedup_key`` is unique: enqueuing the same event twice (a retried command, a second
scan after a restart) keeps one row. Rows are sent after the transaction commits by
``overstory.notify`` (the watchdog, or the command that wrote them); ``sent_at`` is set
once a send succeeded, so delivery is at least once, and a crash between the send and
that mark is the one case that sends twice.
"""

from __future__ import annotations

from overstory.clock import now_ms

TYPE_CHECKING = False  # typing costs milliseconds on the hook path (`ov guard`)
if TYPE_CHECKING:
    import sqlite3
    import typing as t


def enqueue(conn: sqlite3.Connection, dedup_key: str, kind: str, agent: str | None, title: str, body: str) -> bool:
    """Insert one notification (inside the caller's transaction); False when its key is known already."""
    now = now_ms()
    cursor = conn.execute("INSERT INTO notify_outbox (dedup_key, kind, agent, title, body, created_at, next_at) "
                          "VALUES (?,?,?,?,?,?,?) ON CONFLICT (dedup_key) DO NOTHING",
                          (dedup_key, kind, agent, title, body, now, now))
    return cursor.rowcount == 1


def due(conn: sqlite3.Connection, now: int | None = None, limit: int = 50) -> list[dict[str, t.Any]]:
    rows = conn.execute("SELECT * FROM notify_outbox WHERE sent_at IS NULL AND next_at <= ? ORDER BY id LIMIT ?",
                        (now_ms() if now is None else now, limit)).fetchall()
    return [dict(r) for r in rows]


def lease(conn: sqlite3.Connection, row_id: int, seen_next_at: int, until: int) -> bool:
    """Take a due row for sending (until ``until``); False when another sender took it first."""
    return conn.execute("UPDATE notify_outbox SET next_at = ? WHERE id = ? AND sent_at IS NULL AND next_at = ?",
                        (until, row_id, seen_next_at)).rowcount == 1


def mark_sent(conn: sqlite3.Connection, row_id: int, note: str | None = None) -> None:
    conn.execute("UPDATE notify_outbox SET sent_at = ?, attempts = attempts + 1, last_error = ? "
                 "WHERE id = ? AND sent_at IS NULL", (now_ms(), note, row_id))


def mark_failed(conn: sqlite3.Connection, row_id: int, error: str, next_at: int, delivered: list[str]) -> None:
    """A send that failed for some target: retried at ``next_at``; ``delivered`` (targets that got it) are skipped."""
    import json

    conn.execute("UPDATE notify_outbox SET attempts = attempts + 1, last_error = ?, next_at = ?, delivered = ? "
                 "WHERE id = ?", (error[:500], next_at, json.dumps(delivered), row_id))


def cursor(conn: sqlite3.Connection, name: str) -> int:
    row = conn.execute("SELECT value FROM notify_cursor WHERE name = ?", (name,)).fetchone()
    return int(row[0]) if row else 0


def set_cursor(conn: sqlite3.Connection, name: str, value: int) -> None:
    conn.execute("INSERT INTO notify_cursor (name, value) VALUES (?, ?) "
                 "ON CONFLICT (name) DO UPDATE SET value = MAX(value, excluded.value)", (name, value))


def pending(conn: sqlite3.Connection) -> list[dict[str, t.Any]]:
    return [dict(r) for r in conn.execute("SELECT * FROM notify_outbox WHERE sent_at IS NULL ORDER BY id")]


def completions_after(conn: sqlite3.Connection, after_id: int) -> list[sqlite3.Row]:
    """Transitions to ``completed`` after ``after_id`` (notify's transitions cursor), with the agent's row as it
    is now (``g``: its generation, to tell whether the row is still the one that completed)."""
    return conn.execute("SELECT t.id, t.name, t.generation, t.reason, s.generation AS g, s.run_id, s.capability, "
                        "s.task_id, s.parent FROM transitions t LEFT JOIN sessions s ON s.name = t.name "
                        "WHERE t.id > ? AND t.to_state = 'completed' ORDER BY t.id", (after_id,)).fetchall()
