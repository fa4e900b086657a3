"""No silent idling: an agent whose turn ended without its report is nudged, then escalated.

A non-persistent agent that sits ``between_turns`` with no mail waiting, whose last
turn ended cleanly without its terminal mail (``worker_done``…), and that is not
waiting for anyone (no active children, no unanswered question, escalation or
decision gate of its own) gets a ``nudge`` mail from ov after ``turns.idle_nudge``
seconds; the nudge starts its next turn. After ``turns.max_nudges`` nudges its parent
gets one ``escalation`` and the agent becomes ``stalled`` with reason ``no report``.
Mail from anyone but ov (an answer, a new instruction) gives it its nudges back.

Crash safety: the nudge and its counter are written in one transaction (a nudge is
never sent twice for the same count), and the escalation is written inside the
compare-and-swap that stalls the agent, so exactly one is ever sent per stall.
"""

from __future__ import annotations

import typing as t

from overstory.store import sessions
from overstory.store.db import write_transaction
from overstory.store.lifecycle import PERSISTENT_CAPABILITIES
from overstory.store.sessions import Session
from overstory.store.sqlite_module import sqlite3

NUDGE_SENDER = "ov"
NO_REPORT = "no report"
WAITING_TYPES = ("question", "escalation", "decision_gate")


def nudge_text(agent: Session) -> tuple[str, str]:
    terminal = "merged` or `merge_failed" if agent.capability == "merger" else "worker_done"
    return ("your turn ended without a report",
            f"[ov] Your last turn ended without `{terminal}`, and nobody is waiting on an answer from you. "
            f"Finish the task and report it (`ov mail send --type {terminal.split('`')[0]} ...`), or report what "
            "blocks you with `ov mail send --type question` or `--type escalation`.")


def waiting_for_others(conn: sqlite3.Connection, agent: Session) -> bool:
    """Idling is legitimate: it has active children, or its last question is unanswered."""
    from overstory.store import mail_queries

    if sessions.has_active_children(conn, agent.name):
        return True
    asked = mail_queries.last_asked(conn, agent.name, WAITING_TYPES, agent.created_at)
    if asked is None:
        return False
    return not mail_queries.answered_after(conn, agent.name, asked, NUDGE_SENDER)


def check(conn: sqlite3.Connection, agent: Session, *, idle_nudge: float, max_nudges: int, now: int) -> str | None:
    """Nudge or escalate ``agent`` if it idles without a report; returns what was done ('nudged'/'escalated')."""
    if agent.capability in PERSISTENT_CAPABILITIES or agent.mode != "headless" or agent.state != "between_turns":
        return None
    from overstory.store import turns

    last = turns.last_started(conn, agent.name, agent.generation)
    if last is None or last["status"] != "ok" or last["ended_at"] is None:
        return None
    if now - last["ended_at"] < idle_nudge * 1000 or waiting_for_others(conn, agent):
        return None
    if agent.nudges >= max_nudges:
        return "escalated" if escalate(conn, agent) else None
    return "nudged" if nudge(conn, agent) else None


def nudge(conn: sqlite3.Connection, agent: Session) -> int | None:
    """One nudge mail and the counter, in one transaction; the mail id (None if someone else did it)."""
    from overstory.store import mail

    subject, body = nudge_text(agent)
    with write_transaction(conn):
        if not sessions.count_nudge(conn, agent.name, agent.generation, agent.nudges):
            return None
        message_id = mail.insert_message(conn, sender=NUDGE_SENDER, recipient=agent.name, type="nudge",
                                         priority="high", subject=subject, body=body,
                                         payload={"kind": "idle_nudge", "nudge": agent.nudges + 1},
                                         dedup_key=f"idle_nudge:{agent.name}:{agent.generation}:{agent.nudges + 1}")
    if message_id is not None:
        mail.record_sent(conn, [message_id])
    return message_id


def escalate(conn: sqlite3.Connection, agent: Session) -> bool:
    """``stalled`` (no report) and the parent's one escalation, in the same compare-and-swap."""
    from overstory.store import mail

    sent: list[int] = []

    def tell_parent(tx: sqlite3.Connection, ok: sessions.Ok) -> None:
        message_id = mail.insert_message(
            tx, sender=agent.name, recipient=agent.parent or "operator", type="escalation", priority="high",
            subject=f"{agent.name} stopped without reporting",
            body=(f"Agent {agent.name} (task {agent.task_id}) ended its turns without a report even after "
                  f"{agent.nudges} nudge(s) from ov, and is not waiting for anyone. It is marked stalled (no report). "
                  f"Mail it what to do (`ov mail send --to {agent.name} ...`), or stop it (`ov stop {agent.name}`)."),
            payload={"severity": "warning", "agent": agent.name, "task_id": agent.task_id, "kind": "no_report",
                     "reason": NO_REPORT, "details": {"nudges": agent.nudges}},
            dedup_key=f"no_report:{agent.name}:{agent.generation}:{ok.version}")
        if message_id is not None:
            sent.append(message_id)

    outcome = sessions.transition(conn, agent.name, agent.generation, "stalled", actor="ov", reason=NO_REPORT,
                                  expect={"between_turns"}, then=tell_parent)
    if outcome.ok and sent:
        mail.record_sent(conn, sent)
    return outcome.ok


def reset_if_spoken_to(conn: sqlite3.Connection, agent: Session, senders: t.Iterable[str]) -> None:
    """Mail from anyone but ov gives the agent its nudges back."""
    if agent.nudges and any(sender != NUDGE_SENDER for sender in senders):
        sessions.update_fields(conn, agent.name, agent.generation, nudges=0)
