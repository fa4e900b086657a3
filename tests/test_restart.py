"""`ov resume NAME --restart`: a stopped or zombie agent slung again under its own name (issue 32).

Real agent loops on the scripted runtime, real git, real SQLite, the real `ov` command; the
half-way kill is a real SIGKILL of `ov resume --restart` inside the spawn's session step.
"""

from __future__ import annotations

import json
import typing as t
from pathlib import Path

import pytest

from conftest import run_git, run_ov
from durable_helpers import shared
from overstory.paths import ProjectPaths
from overstory.store import sessions
from test_watchdog import (
    REPORT_DONE,
    cleanup_agents,  # noqa: F401 - fixture
    mail_rows,
    repeat_turns,
    row,
    start_agent,
    wait_for,
    write_local_config,
)

pytestmark = pytest.mark.slow


@pytest.fixture
def fast_project(project: ProjectPaths, tmp_path: Path) -> ProjectPaths:
    """test_watchdog's, with a shared directory for the scenario's `once` markers writable in the sandbox."""
    write_local_config(project, turns={"retry_backoff": 0.05, "kill_grace": 1, "stall_timeout": 120,
                                       "max_retries": 3, "max_concurrent": 8},
                       watchdog={"interval": 0.2, "stale_after": 300, "zombie_after": 900},
                       sandbox={"writable": [str(shared(tmp_path))]})
    return project


@pytest.fixture
def marks(fast_project: ProjectPaths, tmp_path: Path) -> Path:
    return shared(tmp_path)


def log(project: ProjectPaths, branch: str) -> list[str]:
    return run_git(project.root, "log", "--format=%s", branch).split("\n")


def test_a_stopped_agent_restarts_on_its_branch_in_a_fresh_session(project: ProjectPaths, state_db: t.Any,
                                                                   marks: Path, cleanup_agents: None) -> None:
    scenario = repeat_turns([
        {"bash": "echo one > one.txt && git add one.txt && git commit -q -m 'first part'", "once": str(marks / "a")},
        {"write": {"path": "scratch.txt", "content": "a draft\n"}, "once": str(marks / "b")},
        {"bash": "sleep 60", "once": str(marks / "c")},  # the first session is stopped here
        {"bash": "echo two > two.txt && git add two.txt && git commit -q -m 'second part'"},
        REPORT_DONE,
    ])
    name = start_agent(project, state_db, "r1", scenario)
    wait_for(lambda: (r := row(state_db, name)).current_tool == "Bash" and (marks / "c").exists() and r,
             what="the first session's sleep")
    first = row(state_db, name)
    assert run_ov("stop", name, cwd=project.root).returncode == 0
    refused = run_ov("sling", "builder", "r1", "--runtime", "scripted", cwd=project.root)
    assert refused.returncode != 0 and "--restart" in refused.stderr, "the old way still says what to do"

    done = run_ov("resume", name, "--restart", "--json", cwd=project.root)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["previous_state"] == "completed" and report["generation"] == first.generation + 1
    assert report["branch"] == f"ov/{name}" and report["commits"][0].endswith("first part")
    assert report["uncommitted"] == ["?? scratch.txt"]
    assert Path(report["archived_run_dir"]).is_dir(), "the earlier run's logs are kept"
    dispatch = mail_rows(state_db, recipient=name, type="dispatch")[-1]
    assert "restarted" in dispatch["body"] and "first part" in dispatch["body"] and "scratch.txt" in dispatch["body"]
    wait_for(lambda: row(state_db, name).state == "completed", timeout=60, what="the restarted agent to finish")
    final = row(state_db, name)
    assert final.state_reason and "stopped" not in final.state_reason
    assert final.runtime_session_id and final.runtime_session_id != first.runtime_session_id, "a fresh session"
    assert log(project, f"ov/{name}")[:2] == ["second part", "first part"], "one branch, both parts"
    assert (Path(final.worktree or "") / "scratch.txt").read_text() == "a draft\n", "the worktree went on"
    again = run_ov("resume", name, "--restart", cwd=project.root)
    assert again.returncode == 2 and "completed its task" in again.stderr


def test_a_restart_killed_half_way_keeps_the_work_and_runs_again(project: ProjectPaths, state_db: t.Any,
                                                                 marks: Path, cleanup_agents: None) -> None:
    from overstory.store.lifecycle import declare_zombie

    name = start_agent(project, state_db, "r2", repeat_turns([REPORT_DONE]), start=False)
    agent = row(state_db, name)
    (Path(agent.worktree or "") / "work.txt").write_text("work\n")
    run_git(Path(agent.worktree or ""), "add", "work.txt")
    run_git(Path(agent.worktree or ""), "commit", "-q", "-m", "work so far")
    assert declare_zombie(state_db, agent, "silent", actor="test").ok
    # Killed inside the spawn's session step: the new session row has just replaced the zombie's.
    killed = run_ov("resume", name, "--restart", cwd=project.root, env={"OV_TEST_KILL_AT": "spawn:session"})
    assert killed.returncode == -9, (killed.returncode, killed.stderr)
    assert log(project, f"ov/{name}")[0] == "work so far", "the branch is not the spawn's to undo"
    assert (Path(agent.worktree or "") / "work.txt").is_file(), "nor is the reused worktree"
    again = run_ov("resume", name, "--restart", "--json", cwd=project.root)
    assert again.returncode == 0, again.stderr
    report = json.loads(again.stdout)
    assert report["previous_state"] == "zombie" and report["commits"][0].endswith("work so far")
    assert report["generation"] > agent.generation
    wait_for(lambda: row(state_db, name).state == "completed", timeout=60, what="the restarted agent to finish")
    assert log(project, f"ov/{name}")[0] == "work so far"
    assert run_git(project.root, "worktree", "list").count(f"ov/{name}") == 1
    assert sessions.get(state_db, name) is not None
    assert Path(report["archived_run_dir"]).name == f"{name}@gen{agent.generation}"
