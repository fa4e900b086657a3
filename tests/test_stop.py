"""`ov stop`: the agent ends completed and nothing it ran is left alive."""

from __future__ import annotations

import json
import typing as t

import pytest

from conftest import run_git, run_ov
from overstory import procs
from overstory.paths import ProjectPaths
from overstory.store import mail, sessions
from test_watchdog import (
    agent_processes,
    cleanup_agents,  # noqa: F401 - fixture
    fast_project,  # noqa: F401 - fixture
    mail_rows,
    repeat_turns,
    row,
    start_agent,
    start_decoy,
    wait_for,
)

SLEEPER = repeat_turns([{"text": "working"}, {"bash": "sleep 60 & sleep 60"}])


def test_stop_mid_tool_call_leaves_no_process_alive(fast_project: ProjectPaths, state_db: t.Any,
                                                    cleanup_agents: None) -> None:
    name = start_agent(fast_project, state_db, "s1", SLEEPER)
    busy = wait_for(lambda: (r := row(state_db, name)).current_tool == "Bash" and r, what="the tool call")
    # Both sleeps run (the turn's group holds only bwrap when it is sandboxed: count by the agent's tag).
    wait_for(lambda: len(agent_processes(fast_project, name)) >= 5, what="the shell's children")
    assert agent_processes(fast_project, name), "the helper must see the agent's processes"
    decoy = start_decoy(fast_project.root / ".overstory" / "worktrees" / name,
                        ["-m", "overstory.runtimes.scripted", "-p", "--output-format", "stream-json"])
    try:
        done = run_ov("stop", name, "--json", cwd=fast_project.root)
        assert done.returncode == 0, done.stderr
        report = json.loads(done.stdout)
        assert report["previous_state"] == "in_turn" and report["state"] == "completed"
        assert report["loop"] in ("stopped", "killed")
        assert agent_processes(fast_project, name) == []
        assert not procs.group_alive(busy.turn_pgid, busy.turn_start_ticks)
        assert not procs.is_alive(busy.loop_pid, busy.loop_start_ticks)
        assert decoy.poll() is None, "a look-alike process ov did not start survives"
    finally:
        decoy.kill()
        decoy.wait()
    final = row(state_db, name)
    assert final.state == "completed" and final.turn_pgid is None
    dispatch = mail_rows(state_db, recipient=name, type="dispatch")[0]
    assert dispatch["claimed_by"] is None and dispatch["read_at"] is None, "its claimed mail is readable again"
    assert mail_rows(state_db, type="worker_died") == []


def test_force_stop_kills_at_once(fast_project: ProjectPaths, state_db: t.Any, cleanup_agents: None) -> None:
    name = start_agent(fast_project, state_db, "s2",
                       repeat_turns([{"bash": "trap '' TERM; sleep 60 & wait"}]))
    busy = wait_for(lambda: (r := row(state_db, name)).current_tool == "Bash" and r, what="the tool call")
    done = run_ov("stop", name, "--force", cwd=fast_project.root)
    assert done.returncode == 0, done.stderr
    assert "stopped" in done.stdout
    assert agent_processes(fast_project, name) == []
    assert not procs.group_alive(busy.turn_pgid, busy.turn_start_ticks)


def test_unclaimed_mail_stays_unread(fast_project: ProjectPaths, state_db: t.Any, cleanup_agents: None) -> None:
    name = start_agent(fast_project, state_db, "s3", {"turns": [{"actions": [{"text": "hi"}], "result": "ok"}]},
                       start=False)
    mail.send(state_db, sender="operator", to=name, subject="later", body="read me later")
    assert run_ov("stop", name, cwd=fast_project.root).returncode == 0
    unread = [m for m in mail_rows(state_db, recipient=name) if m["read_at"] is None]
    assert {m["subject"] for m in unread} == {"task s3", "later"}


def test_unknown_and_already_completed_agents(fast_project: ProjectPaths, state_db: t.Any,
                                              cleanup_agents: None) -> None:
    missing = run_ov("stop", "nobody-here", cwd=fast_project.root)
    assert missing.returncode == 1 and "no agent named 'nobody-here'" in missing.stderr
    name = start_agent(fast_project, state_db, "s4", {"turns": []}, start=False)
    assert run_ov("stop", name, cwd=fast_project.root).returncode == 0
    again = run_ov("stop", name, cwd=fast_project.root)
    assert again.returncode == 0 and "already completed" in again.stdout
    history = [h["to_state"] for h in sessions.history(state_db, name)]
    assert history == ["booting", "completed"], "stopping twice does not write twice"


def test_stopping_a_zombie_settles_it_completed(fast_project: ProjectPaths, state_db: t.Any,
                                                cleanup_agents: None) -> None:
    from overstory.store.lifecycle import declare_zombie

    name = start_agent(fast_project, state_db, "s5", {"turns": []}, start=False)
    assert declare_zombie(state_db, row(state_db, name), "test", actor="test").ok
    done = run_ov("stop", name, "--json", cwd=fast_project.root)
    assert done.returncode == 0
    assert json.loads(done.stdout)["previous_state"] == "zombie"
    assert row(state_db, name).state == "completed"


def _commit_in_worktree(project: ProjectPaths, name: str) -> None:
    worktree = project.worktrees_dir / name
    (worktree / "new.txt").write_text("work\n")
    run_git(worktree, "add", "new.txt")
    run_git(worktree, "commit", "-q", "-m", "agent work")


def test_clean_refuses_an_unmerged_branch_unless_forced(fast_project: ProjectPaths, state_db: t.Any,
                                                        cleanup_agents: None) -> None:
    name = start_agent(fast_project, state_db, "s6", {"turns": []}, start=False)
    _commit_in_worktree(fast_project, name)
    refused = run_ov("stop", name, "--clean", cwd=fast_project.root)
    assert refused.returncode == 1
    assert "not merged into main" in refused.stderr
    assert (fast_project.worktrees_dir / name).is_dir()
    assert run_git(fast_project.root, "branch", "--list", f"ov/{name}").strip()
    assert row(state_db, name).state == "booting", "a refused --clean changes nothing"
    forced = run_ov("stop", name, "--clean", "--force", cwd=fast_project.root)
    assert forced.returncode == 0, forced.stderr
    assert not (fast_project.worktrees_dir / name).exists()
    assert not run_git(fast_project.root, "branch", "--list", f"ov/{name}").strip()
    assert row(state_db, name).state == "completed"


def test_clean_removes_a_merged_branch_and_refuses_uncommitted_changes(fast_project: ProjectPaths, state_db: t.Any,
                                                                       cleanup_agents: None) -> None:
    name = start_agent(fast_project, state_db, "s7", {"turns": []}, start=False)
    _commit_in_worktree(fast_project, name)
    run_git(fast_project.root, "merge", "-q", "--no-edit", f"ov/{name}")
    (fast_project.worktrees_dir / name / "scratch.txt").write_text("not committed\n")
    dirty = run_ov("stop", name, "--clean", cwd=fast_project.root)
    assert dirty.returncode == 1 and "uncommitted" in dirty.stderr
    (fast_project.worktrees_dir / name / "scratch.txt").unlink()
    done = run_ov("stop", name, "--clean", "--json", cwd=fast_project.root)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["cleaned"] == [str(fast_project.worktrees_dir / name), f"ov/{name}"]
    assert (fast_project.root / "new.txt").read_text() == "work\n", "merged work is kept on main"
    assert "ov/" not in run_git(fast_project.root, "branch", "--list")


def _cmdline(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            return handle.read()
    except OSError:
        return b""


@pytest.mark.parametrize("mode", ["off", "bwrap"])
def test_stop_kills_the_orphaned_turn_of_a_dead_loop(fast_project: ProjectPaths, state_db: t.Any,
                                                     cleanup_agents: None, mode: str) -> None:
    """Without a sandbox a turn outlives its dead loop until `ov stop`; in one (--die-with-parent) it dies
    with the loop. Either way `ov stop` leaves nothing and gives the claimed mail back."""
    import os
    import signal

    import yaml

    local = yaml.safe_load(fast_project.local_config_file.read_text())
    fast_project.local_config_file.write_text(yaml.safe_dump({**local, "sandbox": {"mode": mode}}))
    name = start_agent(fast_project, state_db, "s8", SLEEPER)
    busy = wait_for(lambda: (r := row(state_db, name)).current_tool == "Bash" and r, what="the tool call")
    # The call is announced before its PreToolUse hook answers; kill the loop only once the tool runs (with
    # the loop gone, the hook it serves can no longer allow anything).
    wait_for(lambda: any(_cmdline(pid).startswith(b"sleep") for pid in agent_processes(fast_project, name)),
             what="the tool's sleep to start")
    os.kill(busy.loop_pid, signal.SIGKILL)
    wait_for(lambda: not procs.is_alive(busy.loop_pid, busy.loop_start_ticks), what="the loop to die")
    if mode == "off":
        assert procs.group_alive(busy.turn_pgid, busy.turn_start_ticks)
    else:
        wait_for(lambda: not agent_processes(fast_project, name), what="the sandboxed turn to die with its loop")
    done = run_ov("stop", name, "--json", cwd=fast_project.root)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["loop"] == "not running"
    assert report["killed_groups"] == ([busy.turn_pgid] if mode == "off" else [])
    assert report["released_mail"] == 1
    assert agent_processes(fast_project, name) == []
