"""Rows of the ``turns`` table: one per runtime process started for a headless turn.

A turn row is ``starting`` -> ``running`` -> one of ``ok``, ``transient``,
``permanent``, ``resume_failed``, ``stalled``, ``aborted`` (the turn runner's
verdicts), or ``failed``/``interrupted``/``aborted`` when someone else settles a
turn whose runner died or was stopped.
"""

from __future__ import annotations

import typing as t

from overstory import jsontext
from overstory.clock import now_ms
from overstory.store.sqlite_module import sqlite3

LIVE_TURN_STATUSES = ("starting", "running")
_LIVE = "status IN ('starting', 'running')"


def start(conn: sqlite3.Connection, turn_id: str, *, agent: str, generation: int, number: int, attempt: int,
          resumed: bool, started_ms: int, log_dir: str) -> None:
    conn.execute(
        "INSERT INTO turns(id, agent, generation, number, attempt, status, resumed, started_at, log_dir) "
        "VALUES (?,?,?,?,?,?,?,?,?)",
        (turn_id, agent, generation, number, attempt, "starting", int(resumed), started_ms, log_dir),
    )


def mark_running(conn: sqlite3.Connection, turn_id: str, *, pid: int | None, pgid: int | None,
                 node: str | None = None) -> None:
    """``pgid``: the turn's group on this machine (None when it runs elsewhere); ``node``: where it runs."""
    conn.execute("UPDATE turns SET status='running', pid=?, pgid=?, node=COALESCE(?, node) WHERE id=?",
                 (pid, pgid, node, turn_id))


def set_node(conn: sqlite3.Connection, turn_id: str, node: str) -> None:
    conn.execute("UPDATE turns SET node=? WHERE id=?", (node, turn_id))


def set_session_id(conn: sqlite3.Connection, turn_id: str, session_id: str) -> None:
    conn.execute("UPDATE turns SET session_id=? WHERE id=?", (session_id, turn_id))


def finish(conn: sqlite3.Connection, turn_id: str, status: str, *, input_tokens: int, output_tokens: int,
           cost_usd: float, tool_calls: int, session_id: str | None, error: str | None) -> None:
    conn.execute(
        "UPDATE turns SET status=?, ended_at=?, input_tokens=?, output_tokens=?, cost_usd=?, tool_calls=?, "
        "session_id=COALESCE(?, session_id), error=? WHERE id=?",
        (status, now_ms(), input_tokens, output_tokens, cost_usd, tool_calls, session_id, error, turn_id),
    )


def mark_interrupted(conn: sqlite3.Connection, turn_id: str) -> None:
    """A turn whose loop died: recorded as interrupted unless it already ended."""
    conn.execute("UPDATE turns SET status='interrupted', ended_at=? WHERE id=? AND ended_at IS NULL",
                 (now_ms(), turn_id))


def add_cost(conn: sqlite3.Connection, turn_id: str, usd: float) -> None:
    """A turn whose runner died: the spend it was last estimated at goes on its row, as the budget counts it
    (``budgets.settle_interrupted``, in the same transaction), so ``ov costs`` and the budget agree."""
    if usd:
        conn.execute("UPDATE turns SET cost_usd = coalesce(cost_usd, 0) + ? WHERE id = ?", (usd, turn_id))


def end_live_turns(conn: sqlite3.Connection, agent: str, generation: int, *, status: str, error: str) -> int:
    """Close every still-live turn of one agent generation (its runner is gone or was stopped)."""
    return conn.execute(
        f"UPDATE turns SET status = ?, ended_at = ?, error = ? WHERE agent = ? AND generation = ? AND {_LIVE}",
        (status, now_ms(), error, agent, generation)).rowcount


def abort_turns_of_ended_agents(conn: sqlite3.Connection) -> int:
    """Close live turns whose agent generation has ended or been replaced (the watchdog's reconcile)."""
    return conn.execute(
        f"UPDATE turns SET status = 'aborted', ended_at = ?, error = 'agent ended or replaced during the turn' "
        f"WHERE {_LIVE} AND NOT EXISTS (SELECT 1 FROM sessions s WHERE s.name = turns.agent "
        f"AND s.generation = turns.generation AND s.state NOT IN ('completed', 'zombie'))",
        (now_ms(),)).rowcount


def unfinished_of_past(conn: sqlite3.Connection) -> list[dict[str, t.Any]]:
    """Live turns whose agent generation has ended or been replaced (what ``abort_turns_of_ended_agents`` would
    close), each with ``why``: the agent's state now, or the generation that replaced it (`ov doctor`)."""
    rows = conn.execute(
        f"SELECT t.id, t.agent, t.generation, s.state, s.generation AS current FROM turns t "
        f"LEFT JOIN sessions s ON s.name = t.agent WHERE t.{_LIVE} AND NOT EXISTS (SELECT 1 FROM sessions x "
        f"WHERE x.name = t.agent AND x.generation = t.generation AND x.state NOT IN ('completed', 'zombie'))"
    ).fetchall()
    return [{"id": r[0], "agent": r[1], "generation": r[2],
             "why": "gone" if r[3] is None else (f"at generation {r[4]} now" if r[4] != r[2] else r[3])}
            for r in rows]


def label(conn: sqlite3.Connection, turn_id: str, *, capability: str | None, run_id: str | None,
          model: str | None) -> None:
    """Who the turn was for (kept with the turn, so costs survive the agent's later generations)."""
    conn.execute("UPDATE turns SET capability = ?, run_id = ?, model = ? WHERE id = ?",
                 (capability, run_id, model, turn_id))


def record_costs(conn: sqlite3.Connection, turn_id: str, *, model: str | None, cache_read_tokens: int,
                 cache_write_tokens: int, cost_estimated: bool, usage_by_model: dict[str, t.Any] | None) -> None:
    """The turn's cost detail: cache tokens, whether the cost is ov's estimate, tokens per model."""
    conn.execute(
        "UPDATE turns SET model = COALESCE(?, model), cache_read_tokens = ?, cache_write_tokens = ?, "
        "cost_estimated = ?, usage_by_model = ? WHERE id = ?",
        (model, cache_read_tokens, cache_write_tokens, int(cost_estimated),
         jsontext.dumps(usage_by_model, sort_keys=True) if usage_by_model else None, turn_id))


def recent(conn: sqlite3.Connection, agent: str, *, limit: int = 20) -> list[dict[str, object]]:
    """The newest ``limit`` turn rows of ``agent`` (every generation), newest first (index ``turns_agent``)."""
    rows = conn.execute("SELECT * FROM turns WHERE agent = ? ORDER BY started_at DESC, id DESC LIMIT ?",
                        (agent, limit)).fetchall()
    return [dict(r) for r in rows]


def running_ids(conn: sqlite3.Connection) -> set[str]:
    """Turns not ended yet, of any agent."""
    return {row[0] for row in conn.execute("SELECT id FROM turns WHERE ended_at IS NULL")}


def running_ids_of(conn: sqlite3.Connection, agent: str, generation: int) -> list[str]:
    return [r[0] for r in conn.execute("SELECT id FROM turns WHERE agent = ? AND generation = ? AND ended_at IS NULL",
                                       (agent, generation)).fetchall()]


def last_inserted(conn: sqlite3.Connection, agent: str, generation: int) -> sqlite3.Row | None:
    """(id, status, started_at) of the turn of that generation written last."""
    return conn.execute("SELECT id, status, started_at FROM turns WHERE agent = ? AND generation = ? "
                        "ORDER BY rowid DESC LIMIT 1", (agent, generation)).fetchone()


def last_started(conn: sqlite3.Connection, agent: str, generation: int) -> sqlite3.Row | None:
    """(status, started_at, ended_at) of the turn of that generation that started last."""
    return conn.execute("SELECT status, started_at, ended_at FROM turns WHERE agent = ? AND generation = ? "
                        "ORDER BY started_at DESC LIMIT 1", (agent, generation)).fetchone()


def outcome(conn: sqlite3.Connection, turn_id: str) -> sqlite3.Row | None:
    """(status, session_id, cost_usd) of one turn."""
    return conn.execute("SELECT status, session_id, cost_usd FROM turns WHERE id = ?", (turn_id,)).fetchone()


def finished_with_owner(conn: sqlite3.Connection, since_ms: int | None) -> list[sqlite3.Row]:
    """Ended turns started since ``since_ms``, oldest first, with their capability and run (for `ov costs`)."""
    return conn.execute(
        "SELECT t.agent, t.input_tokens, t.output_tokens, t.cost_usd, t.tool_calls, t.model, t.cache_read_tokens, "
        "t.cache_write_tokens, t.cost_estimated, t.usage_by_model, "
        "COALESCE(t.capability, s.capability) AS capability, COALESCE(t.run_id, s.run_id) AS run_id "
        "FROM turns t LEFT JOIN sessions s ON s.name = t.agent AND s.generation = t.generation "
        "WHERE t.ended_at IS NOT NULL AND t.started_at >= ? ORDER BY t.started_at",
        (since_ms or 0,)).fetchall()


def log_dir_of(conn: sqlite3.Connection, turn_id: str) -> str | None:
    """Where the turn's logs are (its stream, stderr, command line), as it was recorded when it started."""
    row = conn.execute("SELECT log_dir FROM turns WHERE id = ?", (turn_id,)).fetchone()
    return row[0] if row is not None and row[0] else None
