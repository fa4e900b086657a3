"""Rows of ``spawn_intents`` and ``merge_intents``: what a command set out to do, kept until it is done.

A command that changes git and the database together writes its intent first; if it is
killed, the row (with the dead pid) tells a retry, `ov stop` or the watchdog what may
exist and must be finished or undone. The decisions live in ``agents.spawn_journal``
and ``merge.intents``; this module only reads and writes the rows.
"""

from __future__ import annotations

import sqlite3
import typing as t

from overstory.clock import now_ms
from overstory.store.db import write_transaction


def begin_spawn(conn: sqlite3.Connection, *, name: str, pid: int, pid_ticks: int | None, branch: str | None,
                base_commit: str | None, worktree: str | None, run_dir: str, tmux_session: str | None) -> bool:
    """Record the intent to spawn ``name``; False if another intent for that name exists."""
    row = conn.execute(
        "INSERT INTO spawn_intents(name, pid, pid_ticks, step, branch, base_commit, worktree, run_dir, tmux_session, "
        "started_at) VALUES (?,?,?,?,?,?,?,?,?,?) ON CONFLICT(name) DO NOTHING RETURNING name",
        (name, pid, pid_ticks, "intent", branch, base_commit, worktree, run_dir, tmux_session, now_ms()),
    ).fetchone()
    return row is not None


def spawn_step(conn: sqlite3.Connection, name: str, step: str, **fields: t.Any) -> None:
    """Note the step a spawn is about to take (and what it learned: generation, dispatch id)."""
    values = {"step": step, **fields}
    sets = ", ".join(f"{k} = :{k}" for k in values)
    conn.execute(f"UPDATE spawn_intents SET {sets} WHERE name = :_name", {**values, "_name": name})


def get_spawn(conn: sqlite3.Connection, name: str) -> dict[str, t.Any] | None:
    row = conn.execute("SELECT * FROM spawn_intents WHERE name = ?", (name,)).fetchone()
    return dict(row) if row else None


def list_spawns(conn: sqlite3.Connection) -> list[dict[str, t.Any]]:
    return [dict(r) for r in conn.execute("SELECT * FROM spawn_intents ORDER BY started_at")]


def end_spawn(conn: sqlite3.Connection, name: str) -> None:
    """The spawn is complete (or fully undone): forget the intent."""
    conn.execute("DELETE FROM spawn_intents WHERE name = ?", (name,))


def abandon_spawn(conn: sqlite3.Connection, name: str) -> None:
    """The spawner gives up on an undo it could not finish: anyone may finish it now."""
    conn.execute("UPDATE spawn_intents SET pid = NULL, pid_ticks = NULL WHERE name = ?", (name,))


def discard_spawn(conn: sqlite3.Connection, intent: t.Mapping[str, t.Any]) -> None:
    """In one transaction: the rows a half-done spawn wrote (session, its history, turns, budget, dispatch) and the intent."""
    name, generation = intent["name"], intent.get("generation")
    with write_transaction(conn):
        if generation is not None:
            conn.execute("DELETE FROM sessions WHERE name = ? AND generation = ?", (name, generation))
            conn.execute("DELETE FROM transitions WHERE name = ? AND generation = ?", (name, generation))
            conn.execute("DELETE FROM turns WHERE agent = ? AND generation = ?", (name, generation))
            conn.execute("DELETE FROM budgets WHERE scope = 'agent' AND name = ? AND generation = ?", (name, generation))
        if intent.get("dispatch_id") is not None:
            conn.execute("DELETE FROM mail WHERE id = ?", (intent["dispatch_id"],))
        conn.execute("DELETE FROM spawn_intents WHERE name = ?", (name,))


# ---- merges ----------------------------------------------------------------------


def begin_merge(conn: sqlite3.Connection, *, agent: str | None, generation: int | None, branch: str, target: str,
                source_commit: str, target_before: str, queue_id: int | None, sender: str, pid: int,
                pid_ticks: int | None) -> int:
    row = conn.execute(
        "INSERT INTO merge_intents(agent, generation, branch, target, source_commit, target_before, queue_id, sender, "
        "pid, pid_ticks, started_at) VALUES (?,?,?,?,?,?,?,?,?,?,?) RETURNING id",
        (agent, generation, branch, target, source_commit, target_before, queue_id, sender, pid, pid_ticks, now_ms()),
    ).fetchone()
    return int(row[0])


def list_merges(conn: sqlite3.Connection) -> list[dict[str, t.Any]]:
    return [dict(r) for r in conn.execute("SELECT * FROM merge_intents ORDER BY id")]


def end_merge(conn: sqlite3.Connection, intent_id: int) -> None:
    conn.execute("DELETE FROM merge_intents WHERE id = ?", (intent_id,))
