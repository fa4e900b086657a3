"""`ov sling` starts the agent's loop before the spawn is done (agents.warm_loop.WarmLoop), so that Python's start-up
and the loop's imports overlap the spawn's git and database work. Until it is told its generation the loop touches
nothing, and without the word (the spawn failed; `ov sling` died anywhere) it ends by itself."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from agent_helpers import agent_env, agent_state, loop_processes, wait_for
from overstory.agents.process import agent_lock_path, loop_log_path
from overstory.agents.warm_loop import WarmLoop
from overstory.paths import ProjectPaths


def _touched(project: ProjectPaths, agent: str) -> list[str]:
    found = [str(path) for path in (loop_log_path(project, agent), agent_lock_path(project, agent)) if path.exists()]
    return found + [str(path) for path in (project.run_dir / agent).glob("*")]


def test_a_warm_loop_never_told_to_go_ends_having_touched_nothing(project: ProjectPaths) -> None:
    warm = WarmLoop(project, "builder-w1", agent_env())
    assert warm.proc is not None
    os.close(warm._go)  # as when `ov sling` dies: the pipe's end, without a word
    warm._go = -1
    assert warm.proc.wait(timeout=30) == 0
    assert _touched(project, "builder-w1") == []


def test_a_discarded_warm_loop_is_gone_when_discard_returns(project: ProjectPaths) -> None:
    warm = WarmLoop(project, "builder-w2", agent_env())
    assert warm.proc is not None
    warm.discard()
    assert warm.proc.poll() is not None  # ended and reaped: a failed spawn leaves no process
    assert _touched(project, "builder-w2") == []
    assert warm.go(1, agent_env()) is None  # and cannot be told to go after that


def test_a_warm_loop_started_with_another_environment_is_not_used(project: ProjectPaths) -> None:
    warm = WarmLoop(project, "builder-w3", agent_env())
    assert warm.proc is not None
    assert warm.go(1, {**agent_env(), "EXTRA": "1"}) is None  # the spawn settled on another environment
    assert warm.proc.poll() is not None
    assert _touched(project, "builder-w3") == []


def test_sling_killed_before_the_word_leaves_its_warm_loop_to_end_by_itself(project: ProjectPaths) -> None:
    """kill -9 of `ov sling` inside its worktree step: the loop it started early gets no word and ends."""
    env = {**agent_env(), "OV_TEST_KILL_AT": "spawn:worktree"}
    proc = subprocess.run([sys.executable, "-m", "overstory", "sling", "builder", "k1", "--runtime", "scripted"],
                          cwd=project.root, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == -signal.SIGKILL
    assert loop_processes("builder-k1", project.root, unstarted_grace=30) == []  # it ended by itself
    assert not loop_log_path(project, "builder-k1").exists()
    assert not agent_lock_path(project, "builder-k1").exists()


def test_a_slung_agent_is_served_by_the_loop_started_early(project: ProjectPaths, tmp_path: Path) -> None:
    import json

    scenario = tmp_path / "slow.json"
    scenario.write_text(json.dumps({"turns": [{"actions": [{"bash": "sleep 2"}], "result": "done"}]}))
    done = subprocess.run([sys.executable, "-m", "overstory", "sling", "builder", "k2", "--runtime", "scripted",
                           "--scenario", str(scenario), "--json"], cwd=project.root, env=agent_env(),
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    loop_pid = json.loads(done.stdout)["loop_pid"]
    ready = agent_state(project, "builder-k2")
    assert b"--go-fd" in Path(f"/proc/{loop_pid}/cmdline").read_bytes()  # the one started early, mid-turn now
    lock = agent_lock_path(project, "builder-k2")  # taken once told: `ov sling` may exit before it is
    wait_for(lambda: lock.exists() and lock.read_text() == f"{loop_pid} 1", timeout=30,
             message="the early loop to take the agent")  # it serves generation 1
    wait_for(lambda: (agent_state(project, "builder-k2") or ready).state == "between_turns", timeout=120,
             message="its first turn to end")
    assert "Traceback" not in loop_log_path(project, "builder-k2").read_text()

