"""Schedules that do not pile up agents (issue 28, item 15): the overlap policy, back-off, one escalation.

Real SQLite, real runner processes running the real `ov sling` (scripted agents whose
first call is a gated ``./deploy.sh``, so each one waits for a person), real guards.
Minutes pass on the fake clock of tests/test_schedules.py (``Scheduler(clock=...)`` in
this process, or driver processes that read the clock from a file).
"""

from __future__ import annotations

import json
import signal
import subprocess
import typing as t
from pathlib import Path

import pytest

from agent_helpers import agent_state, mail_rows, wait_for
from conftest import run_git, run_ov
from durable_helpers import shared
from overstory.paths import ProjectPaths
from overstory.store import schedules
from overstory.store.db import open_state
from test_schedules import MINUTE, T0, add_cron, agents, fires, schedule_events, set_clock, start_driver
from test_watchdog import write_local_config

DEPLOY = "./deploy.sh"
DONE = "ov mail send --type worker_done --subject done --body deployed"


@pytest.fixture
def gated(project: ProjectPaths, tmp_path: Path) -> tuple[ProjectPaths, Path, Path]:
    """approvals.rules gates ./deploy.sh; a builder's first call is ./deploy.sh (its second turn, once approved,
    runs it and reports). Returns the project, the deploy log and the builders' scenario file."""
    log = shared(tmp_path) / "deploy.log"
    script = project.root / "deploy.sh"
    script.write_text(f"#!/bin/sh\necho \"deployed by $OVERSTORY_AGENT_NAME\" >> {log}\n")
    script.chmod(0o755)
    run_git(project.root, "add", "deploy.sh")
    run_git(project.root, "commit", "-q", "-m", "deploy script")
    write_local_config(project, approvals={"rules": [{"match": "Bash(./deploy.sh*)"}]}, agents={"max_concurrent_agents": 3},
                       turns={"retry_backoff": 0.1, "kill_grace": 1, "max_concurrent": 8},
                       sandbox={"writable": [str(shared(tmp_path))]})
    scenario = tmp_path / "deploy-scenario.json"
    scenario.write_text(json.dumps({"turns": [
        {"actions": [{"bash": DEPLOY}], "result": "waiting for approval"},
        {"actions": [{"expect_in_prompt": "approved"}, {"bash": DEPLOY}, {"bash": DONE}], "result": "done"}]}))
    return project, log, scenario


def pending_approvals(project: ProjectPaths) -> list[dict[str, t.Any]]:
    conn = open_state(project.state_db)
    try:
        return [dict(r) for r in conn.execute("SELECT * FROM approvals WHERE status = 'pending' ORDER BY requested_at")]
    finally:
        conn.close()


def schedule_row(project: ProjectPaths, name: str) -> schedules.Schedule:
    conn = open_state(project.state_db)
    try:
        return schedules.require(conn, name)
    finally:
        conn.close()


def parked_for_approval(project: ProjectPaths, name: str) -> t.Any:
    return wait_for(lambda: (a := agent_state(project, name)) and a.state == "parked" and a.park_kind == "approval"
                    and a, 60, interval=0.2, message=f"{name} to wait for its approval")


def test_a_schedule_skips_while_its_agent_waits_for_a_person(gated: tuple[ProjectPaths, Path, Path]) -> None:
    from overstory.scheduling.scheduler import Scheduler, next_due

    project, log, scenario = gated
    added = run_ov("schedule", "add", "deploy", "--cron", "* * * * *", "--", "sling", "builder", "d-{n}",
                   "--runtime", "scripted", "--scenario", str(scenario), "--prompt", "deploy", cwd=project.root)
    assert added.returncode == 0, added.stderr
    now = {"ms": next_due("* * * * *", schedule_row(project, "deploy").cursor) + 1000}
    conn = open_state(project.state_db)
    scheduler = Scheduler(project, conn, clock=lambda: now["ms"])
    try:
        assert [a[1] for a in scheduler.tick()] == ["fired"]
        first = wait_for(lambda: (f := fires(project)[0])["status"] not in schedules.OPEN_FIRE_STATUSES and f, 60,
                         interval=0.2, message="the first fire to settle")
        assert first["status"] == "ok", first["output"]
        parked_for_approval(project, "builder-d-1")
        skipped = []
        for _ in range(4):  # four more minutes: a fire was due each time
            now["ms"] += MINUTE
            skipped += scheduler.tick()
        assert [(name, kind) for name, kind, _ in skipped] == [("deploy", "skipped")] * 4, skipped
        assert "builder-d-1 (fire 1) is still parked (approval)" in skipped[0][2]
        assert len(fires(project)) == 1 and agents(project, "builder-d-") == ["builder-d-1"]
        [gate] = pending_approvals(project)
        assert len(mail_rows(project, type="decision_gate")) == 1 and mail_rows(project, type="escalation") == []
        events = schedule_events(project, "schedule_skipped")
        assert len(events) == 4 and all(e["schedule"] == "deploy" for e in events)
        assert "builder-d-1 (fire 1) is still parked (approval)" in events[0]["summary"]
        feed = run_ov("feed", "--kind", "schedule_skipped", cwd=project.root).stdout
        assert feed.count("is still parked (approval)") == 4, feed
        listed = run_ov("schedule", "list", cwd=project.root).stdout
        assert "overlap: skip" in listed and "skipped: 4" in listed
        assert "builder-d-1 (fire 1) is still parked (approval)" in listed
        document = json.loads(run_ov("schedule", "list", "--json", cwd=project.root).stdout)["schedules"][0]
        assert (document["overlap"], document["agent"], document["skipped"]) == ("skip", "builder-d-{n}", 4)

        # Once the person has decided and the agent is done, the next occasion fires.
        assert run_ov("approve", gate["id"], cwd=project.root).returncode == 0
        wait_for(lambda: agent_state(project, "builder-d-1").state == "completed", 60, interval=0.2,
                 message="builder-d-1 to deploy and finish")
        now["ms"] += MINUTE
        assert [a[1] for a in scheduler.tick()] == ["fired"]
        wait_for(lambda: fires(project)[-1]["status"] == "ok", 60, interval=0.2, message="the second fire")
        assert [f["agent"] for f in fires(project)] == ["builder-d-1", "builder-d-2"]
        assert log.read_text().splitlines() == ["deployed by builder-d-1"]
        assert "(overlap: skip)" in added.stdout, "skip is the default"
    finally:
        scheduler.close()
        conn.close()


def test_failed_fires_back_off_and_escalate_once_per_row(project: ProjectPaths) -> None:
    """Every fire fails on max_concurrent_agents (another agent holds the only slot)."""
    from overstory.scheduling.runner import run_fire
    from overstory.scheduling.scheduler import Scheduler
    from test_watchdog import start_agent

    write_local_config(project, agents={"max_concurrent_agents": 1})
    conn = open_state(project.state_db)
    start_agent(project, conn, "blocker", {"turns": []}, start=False)  # active (booting), no process
    add_cron(project, "busy", "* * * * *", ["sling", "builder", "b-{n}", "--runtime", "scripted"], cursor=T0,
             agent="builder-b-{n}")
    now = {"ms": T0 + 40_000}
    scheduler = Scheduler(project, conn, clock=lambda: now["ms"], launch=lambda p, i: None)

    def minute() -> str:
        actions = scheduler.tick()
        now["ms"] += MINUTE
        assert len(actions) == 1, actions
        if actions[0][1] == "fired":
            done = run_fire(project, int(fires(project)[-1]["id"]))
            assert done is not None
            return done["status"]
        return actions[0][1]

    try:
        # Back-off 60 s, then 120 s, then 240 s after the fires due at minutes 1, 2, 4.
        assert [minute() for _ in range(8)] == ["failed", "failed", "skipped", "failed", "skipped", "skipped",
                                                "skipped", "failed"]
        told = mail_rows(project, type="escalation")
        assert len(told) == 1, [m["subject"] for m in told]
        assert told[0]["subject"] == "schedule busy: fire 1 failed" and "max_concurrent_agents" in told[0]["body"]
        assert len(schedule_events(project, "schedule_failed")) == 4
        assert "backing off after 2 failed fire(s) in a row" in schedule_events(project, "schedule_skipped")[0][
            "summary"]
        row = schedule_row(project, "busy")
        assert row.failures == 4 and row.backoff_until == fires(project)[-1]["due_at"] + 480_000
        listed = run_ov("schedule", "list", cwd=project.root).stdout
        assert "failing: 4 fire(s) in a row; backing off until" in listed

        # The slot is freed: after the back-off a fire succeeds, which ends the row of failures.
        assert run_ov("stop", "builder-blocker", cwd=project.root).returncode == 0
        statuses = [minute() for _ in range(8)]
        assert statuses == ["skipped"] * 7 + ["ok"], statuses
        row = schedule_row(project, "busy")
        assert (row.failures, row.backoff_until) == (0, None)
        # A new row of failures tells a person again, once.
        ok_agent = fires(project)[-1]["agent"]
        run_ov("stop", ok_agent, cwd=project.root)
        wait_for(lambda: agent_state(project, ok_agent).is_terminal, 30, message=f"{ok_agent} to stop")
        start_agent(project, conn, "blocker2", {"turns": []}, start=False)
        assert [minute() for _ in range(3)] == ["failed", "failed", "skipped"]
        assert len(mail_rows(project, type="escalation")) == 2
    finally:
        scheduler.close()
        conn.close()


@pytest.mark.parametrize("kill_at", ["schedule_claimed", "schedule_running"])
def test_a_fire_killed_between_deciding_and_slinging_fires_at_most_once(gated: tuple[ProjectPaths, Path, Path],
                                                                        tmp_path: Path, kill_at: str) -> None:
    """schedule_claimed: the scheduler dies right after deciding and claiming (before any runner); another takes
    the claim over. schedule_running: the runner dies after taking the fire, before `ov sling`; the fire is lost,
    never run again, and the next occasion fires once."""
    project, _log, scenario = gated
    add_cron(project, "k", "* * * * *", ["sling", "builder", "k-{n}", "--runtime", "scripted", "--scenario",
                                         str(scenario), "--prompt", "deploy"], cursor=T0, agent="builder-k-{n}")
    clock = tmp_path / "clock"
    set_clock(clock, T0)
    dying = start_driver(project, clock, tmp_path / "stop-a", OV_TEST_KILL_AT=kill_at)
    survivor = None
    try:
        set_clock(clock, T0 + 40_000)  # the fire of minute 1 is due
        if kill_at == "schedule_claimed":
            assert dying.wait(timeout=30) == -signal.SIGKILL
            assert [f["status"] for f in fires(project)] == ["claimed"]
        else:
            wait_for(lambda: [f["status"] for f in fires(project)] == ["lost"], 30, interval=0.1,
                     message="the dead runner's fire to be settled lost")
            (tmp_path / "stop-a").touch()
            dying.wait(timeout=30)
            set_clock(clock, T0 + 100_000)  # minute 2: after the lost fire's back-off
        survivor = start_driver(project, clock, tmp_path / "stop-b")
        first_agent = "builder-k-1" if kill_at == "schedule_claimed" else "builder-k-2"
        parked_for_approval(project, first_agent)
        for step in range(1, 4):  # three more minutes: each occasion is held back
            set_clock(clock, T0 + 100_000 + step * MINUTE)
            wait_for(lambda step=step: len(schedule_events(project, "schedule_skipped")) == step, 30, interval=0.05,
                     message=f"skipped occasion {step}")
    finally:
        (tmp_path / "stop-a").touch()
        (tmp_path / "stop-b").touch()
        for proc in (dying, survivor):
            if proc is not None and proc.poll() is None:
                proc.wait(timeout=30)
    done = fires(project)
    assert agents(project, "builder-k-") == [first_agent], "one agent, started once"
    if kill_at == "schedule_claimed":
        assert [(f["n"], f["status"]) for f in done] == [(1, "ok")] and done[0]["claimer_pid"] != dying.pid
        assert mail_rows(project, type="escalation") == []
    else:
        assert [(f["n"], f["status"]) for f in done] == [(1, "lost"), (2, "ok")]
        assert [m["subject"] for m in mail_rows(project, type="escalation")] == ["schedule k: fire 1 was lost"]
    assert len(pending_approvals(project)) == 1
    assert subprocess.run(["git", "for-each-ref", "--format=%(refname:short)", "refs/heads/ov/"], cwd=project.root,
                          capture_output=True, text=True, check=True).stdout.split() == [f"ov/{first_agent}"]
