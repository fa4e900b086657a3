"""A write scope (`ov sling --files`, issue 31) holds the REAL Claude Code CLI to its files.

Only the model is mocked (tests/mockapi.py on 127.0.0.1). The CLI's Write outside the scope is
refused by the guard (through the loop's HTTP hook), the reason reaches the model, and the
Write inside the scope goes through; the branch that reaches `ov merge` holds only its file.
"""

from __future__ import annotations

from agent_helpers import wait_terminal
from claude_cli import CLAUDE_BIN, claude_env, requires_claude
from conftest import run_git, run_ov
from mockapi import MockMessagesAPI, conversation_text, text_reply, tool_reply
from overstory.store import ledger
from overstory.store.db import open_state


@requires_claude
def test_a_claude_builder_with_files_src_a_py_is_refused_a_write_to_src_b_py(project, tmp_path):
    root = project.root
    (root / "src").mkdir()
    (root / "src" / "a.py").write_text("A = 1\n")
    (root / "src" / "b.py").write_text("B = 1\n")
    run_git(root, "add", "src")
    run_git(root, "commit", "-qm", "src")
    worktree = project.worktree("builder-calc")
    script = [
        tool_reply("Write", {"file_path": str(worktree / "src" / "b.py"), "content": "B = 2\n"}),
        tool_reply("Write", {"file_path": str(worktree / "src" / "a.py"), "content": "A = 2\n"}),
        tool_reply("Bash", {"command": "git add src/a.py && git commit -qm 'a: 2'", "description": "commit"}),
        tool_reply("Bash", {"command": "ov mail send --type worker_done --subject done --body ok"}),
        text_reply("done"),
    ]
    with MockMessagesAPI(script) as api:
        env = claude_env(api.base_url, tmp_path, extra={"OV_RUNTIME_CLAUDE_BIN": CLAUDE_BIN or "claude"})
        slung = run_ov("sling", "builder", "calc", "--prompt", "set A to 2", "--files", "src/a.py",
                       cwd=root, env=env)
        assert slung.returncode == 0, slung.stderr
        agent = wait_terminal(project, "builder-calc", timeout=120)
        told = "\n".join(conversation_text(r) for r in api.main_requests)
    assert agent.state == "completed", agent.state_reason
    assert "outside builder-calc's write scope (src/a.py)" in told  # the guard's reason reached the model
    assert "ov mail send --to operator --type question" in told
    assert (worktree / "src" / "b.py").read_text() == "B = 1\n"
    conn = open_state(project.state_db)
    try:
        calls = [(c["tool"], c["status"]) for c in ledger.calls(conn, agent="builder-calc")]
    finally:
        conn.close()
    assert calls[:2] == [("Write", "denied"), ("Write", "succeeded")]
    assert run_git(root, "diff", "--name-only", "main", "ov/builder-calc").split() == ["src/a.py"]
    merged = run_ov("merge", "builder-calc", cwd=root)
    assert merged.returncode == 0, merged.stdout + merged.stderr
    assert (root / "src" / "a.py").read_text() == "A = 2\n" and (root / "src" / "b.py").read_text() == "B = 1\n"
