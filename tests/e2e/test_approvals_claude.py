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
import re
import typing as t

from agent_helpers import agent_state, mail_rows, wait_for, wait_terminal
from claude_cli import CLAUDE_BIN, claude_env, requires_claude
from conftest import run_ov
from durable_helpers import make_remote, pushes, shared
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
    project.local_config_file.write_text("guards:\n  push_remotes: [origin]\nturns:\n  retry_backoff: 0.2\n"
                                         f"sandbox:\n  writable: [{json.dumps(str(shared(tmp_path)))}]\n")
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
    log = make_remote(project, shared(tmp_path))  # bound writable into the sandbox (config below)
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
    log = make_remote(project, shared(tmp_path))  # bound writable into the sandbox (config below)
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


# ---- a coordinator decides for its child; its other child may not ---------------------------------------

OBJECTIVE = "ship the gate branch"
MODEL = "claude-sonnet-4-5"
GATE_ID = re.compile(r"ov approve (apr-[0-9a-f]+)")


def coordinator_model(body: dict[str, t.Any]) -> Reply:
    text = conversation_text(body)
    last = body["messages"][-1]
    if isinstance(last.get("content"), list) and any(b.get("type") == "tool_result" for b in last["content"]):
        return text_reply("Done for now.")
    if "Type: decision_gate" in text and "ok from the coordinator" not in text:
        return bash(f"ov approve {GATE_ID.findall(text)[-1]} --note 'ok from the coordinator'")
    if OBJECTIVE in text and "ov sling builder" not in text:
        return bash("ov sling builder gate --prompt 'commit and push' --approve 'Bash(git push*)' && "
                    "ov sling scout peek --prompt 'wait for mail'")
    return text_reply("Nothing to act on.")


def children_model(project) -> t.Callable[[dict[str, t.Any]], Reply]:
    builder = model(project, "ov/builder-gate", [])

    def respond(body: dict[str, t.Any]) -> Reply:
        text = conversation_text(body)
        if "To: scout-peek" in text:
            if REPORT_MARK in text:
                return text_reply("Reported.")
            found = GATE_ID.findall(text)
            if found and "may not decide" not in text:
                return bash(f"ov approve {found[-1]}")
            if "may not decide" in text:
                return bash(f"ov mail send --type worker_done --subject {REPORT_MARK} --body refused")
            return text_reply("Waiting for mail.")
        return builder(body)

    return respond


@requires_claude
def test_the_coordinator_approves_its_childs_gate_from_its_turn_and_a_sibling_is_refused(project, tmp_path):
    import yaml

    log = make_remote(project, shared(tmp_path))  # bound writable into the sandbox (config below)
    with MockMessagesAPI(coordinator_model) as coordinator_api, MockMessagesAPI(children_model(project)) as kids:
        project.local_config_file.write_text(yaml.safe_dump({
            "runtime": {"default": "claude", "claude_bin": CLAUDE_BIN or "claude"},
            "turns": {"stall_timeout": 120, "retry_backoff": 0.2}, "guards": {"push_remotes": ["origin"]},
            "sandbox": {"writable": [str(shared(tmp_path))]},
            "providers": {"mockc": {"base_url": coordinator_api.base_url, "api_key_env": "MOCKC_KEY"},
                          "mockk": {"base_url": kids.base_url, "api_key_env": "MOCKK_KEY"}},
            "models": {"coordinator": f"mockc/{MODEL}", "builder": f"mockk/{MODEL}", "scout": f"mockk/{MODEL}"},
        }))
        env = claude_env("http://127.0.0.1:9", tmp_path, extra={"MOCKC_KEY": "sk-mock-c", "MOCKK_KEY": "sk-mock-k"})
        assert run_ov("coordinator", "start", cwd=project.root, env=env).returncode == 0
        assert run_ov("coordinator", "send", OBJECTIVE, cwd=project.root, env=env).returncode == 0
        gate = wait_for(lambda: next(iter(mail_rows(project, type="decision_gate")), None), 180,
                        message="the builder's request")
        assert gate["recipient"] == "coordinator"
        approval_id = json.loads(gate["payload"])["approval_id"]
        builder = wait_terminal(project, "builder-gate", timeout=240)
        assert builder.state == "completed", builder.state_reason
        assert pushes(log) == {"refs/heads/ov/builder-gate": 1}
        sent = run_ov("mail", "send", "--to", "scout-peek", "--subject", f"please run: ov approve {approval_id}",
                      "--body", f"ov approve {approval_id}", cwd=project.root, env=env)
        assert sent.returncode == 0, sent.stderr
        scout = wait_terminal(project, "scout-peek", timeout=180)
        told = "\n".join(conversation_text(r) for r in kids.main_requests)
        run_ov("coordinator", "stop", cwd=project.root, env=env)
    assert scout.state == "completed", scout.state_reason
    conn = open_state(project.state_db)
    try:
        row = dict(conn.execute("SELECT * FROM approvals WHERE id = ?", (approval_id,)).fetchone())
    finally:
        conn.close()
    assert (row["status"], row["decided_by"], row["note"]) == ("approved", "coordinator", "ok from the coordinator")
    assert f"scout-peek may not decide {approval_id}" in told
