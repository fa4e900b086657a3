"""Rows of the ``merge_queue`` table: branches waiting to be merged, and how each merge ended."""

from __future__ import annotations

import json
import sqlite3
import typing as t

from overstory.clock import now_ms


def enqueue(conn: sqlite3.Connection, *, agent: str, branch: str, target: str | None, task_id: str | None,
            files: t.Sequence[str], mail_id: int, enqueued_at: int) -> int:
    """Queue a branch once per ``merge_ready`` mail; returns 1 if it was new, else 0."""
    cursor = conn.execute(
        "INSERT OR IGNORE INTO merge_queue(agent, branch, target, task_id, files, mail_id, enqueued_at) "
        "VALUES (?,?,?,?,?,?,?)",
        (agent, branch, target, task_id, json.dumps(list(files)), mail_id, enqueued_at),
    )
    return cursor.rowcount


def pending(conn: sqlite3.Connection) -> list[sqlite3.Row]:
    return conn.execute("SELECT * FROM merge_queue WHERE status = 'pending' ORDER BY id").fetchall()


def settle(conn: sqlite3.Connection, queue_id: int, *, merged: bool, tier: int | None, result: str) -> None:
    conn.execute("UPDATE merge_queue SET status=?, tier=?, result=?, processed_at=? WHERE id=?",
                 ("merged" if merged else "failed", tier, result[:2000], now_ms(), queue_id))


def recent(conn: sqlite3.Connection, limit: int = 20) -> list[sqlite3.Row]:
    """Pending rows first (oldest first), then the latest processed ones; at most ``limit``."""
    waiting = conn.execute("SELECT * FROM merge_queue WHERE status = 'pending' ORDER BY id LIMIT ?",
                           (limit,)).fetchall()
    done = conn.execute("SELECT * FROM merge_queue WHERE status != 'pending' ORDER BY id DESC LIMIT ?",
                        (max(0, limit - len(waiting)),)).fetchall()
    return [*waiting, *done]


def announced_not_queued(conn: sqlite3.Connection) -> list[sqlite3.Row]:
    """``merge_ready`` mail that no queue row was made from yet (oldest first)."""
    return conn.execute(
        "SELECT m.id, m.sender, m.payload, m.created_at FROM mail m "
        "LEFT JOIN merge_queue q ON q.mail_id = m.id WHERE m.type = 'merge_ready' AND q.id IS NULL ORDER BY m.id"
    ).fetchall()
