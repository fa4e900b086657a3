"""The runtime session a turn runs in, saved the moment its stream names it; and a lost context said out loud.

ov asks a runtime to resume the agent's session (`claude --resume ID`, `codex exec resume ID`, ...). A
runtime that cannot (the session file is gone, the CLI was upgraded, another machine) may start a new
session instead and carry on with none of the agent's earlier context. That is recorded (a
``session_lost`` event) and the operator is told (an escalation mail and a ``session_lost``
notification, written in one transaction, deduplicated per agent generation and lost session).

The notice is written before the new id is saved: a turn killed in between resumes the old id again, and
the runtime's next new session finds the notice already there (its dedup key). Killed after both, the
retried turn resumes the new session, which is no loss.
"""

from __future__ import annotations

from overstory.store import checkpoints, mail, outbox, sessions
from overstory.store import events as event_store
from overstory.store import turns as turn_rows
from overstory.store.db import write_transaction
from overstory.store.sessions import Session
from overstory.store.sqlite_module import sqlite3

SENDER = "ov"


def note_session(state: sqlite3.Connection, events: sqlite3.Connection, agent: Session, turn_id: str,
                 session_id: str, *, asked: str | None) -> str:
    """Save ``session_id`` for the agent and its turn; first, if ov asked to resume ``asked`` and the runtime
    started another session, record the loss and tell the operator. Returns ``session_id``."""
    if asked and session_id != asked:
        _tell(state, events, agent, turn_id, asked, session_id)
    turn_rows.set_session_id(state, turn_id, session_id)
    checkpoints.set_session(state, turn_id, session_id)
    sessions.update_fields(state, agent.name, agent.generation, runtime_session_id=session_id)
    return session_id


def _tell(state: sqlite3.Connection, events: sqlite3.Connection, agent: Session, turn_id: str, asked: str,
          started: str) -> None:
    logs = turn_rows.log_dir_of(state, turn_id)
    subject = f"{agent.name}: its {agent.runtime} session was not resumed; the context was lost"
    body = (f"ov asked {agent.runtime} to resume session {asked} for {agent.name} (turn {turn_id}); it started a new "
            f"session {started} instead, so the agent goes on without what it knew (its branch and mail are intact). "
            f"Check its work with `ov trace {agent.name}` / `ov diff {agent.name}`; if it starts over, stop it and "
            f"`ov resume {agent.name} --restart` (its dispatch then lists what was done)."
            + (f"\nlogs: {logs}" if logs else ""))
    key = f"session_lost:{agent.name}:{agent.generation}:{asked}"
    event_store.record(events, "session_lost", agent=agent.name, generation=agent.generation, turn_id=turn_id,
                       summary=f"asked to resume {asked}, the runtime started {started}",
                       data={"asked": asked, "started": started, "logs": logs})
    with write_transaction(state):
        mail.insert_message(state, sender=SENDER, recipient="operator", type="escalation", priority="high",
                            subject=subject[:200], body=body,
                            payload={"severity": "warning", "agent": agent.name, "kind": "session_lost"},
                            dedup_key=key)
        outbox.enqueue(state, key, "session_lost", agent.name, f"ov: {subject}"[:200], body)
