"""`ov diff` and `ov clean` on real agents (scripted runtime: real loops, real git, real worktrees)."""

from __future__ import annotations

import json
import os
import socket
import time
import typing as t
from pathlib import Path

import pytest

from agent_helpers import agent_state, wait_terminal
from conftest import run_git, run_ov
from overstory.paths import ProjectPaths
from overstory.store.db import open_state

DONE = {"bash": 'ov mail send --type worker_done --subject done --body done'}


def sling(project: ProjectPaths, tmp_path: Path, name: str, actions: list[dict[str, t.Any]],
          capability: str = "builder") -> str:
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps({"turns": [{"actions": actions, "result": "ok"}]}))
    result = run_ov("sling", capability, name, "--runtime", "scripted", "--scenario", str(path), "--prompt", "work",
                    cwd=project.root)
    assert result.returncode == 0, result.stderr
    agent = f"{capability}-{name}"
    assert wait_terminal(project, agent).state == "completed"
    return agent


def committed(path: str, text: str) -> list[dict[str, t.Any]]:
    return [{"write": {"path": path, "content": text}}, {"bash": f"git add {path} && git commit -q -m 'add {path}'"}]


# ---- ov diff ---------------------------------------------------------------------------------


def test_diff_shows_commits_and_uncommitted_work_against_the_base_only(project: ProjectPaths, tmp_path: Path) -> None:
    agent = sling(project, tmp_path, "d1", [
        *committed("feature.py", "def feature():\n    return 1\n"),
        {"write": {"path": "scratch.txt", "content": "not committed, not even added\n"}},
        {"edit": {"path": "README.md", "old": "hello", "new": "hello, edited"}},
        DONE,
    ])
    worktree = project.worktree(agent)
    # The base branch moves on after the agent started: that is not the agent's change.
    (project.root / "later.txt").write_text("main moved\n")
    run_git(project.root, "add", "later.txt")
    run_git(project.root, "commit", "-q", "-m", "main moves on")
    status_before = run_git(worktree, "status", "--porcelain")
    index_before = (Path(run_git(worktree, "rev-parse", "--path-format=absolute", "--git-path", "index").strip())
                    .read_bytes())

    result = run_ov("diff", agent, cwd=project.root)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "+++ b/feature.py" in out and "+def feature():" in out, "the commit"
    assert "+++ b/scratch.txt" in out, "the untracked file"
    assert "-hello" in out and "+hello, edited" in out, "the uncommitted edit"
    assert "later.txt" not in out, "the base's own later commits are not the agent's"
    assert ".claude" not in out, "ov's instruction and hook files are not the agent's work"
    assert "\x1b[" not in out, "no colour when not on a terminal"

    stat = run_ov("diff", agent, "--stat", cwd=project.root).stdout
    assert "feature.py" in stat and "scratch.txt" in stat and "README.md" in stat and "3 files changed" in stat
    assert "+def" not in stat
    # The agent's own index and status are untouched.
    assert run_git(worktree, "status", "--porcelain") == status_before
    assert Path(run_git(worktree, "rev-parse", "--path-format=absolute", "--git-path", "index").strip()
                ).read_bytes() == index_before

    # Once the worktree is gone, the branch is what is left to show.
    run_git(project.root, "worktree", "remove", "--force", str(worktree))
    branch_only = run_ov("diff", agent, cwd=project.root).stdout
    assert "+++ b/feature.py" in branch_only and "scratch.txt" not in branch_only


def test_diff_of_an_agent_without_changes_or_without_a_branch(project: ProjectPaths, tmp_path: Path) -> None:
    from overstory.views.diffs import agent_diff

    agent = sling(project, tmp_path, "quiet", [DONE])
    result = run_ov("diff", agent, cwd=project.root)
    assert (result.returncode, result.stdout.strip()) == (0, f"{agent} has no changes against its base")
    conn = open_state(project.state_db)
    try:
        assert agent_diff(project, conn, agent) == "" and agent_diff(project, conn, agent, stat=True) == ""
    finally:
        conn.close()
    missing = run_ov("diff", "nobody", cwd=project.root)
    assert missing.returncode == 1 and missing.stderr.count("\n") == 1 and "no agent named 'nobody'" in missing.stderr
    run_git(project.root, "worktree", "remove", "--force", str(project.worktree(agent)))
    run_git(project.root, "branch", "-D", f"ov/{agent}")
    gone = run_ov("diff", agent, cwd=project.root)
    assert gone.returncode == 1 and "gone" in gone.stderr and "Traceback" not in gone.stderr


def test_diff_pages_on_a_terminal(project: ProjectPaths, tmp_path: Path) -> None:
    """In a real pseudo-terminal the diff goes through $PAGER (here `cat` with a marker)."""
    import pty
    import subprocess

    agent = sling(project, tmp_path, "paged", [*committed("paged.py", "x = 1\n"), DONE])
    pager = tmp_path / "pager.sh"
    pager.write_text("#!/bin/sh\necho PAGER-RAN\ncat\n")
    pager.chmod(0o755)
    main, child = pty.openpty()
    from conftest import ov_command

    proc = subprocess.Popen([*ov_command(), "diff", agent], cwd=project.root, stdin=child, stdout=child, stderr=child,
                            env={**os.environ, "PAGER": str(pager), "NO_COLOR": "1"})
    os.close(child)
    output = b""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            chunk = os.read(main, 65536)
        except OSError:
            break
        if not chunk:
            break
        output += chunk
    proc.wait(timeout=30)
    os.close(main)
    text = output.decode(errors="replace")
    assert "PAGER-RAN" in text and "+x = 1" in text
    assert "\x1b[3" not in text, "NO_COLOR: no colour even on a terminal"


# ---- ov clean --------------------------------------------------------------------------------


def test_clean_dry_run_lists_exactly_what_clean_removes_and_keeps_unmerged_work(project: ProjectPaths,
                                                                                tmp_path: Path) -> None:
    merged = sling(project, tmp_path, "m1", [*committed("m1.txt", "merged\n"), DONE])
    unmerged = sling(project, tmp_path, "u1", [*committed("u1.txt", "not merged\n"), DONE])
    dirty = sling(project, tmp_path, "x1", [{"write": {"path": "wip.txt", "content": "uncommitted\n"}}, DONE])
    run_git(project.root, "merge", "-q", "--no-edit", f"ov/{merged}")
    # An old turn log and a fresh one.
    old_log = project.logs_dir / unmerged / "turn-old"
    old_log.mkdir(parents=True)
    (old_log / "stdout.ndjson").write_text("{}\n")
    month_ago = time.time() - 30 * 86400
    os.utime(old_log / "stdout.ndjson", (month_ago, month_ago))
    os.utime(old_log, (month_ago, month_ago))
    fresh_logs = [p for p in (project.logs_dir / merged).iterdir()]
    assert fresh_logs

    dry = run_ov("clean", "--dry-run", "--json", cwd=project.root)
    assert dry.returncode == 0, dry.stderr
    planned = json.loads(dry.stdout)
    assert {(i["kind"], i["target"]) for i in planned["removed"]} == {("agent", merged), ("logs", str(old_log))}
    assert {i["target"] for i in planned["kept"]} == {unmerged, dirty}
    kept = {i["target"]: i["detail"] for i in planned["kept"]}
    assert "not merged" in kept[unmerged] and "uncommitted" in kept[dirty]
    # The dry run removed nothing.
    assert project.worktree(merged).is_dir() and old_log.is_dir()
    text = run_ov("clean", "--dry-run", cwd=project.root).stdout
    assert f"would remove {merged}: worktree .overstory/worktrees/{merged}, branch ov/{merged}" in text
    assert f"kept {unmerged}:" in text

    done = run_ov("clean", "--json", cwd=project.root)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["removed"] == planned["removed"], "the dry run listed exactly what went"
    assert not project.worktree(merged).exists()
    assert run_git(project.root, "branch", "--list", f"ov/{merged}") == ""
    assert not old_log.exists() and all(p.exists() for p in fresh_logs)
    for name in (unmerged, dirty):
        assert project.worktree(name).is_dir() and run_git(project.root, "branch", "--list", f"ov/{name}")
    assert (project.worktree(dirty) / "wip.txt").read_text() == "uncommitted\n"

    merged_only = json.loads(run_ov("clean", "--merged", "--dry-run", "--json", cwd=project.root).stdout)
    assert merged_only == {"dry_run": True, "removed": [], "kept": []}
    forced = run_ov("clean", "--completed", "--force", cwd=project.root)
    assert forced.returncode == 0, forced.stderr
    assert f"removed {unmerged}:" in forced.stdout and "NOT merged" in forced.stdout
    assert not project.worktree(unmerged).exists() and not project.worktree(dirty).exists()
    assert run_ov("clean", cwd=project.root).stdout.strip() == "nothing to clean"


def test_clean_never_touches_active_agents_and_settles_zombies(project: ProjectPaths, tmp_path: Path,
                                                              state_db: t.Any) -> None:
    from overstory.store import sessions
    from overstory.store.lifecycle import declare_zombie

    gone = sling(project, tmp_path, "z1", [DONE])
    # Make it a zombie as the watchdog would have (completed cannot go back, so use a fresh generation row).
    generation = sessions.create_session(state_db, name="builder-live", capability="builder", task_id="live",
                                         runtime="scripted", actor="test", branch="ov/builder-live")
    assert sessions.transition(state_db, "builder-live", generation, "in_turn", actor="test").ok
    zgen = sessions.create_session(state_db, name="scout-dead", capability="scout", task_id="dead",
                                   runtime="scripted", actor="test")
    found = sessions.get(state_db, "scout-dead")
    assert found is not None and declare_zombie(state_db, found, "silent", actor="test").ok
    result = run_ov("clean", "--json", cwd=project.root)
    removed = {i["target"] for i in json.loads(result.stdout)["removed"] if i["kind"] == "agent"}
    assert removed == {gone, "scout-dead"}
    assert agent_state(project, "builder-live").state == "in_turn"
    assert agent_state(project, "scout-dead").state == "completed" and zgen >= 1


def test_clean_removes_only_a_dead_tmux_socket_of_this_project(project: ProjectPaths, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    from overstory.project.cleanup import socket_path

    monkeypatch.setenv("TMUX_TMPDIR", str(tmp_path))
    path = socket_path(project)
    path.parent.mkdir(parents=True)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(1)
    try:
        env = {"TMUX_TMPDIR": str(tmp_path)}
        live = json.loads(run_ov("clean", "--dry-run", "--json", cwd=project.root, env=env).stdout)
        assert [i for i in live["removed"] if i["kind"] == "socket"] == [], "a server answers: not stale"
    finally:
        listener.close()
    assert path.exists()
    other = path.parent / "ov-someoneelse"
    other.write_text("")
    done = run_ov("clean", cwd=project.root, env={"TMUX_TMPDIR": str(tmp_path)})
    assert f"removed tmux socket with no server behind it: {path}" in done.stdout
    assert not path.exists() and other.exists()


def test_clean_refuses_contradicting_flags(project: ProjectPaths) -> None:
    both = run_ov("clean", "--merged", "--completed", cwd=project.root)
    assert both.returncode == 2 and both.stderr.count("\n") == 1
    assert run_ov("clean", "--merged", "--force", cwd=project.root).returncode == 2
