"""Headless agents with the REAL Claude Code CLI, driven through the real `ov` commands.

Only the model is mocked (tests/mockapi.py on 127.0.0.1): it cannot run here. The
CLI, its tools, its hooks (our `ov guard`), its sessions and `--resume`, git, SQLite
and every process are real.
"""

from __future__ import annotations

import json
import os
import signal
import time

import yaml

from agent_helpers import agent_state, mail_rows, shared_dir, wait_for, wait_terminal
from claude_cli import CLAUDE_BIN, claude_env, requires_claude
from conftest import run_git, run_ov
from mockapi import MockMessagesAPI, conversation_text, stalled_reply, text_reply, tool_reply
from overstory import procs
from overstory.store.db import open_events, open_state
from runtime_agents import FAILED_RELEASE, GOOD_RELEASE, RELEASE_LEDGER, check_release_receipts, commit_release_script

PROMPT = "Add a greet() function in greet.py and commit it."


def sling(project, tmp_path, api, capability="builder", task="task-42", prompt=PROMPT, **env_extra):
    env = claude_env(api.base_url, tmp_path, extra={"OV_RUNTIME_CLAUDE_BIN": CLAUDE_BIN or "claude", **env_extra})
    result = run_ov("sling", capability, task, "--prompt", prompt, cwd=project.root, env=env)
    assert result.returncode == 0, result.stderr
    return f"{capability}-{task}"


def builder_script(worktree, *, first=None):
    steps = [
        tool_reply("Write", {"file_path": str(worktree / "greet.py"),
                             "content": "def greet(name):\n    return f'hello {name}'\n"}),
        tool_reply("Bash", {"command": "git add greet.py && git commit -q -m 'add greet'", "description": "commit"}),
        tool_reply("Bash", {"command": "ov mail send --type worker_done --subject 'greet added' --body 'greet.py committed'",
                            "description": "report"}),
        text_reply("Done: greet() is committed and reported."),
    ]
    return ([first] if first else []) + steps


def events(project, agent, kind):
    conn = open_events(project.events_db)
    try:
        rows = conn.execute("SELECT tool, data FROM events WHERE agent = ? AND kind = ? ORDER BY id", (agent, kind))
        return [(r[0], json.loads(r[1]) if r[1] else None) for r in rows]
    finally:
        conn.close()


@requires_claude
def test_builder_writes_commits_reports_and_completes(project, tmp_path):
    worktree = project.worktree("builder-task-42")
    commit_release_script(project)
    project.local_config_file.write_text(yaml.safe_dump({"ledger": RELEASE_LEDGER}))
    releases = [tool_reply("Bash", {"command": command, "description": "release"})
                for command in (FAILED_RELEASE, GOOD_RELEASE)]
    with MockMessagesAPI(releases + builder_script(worktree)) as api:
        started = time.monotonic()
        name = sling(project, tmp_path, api)
        agent = wait_terminal(project, name, timeout=90)
        elapsed = time.monotonic() - started
    assert agent.state == "completed", agent.state_reason
    assert elapsed < 60, f"took {elapsed:.1f}s"
    assert "greet.py" in run_git(project.root, "show", "--name-only", "ov/builder-task-42")
    assert [tool for tool, _ in events(project, name, "tool_start")] == ["Bash", "Bash", "Write", "Bash", "Bash"]
    check_release_receipts(project, name)
    results = events(project, name, "turn_result")
    assert results and results[-1][1]["total_cost_usd"] > 0
    assert agent.cost_usd > 0
    done = mail_rows(project, type="worker_done")
    assert len(done) == 1 and done[0]["recipient"] == "operator"
    assert json.loads(done[0]["payload"])["branch"] == "ov/builder-task-42"


@requires_claude
def test_read_only_scout_is_denied_a_write_and_carries_on(project, tmp_path):
    worktree = project.worktree("scout-survey")
    script = [
        tool_reply("Write", {"file_path": str(worktree / "notes.md"), "content": "scout notes\n"}),
        tool_reply("Bash", {"command": "ov mail send --type worker_done --subject findings --body 'nothing to fix'",
                            "description": "report"}),
        text_reply("Reported."),
    ]
    with MockMessagesAPI(script) as api:
        name = sling(project, tmp_path, api, capability="scout", task="survey", prompt="Survey the repo.")
        agent = wait_terminal(project, name, timeout=90)
        seen_after_denial = [conversation_text(r) for r in api.main_requests[1:]]
    assert agent.state == "completed"
    assert not (worktree / "notes.md").exists()
    assert any("read-only" in text for text in seen_after_denial), "the model never saw the guard's reason"
    denials = [d for _, d in events(project, name, "turn_result") for d in d["permission_denials"]]
    assert denials and denials[0]["tool_name"] == "Write"


@requires_claude
def test_mail_between_turns_resumes_the_same_session(project, tmp_path):
    worktree = project.worktree("builder-task-42")
    script = [
        tool_reply("Bash", {"command": "ov mail send --to operator --subject 'which name?' --type question",
                            "description": "ask"}),
        text_reply("Waiting for the operator's answer about the name."),
        *builder_script(worktree),
    ]
    with MockMessagesAPI(script) as api:
        name = sling(project, tmp_path, api)
        wait_for(lambda: (a := agent_state(project, name)) and a.state == "between_turns" and a.turns == 1, 60,
                 message="first turn")
        first_requests = len(api.main_requests)
        sent = run_ov("mail", "send", "--to", name, "--subject", "answer", "--body", "call it greet", cwd=project.root)
        assert sent.returncode == 0, sent.stderr
        agent = wait_terminal(project, name, timeout=90)
        later = api.main_requests[first_requests:]
    assert agent.state == "completed" and agent.turns == 2
    assert later and "Waiting for the operator's answer" in conversation_text(later[0])
    assert "call it greet" in conversation_text(later[0])
    conn = open_state(project.state_db)
    try:
        turns = conn.execute("SELECT session_id, resumed FROM turns WHERE agent = ? ORDER BY started_at", (name,)).fetchall()
    finally:
        conn.close()
    assert len(turns) == 2 and turns[1]["resumed"] == 1 and turns[0]["session_id"] == turns[1]["session_id"]


@requires_claude
def test_stalled_model_makes_a_zombie_with_one_worker_died(project, tmp_path):
    with MockMessagesAPI([stalled_reply(None)]) as api:
        name = sling(project, tmp_path, api, OV_TURNS_STALL_TIMEOUT="4", OV_TURNS_KILL_GRACE="1")
        agent = wait_terminal(project, name, timeout=90)
        conn = open_state(project.state_db)
        try:
            turn = conn.execute("SELECT id, pgid FROM turns WHERE agent = ?", (name,)).fetchone()
        finally:
            conn.close()
        assert agent.state == "zombie" and "stall" in agent.state_reason
        assert not procs.group_members(turn["pgid"]) and not procs.tagged_processes(turn["id"])
    died = mail_rows(project, type="worker_died")
    assert len(died) == 1 and died[0]["recipient"] == "operator"


@requires_claude
def test_sigkill_of_the_turn_loses_no_mail(project, tmp_path):
    worktree = project.worktree("builder-task-42")
    marker_dir, shared = shared_dir(tmp_path)
    marker = marker_dir / "slept-once"
    first = tool_reply("Bash", {"command": f"test -e {marker} || {{ touch {marker}; sleep 60; }}",
                                "description": "long step"})
    with MockMessagesAPI(builder_script(worktree, first=first)) as api:
        name = sling(project, tmp_path, api, OV_TURNS_RETRY_BACKOFF="0.2", **shared)
        wait_for(marker.exists, 60, message="the long tool call")
        agent = agent_state(project, name)
        assert agent.turn_pgid
        os.killpg(agent.turn_pgid, signal.SIGKILL)  # kill -9 -PGID mid-tool-call
        agent = wait_terminal(project, name, timeout=120)
        last_prompt_seen = conversation_text(api.main_requests[-1])
    assert agent.state == "completed", agent.state_reason
    assert mail_rows(project, type="worker_died") == []
    dispatch = mail_rows(project, type="dispatch")
    assert len(dispatch) == 1 and dispatch[0]["read_at"] is not None
    conn = open_state(project.state_db)
    try:
        turns = conn.execute("SELECT id, status FROM turns WHERE agent = ? ORDER BY started_at", (name,)).fetchall()
    finally:
        conn.close()
    assert [t["status"] for t in turns] == ["transient", "ok"]
    retry_prompt = (project.logs_dir / name / turns[1]["id"] / "prompt.txt").read_text()
    assert PROMPT in retry_prompt and PROMPT in last_prompt_seen


@requires_claude
def test_a_background_command_finishing_after_the_turn_is_read_to_the_end(project, tmp_path):
    """A background Bash call that finishes after the model ended its turn makes the same
    claude process run a second turn for the notification and print a second result.
    ov reads that process to EOF: the report sent in the second turn counts, within one
    ov turn, and the cost is the process's running total, not the sum of both results."""
    script = [
        tool_reply("Bash", {"command": "sleep 2; echo bg-done", "description": "build in the background",
                            "run_in_background": True}),
        text_reply("Started the build; waiting for it."),
        tool_reply("Bash", {"command": "ov mail send --type worker_done --subject built --body 'bg-done seen'",
                            "description": "report"}),
        text_reply("Reported."),
    ]
    with MockMessagesAPI(script) as api:
        name = sling(project, tmp_path, api)
        agent = wait_terminal(project, name, timeout=90)
        notified = conversation_text(api.main_requests[2])
    assert agent.state == "completed", agent.state_reason
    assert agent.turns == 1
    assert "<task-notification>" in notified
    results = [data for _, data in events(project, name, "turn_result")]
    assert [r["result_index"] for r in results] == [0, 1]
    assert results[0]["total_cost_usd"] < results[1]["total_cost_usd"]
    assert agent.cost_usd == results[1]["total_cost_usd"]
    assert agent.input_tokens == sum(r["input_tokens"] for r in results)
    done = mail_rows(project, type="worker_done")
    assert len(done) == 1 and done[0]["body"] == "bg-done seen"
