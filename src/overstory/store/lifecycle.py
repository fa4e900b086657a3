"""Settling an agent's end: the transitions to zombie and completed, with their side effects.

Whoever makes an agent zombie (turn runner, retry policy, watchdog) goes through
``declare_zombie``: the parent's ``worker_died`` mail is inserted inside the same
compare-and-swap transaction, so exactly one is ever sent for a generation. An agent
whose terminal mail is committed is never retried or made zombie: whatever its process
did afterwards, it settles ``completed`` through ``complete_promised``.
"""

from __future__ import annotations

import sqlite3

from overstory.clock import iso, now_ms
from overstory.store import sessions
from overstory.store.sessions import Outcome, Session

# Mail types that end an agent's task, by capability. Persistent capabilities have none.
TERMINAL_MAIL_TYPES: dict[str, frozenset[str]] = {
    "builder": frozenset({"worker_done"}),
    "scout": frozenset({"worker_done"}),
    "reviewer": frozenset({"worker_done"}),
    "lead": frozenset({"worker_done"}),
    "monitor": frozenset({"worker_done"}),
    "merger": frozenset({"merged", "merge_failed"}),
    "coordinator": frozenset(),
}
PERSISTENT_CAPABILITIES = frozenset({"coordinator"})


def declare_zombie(conn: sqlite3.Connection, agent: Session, reason: str, *, actor: str,
                   expect: frozenset[str] | None = None) -> Outcome:
    """Move ``agent`` (as of its generation) to zombie and tell its parent, once."""

    def tell_parent(tx: sqlite3.Connection, ok: sessions.Ok) -> None:
        from overstory.store import mail

        last = tx.execute("SELECT last_activity FROM sessions WHERE name = ?", (agent.name,)).fetchone()
        payload = {
            "agent": agent.name, "task_id": agent.task_id, "branch": agent.branch, "reason": reason,
            "last_activity": iso(last[0]) if last else None, "previous_state": ok.prev,
            "generation": agent.generation,
        }
        mail.insert_message(
            tx, sender=agent.name, recipient=agent.parent or "operator", type="worker_died", priority="high",
            subject=f"{agent.name} died: {reason[:120]}",
            body=f"Agent {agent.name} (task {agent.task_id}) stopped working: {reason}. Its branch {agent.branch} "
                 "keeps whatever it committed; unread mail stays in its inbox.",
            payload=payload, dedup_key=f"worker_died:{agent.name}:{agent.generation}",
        )

    outcome = sessions.transition(
        conn, agent.name, agent.generation, "zombie", actor=actor, reason=reason, expect=expect,
        fields={"turn_pgid": None, "turn_start_ticks": None, "current_turn_id": None, "current_tool": None},
        then=tell_parent,
    )
    if outcome.ok:
        from overstory.store import mail

        row = conn.execute("SELECT id FROM mail WHERE dedup_key = ?",
                           (f"worker_died:{agent.name}:{agent.generation}",)).fetchone()
        if row:
            mail.record_sent(conn, [row[0]])
    return outcome


def terminal_mail_sent(conn: sqlite3.Connection, agent: Session, since_ms: int) -> bool:
    types = TERMINAL_MAIL_TYPES.get(agent.capability, frozenset())
    if not types:
        return False
    marks = ",".join("?" * len(types))
    row = conn.execute(
        f"SELECT 1 FROM mail WHERE sender = ? AND type IN ({marks}) AND created_at >= ? LIMIT 1",
        (agent.name, *sorted(types), since_ms),
    ).fetchone()
    return row is not None


def promised(conn: sqlite3.Connection, agent: Session) -> bool:
    """Whether this generation of ``agent`` has committed its terminal mail: its promise that the task is done."""
    return agent.capability not in PERSISTENT_CAPABILITIES and terminal_mail_sent(conn, agent, agent.created_at)


def complete_promised(conn: sqlite3.Connection, agent: Session, what_happened: str, *, actor: str,
                      expect: frozenset[str] | None = None) -> Outcome:
    """Settle an agent whose terminal mail is committed as ``completed``, whatever its turn did afterwards.

    Retrying would redo the task and send the parent a second terminal mail. The mail its
    last turn had claimed was acted on, so it is marked read; the turn rows are closed.
    """

    def bookkeeping(tx: sqlite3.Connection, _ok: sessions.Ok) -> None:
        now = now_ms()
        tx.execute("UPDATE mail SET read_at = ? WHERE recipient = ? AND claimed_by IS NOT NULL AND read_at IS NULL",
                   (now, agent.name))
        tx.execute("UPDATE turns SET status = 'interrupted', ended_at = ?, error = ? WHERE agent = ? "
                   "AND generation = ? AND status IN ('starting', 'running')",
                   (now, what_happened[:300], agent.name, agent.generation))

    return sessions.transition(
        conn, agent.name, agent.generation, "completed", actor=actor,
        reason=f"terminal mail sent; then {what_happened}"[:300], expect=expect,
        fields={"turn_pgid": None, "turn_start_ticks": None, "current_turn_id": None, "current_tool": None},
        then=bookkeeping,
    )


def mail_sent_since(conn: sqlite3.Connection, agent: Session, since_ms: int) -> int:
    row = conn.execute("SELECT count(*) FROM mail WHERE sender = ? AND created_at >= ?", (agent.name, since_ms)).fetchone()
    return int(row[0])


def touch(conn: sqlite3.Connection, agent: Session, **fields: object) -> bool:
    return sessions.update_fields(conn, agent.name, agent.generation, last_activity=now_ms(), **fields)
