"""Settling an agent's end, and parking it: state changes that carry a side effect.

Whoever makes an agent zombie (turn runner, retry policy, watchdog) goes through
``declare_zombie``: the parent's ``worker_died`` mail is inserted inside the same
compare-and-swap transaction, so exactly one is ever sent for a generation. An agent
whose terminal mail is committed is never retried or made zombie: whatever its process
did afterwards, it settles ``completed`` through ``complete_promised``.

``park`` is the one way into ``parked`` (waiting for something outside the agent: a
budget decision, a quota reset, a fixed key, an approval) and ``unpark`` the one way
out. Parking releases the mail its turn had claimed and, when asked, writes the
parent's ``escalation`` in the same transaction, so each park sends exactly one. If
the process dies halfway, the transaction is rolled back: the agent is not parked,
no mail moved, nothing was sent.
"""

from __future__ import annotations

import typing as t

from overstory.capabilities import PERSISTENT as PERSISTENT_CAPABILITIES
from overstory.capabilities import TERMINAL_MAIL_TYPES as TERMINAL_MAIL_TYPES
from overstory.clock import iso, now_ms
from overstory.store import sessions
from overstory.store.sessions import Session
from overstory.store.sqlite_module import sqlite3

TYPE_CHECKING = False
if TYPE_CHECKING:
    from overstory.store.sessions import Outcome

# loop: an `ov loop` that reached its iterations, repeats one check failure, or whose critic escalated.
# error: its turn failed with an error the runtime's parser could not classify (not retried blindly).
PARK_KINDS = frozenset({"budget", "quota", "auth", "approval", "loop", "error"})


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


def ends_by_terminal_mail(agent: Session) -> bool:
    """Whether the agent's own terminal mail completes it: not for persistent agents, nor for an `ov loop`,
    which ov completes itself when the promise and its own check agree."""
    return agent.capability not in PERSISTENT_CAPABILITIES and not agent.spec.get("loop")


def promised(conn: sqlite3.Connection, agent: Session) -> bool:
    """Whether this generation of ``agent`` has committed its terminal mail: its promise that the task is done."""
    return ends_by_terminal_mail(agent) and terminal_mail_sent(conn, agent, agent.created_at)


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


# ---- parking ----------------------------------------------------------------------


class _NotDue(Exception):
    """Rolls back an unpark whose conditions no longer hold inside its transaction."""


def park(conn: sqlite3.Connection, agent: Session, kind: str, reason: str, *, actor: str,
         until_ms: int | None = None, escalate: bool = True, details: dict[str, object] | None = None,
         expect: t.Collection[str] | None = None,
         also: t.Callable[[sqlite3.Connection], None] | None = None, note: str | None = None) -> Outcome:
    """Move ``agent`` to parked for ``kind`` (until ``until_ms``, or until a person resumes it).

    In the same transaction: its claimed, unread mail is released (the next turn gets it
    again) and, with ``escalate``, its parent gets one ``escalation`` mail whose payload
    carries ``details`` (the figures) and whose body ends with ``note``; ``also`` adds another write to that
    transaction.
    Turn fields are left alone: a turn still running in another process is stopped by
    its own runner, which sees the agent parked.
    """
    if kind not in PARK_KINDS:
        raise ValueError(f"unknown park kind {kind!r}")
    sent: list[int] = []

    def side_effects(tx: sqlite3.Connection, ok: sessions.Ok) -> None:
        from overstory.store import mail

        mail.release_agent(tx, agent.name)
        if escalate:
            message_id = mail.insert_message(
                tx, sender=agent.name, recipient=agent.parent or "operator", type="escalation", priority="high",
                subject=f"{agent.name} parked: {reason[:120]}",
                body=_park_body(agent, kind, reason, until_ms) + (f"\n\n{note}" if note else ""),
                payload={"severity": "error", "agent": agent.name, "task_id": agent.task_id, "kind": kind,
                         "reason": reason, "details": details or {}},
                dedup_key=f"park:{agent.name}:{agent.generation}:{ok.version}")
            if message_id is not None:
                sent.append(message_id)
        if also is not None:
            also(tx)

    outcome = sessions.transition(conn, agent.name, agent.generation, "parked", actor=actor, reason=reason,
                                  fields={"park_kind": kind, "park_until": until_ms}, expect=expect,
                                  then=side_effects)
    if outcome.ok and sent:
        from overstory.store import mail

        mail.record_sent(conn, sent)
    return outcome


def _park_body(agent: Session, kind: str, reason: str, until_ms: int | None) -> str:
    lines = [f"Agent {agent.name} (task {agent.task_id}) is parked: {reason}.",
             "Its unread mail stays in its inbox; nothing it did is lost."]
    if kind == "budget":
        lines.append(f"To let it go on: `ov resume {agent.name} --add-usd 5` (or --add-turns, --add-tool-calls, "
                     "--add-time); `ov budget " + agent.name + "` shows the figures.")
    elif kind == "auth":
        lines.append(f"Fix the runtime's key or login (`ov doctor`), then `ov resume {agent.name}`.")
    elif kind == "error":
        lines.append(f"ov could not tell whether retrying would help, so it did not retry. Its turn's log: "
                     f"`ov logs {agent.name}`; `ov resume {agent.name}` retries the turn.")
    elif kind == "loop":
        lines.append(f"`ov loop status {agent.name}` shows its iterations; `ov resume {agent.name} --add-iterations 3` "
                     "lets it go on.")
    elif until_ms is not None:
        lines.append(f"It goes on by itself at {iso(until_ms)}.")
    return "\n".join(lines)


def unpark(conn: sqlite3.Connection, agent: Session, *, actor: str, reason: str,
           kinds: t.Collection[str] | None = None, due_at: int | None = None) -> Outcome | None:
    """Move a parked ``agent`` back to work (between_turns; working in tmux mode).

    ``kinds`` limits it to those park kinds; ``due_at`` (a time) only un-parks an agent
    whose ``park_until`` has passed by then. None when the agent is not parked that
    way. The conditions are read first and the swap is undone if the agent was parked
    again in between (its version moved on), so a fresh park is never cut short.
    """
    row = conn.execute("SELECT state, generation, version, park_kind, park_until FROM sessions WHERE name = ?",
                       (agent.name,)).fetchone()
    if row is None or row["generation"] != agent.generation or row["state"] != "parked":
        return None
    if kinds is not None and row["park_kind"] not in kinds:
        return None
    if due_at is not None and (row["park_until"] is None or row["park_until"] > due_at):
        return None
    seen_version = row["version"]

    def same_park(tx: sqlite3.Connection, ok: sessions.Ok) -> None:
        if ok.version != seen_version + 1:
            raise _NotDue()

    try:
        return sessions.transition(conn, agent.name, agent.generation,
                                   "working" if agent.mode == "tmux" else "between_turns", actor=actor,
                                   reason=reason, fields={"park_kind": None, "park_until": None}, expect={"parked"},
                                   then=same_park)
    except _NotDue:
        return None


def tell_parent_stopped(tx: sqlite3.Connection, agent: Session, reason: str, previous_state: str) -> int | None:
    """Inside the transaction that completes a stopped agent: its parent's one ``status`` mail.

    A lead or coordinator waiting for the agent's report would otherwise wait forever.
    """
    from overstory.store import mail

    return mail.insert_message(
        tx, sender=agent.name, recipient=agent.parent or "operator", type="status", priority="high",
        subject=f"{agent.name} {reason.removesuffix(' (--force)')}",
        body=f"Agent {agent.name} (task {agent.task_id}) was {reason}; it will not "
             f"report. Its branch {agent.branch or '-'} keeps whatever it committed.",
        payload={"kind": "stopped", "agent": agent.name, "task_id": agent.task_id, "branch": agent.branch,
                 "reason": reason, "previous_state": previous_state, "generation": agent.generation},
        dedup_key=f"stopped:{agent.name}:{agent.generation}")
