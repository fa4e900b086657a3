"""A run on disk without ov: each turn's metadata.json and the run's summary.txt (agents/run_files.py)."""

from __future__ import annotations

import json
import typing as t
from pathlib import Path

from agent_helpers import wait_terminal
from conftest import run_ov
from overstory.paths import ProjectPaths
from overstory.store import runs, sessions
from test_coordinator import (
    BUILDER_DONE,
    READY,
    scenario,
    team,  # noqa: F401 - fixture
    wait_idle,
)


def _metadata(project: ProjectPaths, agent: str) -> list[dict[str, t.Any]]:
    return [json.loads(path.read_text()) for path in sorted((project.logs_dir / agent).glob("*/metadata.json"))]


def test_each_turn_gets_its_metadata_and_the_run_its_summary(team: ProjectPaths, tmp_path: Path) -> None:
    path = scenario(tmp_path / "s.json", {"coordinator": READY, "builder-*": BUILDER_DONE})
    started = run_ov("coordinator", "start", "--scenario", str(path), "--json", cwd=team.root)
    assert started.returncode == 0, started.stderr
    run_id = json.loads(started.stdout)["run_id"]
    slung = run_ov("sling", "builder", "greet", "--name", "builder-greet", "--runtime", "scripted",
                   "--scenario", str(path), cwd=team.root)
    assert slung.returncode == 0, slung.stderr
    builder = wait_terminal(team, "builder-greet")
    wait_idle(team, "coordinator", 1)

    turns = _metadata(team, "builder-greet")
    assert len(turns) == builder.turns >= 1
    first = turns[0]
    assert first["agent"] == "builder-greet" and first["task"] == "greet" and first["run"] == run_id
    assert first["capability"] == "builder" and first["runtime"] == "scripted" and first["status"] == "ok"
    assert first["exit"] == 0 and first["session"] and first["model"]
    assert first["input_tokens"] > 0 and first["output_tokens"] > 0 and first["cost_usd"] > 0
    assert first["tool_calls"] >= 1 and first["started_at"] <= first["ended_at"]
    # The same figures as the turn's row (the database stays the record; the file is its copy).
    shown = json.loads(run_ov("run", "show", run_id, "--json", cwd=team.root).stdout)
    row = next(turn for turn in shown["turns"] if turn["id"] == first["turn"])
    assert (row["input_tokens"], row["output_tokens"], row["session_id"]) == (
        first["input_tokens"], first["output_tokens"], first["session"])
    assert not list((team.logs_dir / "builder-greet").glob("*/.metadata.json.*.tmp"))

    summary_path = team.ov_dir / "runs" / run_id / "summary.txt"
    assert not summary_path.exists(), "the run is still open"
    stopped = run_ov("coordinator", "stop", cwd=team.root)
    assert stopped.returncode == 0, stopped.stderr
    summary = summary_path.read_text()
    assert summary.startswith(f"run {run_id}: completed\n")
    assert "builder-greet [builder, task greet, scripted]: completed" in summary
    assert "coordinator [coordinator," in summary and f"{first['turn']} builder-greet #1" in summary


def test_a_run_completed_by_a_process_that_died_writing_its_summary_gets_it_from_the_watchdog(
        project: ProjectPaths, state_db: t.Any) -> None:
    run, _ = runs.open_or_join(state_db, "coordinator")
    sessions.create_session(state_db, name="coordinator", capability="coordinator", task_id="coordinator",
                            runtime="scripted", actor="test", parent="operator", depth=0, run_id=run.id)
    agent = sessions.get(state_db, "coordinator")
    assert agent is not None and sessions.transition(state_db, "coordinator", agent.generation, "completed",
                                                     actor="test").ok
    folder = project.ov_dir / "runs" / run.id

    died = run_ov("run", "complete", run.id, cwd=project.root, env={"OV_TEST_DIE_WRITING": "summary.txt"})
    assert died.returncode == 9, died.stderr  # killed inside the write: temporary file done, not yet renamed
    assert runs.get_run(state_db, run.id).status == "completed"  # type: ignore[union-attr]
    assert not (folder / "summary.txt").exists(), "never half a summary"
    assert [p.name for p in folder.iterdir()] and all(p.name.endswith(".tmp") for p in folder.iterdir())

    tick = run_ov("watchdog", "--once", "--json", cwd=project.root)
    assert tick.returncode == 0, tick.stderr
    assert f"{run.id}: summary.txt written" in tick.stdout
    assert [p.name for p in folder.iterdir()] == ["summary.txt"], "the dead writer's temporary file is gone"
    summary = (folder / "summary.txt").read_text()
    assert summary.startswith(f"run {run.id}: completed\n") and "coordinator [coordinator, task coordinator" in summary
    again = run_ov("watchdog", "--once", "--json", cwd=project.root)
    assert "summary.txt written" not in again.stdout, "written once"
