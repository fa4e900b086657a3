"""Approval gates with the REAL Claude Code CLI (issue 17); the model is mocked on 127.0.0.1.

Only the model is mocked (tests/mockapi.py): it cannot run here, and only a scripted
model reliably tries a push and then reacts to ov's answer. The CLI, its Bash tool, its
PreToolUse hook (`ov guard`, where the gate is), its sessions and `--resume`, git with a
local bare remote, SQLite, the agent loop and the `ov` commands are real. The mock
looks into state.db when the model is told to wait: the pending approval must exist
before the turn ends.
"""

from __future__ import annotations

import json
import typing as t

from agent_helpers import agent_state, mail_rows, wait_for, wait_terminal
from claude_cli import CLAUDE_BIN, claude_env, requires_claude
from conftest import run_ov
from durable_helpers import make_remote, pushes
from mockapi import MockMessagesAPI, Reply, conversation_text, text_reply, tool_reply
from overstory.store.db import open_state

REPORT_MARK = "e2e-gate-report"


def bash(command: str) -> Reply:
    return tool_reply("Bash", {"command": command, "description": "step"})


def pending_gates(project) -> list[dict[str, t.Any]]:
    conn = open_state(project.state_db)
    try:
        return [dict(r) for r in conn.execute("SELECT * FROM approvals WHERE status = 'pending'")]
    finally:
        conn.close()


def model(project, branch: str, seen_pending: list[int]) -> t.Callable[[dict[str, t.Any]], Reply]:
    push = f"git push origin {branch}"
    report = f"ov mail send --type worker_done --subject {REPORT_MARK} --body finished"

    def respond(body: dict[str, t.Any]) -> Reply:
        text = conversation_text(body)
        if REPORT_MARK in text:
            return text_reply("Reported; done.")
        if "approved: you may now run" in text:
            return bash(report) if "[new branch]" in text else bash(push)
        if "not before the review" in text:
            return bash(report)  # told why: goes on without the push
        if "waiting for approval" in text:
            seen_pending.append(len(pending_gates(project)))  # the row exists while the turn still runs
            return text_reply("Waiting for approval; ending my turn.")
        if "COMMITTED" not in text:
            return bash("echo hi > gate.txt && git add gate.txt && git commit -qm gate && echo COMMITTED")
        return bash(push)

    return respond


def start(project, tmp_path, api) -> tuple[str, dict[str, str]]:
    project.local_config_file.write_text("guards:\n  push_remotes: [origin]\nturns:\n  retry_backoff: 0.2\n")
    env = claude_env(api.base_url, tmp_path, extra={"OV_RUNTIME_CLAUDE_BIN": CLAUDE_BIN or "claude"})
    result = run_ov("sling", "builder", "gate", "--prompt", "commit and push", "--approve", "Bash(git push*)",
                    cwd=project.root, env=env)
    assert result.returncode == 0, result.stderr
    return "builder-gate", env


def gated_and_parked(project, name: str, seen_pending: list[int]) -> dict[str, t.Any]:
    agent = wait_for(lambda: (a := agent_state(project, name)) and a.state == "parked" and a, 180,
                     message="the agent to park for approval")
    assert agent.park_kind == "approval"
    [gate] = pending_gates(project)
    assert agent.state_reason == f"approval {gate['id']}"
    assert seen_pending and seen_pending[0] == 1, "the pending approval existed before the turn ended"
    gates = mail_rows(project, type="decision_gate")
    assert [(m["recipient"], json.loads(m["payload"])["approval_id"]) for m in gates] == [("operator", gate["id"])]
    return gate


@requires_claude
def test_approve_then_the_next_turn_pushes_exactly_once(project, tmp_path):
    log = make_remote(project, tmp_path)
    seen: list[int] = []
    with MockMessagesAPI(model(project, "ov/builder-gate", seen)) as api:
        name, env = start(project, tmp_path, api)
        gate = gated_and_parked(project, name, seen)
        assert pushes(log) == {}
        done = run_ov("approve", gate["id"], "--note", "go ahead", cwd=project.root, env=env)
        assert done.returncode == 0, done.stderr
        agent = wait_terminal(project, name, timeout=180)
    assert agent.state == "completed", agent.state_reason
    assert pushes(log) == {"refs/heads/ov/builder-gate": 1}
    assert len(mail_rows(project, type="worker_done")) == 1


@requires_claude
def test_reject_then_the_model_hears_why_and_completes_without_the_push(project, tmp_path):
    log = make_remote(project, tmp_path)
    seen: list[int] = []
    with MockMessagesAPI(model(project, "ov/builder-gate", seen)) as api:
        name, env = start(project, tmp_path, api)
        gate = gated_and_parked(project, name, seen)
        done = run_ov("reject", gate["id"], "--reason", "not before the review", cwd=project.root, env=env)
        assert done.returncode == 0, done.stderr
        agent = wait_terminal(project, name, timeout=180)
        told = "\n".join(conversation_text(r) for r in api.main_requests)
    assert agent.state == "completed", agent.state_reason
    assert pushes(log) == {}
    assert "rejected: git push origin ov/builder-gate" in told and "not before the review" in told
