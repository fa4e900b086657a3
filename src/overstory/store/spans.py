"""The rows a run's trace is made of (``overstory.project.telemetry``): its agents, turns, tool calls, approvals, merges."""

from __future__ import annotations

import sqlite3


def run_rows(conn: sqlite3.Connection, run_id: str) -> dict[str, list[sqlite3.Row]]:
    """Everything of one run with its start and end times (ms), oldest first; empty lists for a run without agents."""
    agents = conn.execute("SELECT name, generation, capability, task_id, runtime, state, created_at, updated_at "
                          "FROM sessions WHERE run_id = ? ORDER BY created_at", (run_id,)).fetchall()
    names = [r["name"] for r in agents]
    if not names:
        return {"agents": [], "turns": [], "tool_calls": [], "approvals": [], "merges": []}
    marks = ",".join("?" * len(names))
    run = conn.execute("SELECT started_at FROM runs WHERE id = ?", (run_id,)).fetchone()
    since = run["started_at"] if run else 0
    turns = conn.execute(
        f"SELECT id, agent, generation, number, attempt, status, model, session_id, input_tokens, output_tokens, "
        f"cost_usd, tool_calls, error, started_at, ended_at FROM turns WHERE agent IN ({marks}) AND started_at >= ? "
        "ORDER BY started_at, id", (*names, since)).fetchall()
    calls = conn.execute(
        "SELECT id, agent, turn_id, tool, class, status, reason, flagged, exit_code, started_at, ended_at "
        "FROM tool_calls WHERE run_id = ? ORDER BY id", (run_id,)).fetchall()
    approvals = conn.execute(
        f"SELECT id, agent, turn_id, tool, decider, status, requested_at, decided_at, decided_by FROM approvals "
        f"WHERE agent IN ({marks}) AND requested_at >= ? ORDER BY requested_at", (*names, since)).fetchall()
    merges = conn.execute(
        f"SELECT id, agent, branch, target, status, tier, enqueued_at, processed_at FROM merge_queue "
        f"WHERE agent IN ({marks}) AND enqueued_at >= ? ORDER BY id", (*names, since)).fetchall()
    return {"agents": agents, "turns": turns, "tool_calls": calls, "approvals": approvals, "merges": merges}


