"""A runtime that starts a new session instead of resuming the one ov asked for: recorded and said (issue 32).

A real agent loop on the scripted runtime, whose player is told (``OV_SCRIPTED_FORGET_SESSIONS``) to start
a new session whenever it is asked to resume one, as a CLI whose session store was wiped does.
"""

from __future__ import annotations

import typing as t

import pytest

from overstory.paths import ProjectPaths
from overstory.store import events as event_store
from overstory.store import mail, sessions
from overstory.store.db import open_events
from test_watchdog import (
    cleanup_agents,  # noqa: F401 - fixture
    fast_project,  # noqa: F401 - fixture
    mail_rows,
    repeat_turns,
    row,
    start_agent,
    wait_for,
)


def test_a_session_the_runtime_did_not_resume_is_recorded_and_told(fast_project: ProjectPaths, state_db: t.Any,
                                                                  cleanup_agents: None,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OV_SCRIPTED_FORGET_SESSIONS", "1")
    name = start_agent(fast_project, state_db, "lost", repeat_turns([{"text": "working on it"}]))
    first = wait_for(lambda: (r := row(state_db, name)).state == "between_turns" and r.runtime_session_id and r,
                     timeout=60, what="the first turn")
    assert mail_rows(state_db, recipient="operator", type="escalation") == [], "a first turn resumes nothing"
    mail.send(state_db, sender="operator", to=name, subject="one more thing", body="and the docs")
    told = wait_for(lambda: mail_rows(state_db, recipient="operator", type="escalation"), timeout=60,
                    what="the operator to be told")
    assert len(told) == 1 and "context was lost" in told[0]["subject"] and name in told[0]["subject"]
    assert first.runtime_session_id in told[0]["body"] and "logs: " in told[0]["body"]
    second = wait_for(lambda: (r := row(state_db, name)).runtime_session_id != first.runtime_session_id and r,
                      what="the new session saved")
    events = open_events(fast_project.events_db)
    try:
        lost = event_store.query(events, agent=name, kinds=["session_lost"])
    finally:
        events.close()
    assert len(lost) == 1 and lost[0].data["asked"] == first.runtime_session_id
    assert lost[0].data["started"] == second.runtime_session_id
    queued = state_db.execute("SELECT kind, agent, body FROM notify_outbox WHERE kind = 'session_lost'").fetchall()
    assert [(r["kind"], r["agent"]) for r in queued] == [("session_lost", name)]
    assert sessions.get(state_db, name).generation == first.generation
