"""Rows of the ``merge_queue`` table: branches waiting to be merged, and how each merge ended.

A row is made from a report: a ``merge_ready`` mail, or a builder's ``worker_done`` (its
branch is its work). Status: ``pending`` (not tried yet), ``failed`` (tried; ``result`` says
why; still open: ``ov merge --all`` tries it again), then closed: ``merged``, ``empty`` (the
branch had nothing to merge) or ``dismissed`` (the operator gave it up: ``ov merge --dismiss``).
"""

from __future__ import annotations

import json
import sqlite3
import typing as t

from overstory.clock import now_ms

OPEN = ("pending", "failed")
CLOSED = ("merged", "empty", "dismissed")


def enqueue(conn: sqlite3.Connection, *, agent: str, branch: str, target: str | None, task_id: str | None,
            files: t.Sequence[str], mail_id: int | None, enqueued_at: int, status: str = "pending",
            result: str | None = None) -> int:
    """Queue a branch once per report mail; returns 1 if it was new, else 0."""
    cursor = conn.execute(
        "INSERT OR IGNORE INTO merge_queue(agent, branch, target, task_id, files, mail_id, enqueued_at, status, result,"
        " processed_at) VALUES (?,?,?,?,?,?,?,?,?,?)",
        (agent, branch, target, task_id, json.dumps(list(files)), mail_id, enqueued_at, status, result,
         None if status == "pending" else now_ms()),
    )
    return cursor.rowcount


def open_rows(conn: sqlite3.Connection) -> list[sqlite3.Row]:
    """Rows still waiting for a merge: not tried yet, or tried and failed (oldest first)."""
    return conn.execute("SELECT * FROM merge_queue WHERE status IN ('pending', 'failed') ORDER BY id").fetchall()


def settle(conn: sqlite3.Connection, queue_id: int, *, merged: bool, tier: int | None, result: str,
           status: str | None = None) -> None:
    conn.execute("UPDATE merge_queue SET status=?, tier=?, result=?, processed_at=? WHERE id=?",
                 (status or ("merged" if merged else "failed"), tier, result[:2000], now_ms(), queue_id))


def settle_branch(conn: sqlite3.Connection, branch: str, target: str, *, status: str, tier: int | None,
                  result: str) -> int:
    """Settle every open row of ``branch`` into ``target``; returns how many."""
    cursor = conn.execute(
        "UPDATE merge_queue SET status=?, tier=?, result=?, processed_at=? WHERE branch=? AND target=? "
        "AND status IN ('pending', 'failed')", (status, tier, result[:2000], now_ms(), branch, target))
    return cursor.rowcount


def dismiss(conn: sqlite3.Connection, branch: str, result: str) -> int:
    """Close every open row of ``branch`` (whatever its target) as dismissed; returns how many."""
    cursor = conn.execute(
        "UPDATE merge_queue SET status='dismissed', result=?, processed_at=? WHERE branch=? "
        "AND status IN ('pending', 'failed')", (result[:2000], now_ms(), branch))
    return cursor.rowcount


def dismissed(conn: sqlite3.Connection, branch: str) -> bool:
    """Whether the operator gave ``branch`` up (a dismissed row, and no open row after it)."""
    row = conn.execute("SELECT status FROM merge_queue WHERE branch = ? ORDER BY id DESC LIMIT 1", (branch,)).fetchone()
    return row is not None and row[0] == "dismissed"


def last_status(conn: sqlite3.Connection, branch: str) -> str | None:
    """The status of ``branch``'s latest queue row (pending, merged, failed, empty, dismissed), or None."""
    row = conn.execute("SELECT status FROM merge_queue WHERE branch = ? ORDER BY id DESC LIMIT 1", (branch,)).fetchone()
    return str(row[0]) if row is not None else None


def branches_with_rows(conn: sqlite3.Connection) -> dict[str, int]:
    """Branch -> when its latest row was made (any status)."""
    return {r[0]: int(r[1]) for r in conn.execute("SELECT branch, max(enqueued_at) FROM merge_queue GROUP BY branch")}


def recent_closed(conn: sqlite3.Connection, limit: int = 20) -> list[sqlite3.Row]:
    """The latest closed rows (merged, empty, dismissed), newest first."""
    return conn.execute("SELECT * FROM merge_queue WHERE status IN ('merged', 'empty', 'dismissed') "
                        "ORDER BY processed_at DESC, id DESC LIMIT ?", (limit,)).fetchall()


def announced_not_queued(conn: sqlite3.Connection) -> list[sqlite3.Row]:
    """Reports that no queue row was made from yet (oldest first): ``merge_ready`` mail, and the
    ``worker_done`` of builders (of their current generation) that have a branch."""
    return conn.execute(
        "SELECT m.id, m.sender, m.type, m.payload, m.created_at FROM mail m "
        "LEFT JOIN merge_queue q ON q.mail_id = m.id "
        "LEFT JOIN sessions s ON s.name = m.sender "
        "WHERE q.id IS NULL AND (m.type = 'merge_ready' OR (m.type = 'worker_done' AND s.capability = 'builder' "
        "AND s.branch IS NOT NULL AND m.created_at >= s.created_at)) ORDER BY m.id"
    ).fetchall()
