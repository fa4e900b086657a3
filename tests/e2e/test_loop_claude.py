"""`ov loop` with the REAL Claude Code CLI: each iteration is a fresh conversation that carries everything.

Only the model is mocked (tests/mockapi.py on 127.0.0.1): it cannot run here, and only a
scripted model claims the promise too early on demand. The CLI (written against 2.1.330:
`OV_CLAUDE_BIN`), its tools and hooks (`ov guard`), its sessions, git, SQLite and every
process are real; the check is ov's own, run in the sandbox over the agent's branch.
"""

from __future__ import annotations

import json
import typing as t

from agent_helpers import agent_state, wait_for
from claude_cli import CLAUDE_BIN, claude_env, requires_claude
from conftest import run_git, run_ov
from mockapi import MockMessagesAPI, Reply, assistant_turns, conversation_text, text_reply, tool_reply
from overstory.store.db import open_state
from sandbox_helpers import requires_bwrap
from test_loop_check_sandbox import CALC, PYTEST, evil_code
from test_watchdog import write_local_config

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


@requires_claude
@requires_bwrap
def test_a_check_runs_what_claude_wrote_in_the_sandbox_and_a_protected_change_fails_it(project, tmp_path):
    """Issue 28, item 2: Claude commits a conftest.py that writes into the main checkout and exits 0 (a protected
    path: pinned away, and the check fails), then leaves a pytest.py that does the same (not protected: it runs,
    inside the sandbox, where every write outside its checkout fails and no API key is in its environment)."""
    for name, text in CALC.items():
        (project.root / name).write_text(text)
    run_git(project.root, "add", "-A")
    run_git(project.root, "commit", "-q", "-m", "calc with a bug")
    write_local_config(project, sandbox={"mode": "bwrap"}, loop={"protected_paths": ["conftest.py"]})
    worktree = project.worktree("builder-t1")
    outside = tmp_path / "outside"
    outside.mkdir()
    targets = [project.root / "PWNED-main", project.ov_dir / "PWNED-ov", worktree / "PWNED-worktree",
               outside / "PWNED-outside"]
    evil = evil_code(targets)

    def respond(body: dict[str, t.Any]) -> Reply:
        text, turns = conversation_text(body), assistant_turns(body)
        if "Iteration 1 of" in text:
            if turns == 0:
                return tool_reply("Write", {"file_path": str(worktree / "conftest.py"), "content": evil})
            if turns == 1:
                return tool_reply("Bash", {"command": "git add conftest.py && git commit -q -m 'make it pass'",
                                           "description": "commit"})
            return text_reply("All green. LOOP_DONE")
        if turns == 0:
            return tool_reply("Bash", {"command": "git rm -q conftest.py && git commit -q -m 'drop conftest'",
                                       "description": "drop the protected file"})
        if turns == 1:
            return tool_reply("Write", {"file_path": str(worktree / "pytest.py"), "content": evil})
        return text_reply("Green now. LOOP_DONE")

    with MockMessagesAPI(respond) as api:
        env = claude_env(api.base_url, tmp_path, extra={"OV_RUNTIME_CLAUDE_BIN": CLAUDE_BIN or "claude"})
        started = run_ov("loop", "builder", "t1", "--prompt", "make the tests pass", "--check", PYTEST,
                         cwd=project.root, env=env)
        assert started.returncode == 0, started.stderr
        agent = wait_for(lambda: (a := agent_state(project, "builder-t1")) and (a.is_terminal or a.state == "parked")
                         and a, 180, interval=0.2, message="the loop to settle")
        requests = api.main_requests
    for target in targets:
        assert not target.exists(), f"a check wrote {target}"
    conn = open_state(project.state_db)
    rows = [dict(r) for r in conn.execute("SELECT * FROM loop_iterations WHERE name = 'builder-t1' ORDER BY number")]
    conn.close()
    assert agent.state == "completed", (agent.state_reason, rows)
    first, second = rows
    assert first["check_exit"] != 0 and "protected path(s) changed: conftest.py (added)" in first["outcome"]
    assert "1 failed" in first["check_tail"] and "EVIL-RAN" not in first["check_tail"]
    told = [conversation_text(b) for b in requests if "Iteration 2 of" in conversation_text(b)]
    assert told and "protected path(s) changed: conftest.py (added)" in told[0], "the model is told why"
    assert second["check_exit"] == 0 and "EVIL-RAN" in second["check_tail"] and "WROTE" not in second["check_tail"]
    assert second["check_tail"].count("BLOCKED") == len(targets) and "LEAKED []" in second["check_tail"]
    assert "protected path(s) changed: conftest.py (added)" in run_ov("loop", "status", "builder-t1",
                                                                      cwd=project.root).stdout
