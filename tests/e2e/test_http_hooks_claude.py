"""Claude's tool-call hooks over HTTP with the REAL Claude Code CLI, through `ov sling` (issue 20).

Only the model is mocked (tests/mockapi.py on 127.0.0.1): it cannot run here. The CLI calls
the agent loop's listener for every PreToolUse; the receipts come from the turn's stream,
which the loop reads. The loop, its sandbox, git and SQLite are real.
"""

from __future__ import annotations

import json

from agent_helpers import agent_state, wait_for, wait_terminal
from claude_cli import CLAUDE_BIN, claude_env, requires_claude
from conftest import run_ov
from mockapi import MockMessagesAPI, conversation_text, text_reply, tool_reply
from overstory.store.db import open_state


def sling(project, tmp_path, api, task: str, **extra: str) -> tuple[str, dict[str, str]]:
    env = claude_env(api.base_url, tmp_path, extra={"OV_RUNTIME_CLAUDE_BIN": CLAUDE_BIN or "claude", **extra})
    result = run_ov("sling", "builder", task, "--prompt", f"work on {task}", cwd=project.root, env=env)
    assert result.returncode == 0, result.stderr
    return f"builder-{task}", env


def ledger(project, agent: str) -> list[dict]:
    conn = open_state(project.state_db)
    try:
        return [dict(r) for r in conn.execute("SELECT * FROM tool_calls WHERE agent = ? ORDER BY id", (agent,))]
    finally:
        conn.close()


@requires_claude
def test_a_claude_builder_is_guarded_through_its_loops_http_hooks(project, tmp_path):
    worktree = project.worktree("builder-http")
    script = [
        tool_reply("Write", {"file_path": str(project.root / "planted.txt"), "content": "x\n"}),
        tool_reply("Write", {"file_path": str(worktree / "greet.py"), "content": "def greet():\n    return 1\n"}),
        tool_reply("Bash", {"command": "git add greet.py && git commit -qm greet", "description": "commit"}),
        tool_reply("Bash", {"command": "ov mail send --type worker_done --subject done --body ok"}),
        text_reply("done"),
    ]
    with MockMessagesAPI(script) as api:
        name, _ = sling(project, tmp_path, api, "http")
        agent = wait_terminal(project, name, timeout=120)
        told = "\n".join(conversation_text(r) for r in api.main_requests)
    assert agent.state == "completed", agent.state_reason
    run_dir = project.run_dir / name
    assert (run_dir / "hook_transport").read_text().startswith("http ")
    hooks = json.loads((run_dir / "settings.http.json").read_text())["hooks"]
    assert hooks["PreToolUse"][0]["hooks"][0]["type"] == "http"
    assert hooks["PreToolUse"][0]["hooks"][0]["onFailure"] == "block"
    assert not (project.root / "planted.txt").exists()
    assert "may only write inside its worktree" in told  # the guard's reason reached the model
    assert set(hooks) == {"PreToolUse"}, "one hook per call: the receipts come from the stream"
    rows = ledger(project, name)
    calls = [(r["tool"], r["status"]) for r in rows]
    assert calls == [("Write", "denied"), ("Write", "succeeded"), ("Bash", "succeeded"), ("Bash", "succeeded")]
    assert rows[1]["receipt"].startswith("File created successfully") and rows[1]["duration_ms"] is not None
    assert [r["exit_code"] for r in rows[2:]] == [0, 0] and rows[3]["receipt"].startswith("sent #")


@requires_claude
def test_a_gone_listener_blocks_the_next_call_and_the_next_turn_gets_a_new_one(project, tmp_path):
    """Fail closed: the listener closes itself after one answer (a test hook in the loop); the next tool
    call cannot be checked and Claude blocks it. The turn ends as usual; the next turn runs with a new
    listener."""
    worktree = project.worktree("builder-gone")
    script = [
        tool_reply("Bash", {"command": "touch first.txt", "description": "one"}),
        tool_reply("Bash", {"command": "touch second.txt", "description": "two"}),
        text_reply("stopping here"),
        tool_reply("Bash", {"command": "touch third.txt", "description": "three"}),
        tool_reply("Bash", {"command": "ov mail send --type worker_done --subject done --body ok"}),
        text_reply("done"),
    ]
    with MockMessagesAPI(script) as api:
        name, env = sling(project, tmp_path, api, "gone", OV_TEST_HOOKS_CLOSE_AFTER="1")
        first_port = wait_for(lambda: (f := project.run_dir / name / "hook_transport").exists() and f.read_text(),
                              60, message="the loop to choose its hooks")
        wait_for(lambda: (a := agent_state(project, name)) and a.turns >= 1 and a.state == "between_turns", 120,
                 message="the first turn to end")
        assert (worktree / "first.txt").exists()
        assert not (worktree / "second.txt").exists(), "a call no hook could check ran"
        told = "\n".join(conversation_text(r) for r in api.main_requests)
        assert "onFailure" in told or "ECONNREFUSED" in told, told[-800:]
        doctor = run_ov("doctor", "--json", cwd=project.root, env=env)
        [hooks] = [c for c in json.loads(doctor.stdout)["checks"] if c["name"] == "hooks"]
        assert f"{name}: http" in hooks["detail"]  # ov doctor says which transport each live agent uses
        sent = run_ov("mail", "send", "--to", name, "--subject", "go on", "--body", "continue", cwd=project.root,
                      env=env)
        assert sent.returncode == 0, sent.stderr
        agent = wait_terminal(project, name, timeout=120)
    assert agent.state == "completed", agent.state_reason
    assert (worktree / "third.txt").exists()
    assert (project.run_dir / name / "hook_transport").read_text() != first_port  # a new listener, a new port
