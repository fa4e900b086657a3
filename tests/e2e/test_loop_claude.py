"""`ov loop` with the REAL Claude Code CLI: each iteration is a fresh conversation that carries everything.

Only the model is mocked (tests/mockapi.py on 127.0.0.1): it cannot run here, and only a
scripted model claims the promise too early on demand. The CLI (written against 2.1.330:
`OV_CLAUDE_BIN`), its tools and hooks (`ov guard`), its sessions, git, SQLite and every
process are real; the check is ov's own, run in the worktree.
"""

from __future__ import annotations

import json
import typing as t

from agent_helpers import agent_state, wait_for
from claude_cli import CLAUDE_BIN, claude_env, requires_claude
from conftest import run_git, run_ov
from mockapi import MockMessagesAPI, Reply, assistant_turns, conversation_text, text_reply, tool_reply
from overstory.store.db import open_state

SPEC_MARK = "SPEC-7f2c"
PROGRESS_MARK = "PROGRESS-41aa"
CHECK_MARK = "CHECK-90de"
CHECK_PY = f"import os, sys\nif not os.path.exists('done.txt'):\n    sys.exit('{CHECK_MARK}: done.txt is missing')\n"


@requires_claude
def test_the_second_iteration_is_a_fresh_conversation_with_the_spec_progress_and_check_output(project, tmp_path):
    (project.root / "check.py").write_text(CHECK_PY)
    run_git(project.root, "add", "check.py")
    run_git(project.root, "commit", "-q", "-m", "the loop's check")
    worktree = project.worktree("builder-t1")
    spec = tmp_path / "spec.yaml"
    spec.write_text(f"objective: Create done.txt holding OK ({SPEC_MARK}).\nconstraints: [touch nothing else]\n")

    def respond(body: dict[str, t.Any]) -> Reply:
        text, turns = conversation_text(body), assistant_turns(body)
        if "Iteration 1 of" in text:  # writes its progress, then claims the promise too early
            if turns == 0:
                return tool_reply("Write", {"file_path": str(worktree / ".overstory-progress.md"),
                                            "content": f"# {PROGRESS_MARK}: looked around, nothing made yet\n"})
            return text_reply("All finished. LOOP_DONE")
        if turns == 0:
            return tool_reply("Write", {"file_path": str(worktree / "done.txt"), "content": "OK\n"})
        return text_reply("done.txt is there now. LOOP_DONE")

    with MockMessagesAPI(respond) as api:
        env = claude_env(api.base_url, tmp_path, extra={"OV_RUNTIME_CLAUDE_BIN": CLAUDE_BIN or "claude"})
        started = run_ov("loop", "builder", "t1", "--spec", str(spec), "--check", "python3 check.py",
                         cwd=project.root, env=env)
        assert started.returncode == 0, started.stderr
        agent = wait_for(lambda: (a := agent_state(project, "builder-t1")) and (a.is_terminal or a.state == "parked")
                         and a, 180, interval=0.2, message="the loop to settle")
        requests = api.main_requests
    assert agent.state == "completed", agent.state_reason
    firsts = [body for body in requests if assistant_turns(body) == 0]
    second = [body for body in firsts if "Iteration 2 of" in conversation_text(body)]
    assert len(second) == 1, [conversation_text(b)[:200] for b in firsts]
    opening = second[0]
    roles = [m["role"] for m in opening["messages"]]
    # 2.1.330 puts a role "system" message after the first user message (tests/fixtures/CLAUDE_PROBE_NOTES.md)
    assert roles.count("user") == 1 and "assistant" not in roles, f"a fresh conversation: {roles}"
    assert roles == [m["role"] for m in firsts[0]["messages"]], "shaped like the first iteration's opening"
    text = conversation_text(opening)
    assert SPEC_MARK in text and "touch nothing else" in text, "the spec"
    assert PROGRESS_MARK in text, "the progress file"
    assert f"{CHECK_MARK}: done.txt is missing" in text and "Last check (exit 1)" in text, "the last check's output"
    assert "All finished. LOOP_DONE" not in text, "nothing of the first conversation"

    conn = open_state(project.state_db)
    rows = [dict(r) for r in conn.execute("SELECT * FROM loop_iterations WHERE name = 'builder-t1' ORDER BY number")]
    resumed = [r[0] for r in conn.execute("SELECT resumed FROM turns WHERE agent = 'builder-t1'")]
    conn.close()
    assert [(r["number"], r["promise_seen"], r["check_exit"]) for r in rows] == [(1, 1, 1), (2, 1, 0)]
    assert rows[0]["session_id"] != rows[1]["session_id"] and resumed == [0, 0]
    status = json.loads(run_ov("loop", "status", "builder-t1", "--json", cwd=project.root).stdout)
    assert status["records"][0]["progress"].startswith(PROGRESS_MARK)
