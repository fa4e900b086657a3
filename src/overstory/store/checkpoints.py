"""One checkpoint per headless turn: where the agent stood, for resume, fork and ``ov trace``.

Written when the turn starts (``phase = 'start'``: the mail it claimed, the session it
resumes, the worktree's HEAD and ``git status`` summary, the spend so far) and
rewritten when it ends (``phase = 'end'``: the session id, HEAD and spend after it).
A turn that died mid-way keeps its start checkpoint; the runtime session id is written
into it as soon as the stream names it.
"""

from __future__ import annotations

from overstory import jsontext
from overstory.clock import now_ms
from overstory.store.sqlite_module import sqlite3

TYPE_CHECKING = False  # typing costs milliseconds on the hook path (`ov guard`, `ov mail send`)
if TYPE_CHECKING:
    import typing as t


def save_start(conn: sqlite3.Connection, turn_id: str, *, agent: str, generation: int, attempt: int,
               scope: str | None, mail_ids: t.Sequence[int], session_id: str | None, head: str | None,
               git_status: t.Mapping[str, t.Any] | None, cost_usd: float, input_tokens: int, output_tokens: int,
               started_ms: int) -> None:
    conn.execute(
        "INSERT OR REPLACE INTO checkpoints(turn_id, agent, generation, attempt, scope, mail_ids, session_id, head, "
        "git_status, cost_usd, input_tokens, output_tokens, phase, turn_status, started_at, at) "
        "VALUES (?,?,?,?,?,?,?,?,?,?,?,?,'start',NULL,?,?)",
        (turn_id, agent, generation, attempt, scope, jsontext.dumps(list(mail_ids)), session_id, head,
         jsontext.dumps(git_status) if git_status is not None else None, cost_usd, input_tokens, output_tokens,
         started_ms, now_ms()))


def set_session(conn: sqlite3.Connection, turn_id: str, session_id: str) -> None:
    conn.execute("UPDATE checkpoints SET session_id = ? WHERE turn_id = ?", (session_id, turn_id))


def save_end(conn: sqlite3.Connection, turn_id: str, *, session_id: str | None, head: str | None,
             git_status: t.Mapping[str, t.Any] | None, cost_usd: float, input_tokens: int, output_tokens: int,
             turn_status: str) -> None:
    conn.execute(
        "UPDATE checkpoints SET phase = 'end', session_id = COALESCE(?, session_id), head = COALESCE(?, head), "
        "git_status = COALESCE(?, git_status), cost_usd = ?, input_tokens = ?, output_tokens = ?, turn_status = ?, "
        "at = ? WHERE turn_id = ?",
        (session_id, head, jsontext.dumps(git_status) if git_status is not None else None, cost_usd, input_tokens,
         output_tokens, turn_status, now_ms(), turn_id))


def mark_interrupted(conn: sqlite3.Connection, turn_id: str, reason: str) -> None:
    """A turn its loop stopped on a signal (the agent still its own): the turn row and the end checkpoint say
    ``interrupted`` (it is retried), not ``aborted`` (the agent was stopped). One transaction."""
    from overstory.store.db import write_transaction

    with write_transaction(conn):
        conn.execute("UPDATE turns SET status = 'interrupted', error = ? WHERE id = ? AND status = 'aborted'",
                     (reason, turn_id))
        conn.execute("UPDATE checkpoints SET turn_status = 'interrupted' WHERE turn_id = ? AND turn_status = 'aborted'",
                     (turn_id,))


def _as_dict(row: sqlite3.Row) -> dict[str, t.Any]:
    values = dict(row)
    values["mail_ids"] = jsontext.loads(values["mail_ids"] or "[]")
    values["git_status"] = jsontext.loads(values["git_status"]) if values["git_status"] else None
    return values


def latest(conn: sqlite3.Connection, agent: str, generation: int | None = None) -> dict[str, t.Any] | None:
    """The agent's newest checkpoint (of one generation when given)."""
    if generation is None:
        row = conn.execute("SELECT * FROM checkpoints WHERE agent = ? ORDER BY started_at DESC, rowid DESC LIMIT 1",
                           (agent,)).fetchone()
    else:
        row = conn.execute("SELECT * FROM checkpoints WHERE agent = ? AND generation = ? "
                           "ORDER BY started_at DESC, rowid DESC LIMIT 1", (agent, generation)).fetchone()
    return _as_dict(row) if row else None


def of_agent(conn: sqlite3.Connection, agent: str) -> list[dict[str, t.Any]]:
    rows = conn.execute("SELECT * FROM checkpoints WHERE agent = ? ORDER BY started_at, rowid", (agent,)).fetchall()
    return [_as_dict(r) for r in rows]


def by_turn(conn: sqlite3.Connection, turn_ids: t.Sequence[str]) -> dict[str, dict[str, t.Any]]:
    if not turn_ids:
        return {}
    rows = conn.execute(f"SELECT * FROM checkpoints WHERE turn_id IN ({','.join('?' * len(turn_ids))})",
                        tuple(turn_ids)).fetchall()
    return {r["turn_id"]: _as_dict(r) for r in rows}


def dispatch_started(conn: sqlite3.Connection, turn_id: str) -> int | None:
    """When the first attempt at the dispatch that ``turn_id`` answers started (None if unknown)."""
    row = conn.execute(
        "SELECT min(c.started_at) FROM checkpoints c JOIN checkpoints me ON me.turn_id = ? "
        "WHERE c.agent = me.agent AND c.generation = me.generation AND c.scope = me.scope", (turn_id,)).fetchone()
    return int(row[0]) if row and row[0] is not None else None
