"""`ov resume AGENT --dry-run`: what a retry of AGENT would do, read from the database, changing nothing.

A retry (an un-parked agent's next turn, or a turn that died and is tried again) resumes
the agent's runtime session (``runtime_session_id``; none: a fresh session) and carries
the mail it is given. When the newest turn did not end ``ok``, the retry is its next
attempt, and that turn's tool calls meet the ledger's replay policy (config
``ledger.replay``, ``agents.ledger``): each recorded effect is shown with what the next
attempt would do if the model makes the same call again:

- ``replayed``: a side effect that succeeded is not run again; the model gets its receipt;
- ``held back``: a side effect that started without a receipt is refused once (it may
  have happened), and one whose class's policy is ``ask`` waits for a person;
- ``re-run``: reads and local writes (policy ``rerun``), and side effects that are
  idempotent themselves (`ov mail send`, `ov sling`), run again.

The cost estimate is the newest turn's cost: a retry that resumes the session re-reads
about as much context as that turn did. Budget limits that would keep the agent parked
are named, as `ov resume` would refuse them.
"""

from __future__ import annotations

import json
import sqlite3
import typing as t

from overstory.agents.ledger import DEFAULT_REPLAY
from overstory.store import budgets, mail, sessions, turns
from overstory.store import ledger as ledger_store

if t.TYPE_CHECKING:
    from overstory.config.model import Config

EFFECT_STATUSES = ("succeeded", "started")  # the rows a retried call is matched against (``store.ledger.begin``)


def _verdict(row: t.Mapping[str, t.Any], replay: t.Mapping[str, str], rules: t.Any) -> tuple[str, str]:
    from overstory.guards.classify import reruns_safely

    policy = replay.get(row["class"], DEFAULT_REPLAY.get(row["class"], "rerun"))
    if row["status"] not in EFFECT_STATUSES:
        return "re-run", f"it {row['status'].replace('_', ' ')} before: nothing happened, so it runs if asked again"
    if policy == "rerun":
        return "re-run", f"a {row['class']} call (policy rerun)"
    if policy == "ask":
        return "held back", f"a {row['class']} call (policy ask): it waits for a person's approval"
    if row["status"] == "succeeded":
        return "replayed", "it succeeded before: not run again, the model gets its receipt"
    try:
        tool_input = json.loads(row["input"])
    except ValueError:
        tool_input = None
    if isinstance(tool_input, dict) and reruns_safely(row["tool"], tool_input, rules):
        return "re-run", "its result never came back, but the command is idempotent itself"
    return "held back", "its result never came back, so it may have happened: refused once, with a warning"


def preview(conn: sqlite3.Connection, config: Config, name: str) -> dict[str, t.Any]:
    """The document `ov resume AGENT --dry-run` prints; reads only."""
    from overstory.agents.ledger import LedgerPolicy
    from overstory.guards.classify import DEFAULT_LEDGER_RULES

    agent = sessions.get(conn, name)
    if agent is None:
        raise sessions.agent_not_found(conn, name)
    newest: dict[str, t.Any] | None = next(
        (row for row in turns.recent(conn, name, limit=50) if row["generation"] == agent.generation), None)
    retried = newest if newest is not None and newest["status"] not in ("ok", "running") else None
    policy = LedgerPolicy(tuple(config.ledger.read_only), tuple(config.ledger.side_effects),
                          dict(config.ledger.replay))  # as the turn's hooks get it (``agents.turns.durable_env``)
    rules = policy.rules() or DEFAULT_LEDGER_RULES
    replay = policy.replay
    calls = []
    if retried is not None:
        for row in ledger_store.calls(conn, agent=name, turn_ids=[str(retried["id"])]):
            action, why = _verdict(row, replay, rules)
            calls.append({"id": row["id"], "tool": row["tool"], "class": row["class"], "status": row["status"],
                          "input": ledger_store.trim(row["input"], 200), "action": action, "why": why})
    crossing = budgets.check(conn, name, agent.generation, starting_turn=True) if not agent.is_terminal else None
    cost = float(newest["cost_usd"] or 0) if newest is not None else None
    return {
        "agent": name, "generation": agent.generation, "state": agent.state, "park_kind": agent.park_kind,
        "can_resume": not agent.is_terminal and crossing is None,
        "blocked_by": crossing.reason if crossing is not None else (
            f"{name} is {agent.state}: there is nothing to resume" if agent.is_terminal else None),
        "session": agent.runtime_session_id, "runtime": agent.runtime,
        "retries_turn": None if retried is None else {
            "id": retried["id"], "number": retried["number"], "attempt": retried["attempt"],
            "status": retried["status"], "error": retried["error"], "next_attempt": int(retried["attempt"]) + 1},
        "pending_mail": mail.pending_count(conn, name),
        "calls": calls,
        "counts": {action: sum(1 for c in calls if c["action"] == action)
                   for action in ("replayed", "held back", "re-run")},
        "estimated_usd": cost,
        "estimate_basis": None if newest is None else f"the cost of turn {newest['number']} (its newest)",
    }


def summary_lines(document: t.Mapping[str, t.Any]) -> list[str]:
    name = document["agent"]
    lines = [f"dry run: nothing was changed. A retry of {name} ({document['state']}"
             + (f", parked: {document['park_kind']}" if document["park_kind"] else "") + "):"]
    if document["blocked_by"]:
        lines.append(f"  it would not run now: {document['blocked_by']}")
    session = document["session"]
    lines.append(f"  session: resumes {document['runtime']} session {session}" if session
                 else f"  session: none recorded; it starts a fresh {document['runtime']} session")
    turn = document["retries_turn"]
    if turn is not None:
        lines.append(f"  retries turn {turn['number']} ({turn['status']}"
                     + (f": {turn['error']}" if turn["error"] else "") + f") as attempt {turn['next_attempt']}")
    else:
        lines.append("  its newest turn ended ok: the next turn is new work, not a retry")
    lines.append(f"  mail waiting for it: {document['pending_mail']}")
    if document["calls"]:
        counts = document["counts"]
        lines.append(f"  tool calls of that turn: {counts['replayed']} replayed, {counts['held back']} held back, "
                     f"{counts['re-run']} re-run")
        for call in document["calls"]:
            lines.append(f"    #{call['id']} {call['action']:<9} {call['tool']} {call['input']}  ({call['why']})")
    elif turn is not None:
        lines.append("  tool calls of that turn: none recorded")
    cost = document["estimated_usd"]
    lines.append("  cost: unknown (no turn yet)" if cost is None
                 else f"  cost: about ${cost:.4f} ({document['estimate_basis']})")
    return lines
