"""Exactly-once side effects and session resume with the REAL Claude Code CLI (model mocked on 127.0.0.1).

Only the model is mocked (tests/mockapi.py): it cannot run here. The CLI, its Bash
tool, its PreToolUse/PostToolUse hooks (`ov guard`, `ov guard --post`), its sessions
and `--resume`, git (with a local bare remote) and SQLite are real. The mock replays
the same calls when a turn is retried, as a model answering the same mail again would:
``TurnScript`` answers by position within the current turn (counted from the last user
message that carries ov's mail), not within the whole conversation.
"""

from __future__ import annotations

import json
import os
import signal
import typing as t
from pathlib import Path

from agent_helpers import agent_state, mail_rows, wait_for, wait_terminal
from claude_cli import CLAUDE_BIN, claude_env, requires_claude
from conftest import run_ov
from durable_helpers import make_remote, pushes, shared
from mockapi import MockMessagesAPI, TurnScript, conversation_text, text_reply, tool_reply
from overstory import procs
from overstory.store import ledger
from overstory.store.db import open_events, open_state

Step = tuple[str, dict[str, t.Any]] | str


def replay_turn(steps: list[Step]) -> TurnScript:
    """The steps as a script played by position within the current turn (see ``TurnScript``)."""
    return TurnScript([text_reply(step) if isinstance(step, str) else tool_reply(step[0], step[1]) for step in steps])


def bash(command: str, what: str = "step") -> tuple[str, dict[str, t.Any]]:
    return ("Bash", {"command": command, "description": what})


def once(marker: Path, then: str) -> str:
    return f"test -e {marker} || {{ touch {marker}; {then}; }}"


def start(project, tmp_path, api, task: str) -> tuple[str, dict[str, str]]:
    local = project.local_config_file
    local.write_text("guards:\n  push_remotes: [origin]\nturns:\n  retry_backoff: 0.2\n  kill_grace: 1\n"
                     f"sandbox:\n  writable: [{json.dumps(str(shared(tmp_path)))}]\n")
    env = claude_env(api.base_url, tmp_path, extra={"OV_RUNTIME_CLAUDE_BIN": CLAUDE_BIN or "claude"})
    result = run_ov("sling", "builder", task, "--prompt", f"work on {task}", cwd=project.root, env=env)
    assert result.returncode == 0, result.stderr
    return f"builder-{task}", env


def kill_turn_group(project, name: str, marker: Path) -> None:
    """SIGKILL the turn's process group (the claude CLI) while the marked tool call runs."""
    wait_for(marker.exists, 120, message="the tool call to start")
    agent = agent_state(project, name)
    assert agent is not None and agent.turn_pgid and procs.group_is_ours(agent.turn_pgid, agent.turn_start_ticks)
    os.killpg(agent.turn_pgid, signal.SIGKILL)


def calls(project, name: str, needle: str) -> list[dict[str, t.Any]]:
    conn = open_state(project.state_db)
    try:
        return [c for c in ledger.calls(conn, agent=name) if needle in c["input"]]
    finally:
        conn.close()


@requires_claude
def test_a_killed_turn_is_retried_without_a_second_push_or_merge_ready(project, tmp_path):
    log = make_remote(project, shared(tmp_path))
    marker = shared(tmp_path) / "slept"
    worktree = project.worktree("builder-push")
    steps: list[Step] = [
        ("Write", {"file_path": str(worktree / "greet.py"), "content": "def greet():\n    return 'hi'\n"}),
        bash("git add greet.py && git commit -qm greet || true", "commit"),
        bash("git push origin ov/builder-push", "push"),
        bash("ov mail send --type merge_ready --subject 'greet ready' --body 'pushed ov/builder-push'", "report"),
        bash(once(marker, "sleep 300"), "long check"),
        bash("ov mail send --type worker_done --subject done --body 'greet pushed'", "report"),
        "Done.",
    ]
    with MockMessagesAPI(replay_turn(steps)) as api:
        name, _ = start(project, tmp_path, api, "push")
        kill_turn_group(project, name, marker)  # after the push and the mail, before the turn's result
        agent = wait_terminal(project, name, timeout=180)
        seen = "\n".join(conversation_text(r) for r in api.main_requests)
    assert agent.state == "completed", agent.state_reason
    assert pushes(log) == {"refs/heads/ov/builder-push": 1}
    assert len(mail_rows(project, type="merge_ready")) == 1
    assert len(mail_rows(project, type="worker_done")) == 1
    push = calls(project, name, "git push")
    assert [(c["attempt"], c["status"]) for c in push] == [(0, "succeeded"), (1, "skipped_duplicate")]
    assert push[1]["replay_of"] == push[0]["id"]
    mail = calls(project, name, "merge_ready")
    assert [(c["attempt"], c["status"]) for c in mail] == [(0, "succeeded"), (1, "skipped_duplicate")]
    # The retried turn's model was told, through the hook's denial, what the crashed attempt did.
    assert "already succeeded in an earlier attempt" in seen and "[new branch]" in seen


@requires_claude
def test_a_side_effect_killed_mid_call_is_warned_not_repeated_and_flagged(project, tmp_path):
    log = make_remote(project, shared(tmp_path))
    marker = shared(tmp_path) / "slept"
    worktree = project.worktree("builder-mid")
    push = bash(f"git push origin ov/builder-mid && {once(marker, 'sleep 300')}", "push")
    steps: list[Step] = [
        ("Write", {"file_path": str(worktree / "greet.py"), "content": "def greet():\n    return 'hi'\n"}),
        bash("git add greet.py && git commit -qm greet || true", "commit"),
        push,
        push,  # told "may already have happened", the model checks and asks again
        bash("ov mail send --type worker_done --subject done --body 'greet pushed'", "report"),
        "Done.",
    ]
    with MockMessagesAPI(replay_turn(steps)) as api:
        name, _ = start(project, tmp_path, api, "mid")
        kill_turn_group(project, name, marker)  # PreToolUse ran and the push happened; PostToolUse never will
        agent = wait_terminal(project, name, timeout=180)
        seen = "\n".join(conversation_text(r) for r in api.main_requests)
    assert agent.state == "completed", agent.state_reason
    assert pushes(log) == {"refs/heads/ov/builder-mid": 1}
    rows = calls(project, name, "git push")
    assert [(c["attempt"], c["status"], c["flagged"]) for c in rows] == [
        (0, "started", False), (1, "denied", True), (1, "succeeded", False)]
    assert "may already have happened" in seen
    # The operator sees the flag: in ov trace, and as an event among `ov watch`'s problems.
    trace = json.loads(run_ov("trace", name, "--json", cwd=project.root).stdout)
    assert [c["id"] for c in trace["flagged"]] == [rows[1]["id"]]
    conn = open_events(project.events_db)
    try:
        from overstory.views.status import recent_problems

        assert [p["agent"] for p in recent_problems(conn) if p["kind"] == "tool_call_flagged"] == [name]
    finally:
        conn.close()


@requires_claude
def test_a_crash_inside_the_first_turn_resumes_the_same_claude_session(project, tmp_path):
    marker = shared(tmp_path) / "slept"
    steps: list[Step] = [
        bash(once(marker, "sleep 300"), "long check"),
        bash("ov mail send --type worker_done --subject done --body finished", "report"),
        "Done.",
    ]
    with MockMessagesAPI(replay_turn(steps)) as api:
        name, _ = start(project, tmp_path, api, "first")
        kill_turn_group(project, name, marker)
        first_session = agent_state(project, name).runtime_session_id
        assert first_session, "the session id is stored as soon as the stream names it, not at the turn's end"
        agent = wait_terminal(project, name, timeout=180)
        retried = api.main_requests[-1]
    assert agent.state == "completed", agent.state_reason
    conn = open_state(project.state_db)
    try:
        turns = [dict(r) for r in conn.execute("SELECT * FROM turns WHERE agent = ? ORDER BY started_at", (name,))]
    finally:
        conn.close()
    assert [(t["status"], t["resumed"]) for t in turns] == [("transient", 0), ("ok", 1)]
    assert turns[0]["session_id"] == turns[1]["session_id"] == first_session
    # The mock saw the first attempt's messages again: the same prompt twice, and the killed call.
    text = conversation_text(retried)
    assert text.count("=== BEGIN MESSAGE #1 ===") == 2, text[:2000]
    assert str(marker) in text
