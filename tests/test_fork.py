"""`ov resume AGENT --fork` keeps what limits and gates its source: approvals, budget, loop (issue 28, item 12).

Real agent loops on the scripted runtime (every tool call goes through the real `ov
guard`), real git, real SQLite, the real `ov` commands. A scenario's ``agents`` section
gives the source and its fork scripts of their own (the first pattern that matches wins).
"""

from __future__ import annotations

import json
import typing as t
from pathlib import Path

import pytest
import yaml

from agent_helpers import agent_state, wait_for
from conftest import run_git, run_ov
from durable_helpers import kill_everything, shared
from overstory.paths import ProjectPaths
from overstory.store.db import open_state
from test_watchdog import write_local_config

pytestmark = pytest.mark.slow

DEPLOY = "./deploy.sh"
BIG_BILL = {"usage": {"input_tokens": 1000, "output_tokens": 0, "model": "claude-opus-4-8", "cost_usd": 1.5}}


@pytest.fixture
def deployable(project: ProjectPaths, tmp_path: Path) -> t.Iterator[tuple[ProjectPaths, Path]]:
    """A project with a committed ./deploy.sh that logs each run in a directory the sandbox may write."""
    log = shared(tmp_path) / "deploy.log"
    script = project.root / "deploy.sh"
    script.write_text(f"#!/bin/sh\necho \"deployed by $OVERSTORY_AGENT_NAME\" >> {log}\n")
    script.chmod(0o755)
    run_git(project.root, "add", "deploy.sh")
    run_git(project.root, "commit", "-q", "-m", "deploy script")
    write_local_config(project, turns={"retry_backoff": 0.1, "kill_grace": 1, "max_concurrent": 8},
                       watchdog={"interval": 0.3}, sandbox={"writable": [str(shared(tmp_path))]})
    yield project, log
    kill_everything(project)


def plan(tmp_path: Path, **agents: t.Any) -> str:
    path = tmp_path / "fork-scenario.yaml"
    path.write_text(yaml.safe_dump({"agents": agents}, sort_keys=False))
    return str(path)


def pending(project: ProjectPaths, agent: str) -> list[dict[str, t.Any]]:
    conn = open_state(project.state_db)
    try:
        return [dict(r) for r in conn.execute("SELECT * FROM approvals WHERE agent = ? AND status = 'pending'",
                                              (agent,))]
    finally:
        conn.close()


def turns(project: ProjectPaths, agent: str) -> int:
    conn = open_state(project.state_db)
    try:
        return int(conn.execute("SELECT count(*) FROM turns WHERE agent = ?", (agent,)).fetchone()[0])
    finally:
        conn.close()


def parked(project: ProjectPaths, name: str, kind: str) -> t.Any:
    return wait_for(lambda: (a := agent_state(project, name)) and a.state == "parked" and a.park_kind == kind and a,
                    60, interval=0.2, message=f"{name} to park ({kind})")


def test_a_fork_keeps_its_sources_approval_gates_and_budget(deployable: tuple[ProjectPaths, Path],
                                                            tmp_path: Path) -> None:
    project, log = deployable
    scenario = plan(tmp_path, **{
        "*-fork*": {"turns": [
            {"actions": [{"bash": DEPLOY}], "result": "waiting for approval"},
            {"actions": [{"expect_in_prompt": "not now"}, BIG_BILL], "result": "spent a lot"},
            {"actions": [BIG_BILL], "result": "spent more"}]},
        "builder-*": {"turns": [{"actions": [{"bash": DEPLOY}], "result": "waiting for approval"}]}})
    slung = run_ov("sling", "builder", "s1", "--runtime", "scripted", "--scenario", scenario, "--prompt", "deploy it",
                   "--approve", "Bash(./deploy.sh*)", "--max-usd", "1", cwd=project.root)
    assert slung.returncode == 0, slung.stderr
    parked(project, "builder-s1", "approval")
    [source_gate] = pending(project, "builder-s1")

    forked = run_ov("resume", "builder-s1", "--fork", "--prompt", "deploy another way", cwd=project.root)
    assert forked.returncode == 0, forked.stderr
    assert "forked builder-s1 as builder-s1-fork1" in forked.stdout
    fork = parked(project, "builder-s1-fork1", "approval")
    [fork_gate] = pending(project, "builder-s1-fork1")
    assert fork_gate["id"] != source_gate["id"] and "deploy.sh" in fork_gate["input"]
    assert [g["id"] for g in pending(project, "builder-s1")] == [source_gate["id"]], "the source's still waits"
    assert not log.exists(), "neither deploy.sh ran: each waits for its own decision"
    [budget] = json.loads(run_ov("budget", fork.name, "--json", cwd=project.root).stdout)["budgets"]
    assert budget["limits"]["usd"]["limit"] == 1.0

    rejected = run_ov("reject", fork_gate["id"], "--reason", "not now", cwd=project.root)
    assert rejected.returncode == 0, rejected.stderr
    # The second turn's bill crosses the dollar limit it kept: the breaker stops that turn and parks the fork.
    fork = parked(project, fork.name, "budget")
    assert "max_usd 1.00 reached" in fork.state_reason, fork.state_reason
    assert turns(project, fork.name) == 2, "no turn starts past the limit it kept"
    assert not log.exists()
    # It says what it kept and what it could not carry over.
    assert "kept: budget max_usd 1.00" in forked.stdout and "approval gates Bash(./deploy.sh*)" in forked.stdout
    assert "not carried over: uncommitted changes" in forked.stdout
    # The scripted runtime cannot fork a session (as gemini cannot): the fork says so and starts a fresh one.
    assert "its conversation (scripted has no way to fork a session" in forked.stdout
    assert fork.spec["fork_of"] == {"agent": "builder-s1", "generation": 1, "runtime": "scripted",
                                    "parent_run_id": fork.spec["fork_of"]["parent_run_id"]}
    assert fork.spec["fork_of"]["parent_run_id"], "the source's checkpoint turn"


def test_a_fork_of_a_loop_is_a_loop_with_the_same_check_and_promise(project: ProjectPaths, tmp_path: Path) -> None:
    (project.root / "calc.py").write_text("def add(a, b):\n    return a - b\n")
    (project.root / "test_calc.py").write_text("from calc import add\nassert add(1, 1) == 2, 'add is wrong'\n")
    run_git(project.root, "add", "-A")
    run_git(project.root, "commit", "-q", "-m", "calc with a bug")
    write_local_config(project, turns={"retry_backoff": 0.05, "kill_grace": 1}, watchdog={"interval": 0.2})
    fix = [{"edit": {"path": "calc.py", "old": "a - b", "new": "a + b"}},
           {"bash": "git add calc.py && git commit -q -m 'fix add'"}]
    scenario = plan(tmp_path, **{
        "*-fork*": {"iterations": [
            {"actions": [{"expect_in_prompt": "fork of builder-t1"}], "result": "surely fine. LOOP_DONE"},
            {"actions": [{"expect_in_prompt": "add is wrong"}, *fix], "result": "fixed. LOOP_DONE"}]},
        "builder-*": {"iterations": [{"actions": [], "result": "not yet"}, {"actions": [], "result": "still not"}]}})
    looped = run_ov("loop", "builder", "t1", "--runtime", "scripted", "--scenario", scenario, "--prompt", "fix add",
                    "--check", "python3 test_calc.py", "--until", "LOOP_DONE", "--max-iterations", "2",
                    cwd=project.root)
    assert looped.returncode == 0, looped.stderr
    source = parked(project, "builder-t1", "loop")
    assert "max_iterations 2" in source.state_reason

    forked = run_ov("resume", "builder-t1", "--fork", "builder-t1-fork-table", "--json", cwd=project.root)
    assert forked.returncode == 0, forked.stderr
    document = json.loads(forked.stdout)
    assert document["name"] == "builder-t1-fork-table"
    fork = wait_for(lambda: (a := agent_state(project, "builder-t1-fork-table")) and a.is_terminal and a, 90,
                    interval=0.2, message="the fork's loop to finish")
    assert fork.state == "completed", fork.state_reason
    status = json.loads(run_ov("loop", "status", fork.name, "--json", cwd=project.root).stdout)
    assert status["until"] == "LOOP_DONE" and status["max_iterations"] == 2
    # The promise alone did not end it: ov's own check failed the first iteration, passed the second.
    assert [(r["promise_seen"], r["check_exit"]) for r in status["records"]] == [(True, 1), (True, 0)]
    assert document["kept"]["loop"]["until"] == "LOOP_DONE"
    assert any("iteration 1" in note for note in document["not_carried"])
