"""Counting one tool call against the agent's and its run's ``max_tool_calls`` (`ov guard`).

This is the guard's only database write, kept in one small function so that it can
be routed elsewhere: inside an agent's turn (a sandbox with a read-only ``.overstory/``)
the guard asks the agent's endpoint, which runs this same function outside. The allowed path is one UPDATE: it counts the call only while
neither the agent nor its run has reached its tool-call limit or its dollar limit (the
spend so far plus the live estimate of the turn in progress, which the turn runner
writes as the stream's bills arrive), and a trigger adds it to the run's row (migration
m005). A refusal, the rare path, is counted in ``refused_tool_calls``, which tells the
turn runner to stop the turn and park.

Standard library only, and never creates the database: this runs on every tool call.
It talks to SQLite through ``_sqlite3``, the C module behind ``sqlite3``, loaded by
``store.sqlite_module`` without the package's ``datetime`` adapters and without ``functools``.
"""

from __future__ import annotations

from overstory.store.sqlite_module import sqlite3

_COUNT = (
    "UPDATE budgets SET tool_calls = tool_calls + 1 "
    "WHERE scope = 'agent' AND name = ? AND generation = ? "
    "AND (max_tool_calls IS NULL OR tool_calls < max_tool_calls) "
    "AND (max_usd IS NULL OR spent_usd + live_usd < max_usd) "
    "AND (run_id IS NULL OR NOT EXISTS (SELECT 1 FROM budgets r WHERE r.scope = 'run' AND r.name = budgets.run_id "
    "AND r.generation = 0 AND ((r.max_tool_calls IS NOT NULL AND r.tool_calls >= r.max_tool_calls) "
    "OR (r.max_usd IS NOT NULL AND r.spent_usd + r.live_usd >= r.max_usd)))) "
    "RETURNING tool_calls"
)
_REFUSE = (
    "UPDATE budgets SET refused_tool_calls = refused_tool_calls + 1 "
    "WHERE scope = 'agent' AND name = ? AND generation = ? "
    "RETURNING tool_calls, max_tool_calls, spent_usd + live_usd, max_usd, run_id, "
    "(SELECT r.tool_calls FROM budgets r WHERE r.scope = 'run' AND r.name = budgets.run_id AND r.generation = 0), "
    "(SELECT r.max_tool_calls FROM budgets r WHERE r.scope = 'run' AND r.name = budgets.run_id AND r.generation = 0), "
    "(SELECT r.spent_usd + r.live_usd FROM budgets r WHERE r.scope = 'run' AND r.name = budgets.run_id "
    "AND r.generation = 0), "
    "(SELECT r.max_usd FROM budgets r WHERE r.scope = 'run' AND r.name = budgets.run_id AND r.generation = 0)"
)


def count_tool_call(state_db: str, agent: str, generation: int) -> str | None:
    """Count one tool call of ``agent``; the reason to deny it, or None to let it run.

    No budget row (an older database, a replaced generation) or a database that cannot
    be opened counts nothing and allows: the budget is enforced again before and after
    each turn, and a broken guard must not stop every agent.
    """
    try:
        conn = sqlite3.connect(f"file:{state_db}?mode=rw", uri=True, timeout=10, isolation_level=None)
    except sqlite3.Error:
        return None
    try:
        # As every ov connection: in WAL mode a commit then needs no fsync (the count is not worth one per call).
        conn.execute("PRAGMA synchronous = NORMAL")
        return count_on(conn, agent, generation)
    except sqlite3.Error:
        return None
    finally:
        conn.close()


def count_on(conn: sqlite3.Connection, agent: str, generation: int) -> str | None:
    """``count_tool_call`` on an open autocommit connection (the endpoint's HTTP hook keeps one)."""
    try:
        if conn.execute(_COUNT, (agent, generation)).fetchone() is not None:
            return None
        row = conn.execute(_REFUSE, (agent, generation)).fetchone()
    except sqlite3.Error:
        return None
    if row is None:
        return None
    used, maximum, usd, max_usd, run_id, run_used, run_maximum, run_usd, run_max_usd = row
    if max_usd is not None and usd >= max_usd:
        limit, which = "max_usd", f"this agent's budget allows ${max_usd:.2f} and ${usd:.2f} is spent"
    elif run_max_usd is not None and run_usd is not None and run_usd >= run_max_usd:
        limit, which = "max_usd", f"run {run_id}'s budget allows ${run_max_usd:.2f} and ${run_usd:.2f} is spent"
    elif maximum is not None and used >= maximum:
        limit, which = "max_tool_calls", f"this agent's budget allows {maximum} tool calls and all {used} are used"
    else:
        limit = "max_tool_calls"
        which = f"run {run_id}'s budget allows {run_maximum} tool calls and all {run_used} are used"
    return (f"budget: {limit} reached ({which}). ov is stopping this turn and parking the agent until "
            "the operator raises the limit (`ov resume`); end your turn now.")
