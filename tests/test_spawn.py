"""`ov sling` is a transaction: a failure at any step leaves nothing behind."""

from __future__ import annotations

import subprocess

import pytest

from agent_helpers import agent_env, loop_processes, wait_terminal
from conftest import run_git, run_ov
from overstory.agents.spawn import FAULT_ENV, SPAWN_STEPS, SlingRequest, sling
from overstory.config.model import load_config
from overstory.errors import AgentExists, InvalidName, SpawnError, UsageError
from overstory.store import sessions
from overstory.store.db import open_state


def _sling(project, environ=None, **kwargs):
    config = load_config(project.config_file, project.local_config_file, environ=environ or {})
    conn = open_state(project.state_db)
    try:
        request = SlingRequest(**{"capability": "builder", "task_id": "t1", "runtime": "scripted", **kwargs})
        return sling(project, config, conn, request, environ=agent_env(**(environ or {})))
    finally:
        conn.close()


def _leftovers(project, name="builder-t1"):
    conn = open_state(project.state_db)
    try:
        rows = conn.execute("SELECT count(*) FROM sessions WHERE name = ?", (name,)).fetchone()[0]
        mail = conn.execute("SELECT count(*) FROM mail WHERE recipient = ?", (name,)).fetchone()[0]
    finally:
        conn.close()
    branches = run_git(project.root, "branch", "--list", f"ov/{name}").strip()
    worktrees = run_git(project.root, "worktree", "list", "--porcelain")
    return {
        "session_rows": rows, "mail": mail, "branch": branches,
        "worktree_registered": str(project.worktree(name)) in worktrees,
        "worktree_dir": project.worktree(name).exists(), "run_dir": (project.run_dir / name).exists(),
        "loops": loop_processes(name, project.root),
    }


NOTHING = {"session_rows": 0, "mail": 0, "branch": "", "worktree_registered": False, "worktree_dir": False,
           "run_dir": False, "loops": []}


@pytest.mark.parametrize("step", [*SPAWN_STEPS, "after_start"])
def test_failure_at_any_step_leaves_nothing_and_retry_works(project, step):
    with pytest.raises(SpawnError, match=step):
        _sling(project, {FAULT_ENV: step})
    assert _leftovers(project) == NOTHING
    result = _sling(project)
    assert result.name == "builder-t1"
    assert wait_terminal(project, "builder-t1").state == "completed"


def test_successful_sling_creates_everything(project):
    result = _sling(project, prompt="do the thing", files=["src/a.py", "work/*.md"])  # the scripted default writes work/
    assert result.branch == "ov/builder-t1" and result.parent == "operator" and result.depth == 0
    worktree = project.worktree("builder-t1")
    instructions = (worktree / ".claude" / "CLAUDE.md").read_text()
    assert "do the thing" in instructions and "src/a.py" in instructions and "ov/builder-t1" in instructions
    # What decides what the agent may do lives in its run dir (read-only in its sandbox), not in its worktree.
    run_dir = project.run_dir / "builder-t1"
    assert "guard" in (run_dir / "settings.json").read_text()
    assert (run_dir / "CLAUDE.md").read_text() == instructions  # the worktree's copy is for humans only
    assert not (worktree / ".claude" / "settings.local.json").exists()
    wait_terminal(project, "builder-t1")
    # The per-agent files never end up in the agent's commits.
    committed = run_git(project.root, "log", "--name-only", "--format=", "main..ov/builder-t1")
    assert ".claude" not in committed and "work/t1.md" in committed
    assert run_git(worktree, "status", "--porcelain").strip() == ""


@pytest.mark.parametrize("name", ["Bad", "-x", ".x", "a b", "a/b", "x" * 65, "", "a..b", "ünï"])
def test_bad_names_are_refused_with_the_rule(project, name):
    with pytest.raises(InvalidName, match="lower-case letters"):
        _sling(project, name=name)
    assert _leftovers(project) == NOTHING


def test_bad_task_id_and_capability(project):
    with pytest.raises(InvalidName, match="task id"):
        _sling(project, task_id="Task 1")
    with pytest.raises(UsageError, match="unknown capability"):
        _sling(project, capability="wizard")


def test_active_agent_is_refused(project):
    _sling(project, scenario=None)
    conn = open_state(project.state_db)
    try:
        agent = sessions.get(conn, "builder-t1")
        assert agent is not None
        if agent.is_terminal:  # finished already: make an active one to collide with
            sessions.create_session(conn, name="builder-t2", capability="builder", task_id="t2",
                                    runtime="scripted", actor="test")
            name, task = "builder-t2", "t2"
        else:
            name, task = "builder-t1", "t1"
    finally:
        conn.close()
    with pytest.raises(AgentExists, match="already active"):
        _sling(project, task_id=task)
    assert name


def test_cli_errors_are_one_line_and_leave_nothing(project, tmp_path):
    for args, expected in [
        (["sling", "builder", "Bad Name", "--runtime", "scripted"], "invalid task id"),
        (["sling", "wizard", "t1", "--runtime", "scripted"], "unknown capability"),
    ]:
        result = run_ov(*args, cwd=project.root)
        assert result.returncode != 0
        assert expected in result.stderr and "Traceback" not in result.stderr
        assert len(result.stderr.strip().splitlines()) == 1
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    result = run_ov("sling", "builder", "t1", "--runtime", "scripted", cwd=outside)
    assert result.returncode == 1 and "no ov project" in result.stderr and "Traceback" not in result.stderr
    assert _leftovers(project) == NOTHING
    ok = run_ov("sling", "builder", "t1", "--runtime", "scripted",
                "--scenario", str(_sleepy(tmp_path)), cwd=project.root)
    assert ok.returncode == 0, ok.stderr
    again = run_ov("sling", "builder", "t1", "--runtime", "scripted", cwd=project.root)
    assert again.returncode == 1 and "already active" in again.stderr
    subprocess.run(["kill", "-TERM", *map(str, loop_processes("builder-t1", project.root))], check=False)


def _sleepy(tmp_path):
    from agent_helpers import write_scenario

    return write_scenario(tmp_path / "sleepy.json", [{"actions": [{"sleep": 30}]}])
