"""Read-only documents behind the HTTP API and the web page: one agent in detail, an
agent's mail, and what is waiting for the operator.

Never writes; standard library only. Like ``status``, every query is bounded and
served by an index (or walks the newest rows first and stops at its limit).
"""

from __future__ import annotations

import json
import sqlite3
import typing as t

from overstory.clock import iso, now_ms
from overstory.store import approvals, mail_queries, overview, sessions, turns
from overstory.store.lifecycle import PARK_KINDS
from overstory.views.status import agent_entry

# Unread mail of these types to the operator needs a person.
ATTENTION_TYPES = ("question", "escalation", "decision_gate", "worker_died", "merge_failed")
_PRIORITY_NAMES = {0: "low", 1: "normal", 2: "high", 3: "urgent"}


def _turn(row: dict[str, t.Any]) -> dict[str, t.Any]:
    started, ended = row["started_at"], row["ended_at"]
    return {"id": row["id"], "generation": row["generation"], "number": row["number"], "attempt": row["attempt"],
            "status": row["status"], "started_at": iso(started), "ended_at": iso(ended),
            "duration_seconds": round((ended - started) / 1000, 3) if ended is not None else None,
            "input_tokens": row["input_tokens"], "output_tokens": row["output_tokens"],
            "cost_usd": round(row["cost_usd"], 6), "tool_calls": row["tool_calls"], "error": row["error"],
            "node": row.get("node")}


def agent_detail(conn: sqlite3.Connection, name: str, *, turn_limit: int = 20, history_limit: int = 20,
                 now: int | None = None) -> dict[str, t.Any]:
    """`ov status`'s entry for one agent plus its turns, its state history and its spend."""
    agent = sessions.get(conn, name)
    if agent is None:
        raise sessions.agent_not_found(conn, name)
    now = now_ms() if now is None else now
    document = agent_entry(agent, now, mail_queries.pending_indexed(conn, name),
                           node=overview.latest_node(conn, name, agent.generation))
    history = sessions.recent_transitions(conn, name, agent.generation, history_limit)
    document.update({
        "task": agent.spec.get("prompt"), "model": agent.model, "worktree": agent.worktree,
        "base_branch": agent.base_branch, "created_at": iso(agent.created_at), "failed_turns": agent.failed_turns,
        "turn_list": [_turn(r) for r in turns.recent(conn, name, limit=turn_limit)],
        "history": [{"from": r["from_state"], "to": r["to_state"], "actor": r["actor"], "reason": r["reason"],
                     "at": iso(r["at"])} for r in reversed(history)],
        "spend": {"cost_usd": round(agent.cost_usd, 6), "input_tokens": agent.input_tokens,
                  "output_tokens": agent.output_tokens, "turns": agent.turns},
    })
    return document


def _message(row: sqlite3.Row, *, body_limit: int | None = None) -> dict[str, t.Any]:
    body = row["body"] or ""
    if body_limit is not None and len(body) > body_limit:
        body = body[:body_limit] + "…"
    state = "read" if row["read_at"] else ("claimed" if row["claimed_by"] else "unread")
    return {"id": row["id"], "thread_id": row["thread_id"] if row["thread_id"] is not None else row["id"],
            "reply_to": row["reply_to"], "from": row["sender"], "to": row["recipient"], "type": row["type"],
            "priority": _PRIORITY_NAMES.get(row["priority"], str(row["priority"])), "subject": row["subject"],
            "body": body, "payload": json.loads(row["payload"]) if row["payload"] else None,
            "created_at": iso(row["created_at"]), "state": state}


def agent_mail(conn: sqlite3.Connection, name: str, *, limit: int = 50) -> list[dict[str, t.Any]]:
    """The newest ``limit`` messages to or from ``name``, oldest first (its conversation)."""
    received, sent = mail_queries.newest_of(conn, name, limit)
    rows = sorted({r["id"]: r for r in (*received, *sent)}.values(), key=lambda r: r["id"])[-limit:]
    return [_message(r) for r in rows]


def waiting(conn: sqlite3.Connection, *, limit: int = 50) -> dict[str, t.Any]:
    """What needs a person, one item per thing waiting: parked agents and unread mail to the operator that asks
    for something.

    An approval (``/api/approvals``), its ``decision_gate`` mail and its agent's ``parked`` state are one item:
    the approval's, so neither of the other two is listed. A park's own escalation mail goes into its parked
    entry (``mail``). An item goes when it is decided (the approval), resumed (the park, and with it the mail
    that announced it) or stale: mail about an agent that has since ended (a question, an escalation) or that
    was slung again since (any of them)."""
    agents = {a.name: a for a in sessions.list_sessions(conn, include_terminal=True)}
    gated = approvals.agents_waiting(conn)
    parked: dict[str, dict[str, t.Any]] = {
        a.name: {"name": a.name, "capability": a.capability, "task_id": a.task_id, "reason": a.state_reason,
                 "park_kind": a.park_kind, "since": iso(a.updated_at), "mail": []}
        for a in agents.values() if a.state == "parked" and not (a.park_kind == "approval" and a.name in gated)}
    rows = mail_queries.unread_to_operator(conn, ATTENTION_TYPES, limit)
    mail = []
    for row in reversed(rows):
        message = _message(row, body_limit=2000)
        payload = message["payload"] if isinstance(message["payload"], dict) else {}
        about = agents.get(str(payload.get("agent") or row["sender"]))
        if row["type"] == "decision_gate":
            continue  # its approval is the item (or was decided)
        if about is not None:
            if about.created_at > row["created_at"]:
                continue  # slung again since (`ov resume --restart`, a new sling of the name)
            if about.is_terminal and row["type"] in ("question", "escalation"):
                continue  # it has ended: nobody waits for the answer
            if row["type"] == "escalation" and payload.get("kind") and payload.get("kind") == about.park_kind \
                    and about.state == "parked":
                if about.name in parked:
                    parked[about.name]["mail"].append(message)
                continue  # the park's own announcement: part of its parked item
            if row["type"] == "escalation" and payload.get("kind") in PARK_KINDS and about.state != "parked":
                continue  # resumed since
        mail.append(message)
    return {"parked": list(parked.values()), "mail": mail}
