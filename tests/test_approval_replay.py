"""An approved side effect that already ran is answered from the ledger on a retried turn, before any gate.

Issue 28, item 8: with ``ledger.side_effects: ["Bash(./deploy.sh*)"]`` and ``ov sling ...
--approve 'Bash(./deploy.sh*)'`` the operator approves, ``./deploy.sh`` runs and the ledger
records it; the agent's loop is killed (SIGKILL) in the middle of that turn; the watchdog
re-adopts the agent and retries the turn. The retried ``./deploy.sh`` must get the first run's
result from the ledger (``ledger.replay.side_effect: skip``), not a second ``decision_gate``.

Real parts: `ov sling` and `ov approve` as commands, the agent's loop and the watchdog as
processes, the scripted runtime playing Claude's HTTP hooks against the loop, real git and SQLite.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import typing as t
from pathlib import Path

from conftest import ov_command, run_git, run_ov
from durable_helpers import kill_everything, row, shared, wait_for
from overstory import procs
from overstory.paths import ProjectPaths
from test_watchdog import write_local_config

DEPLOY = "./deploy.sh --prod"
DONE = "ov mail send --type worker_done --subject done --body deployed"


def _deploy_rows(conn: t.Any, name: str) -> list[dict[str, t.Any]]:
    return [dict(r) for r in conn.execute("SELECT * FROM tool_calls WHERE agent = ? AND input LIKE '%deploy.sh%' "
                                          "ORDER BY id", (name,))]


def test_a_retried_turn_gets_an_approved_calls_result_from_the_ledger_not_a_second_gate(
        project: ProjectPaths, state_db: t.Any, tmp_path: Path) -> None:
    outside = shared(tmp_path)
    log = outside / "deploy.log"
    script = project.root / "deploy.sh"
    script.write_text(f"#!/bin/sh\necho \"deployed $*\" >> {log}\necho 'deploy: done'\n")
    script.chmod(0o755)
    run_git(project.root, "add", "deploy.sh")
    run_git(project.root, "commit", "-qm", "a deploy script")
    write_local_config(project, ledger={"side_effects": ["Bash(./deploy.sh*)"]},
                       turns={"retry_backoff": 0.1, "kill_grace": 1, "max_concurrent": 8},
                       watchdog={"interval": 0.3}, sandbox={"writable": [str(outside)]})
    scenario = tmp_path / "deploy.json"
    scenario.write_text(json.dumps({"turns": [
        {"actions": [{"bash": DEPLOY}], "result": "waiting for approval"},
        # The approved turn: deploy, then work long enough to be killed in the middle (once: a retry goes on).
        {"actions": [{"bash": DEPLOY}, {"bash": "sleep 120", "once": "slept"}, {"bash": DONE}], "result": "done"},
    ]}))
    slung = run_ov("sling", "builder", "ship", "--runtime", "scripted", "--scenario", str(scenario),
                   "--approve", "Bash(./deploy.sh*)", "--json", cwd=project.root)
    assert slung.returncode == 0, slung.stderr
    name = json.loads(slung.stdout)["name"]
    watchdog = None
    try:
        wait_for(lambda: row(state_db, name).state == "parked", 60, "the agent to park for its approval")
        [gate] = [dict(r) for r in state_db.execute("SELECT * FROM approvals WHERE agent = ?", (name,))]
        approved = run_ov("approve", gate["id"], cwd=project.root)
        assert approved.returncode == 0, approved.stderr

        # deploy.sh ran and its receipt is in the ledger; the turn is now in its long step: kill its loop.
        wait_for(lambda: [r["status"] for r in _deploy_rows(state_db, name)] == ["denied", "succeeded"], 60,
                 "the approved deploy to run and its receipt to be stored")
        busy = row(state_db, name)
        assert busy.state == "in_turn" and busy.loop_pid
        os.kill(busy.loop_pid, signal.SIGKILL)
        wait_for(lambda: not procs.is_alive(busy.loop_pid, busy.loop_start_ticks), 30, "the loop to die")
        watchdog = subprocess.Popen([*ov_command(), "watchdog"], cwd=project.root, stdout=subprocess.DEVNULL,
                                    stderr=subprocess.DEVNULL)
        settled = wait_for(lambda: ((a := row(state_db, name)).is_terminal or (
            a.state == "parked" and a.loop_pid != busy.loop_pid)) and a, 90, "the retried turn to end")
    finally:
        if watchdog is not None:
            watchdog.terminate()
            watchdog.wait(30)
    try:
        gates = state_db.execute("SELECT subject FROM mail WHERE type = 'decision_gate'").fetchall()
        assert log.read_text().splitlines() == ["deployed --prod"], "deploy.sh ran once"
        assert len(gates) == 1, [g["subject"] for g in gates]
        assert settled.state == "completed", (settled.state, settled.state_reason)
        statuses = [(r["status"], r["replay_of"] is not None) for r in _deploy_rows(state_db, name)]
        assert statuses == [("denied", False), ("succeeded", False), ("skipped_duplicate", True)], statuses
        skipped = _deploy_rows(state_db, name)[-1]
        assert "already succeeded" in skipped["reason"] and "deploy: done" in skipped["reason"]
        assert [r["status"] for r in state_db.execute("SELECT status FROM approvals WHERE agent = ?", (name,))] == \
            ["approved"]
    finally:
        kill_everything(project)


def _ctx(turn: str, dispatch: int, attempt: int = 0) -> t.Any:
    from overstory.agents.ledger import LedgerContext

    return LedgerContext(agent="builder-a", generation=1, task="t", turn_id=turn, attempt=attempt,
                         dispatch=(dispatch,), worktree="/wt")


def _call(conn: t.Any, command: str, use: str, ctx: t.Any, spec: str) -> t.Any:
    from overstory.agents.ledger import gate_and_record
    from overstory.guards.policy import ALLOW

    hook = {"hook_event_name": "PreToolUse", "tool_name": "Bash", "tool_input": {"command": command},
            "tool_use_id": use}
    return gate_and_record(conn, hook, ALLOW, ctx, spec)


def _receipt(conn: t.Any, command: str, use: str, ctx: t.Any, stdout: str) -> None:
    from overstory.agents.ledger import record_post

    record_post(conn, {"hook_event_name": "PostToolUse", "tool_name": "Bash", "tool_input": {"command": command},
                       "tool_use_id": use, "tool_response": {"stdout": stdout, "stderr": ""}}, ctx)


def test_the_ledger_answers_a_replay_before_any_gate_and_a_gate_commits_with_its_row(state_db: t.Any) -> None:
    from overstory.agents.approvals import decide
    from overstory.agents.gate import spec_env

    spec = spec_env([{"match": "Bash(git push*)"}], decider="operator", timeout=60, on_timeout="reject")

    def gates() -> list[str]:
        return [r["status"] for r in state_db.execute("SELECT status FROM approvals ORDER BY requested_at")]

    def mails() -> int:
        return int(state_db.execute("SELECT count(*) FROM mail WHERE type = 'decision_gate'").fetchone()[0])

    push = "git push origin ov/a"
    asked = _call(state_db, push, "u1", _ctx("turn-1", 7), spec)
    assert not asked.allow and "waiting for approval" in asked.reason and (gates(), mails()) == (["pending"], 1)
    decide(state_db, state_db.execute("SELECT id FROM approvals").fetchone()[0], approve=True, by="operator")
    assert _call(state_db, push, "u2", _ctx("turn-2", 8), spec).allow, "approved: it runs once"
    _receipt(state_db, push, "u2", _ctx("turn-2", 8), " * [new branch] ov/a")
    # The turn is retried (its loop was killed): the ledger answers with the first run's result, no second gate.
    retried = _call(state_db, push, "u3", _ctx("turn-3", 8, attempt=1), spec)
    assert not retried.allow and "already succeeded" in retried.reason and "[new branch] ov/a" in retried.reason
    assert (gates(), mails()) == (["approved"], 1)
    statuses = [r["status"] for r in state_db.execute("SELECT status FROM tool_calls ORDER BY id")]
    assert statuses == ["denied", "succeeded", "skipped_duplicate"]

    # Killed while the approved call ran (no receipt): held back once from the ledger, again without a gate;
    # asked for again after that, the uncertain effect waits for a person once more.
    other = "git push origin ov/b"
    _call(state_db, other, "u4", _ctx("turn-4", 20), spec)
    decide(state_db, state_db.execute("SELECT id FROM approvals WHERE status = 'pending'").fetchone()[0],
           approve=True, by="operator")
    assert _call(state_db, other, "u5", _ctx("turn-5", 21), spec).allow
    held = _call(state_db, other, "u6", _ctx("turn-6", 21, attempt=1), spec)
    assert not held.allow and "may already have happened" in held.reason and mails() == 2
    again = _call(state_db, other, "u7", _ctx("turn-6", 21, attempt=1), spec)
    assert not again.allow and "waiting for approval" in again.reason and (gates()[-1], mails()) == ("pending", 3)

    # A gate that cannot be written refuses the call, and the refusal is in the ledger (nothing half-written).
    state_db.execute("DROP TABLE approvals")
    broken = _call(state_db, "git push origin ov/c", "u8", _ctx("turn-7", 30), spec)
    assert not broken.allow and "the request could not be recorded" in broken.reason
    last = state_db.execute("SELECT status, reason FROM tool_calls ORDER BY id DESC LIMIT 1").fetchone()
    assert last["status"] == "denied" and "could not be recorded" in last["reason"] and mails() == 3
