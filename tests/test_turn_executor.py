"""The agent loop's turns go through the turn executor (``agents.turn_exec``): ``local`` by default.

Real loops, real scripted turns, real SQLite. The cluster's side is in ``test_turns_on_ray.py``.
"""

from __future__ import annotations

import json
import os
import shutil
import typing as t
from pathlib import Path

from conftest import run_ov
from overstory import procs
from overstory.paths import ProjectPaths
from overstory.store import sessions
from requires import missing
from test_watchdog import REPORT_DONE, load, repeat_turns, row, start_agent, wait_for, write_local_config


def test_a_local_turn_runs_under_the_executor_and_its_node_is_shown(project: ProjectPaths, state_db: t.Any) -> None:
    write_local_config(project, turns={"retry_backoff": 0.05})
    name = start_agent(project, state_db, "n1", {"turns": [{"actions": [REPORT_DONE], "result": "done"}]})
    wait_for(lambda: (found := sessions.get(state_db, name)) is not None and found.is_terminal, 60, "the agent to end")
    assert t.cast(sessions.Session, sessions.get(state_db, name)).state == "completed"
    turn = state_db.execute("SELECT id, node, status FROM turns WHERE agent = ?", (name,)).fetchone()
    assert (turn["node"], turn["status"]) == (os.uname().nodename, "ok")
    listed = run_ov("status", "--json", "--all", cwd=project.root)
    assert listed.returncode == 0, listed.stderr
    assert [a["node"] for a in json.loads(listed.stdout)["agents"] if a["name"] == name] == [os.uname().nodename]
    # the executor's own record of the turn is in the agent's run dir (not beside the run dirs: other agents'
    # and the containment check's business), dropped once the turn has settled; its logs stay
    assert (project.run_dir / name / "turns").is_dir() and not (project.run_dir / "turns").exists()
    assert not (project.run_dir / name / "turns" / turn["id"]).exists()
    assert (project.logs_dir / name / turn["id"] / "stderr.txt").exists()


def test_the_group_ov_records_and_stops_is_the_runtimes_not_its_shims(project: ProjectPaths,
                                                                      state_db: t.Any) -> None:
    """The shim sits between the loop and the runtime: the agent's turn_pgid (what the watchdog and `ov stop`
    signal) is the group the shim started the runtime in, with its leader's start ticks; the shim is outside it."""
    write_local_config(project, turns={"retry_backoff": 0.05, "kill_grace": 1})
    name = start_agent(project, state_db, "g1", repeat_turns([{"bash": "sleep 60"}, REPORT_DONE]))
    busy = wait_for(lambda: (r := row(state_db, name)).current_tool == "Bash" and r.turn_pgid and r, 60,
                    "the turn's tool call")
    turn = state_db.execute("SELECT pid, pgid FROM turns WHERE id = ?", (busy.current_turn_id,)).fetchone()
    assert busy.turn_pgid == turn["pgid"] == turn["pid"] == os.getpgid(turn["pid"]), "the runtime leads its group"
    assert busy.turn_start_ticks == procs.start_ticks(turn["pid"])
    record = json.loads((project.run_dir / name / "turns" / str(busy.current_turn_id) / "proc.json").read_text())
    shim = int(record["shim_pid"])
    assert shim != busy.turn_pgid and os.getpgid(shim) != busy.turn_pgid, "the shim is not in the turn's group"
    assert shim not in procs.tagged_processes(str(busy.current_turn_id)), "nor tagged with the turn"
    stopped = run_ov("stop", name, "--json", cwd=project.root)
    assert stopped.returncode == 0, stopped.stderr
    assert not procs.group_alive(busy.turn_pgid, busy.turn_start_ticks), "ov stop reached the runtime's group"
    assert not procs.tagged_processes(str(busy.current_turn_id)), "and what the turn started"
    wait_for(lambda: not procs.is_alive(shim), 10, "the shim to record the end and exit")
    assert row(state_db, name).state == "completed"


def test_sling_executor_ray_without_a_cluster_address_is_one_line(project: ProjectPaths) -> None:
    refused = run_ov("sling", "builder", "x1", "--runtime", "scripted", "--executor", "ray", cwd=project.root)
    assert refused.returncode != 0
    assert refused.stderr.strip().count("\n") == 0 and "executor.ray.address" in refused.stderr
    assert "Traceback" not in refused.stderr


def test_sling_executor_ray_with_tmux_is_refused(project: ProjectPaths) -> None:
    write_local_config(project, executor={"ray": {"address": "127.0.0.1:6379"}})
    node_bin = Path(__file__).resolve().parents[1] / ".ci" / "node" / "node_modules" / ".bin"
    if not (node_bin / "claude").exists() or shutil.which("tmux") is None:
        missing("the claude CLI (.ci/node) and tmux")
    refused = run_ov("sling", "builder", "x2", "--runtime", "claude", "--executor", "ray", "--tmux",
                     cwd=project.root, env={"PATH": f"{node_bin}{os.pathsep}{os.environ['PATH']}"})
    assert refused.returncode != 0 and "Traceback" not in refused.stderr
    assert "--executor ray runs headless turns" in refused.stderr, refused.stderr


def test_sling_executor_unknown_is_a_usage_error(project: ProjectPaths) -> None:
    refused = run_ov("sling", "builder", "x3", "--runtime", "scripted", "--executor", "k8s", cwd=project.root)
    assert refused.returncode == 2 and "k8s" in refused.stderr


def test_the_dashboards_sweep_at_a_jobs_end_is_not_a_lost_turn() -> None:
    """Ray's state API records every unfinished task of a job failed (WORKER_DIED) when the job's driver exits,
    though the tasks run on: the bench's 30 agents on one node lost 12 turns to it when the agent loop that had
    made the turn hub exited. Only a record of a real death makes a turn lost."""
    from types import SimpleNamespace

    from overstory.executors.ray_executor import reports_lost

    def task(state: str, error_type: str | None, message: str) -> t.Any:
        return SimpleNamespace(state=state, error_type=error_type, error_message=message)

    assert not reports_lost(task("FAILED", "WORKER_DIED", "Job finishes (02000000) as driver exits. Marking all "
                                                          "non-terminal tasks as failed."))
    assert reports_lost(task("FAILED", "WORKER_DIED", "Worker running the task (ab12) died with exit_type: "
                                                      "SYSTEM_ERROR"))
    assert reports_lost(task("FAILED", "NODE_DIED", "The node died"))
    assert not reports_lost(task("FAILED", "TASK_EXECUTION_EXCEPTION", "boom"))
    assert not reports_lost(task("RUNNING", None, ""))


def test_an_agent_without_a_worktree_keeps_its_turns_here_when_the_config_says_ray(project: ProjectPaths,
                                                                                    state_db: t.Any) -> None:
    """The coordinator works at the project's root (no worktree of its own), which does not travel to a node."""
    from overstory.agents.turn_exec import executor_kind

    write_local_config(project, executor={"kind": "ray", "ray": {"address": "127.0.0.1:6379"}})
    sessions.create_session(state_db, name="coordinator", capability="coordinator", task_id="run", runtime="scripted",
                            actor="test")
    sessions.create_session(state_db, name="builder-w", capability="builder", task_id="w", runtime="scripted",
                            actor="test", branch="ov/builder-w", worktree=str(project.root / "wt"))
    config = load(project)
    assert executor_kind(config, sessions.get(state_db, "coordinator")) == "local"  # type: ignore[arg-type]
    assert executor_kind(config, sessions.get(state_db, "builder-w")) == "ray"  # type: ignore[arg-type]
