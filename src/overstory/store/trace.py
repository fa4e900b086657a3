"""One agent's timeline for ``ov trace``: state changes, turns and their attempts, tool calls, mail.

Read-only queries over state.db. Every entry carries ``at`` (milliseconds) and ``kind``;
``timeline`` interleaves them in time order, and the same rows are also grouped by turn
(``turns[*].tool_calls``) for machine readers.
"""

from __future__ import annotations

import sqlite3
import typing as t

from overstory.clock import iso
from overstory.store import checkpoints, ledger
from overstory.store.sessions import agent_not_found

RECEIPT_SUMMARY = 160


def _summary(text: str | None, limit: int = RECEIPT_SUMMARY) -> str | None:
    if text is None:
        return None
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def trace(conn: sqlite3.Connection, agent: str) -> dict[str, t.Any]:
    """Everything ov recorded about ``agent`` (all its generations), grouped and as one timeline."""
    session = conn.execute("SELECT * FROM sessions WHERE name = ?", (agent,)).fetchone()
    turn_rows = conn.execute("SELECT * FROM turns WHERE agent = ? ORDER BY started_at, rowid", (agent,)).fetchall()
    if session is None and not turn_rows:
        raise agent_not_found(conn, agent)
    marks = checkpoints.by_turn(conn, [r["id"] for r in turn_rows])
    calls = ledger.calls(conn, agent=agent, limit=100_000)
    by_turn: dict[str | None, list[dict[str, t.Any]]] = {}
    for call in calls:
        by_turn.setdefault(call["turn_id"], []).append(_call_entry(call))
    turns = [_turn_entry(r, marks.get(r["id"]), by_turn.get(r["id"], [])) for r in turn_rows]
    mail = [_mail_entry(r, agent) for r in conn.execute(
        "SELECT id, sender, recipient, type, subject, created_at, read_at, claimed_by FROM mail "
        "WHERE sender = ? OR recipient = ? ORDER BY id", (agent, agent))]
    states = [{"kind": "state", "at": r["at"], "generation": r["generation"], "from": r["from_state"],
               "to": r["to_state"], "actor": r["actor"], "reason": r["reason"]}
              for r in conn.execute("SELECT * FROM transitions WHERE name = ? ORDER BY id", (agent,))]
    timeline: list[dict[str, t.Any]] = [*states, *mail]
    for turn in turns:
        timeline.append({"kind": "turn_start", "at": turn["started_ms"], "turn_id": turn["id"],
                         "number": turn["number"], "attempt": turn["attempt"], "resumed": turn["resumed"],
                         "session_id": turn["session_id"], "dispatch": turn["dispatch"], "mail_ids": turn["mail_ids"],
                         "head": turn["head_start"], "node": turn["node"]})
        timeline.extend({**call, "kind": "tool_call"} for call in turn["tool_calls"])
        if turn["ended_ms"] is not None:
            timeline.append({"kind": "turn_end", "at": turn["ended_ms"], "turn_id": turn["id"],
                             "status": turn["status"], "error": turn["error"], "cost_usd": turn["cost_usd"],
                             "head": turn["head"], "git_status": turn["git_status"]})
    timeline.extend({**call, "kind": "tool_call"} for call in by_turn.get(None, []))
    order = {"state": 0, "turn_start": 1, "mail": 2, "tool_call": 3, "turn_end": 4}
    timeline.sort(key=lambda e: (e["at"] or 0, order.get(e["kind"], 5)))
    for entry in timeline:
        entry["time"] = iso(entry["at"])
    flagged = [c for c in calls if c["flagged"]]
    return {
        "agent": agent,
        "session": None if session is None else {
            "generation": session["generation"], "state": session["state"], "reason": session["state_reason"],
            "capability": session["capability"], "task_id": session["task_id"], "parent": session["parent"],
            "branch": session["branch"], "runtime": session["runtime"],
            "runtime_session_id": session["runtime_session_id"], "turns": session["turns"],
            "retries": session["retries"], "cost_usd": round(session["cost_usd"], 6)},
        "turns": turns,
        "mail": mail,
        "flagged": [_call_entry(c) for c in flagged],
        "approvals": _approvals(conn, agent),
        "timeline": timeline,
    }


def _approvals(conn: sqlite3.Connection, agent: str) -> list[dict[str, t.Any]]:
    """The agent's approval gates: what it asked for, who decided what, when."""
    from overstory.store.approvals import describe_call

    rows = conn.execute("SELECT * FROM approvals WHERE agent = ? ORDER BY requested_at", (agent,)).fetchall()
    return [{"id": r["id"], "call": describe_call(r["tool"], r["input"]), "status": r["status"],
             "decider": r["decider"], "decided_by": r["decided_by"], "note": r["note"],
             "requested_at": iso(r["requested_at"]), "deadline": iso(r["deadline"]),
             "decided_at": iso(r["decided_at"]) if r["decided_at"] else None,
             "used_at": iso(r["used_at"]) if r["used_at"] else None} for r in rows]


def _turn_entry(row: sqlite3.Row, mark: dict[str, t.Any] | None, calls: list[dict[str, t.Any]]) -> dict[str, t.Any]:
    mark = mark or {}
    return {
        "id": row["id"], "generation": row["generation"], "number": row["number"], "attempt": row["attempt"],
        "status": row["status"], "resumed": bool(row["resumed"]), "session_id": row["session_id"] or
        mark.get("session_id"), "started_ms": row["started_at"], "ended_ms": row["ended_at"],
        "started_at": iso(row["started_at"]), "ended_at": iso(row["ended_at"]),
        "duration_ms": row["ended_at"] - row["started_at"] if row["ended_at"] else None,
        "cost_usd": round(row["cost_usd"], 6), "error": row["error"], "dispatch": mark.get("scope"),
        "mail_ids": mark.get("mail_ids") or [], "head_start": mark.get("head") if mark.get("phase") == "start"
        else None, "head": mark.get("head"), "git_status": mark.get("git_status"),
        "spend_usd": mark.get("cost_usd"), "tool_calls": calls, "node": row["node"],
    }


def _call_entry(call: dict[str, t.Any]) -> dict[str, t.Any]:
    return {
        "at": call["started_at"], "id": call["id"], "turn_id": call["turn_id"], "attempt": call["attempt"],
        "tool": call["tool"], "class": call["class"], "status": call["status"], "duration_ms": call["duration_ms"],
        "exit_code": call["exit_code"], "input": _summary(call["input"], 200),
        "receipt": _summary(call["receipt"]), "reason": _summary(call["reason"], 300),
        "replay_of": call["replay_of"], "flagged": call["flagged"], "source": call["source"],
        "tool_use_id": call["tool_use_id"], "dispatch": call["scope"],
    }


def _mail_entry(row: sqlite3.Row, agent: str) -> dict[str, t.Any]:
    return {"kind": "mail", "at": row["created_at"], "id": row["id"],
            "direction": "out" if row["sender"] == agent else "in", "from": row["sender"], "to": row["recipient"],
            "type": row["type"], "subject": row["subject"], "read_at": iso(row["read_at"]),
            "claimed_by": row["claimed_by"]}
