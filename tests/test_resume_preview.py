"""`ov resume AGENT --dry-run`: what a retry would do (session, ledger rows, cost), changing nothing.

Real SQLite files, the real `ov` process; the ledger rows are written by the ledger's own code
(``agents.ledger.record_pre``/``record_post``), as a turn's hooks write them.
"""

from __future__ import annotations

import json
import typing as t

from conftest import run_ov
from overstory.agents import ledger
from overstory.guards.policy import ALLOW
from overstory.paths import ProjectPaths
from overstory.store import sessions, turns
from overstory.store.db import write_transaction


def _dump(project: ProjectPaths) -> list[str]:
    from overstory.store.db import open_events, open_state

    found = []
    for opener, path in ((open_state, project.state_db), (open_events, project.events_db)):
        conn = opener(path)
        try:
            found.extend(conn.iterdump())
        finally:
            conn.close()
    return found


def _call(conn: t.Any, ctx: ledger.LedgerContext, command: str, use: str, receipt: str | None) -> None:
    hook = {"hook_event_name": "PreToolUse", "tool_name": "Bash", "tool_input": {"command": command},
            "tool_use_id": use}
    assert ledger.record_pre(conn, hook, ALLOW, ctx).allow
    if receipt is not None:  # else: the turn died before the call's result came back
        ledger.record_post(conn, {**hook, "hook_event_name": "PostToolUse",
                                  "tool_response": {"stdout": receipt, "stderr": ""}}, ctx)


def test_dry_run_says_what_a_retry_would_do_and_changes_nothing(project: ProjectPaths, state_db: t.Any) -> None:
    sessions.create_session(state_db, name="builder-a", capability="builder", task_id="t", runtime="scripted",
                            actor="test", parent="operator")
    agent = sessions.get(state_db, "builder-a")
    assert agent is not None
    sessions.update_fields(state_db, "builder-a", agent.generation, runtime_session_id="sess-1234")
    with write_transaction(state_db):
        turns.start(state_db, "turn-1", agent="builder-a", generation=agent.generation, number=3, attempt=0,
                    resumed=True, started_ms=1, log_dir="/tmp/x")
        turns.finish(state_db, "turn-1", "interrupted", input_tokens=100, output_tokens=10, cost_usd=0.25,
                     tool_calls=4, session_id="sess-1234", error="killed mid-turn")
    ctx = ledger.LedgerContext(agent="builder-a", generation=agent.generation, task="t", turn_id="turn-1",
                               attempt=0, dispatch=(7,), worktree="/wt")
    _call(state_db, ctx, "git push origin ov/a", "u1", "To remote\n * [new branch] ov/a")
    _call(state_db, ctx, "gh pr create --fill", "u2", None)
    _call(state_db, ctx, "git log --oneline -3", "u3", "abc first")
    _call(state_db, ctx, "ov mail send --to operator --subject done", "u4", None)
    before = _dump(project)

    shown = run_ov("resume", "builder-a", "--dry-run", "--json", cwd=project.root)
    assert shown.returncode == 0, shown.stderr
    document = json.loads(shown.stdout)
    assert document["session"] == "sess-1234" and document["estimated_usd"] == 0.25
    assert document["retries_turn"]["id"] == "turn-1" and document["retries_turn"]["next_attempt"] == 1
    assert [(c["tool"], c["action"]) for c in document["calls"]] == [
        ("Bash", "replayed"), ("Bash", "held back"), ("Bash", "re-run"), ("Bash", "re-run")]
    assert document["counts"] == {"replayed": 1, "held back": 1, "re-run": 2}

    text = run_ov("resume", "builder-a", "--dry-run", cwd=project.root)
    assert text.returncode == 0, text.stderr
    assert "nothing was changed" in text.stdout and "resumes scripted session sess-1234" in text.stdout
    assert "retries turn 3 (interrupted: killed mid-turn) as attempt 1" in text.stdout
    assert "1 replayed, 1 held back, 2 re-run" in text.stdout and "$0.2500" in text.stdout
    assert _dump(project) == before, "a dry run writes nothing"

    assert run_ov("resume", "nobody", "--dry-run", cwd=project.root).returncode != 0
    bad = run_ov("resume", "builder-a", "--dry-run", "--add-usd", "5", cwd=project.root)
    assert bad.returncode == 2 and _dump(project) == before
    assert run_ov("resume", "--all", "--dry-run", cwd=project.root).returncode == 2
