"""`ov loop` under the ledger's and the approvals' promises (issue 28, items 10 and 11).

A re-run iteration (its loop process was killed mid-turn) must not repeat what the dead
attempt already did, as a retried turn does not; and a loop waits for a person like any
agent: a call that waits for approval parks it and keeps it from completing.

Real agent loops on the scripted runtime (every tool call through the real `ov guard`),
real git, SQLite, bubblewrap and `ov` commands; the watchdog re-adopts the killed loop.
"""

from __future__ import annotations

import json
import os
import signal
import typing as t
from pathlib import Path

import pytest
import yaml

from agent_helpers import agent_state, mail_rows, wait_for
from conftest import run_git, run_ov
from overstory import procs
from overstory.paths import ProjectPaths
from overstory.store import ledger
from overstory.store.db import open_state
from test_loop import records, settled
from test_watchdog import make_watchdog, write_local_config

NAME = "builder-t1"


def loop_scenario(tmp_path: Path, iterations: list[dict[str, t.Any]]) -> str:
    path = tmp_path / "loop-scenario.yaml"
    path.write_text(yaml.safe_dump({"agents": {"builder-*": {"iterations": iterations}}}))
    return str(path)


def operator_mail(project: ProjectPaths, subject: str) -> list[dict[str, t.Any]]:
    return [m for m in mail_rows(project, recipient="operator") if m["subject"] == subject]


def send(subject: str) -> dict[str, str]:
    return {"bash": f"ov mail send --to operator --subject {subject} --body 'from the loop'"}


def iter2_calls(project: ProjectPaths) -> list:
    conn = open_state(project.state_db)
    try:
        return [r for r in ledger.calls(conn, agent=NAME) if "iter2" in r["input"]]
    finally:
        conn.close()


def test_a_rerun_iteration_does_not_repeat_what_its_killed_attempt_did(project: ProjectPaths, tmp_path: Path):
    """Two phases (their gates pass at once); iteration 2, the first of phase two, is killed at work after
    its mail went out. The re-run gets the send's receipt instead of sending again; the same mail of
    another iteration (here, of the phase before) is other work and went out in its own right."""
    shared = tmp_path / "shared"  # bound writable into the agent's sandbox: the test sees the marker
    shared.mkdir()
    write_local_config(project, turns={"retry_backoff": 0.05, "kill_grace": 1, "max_retries": 3},
                       watchdog={"interval": 0.2}, sandbox={"writable": [str(shared)]})
    working = shared / "iteration-2-works"
    plan = loop_scenario(tmp_path, [
        {"actions": [send("progress")], "result": "phase one done. LOOP_DONE"},
        # 30 s of work only in the first attempt: the marker is made as the sleep starts.
        {"actions": [{"expect_in_prompt": "Phase 2 of 2: two"}, send("progress"), send("iter2"),
                     {"sleep": 30, "once": str(working)}], "result": "LOOP_DONE"},
    ])
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump({"objective": "say it once", "phases": [
        {"name": "one", "objective": "report progress", "gate": "true"},
        {"name": "two", "objective": "report iter2", "gate": "true"}]}))
    done = run_ov("loop", "builder", "t1", "--runtime", "scripted", "--spec", str(spec), "--scenario", plan,
                  cwd=project.root)
    assert done.returncode == 0, done.stderr
    busy = wait_for(lambda: (a := agent_state(project, NAME)) and a.state == "in_turn" and working.exists()
                    and a.turn_pgid and a, 60, message="iteration 2 to be at work after its mail")
    assert len(operator_mail(project, "iter2")) == 1
    # At work means after the loop read the send's receipt from the stream (it can lag the marker, more so with
    # the turn's shim between them); a loop killed before that read is tests/test_durable.py's case.
    wait_for(lambda: [r["status"] for r in iter2_calls(project)] == ["succeeded"], 30,
             message="the loop to record iter2's receipt")
    os.kill(busy.loop_pid, signal.SIGKILL)
    wait_for(lambda: not procs.is_alive(busy.loop_pid, busy.loop_start_ticks), message="the loop to die")
    dog = make_watchdog(project)
    try:
        actions = dog.tick()
    finally:
        dog.close()
    assert [(a.agent, a.kind) for a in actions] == [(NAME, "readopted")], actions
    agent = settled(project)
    assert agent.state == "completed", agent.state_reason
    assert [(r["number"], r["attempt"], r["status"]) for r in records(project)] == [
        (1, 1, "done"), (2, 1, "interrupted"), (2, 2, "done")]
    assert len(operator_mail(project, "iter2")) == 1, "the re-run iteration sent iter2 again"
    assert len(operator_mail(project, "progress")) == 2, "one per iteration: iteration 2 is not iteration 1"
    assert [r["phase"] for r in records(project)] == ["one", "two", "two"]
    rerun = iter2_calls(project)
    assert [r["status"] for r in rerun] == ["succeeded", "skipped_duplicate"], rerun
    assert rerun[0]["scope"] == rerun[1]["scope"] == f"loop:{agent.generation}.2"


@pytest.mark.parametrize("kill_at", [None, "loop_held"])
def test_a_loop_parks_on_an_approval_and_a_pending_one_keeps_it_from_completing(project: ProjectPaths,
                                                                                tmp_path: Path, kill_at):
    """Also killed (SIGKILL) after the iteration was set aside for the approval, before the park: the
    watchdog's restart of the loop parks it."""
    shared = tmp_path / "shared"
    shared.mkdir()
    deployed = shared / "deploy.log"
    script = project.root / "deploy.sh"
    script.write_text(f"#!/bin/sh\necho deployed >> {deployed}\n")
    script.chmod(0o755)
    run_git(project.root, "add", "deploy.sh")
    run_git(project.root, "commit", "-qm", "deploy script")
    write_local_config(project, approvals={"rules": [{"match": "Bash(./deploy.sh*)"}]}, watchdog={"interval": 0.2},
                       turns={"retry_backoff": 0.05, "kill_grace": 1}, sandbox={"writable": [str(shared)]})
    plan = loop_scenario(tmp_path, [
        # Refused, the model says the promise anyway and the check passes: that is not done.
        {"actions": [{"bash": "./deploy.sh"}], "result": "Deployed, I think. LOOP_DONE"},
        {"actions": [{"expect_in_prompt": "approved: you may now run ./deploy.sh"}, {"bash": "./deploy.sh"}],
         "result": "Deployed. LOOP_DONE"},
    ])
    done = run_ov("loop", "builder", "t1", "--runtime", "scripted", "--prompt", "deploy it", "--check", "true",
                  "--scenario", plan, cwd=project.root, env={"OV_TEST_KILL_AT": kill_at} if kill_at else None)
    assert done.returncode == 0, done.stderr
    if kill_at:
        marker = project.run_dir / NAME / f"killed-at-{kill_at}"
        first = wait_for(lambda: marker.exists() and (a := agent_state(project, NAME)) and a, 60,
                         message=f"the loop to die at {kill_at}")
        wait_for(lambda: not procs.is_alive(first.loop_pid, first.loop_start_ticks), 30, message="the loop to go")
        assert first.state == "between_turns"
        dog = make_watchdog(project)
        try:
            assert [(a.agent, a.kind) for a in dog.tick()] == [(NAME, "readopted")]
        finally:
            dog.close()
    waited = run_ov("wait", NAME, "--timeout", "60", cwd=project.root)
    assert waited.returncode == 7, (waited.returncode, waited.stdout, waited.stderr)
    agent = agent_state(project, NAME)
    assert agent.state == "parked" and agent.park_kind == "approval", (agent.state, agent.state_reason)
    [pending] = json.loads(run_ov("approvals", "--json", cwd=project.root).stdout)
    assert agent.state_reason == f"approval {pending['id']}"
    [first] = records(project)
    assert first["status"] == "done" and first["check_exit"] is None and "approval" in first["outcome"], first
    assert mail_rows(project, type="worker_done") == [] and not deployed.exists()
    status = json.loads(run_ov("loop", "status", NAME, "--json", cwd=project.root).stdout)
    assert status["state"] == "parked" and status["park_kind"] == "approval"

    approved = run_ov("approve", pending["id"], cwd=project.root)
    assert approved.returncode == 0, approved.stderr
    agent = settled(project)
    assert agent.state == "completed", agent.state_reason
    assert deployed.read_text() == "deployed\n", "the approved call ran once"
    assert [(r["number"], r["check_exit"]) for r in records(project)] == [(1, None), (2, 0)]
    assert len(mail_rows(project, type="worker_done")) == 1


def test_deciding_an_approval_of_an_agent_that_ended_says_so(project: ProjectPaths, tmp_path: Path):
    write_local_config(project, approvals={"rules": [{"match": "Bash(./deploy.sh*)"}]},
                       turns={"retry_backoff": 0.05, "kill_grace": 1})
    plan = loop_scenario(tmp_path, [{"actions": [{"bash": "./deploy.sh"}], "result": "waiting"}])
    done = run_ov("loop", "builder", "t1", "--runtime", "scripted", "--prompt", "deploy it", "--check", "true",
                  "--scenario", plan, cwd=project.root)
    assert done.returncode == 0, done.stderr
    wait_for(lambda: (a := agent_state(project, NAME)) and a.state == "parked", 60, message="the loop to park")
    [pending] = json.loads(run_ov("approvals", "--json", cwd=project.root).stdout)
    stopped = run_ov("stop", NAME, cwd=project.root)
    assert stopped.returncode == 0, stopped.stderr
    assert agent_state(project, NAME).state == "completed"
    for verb, says in ((["approve", pending["id"]], f"{NAME} has ended (completed)"),
                       (["reject", pending["id"], "--reason", "late"], "was dropped at")):
        late = run_ov(*verb, cwd=project.root)
        assert late.returncode == 1, (verb, late.stdout, late.stderr)
        assert says in late.stderr and f"{NAME} ha" in late.stderr and "Traceback" not in late.stderr, late.stderr
        assert len(late.stderr.strip().splitlines()) == 1
    conn = open_state(project.state_db)
    try:
        row = conn.execute("SELECT status FROM approvals WHERE id = ?", (pending["id"],)).fetchone()
    finally:
        conn.close()
    assert row["status"] == "expired", "dropped: nobody is left to run it"
