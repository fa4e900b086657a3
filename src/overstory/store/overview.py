"""Bounded read queries behind `ov status` and `ov watch` over runs, the merge queue and approvals.

`ov status --json` imports this module, and the modules that own those tables import more than
the hot path may (json, dataclasses): so their overview queries live here. Standard library
only, nothing at import time; every query has a limit.
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing costs milliseconds and hot commands import this module
if TYPE_CHECKING:
    import sqlite3


def recent_runs(conn: sqlite3.Connection, limit: int, run_id: str | None = None) -> list[sqlite3.Row]:
    """(id, coordinator, status, started_at, completed_at, agents) of the newest ``limit`` runs (only ``run_id``)."""
    where, args = ("WHERE r.id = ? ", (run_id, limit)) if run_id is not None else ("", (limit,))
    return conn.execute(
        "SELECT r.id, r.coordinator, r.status, r.started_at, r.completed_at, "
        "(SELECT count(*) FROM sessions s WHERE s.run_id = r.id) AS agents "
        f"FROM runs r {where}ORDER BY r.started_at DESC LIMIT ?", args).fetchall()


def latest_node(conn: sqlite3.Connection, agent: str, generation: int) -> str | None:
    """The node of the agent generation's latest turn that has one (index turns_agent; its 20 latest turns)."""
    row = conn.execute("SELECT node FROM (SELECT node, generation FROM turns WHERE agent = ? "
                       "ORDER BY started_at DESC LIMIT 20) WHERE generation = ? AND node IS NOT NULL LIMIT 1",
                       (agent, generation)).fetchone()
    return None if row is None else str(row[0])


def merge_queue(conn: sqlite3.Connection, limit: int) -> list[sqlite3.Row]:
    """Up to ``limit`` pending merge requests, oldest first, then up to ``limit`` processed ones, newest first."""
    return conn.execute(
        "SELECT * FROM (SELECT id, agent, branch, target, status, tier, enqueued_at FROM merge_queue "
        "WHERE status = 'pending' ORDER BY id LIMIT ?) "
        "UNION ALL SELECT * FROM (SELECT id, agent, branch, target, status, tier, enqueued_at FROM merge_queue "
        "WHERE status != 'pending' ORDER BY id DESC LIMIT ?)", (limit, limit)).fetchall()


def pending_approvals(conn: sqlite3.Connection, limit: int) -> list[sqlite3.Row]:
    """(id, agent, tool, input, reason, decider, deadline) of requests waiting, soonest deadline first.

    Raises ``sqlite3.OperationalError`` on a state database older than approval gates.
    """
    return conn.execute("SELECT id, agent, tool, input, reason, decider, deadline FROM approvals "
                        "WHERE status = 'pending' ORDER BY deadline LIMIT ?", (limit,)).fetchall()
