"""`ov resume AGENT --fork` with the REAL Claude Code CLI: the fork continues its source's conversation.

Only the model is mocked (tests/mockapi.py on 127.0.0.1). The CLI, its sessions, `--resume SESSION
--fork-session`, the hooks (`ov guard`), git and SQLite are real. Two CLI runs: the source's one turn,
then the fork's first turn (issue 35: "the fork test shows the forked agent's first request carrying
the source's conversation").
"""

from __future__ import annotations

import json
import typing as t
from pathlib import Path

from agent_helpers import agent_state, wait_terminal
from claude_cli import CLAUDE_BIN, claude_env, requires_claude
from conftest import run_git, run_ov
from mockapi import MockMessagesAPI, Reply, TurnScript, conversation_text, text_reply, tool_reply
from overstory.paths import ProjectPaths
from overstory.store import checkpoints
from overstory.store.db import open_events, open_state

SOURCE_PLAN = "SOURCE-PLAN: parse with recursive descent"


def bash(command: str) -> Reply:
    return tool_reply("Bash", {"command": command, "description": "step"})


def sessions_of(config_dir: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in (config_dir / "projects").rglob("*.jsonl")}


@requires_claude
def test_a_claude_fork_continues_its_sources_conversation_in_a_session_of_its_own(
        project: ProjectPaths, tmp_path: Path) -> None:
    source_script = TurnScript([
        bash("echo one > one.txt && git add one.txt && git commit -qm one"),
        bash("ov mail send --type worker_done --subject 'one added' --body 'one.txt committed'"),
        text_reply(SOURCE_PLAN)])
    fork_script = TurnScript([bash("ov mail send --type worker_done --subject 'tried' --body 'another way'"),
                              text_reply("Done the other way.")], marker="a fork of builder-src")

    def answer(body: dict[str, t.Any]) -> Reply:
        return (fork_script if "a fork of builder-src" in conversation_text(body) else source_script)(body)

    with MockMessagesAPI(answer) as api:
        env = claude_env(api.base_url, tmp_path, extra={"OV_RUNTIME_CLAUDE_BIN": CLAUDE_BIN or "claude"})
        slung = run_ov("sling", "builder", "src", "--prompt", "write a parser for the config format",
                       cwd=project.root, env=env)
        assert slung.returncode == 0, slung.stderr
        source = wait_terminal(project, "builder-src", timeout=120)
        assert source.state == "completed", source.state_reason
        source_dir = project.run_dir / "builder-src" / "claude"
        source_sessions = sessions_of(source_dir)
        source_requests = len(api.main_requests)

        forked = run_ov("resume", "builder-src", "--fork", "--prompt", "try a table-driven parser", cwd=project.root,
                        env=env)
        assert forked.returncode == 0, forked.stderr
        fork = wait_terminal(project, "builder-src-fork1", timeout=120)
        fork_requests = api.main_requests[source_requests:]
    assert fork.state == "completed", fork.state_reason
    # The fork's first request carries the source's conversation: its dispatch, its tool call and its answer.
    first = fork_requests[0]
    said = [(m["role"], conversation_text({"messages": [m]})) for m in first["messages"]]
    source_first = api.main_requests[0]["messages"][0]
    assert first["messages"][0] == source_first, "the source's first user message, as the source sent it"
    assert any(role == "assistant" and "git commit -qm one" in text for role, text in said)
    assert any(role == "assistant" and SOURCE_PLAN in text for role, text in said)
    [note] = [text for role, text in said if role == "user" and "a fork of builder-src" in text]
    assert "try a table-driven parser" in note and SOURCE_PLAN not in note
    # ... through `claude --resume SOURCE --fork-session`, in a session of its own; the source's is untouched.
    conn = open_state(project.state_db)
    try:
        turns = [dict(r) for r in conn.execute("SELECT * FROM turns WHERE agent = ? ORDER BY started_at",
                                                (fork.name,))]
        mark = checkpoints.latest(conn, "builder-src")
        fork_start = checkpoints.of_agent(conn, fork.name)[0]
    finally:
        conn.close()
    assert mark is not None
    command = json.loads((Path(turns[0]["log_dir"]) / "command.json").read_text())
    assert command[command.index("--resume") + 1] == source.runtime_session_id and "--fork-session" in command
    assert fork.runtime_session_id and fork.runtime_session_id != source.runtime_session_id
    assert turns[0]["session_id"] == fork.runtime_session_id
    assert sessions_of(source_dir) == source_sessions, "the source's session files did not change"
    assert agent_state(project, "builder-src").runtime_session_id == source.runtime_session_id
    # On the checkpoint's commit, with where it came from recorded.
    assert fork_start["head"] == mark["head"] == run_git(project.root, "rev-parse", "ov/builder-src").strip()
    fork_of = fork.spec["fork_of"]
    assert (fork_of["agent"], fork_of["parent_run_id"], fork_of["session"]) == (
        "builder-src", mark["turn_id"], source.runtime_session_id)
    assert "its conversation (session" in forked.stdout and "--fork-session" in forked.stdout
    events = open_events(project.events_db)
    try:
        lost = events.execute("SELECT count(*) FROM events WHERE kind = 'session_lost'").fetchone()[0]
    finally:
        events.close()
    assert lost == 0, "a fork's new session is no lost session"
