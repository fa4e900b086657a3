"""Budgets, quota and auth parking, idle nudges, `ov stop` and `ov wait` with real agent processes.

The scripted runtime stands in for the model (it prints the stream-json the real CLI
prints, with the token usage, rate-limit and auth events a scenario asks for); the
loops, process groups, guards, SQLite and `ov` commands are the real ones. The same
checks with the real claude CLI are in tests/e2e/test_cost_control_claude.py.
"""

from __future__ import annotations

import json
import os
import signal
import time

import pytest

from agent_helpers import agent_state, mail_rows, wait_for, write_scenario
from conftest import run_ov
from overstory import procs
from overstory.agents.spawn import SlingRequest, sling
from overstory.config.model import load_config
from overstory.store.db import open_events, open_state

REPORT = {"bash": 'ov mail send --type worker_done --subject "done ${OVERSTORY_AGENT_NAME}" --body ok'}
# $1.00: claude-opus-4-8 costs $5 per million input tokens (measured; see tests/fixtures/CLAUDE_PROBE_NOTES.md).
BIG = {"input_tokens": 200_000, "output_tokens": 0, "model": "claude-opus-4-8"}


def start(project, tmp_path, turns, *, task="t1", env=None, budget=None, capability="builder", parent=None,
          scenario_name=None):
    scenario = write_scenario(tmp_path / f"{scenario_name or task}.json", turns)
    environ = {**os.environ, **(env or {})}
    config = load_config(project.config_file, project.local_config_file, environ=environ)
    conn = open_state(project.state_db)
    try:
        return sling(project, config, conn, SlingRequest(capability=capability, task_id=task, runtime="scripted",
                                                         scenario=scenario, budget=budget, parent=parent), environ)
    finally:
        conn.close()


def events(project, agent, kind):
    conn = open_events(project.events_db)
    try:
        rows = conn.execute("SELECT at, summary, data FROM events WHERE agent = ? AND kind = ? ORDER BY id",
                            (agent, kind)).fetchall()
        return [{"at": r[0], "summary": r[1], "data": json.loads(r[2]) if r[2] else None} for r in rows]
    finally:
        conn.close()


def turns_of(project, agent):
    conn = open_state(project.state_db)
    try:
        return [dict(r) for r in conn.execute("SELECT * FROM turns WHERE agent = ? ORDER BY started_at", (agent,))]
    finally:
        conn.close()


def settled(project, name, timeout=60):
    return wait_for(lambda: (a := agent_state(project, name)) and (a.is_terminal or a.state == "parked") and a,
                    timeout, message=f"{name} to settle")


def test_crossing_max_usd_mid_turn_parks_and_resume_continues_the_session(project, tmp_path):
    once = "spent-once"  # in the agent's state dir: the sandbox's /tmp is private to each turn
    # The 30 s sleep holds the first turn open until ov stops it; the resumed turn skips both (once).
    start(project, tmp_path, [{"actions": [{"usage": BIG, "once": str(once)}, {"sleep": 30, "once": "slept-once"},
                                           REPORT]}],
          budget={"max_usd": 0.5})
    agent = settled(project, "builder-t1")
    assert agent.state == "parked" and agent.park_kind == "budget"
    assert agent.state_reason.startswith("budget: max_usd 0.50 reached (1.00")
    first = turns_of(project, "builder-t1")[0]
    assert first["status"] == "budget" and first["cost_estimated"] == 1 and first["cost_usd"] == pytest.approx(1.0, 0.01)
    assert not procs.group_members(first["pgid"]), "the turn's process group is gone"
    crossed = events(project, "builder-t1", "budget_crossed")
    stopped = events(project, "builder-t1", "turn_stopped")
    assert len(crossed) == 1 and len(stopped) == 1 and stopped[0]["data"]["stop_seconds"] < 2
    assert mail_rows(project, type="dispatch")[0]["read_at"] is None, "its mail is unread again"
    escalation = mail_rows(project, type="escalation")
    assert len(escalation) == 1 and escalation[0]["recipient"] == "operator"
    assert json.loads(escalation[0]["payload"])["details"]["limit"] == "max_usd"

    waited = run_ov("wait", "builder-t1", "--timeout", "5", cwd=project.root)
    assert waited.returncode == 4, waited.stdout + waited.stderr
    resumed = run_ov("resume", "builder-t1", "--add-usd", "5", cwd=project.root)
    assert resumed.returncode == 0, resumed.stderr
    waited = run_ov("wait", "builder-t1", "--timeout", "90", cwd=project.root, timeout=120)
    assert waited.returncode == 0, waited.stdout + waited.stderr
    rows = turns_of(project, "builder-t1")
    assert [r["status"] for r in rows] == ["budget", "ok"]
    assert rows[1]["resumed"] == 1 and rows[1]["session_id"] == rows[0]["session_id"]
    assert len(mail_rows(project, type="escalation")) == 1 and len(mail_rows(project, type="worker_done")) == 1


def test_no_turn_starts_past_max_turns(project, tmp_path):
    start(project, tmp_path, [{"actions": [{"bash": "ov mail send --to operator --subject ready"}]},
                              {"actions": [REPORT]}], budget={"max_turns": 1})
    wait_for(lambda: (a := agent_state(project, "builder-t1")) and a.turns == 1 and a.state == "between_turns", 30)
    assert run_ov("mail", "send", "--to", "builder-t1", "--subject", "go on", cwd=project.root).returncode == 0
    agent = settled(project, "builder-t1")
    assert agent.state == "parked" and agent.state_reason == "budget: max_turns 1 reached (1)"
    assert len(turns_of(project, "builder-t1")) == 1, "the second turn never started"
    assert len(mail_rows(project, type="escalation")) == 1
    assert len([m for m in mail_rows(project, recipient="builder-t1") if m["read_at"] is None]) == 1


def test_the_guard_refuses_the_tool_call_past_the_limit_and_the_agent_parks(project, tmp_path):
    # In the worktree: the sandbox's /tmp (where tmp_path is) is private to the turn.
    marker = project.worktree("builder-t1") / "third-ran"
    start(project, tmp_path, [{"actions": [{"bash": "true"}, {"bash": "true"}, {"bash": "touch third-ran"},
                                           {"sleep": 20}, REPORT]}], budget={"max_tool_calls": 2})
    agent = settled(project, "builder-t1")
    assert agent.state == "parked" and agent.state_reason == "budget: max_tool_calls 2 reached (2)"
    assert not marker.exists(), "the call past the limit never ran"
    conn = open_state(project.state_db)
    try:
        row = conn.execute("SELECT tool_calls, refused_tool_calls FROM budgets WHERE name = 'builder-t1'").fetchone()
    finally:
        conn.close()
    assert tuple(row) == (2, 1)
    assert turns_of(project, "builder-t1")[0]["status"] == "budget"


def test_max_wallclock_stops_a_long_turn(project, tmp_path):
    start(project, tmp_path, [{"actions": [{"text": "thinking"}, {"sleep": 60}, REPORT]}],
          budget={"max_wallclock": 3})
    agent = settled(project, "builder-t1", timeout=30)
    assert agent.state == "parked" and agent.state_reason.startswith("budget: max_wallclock 3s reached")
    assert turns_of(project, "builder-t1")[0]["status"] == "budget"


def test_a_run_budget_parks_every_agent_of_the_run_and_starts_no_turn(project, tmp_path):
    coordinator = write_scenario(tmp_path / "coordinator.json", [{"actions": [{"text": "ready"}]}])
    started = run_ov("coordinator", "start", "--runtime", "scripted", "--scenario", str(coordinator),
                     "--budget-usd", "2", cwd=project.root)
    assert started.returncode == 0, started.stderr
    for task in ("a", "b", "c"):
        # The once markers are relative: in the agent's state dir (a sandboxed turn has a private /tmp). The
        # sleep holds each first turn open until ov parks it; the resumed turns skip it.
        start(project, tmp_path, [{"actions": [{"usage": BIG, "once": f"once-{task}"},
                                               {"sleep": 30, "once": f"slept-{task}"}, REPORT]}], task=task)
    names = ["builder-a", "builder-b", "builder-c"]
    for name in names:
        assert settled(project, name).state == "parked"
    conn = open_state(project.state_db)
    try:
        run_id = conn.execute("SELECT run_id FROM sessions WHERE name = 'builder-a'").fetchone()[0]
        reasons = {r["name"]: r["state_reason"] for r in conn.execute("SELECT name, state_reason FROM sessions")}
    finally:
        conn.close()
    assert all(reasons[n].startswith(f"budget: run {run_id} max_usd 2.00 reached") for n in names), reasons
    assert wait_for(lambda: agent_state(project, "coordinator").state == "parked", 10)
    turn_count = sum(len(turns_of(project, n)) for n in names)
    time.sleep(3)
    assert sum(len(turns_of(project, n)) for n in names) == turn_count, "no further turn started"
    to_operator = [m for m in mail_rows(project, type="escalation") if m["recipient"] == "operator"]
    assert len(to_operator) == 1 and run_id in to_operator[0]["subject"]
    assert run_ov("wait", "--run", run_id, "--timeout", "5", cwd=project.root).returncode == 4
    resumed = run_ov("run", "resume", run_id, "--add-usd", "10", cwd=project.root)
    assert resumed.returncode == 0, resumed.stderr
    def finished(name: str) -> bool:
        agent = agent_state(project, name)
        if agent.state == "parked" and agent.state_reason.startswith("budget: max_usd"):
            # Its own limit: a child slung after others spent was capped at what the run had left then, and
            # topping up the run does not raise that cap (a known gap, in the session note).
            run_ov("resume", name, "--add-usd", "5", cwd=project.root)
        return agent.state == "completed"

    for name in names:
        try:
            wait_for(lambda n=name: finished(n), 150, interval=0.5, message=name)
        except AssertionError:
            agent = agent_state(project, name)
            raise AssertionError(f"{name} is {agent.state} ({agent.state_reason}); turns {turns_of(project, name)}") from None
    assert len(mail_rows(project, type="worker_done")) == 3


def test_a_usage_limit_parks_every_agent_of_the_provider_until_the_reset(project, tmp_path):
    env = {"OV_QUOTA_STAGGER": "1"}
    # B asks a question and waits (idle), then A hits the subscription's usage limit.
    start(project, tmp_path, [{"actions": [{"bash": "ov mail send --to operator --type question --subject which"}]},
                              {"actions": [REPORT]}], task="b", env=env)
    wait_for(lambda: (a := agent_state(project, "builder-b")) and a.state == "between_turns" and a.turns == 1, 30)
    start(project, tmp_path, [{"actions": [{"api_error": "usage_limit", "resets_in": 4,
                                            "once": "limited-once"}, REPORT]}], task="a", env=env)
    a = settled(project, "builder-a")
    b = wait_for(lambda: (x := agent_state(project, "builder-b")) and x.state == "parked" and x, 10)
    assert a.park_kind == b.park_kind == "quota" and a.retries == 0, "no retry was consumed"
    assert b.park_until > a.park_until, "staggered"
    assert run_ov("mail", "send", "--to", "builder-b", "--subject", "answer", "--body", "the first",
                  cwd=project.root).returncode == 0
    waited = run_ov("wait", "builder-b", "--timeout", "1", cwd=project.root)
    assert waited.returncode == 5
    for name in ("builder-a", "builder-b"):
        assert wait_for(lambda n=name: agent_state(project, n).state == "completed", 60, message=name)
    assert [r["status"] for r in turns_of(project, "builder-a")] == ["rate_limit", "ok"]
    done = mail_rows(project, type="worker_done")
    assert sorted(m["sender"] for m in done) == ["builder-a", "builder-b"], "nothing lost or duplicated"
    assert all(m["read_at"] is not None for m in mail_rows(project, recipient="builder-a"))


def test_a_rate_limit_without_a_reset_time_backs_off(project, tmp_path):
    start(project, tmp_path, [{"actions": [{"api_error": "rate_limit", "once": "once"}, REPORT]}],
          env={"OV_QUOTA_BACKOFF_INITIAL": "2"})
    agent = settled(project, "builder-t1")
    assert agent.park_kind == "quota" and 1500 <= agent.park_until - turns_of(project, "builder-t1")[0]["ended_at"] <= 3000
    assert wait_for(lambda: agent_state(project, "builder-t1").state == "completed", 30)
    assert mail_rows(project, type="escalation") == []


def test_a_rejected_key_parks_at_the_first_retry_and_resume_brings_the_fixed_key(project, tmp_path):
    report_with_good_key = {"bash": 'test "$ANTHROPIC_API_KEY" = good && ' + REPORT["bash"]}
    scenario = [{"actions": [{"api_error": "auth_retry", "retry_seconds": 120, "once": "auth-once"},
                             report_with_good_key]}]
    began = time.monotonic()
    start(project, tmp_path, scenario, env={"ANTHROPIC_API_KEY": "bad"})
    agent = settled(project, "builder-t1")
    assert time.monotonic() - began < 60, "stopped at the first retry, not after the CLI's minutes of retries"
    assert agent.park_kind == "auth" and agent.state_reason.startswith("auth: the API rejected the credentials (401")
    assert [r["status"] for r in turns_of(project, "builder-t1")] == ["auth"]
    escalation = mail_rows(project, type="escalation")
    assert len(escalation) == 1 and escalation[0]["recipient"] == "operator"
    doctor = run_ov("doctor", cwd=project.root)
    assert doctor.returncode == 1 and "parked because the API rejected their key" in doctor.stdout
    assert run_ov("wait", "builder-t1", "--timeout", "2", cwd=project.root).returncode == 6
    resumed = run_ov("resume", "builder-t1", cwd=project.root, env={"ANTHROPIC_API_KEY": "good"})
    assert resumed.returncode == 0 and "ANTHROPIC_API_KEY" in resumed.stdout, resumed.stdout + resumed.stderr
    assert wait_for(lambda: agent_state(project, "builder-t1").state == "completed", 60)


def test_an_agent_that_ends_without_a_report_is_nudged_then_escalated_once(project, tmp_path):
    start(project, tmp_path, [{"actions": [{"text": "I looked around."}]}] * 4,
          env={"OV_TURNS_IDLE_NUDGE": "1", "OV_TURNS_MAX_NUDGES": "2"})
    agent = wait_for(lambda: (a := agent_state(project, "builder-t1")) and a.state == "stalled" and a, 60)
    assert agent.state_reason == "no report" and agent.turns == 3  # the dispatch and two nudges
    nudges = mail_rows(project, type="nudge")
    assert [m["sender"] for m in nudges] == ["ov", "ov"] and all(m["read_at"] for m in nudges)
    time.sleep(3)
    escalation = mail_rows(project, type="escalation")
    assert len(escalation) == 1 and escalation[0]["recipient"] == "operator"
    assert agent_state(project, "builder-t1").state == "stalled"


def test_a_waiting_agent_is_not_nudged(project, tmp_path):
    start(project, tmp_path, [{"actions": [{"bash": "ov mail send --to operator --type question --subject which"}]}],
          env={"OV_TURNS_IDLE_NUDGE": "1"})
    wait_for(lambda: (a := agent_state(project, "builder-t1")) and a.state == "between_turns" and a.turns == 1, 30)
    time.sleep(4)
    assert mail_rows(project, type="nudge") == [] and agent_state(project, "builder-t1").state == "between_turns"


def test_stopping_a_child_tells_its_parent_once(project, tmp_path):
    lead = start(project, tmp_path, [{"actions": [{"text": "waiting for my builder"}]}], task="l", capability="lead")
    start(project, tmp_path, [{"actions": [{"sleep": 60}, REPORT]}], task="c", parent=lead.name)
    wait_for(lambda: agent_state(project, "builder-c").state == "in_turn", 30)
    assert run_ov("stop", "builder-c", cwd=project.root).returncode == 0
    assert run_ov("stop", "builder-c", cwd=project.root).returncode == 0  # a second stop sends nothing
    told = mail_rows(project, recipient=lead.name, type="status")
    assert len(told) == 1 and told[0]["subject"] == "builder-c stopped by the operator"
    assert json.loads(told[0]["payload"])["reason"] == "stopped by the operator"
    status = run_ov("status", "--all", cwd=project.root)
    assert "stopped by the operator" in status.stdout
    run_ov("stop", lead.name, cwd=project.root)
    assert mail_rows(project, recipient="operator", type="status") == [], "the operator is not told what they did"


def test_wait_exit_codes(project, tmp_path):
    start(project, tmp_path, [{"actions": [REPORT]}], task="ok")
    start(project, tmp_path, [{"actions": [{"api_error": "invalid_request"}]}], task="dead")
    start(project, tmp_path, [{"actions": [{"sleep": 60}]}], task="slow")
    assert run_ov("wait", "builder-ok", "--timeout", "60", cwd=project.root).returncode == 0
    assert run_ov("wait", "builder-dead", "--timeout", "60", cwd=project.root).returncode == 3
    timed = run_ov("wait", "builder-slow", "--timeout", "0.5", "--json", cwd=project.root)
    assert timed.returncode == 124 and json.loads(timed.stdout)["timed_out"] is True
    assert run_ov("wait", cwd=project.root).returncode == 2
    assert run_ov("wait", "builder-nobody", cwd=project.root).returncode == 1
    run_ov("stop", "builder-slow", cwd=project.root)


def test_a_loop_that_dies_between_the_budget_stop_and_the_park_parks_once_after_recovery(project, tmp_path):
    """Crash safety: the watchdog re-adopts the agent and the pre-turn budget check parks it, once."""
    import signal
    import subprocess

    from conftest import ov_command

    once = "spent-once"  # in the agent's state dir: the sandbox's /tmp is private to each turn
    start(project, tmp_path, [{"actions": [{"usage": BIG, "once": str(once)}, {"sleep": 30, "once": "slept-once"},
                                           REPORT]}],
          budget={"max_usd": 0.5}, env={"OV_TEST_DIE_AT": "park"})
    wait_for(lambda: (rows := turns_of(project, "builder-t1")) and rows[0]["status"] == "budget", 60)
    wait_for(lambda: not procs.is_alive(agent_state(project, "builder-t1").loop_pid), 10, message="the loop died")
    assert agent_state(project, "builder-t1").state == "in_turn", "it died before parking"
    watchdog = subprocess.Popen([*ov_command(), "watchdog", "--interval", "0.5"], cwd=project.root,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        agent = settled(project, "builder-t1")
    finally:
        os.killpg(watchdog.pid, signal.SIGTERM)
        watchdog.wait(timeout=30)
    assert agent.state == "parked" and agent.state_reason.startswith("budget: max_usd 0.50 reached (1.00")
    assert len(mail_rows(project, type="escalation")) == 1
    assert mail_rows(project, type="dispatch")[0]["read_at"] is None
    assert len(turns_of(project, "builder-t1")) == 1, "no turn was started past the limit"


def test_demo_exit_codes(tmp_path):
    from conftest import stop_project_processes
    from overstory.paths import ProjectPaths

    quick = run_ov("demo", "--dir", str(tmp_path / "quick"), "--timeout", "0", "--json", cwd=tmp_path)
    try:
        assert quick.returncode == 124, quick.stderr
        assert json.loads(quick.stdout)["exit_code"] == 124
    finally:
        stop_project_processes(ProjectPaths(tmp_path / "quick"))
    full = run_ov("demo", "--dir", str(tmp_path / "full"), "--timeout", "120", cwd=tmp_path, timeout=180)
    try:
        assert full.returncode == 0, full.stdout + full.stderr
        assert "every agent completed" in full.stdout
    finally:
        stop_project_processes(ProjectPaths(tmp_path / "full"))


def test_a_turn_whose_loop_dies_carries_its_last_estimate_so_turns_and_budget_agree(project, tmp_path):
    """kill -9 of the loop after a priced message: the watchdog settles the turn, and the estimate the budget
    keeps as spent is on the turn's row too (chaos seed 27: a run's spend was on no turn, so nothing was
    'in a turn' when it crossed)."""
    from test_watchdog import make_watchdog, write_local_config

    marker_dir = tmp_path / "shared"  # bound writable into the agent's sandbox: the test sees the marker
    marker_dir.mkdir()
    write_local_config(project, turns={"retry_backoff": 0.05, "kill_grace": 1, "max_retries": 3},
                       watchdog={"interval": 0.2}, sandbox={"writable": [str(marker_dir)]})
    marker = marker_dir / "slept-once"
    first = start(project, tmp_path, [{"actions": [{"usage": {"cost_usd": 0.25}, "once": str(marker_dir / "paid")},
                                                   {"sleep": 60, "once": str(marker)}, REPORT]}])
    conn = open_state(project.state_db)
    try:
        live = lambda: conn.execute("SELECT live_usd FROM budgets WHERE scope = 'agent' AND name = ?",  # noqa: E731
                                    (first.name,)).fetchone()[0]
        busy = wait_for(lambda: (a := agent_state(project, first.name)) and a.state == "in_turn" and marker.exists()
                        and live() > 0 and a, 60, message="the turn to be priced and asleep")
        assert live() == pytest.approx(0.25)
        os.kill(busy.loop_pid, signal.SIGKILL)
        wait_for(lambda: not procs.is_alive(busy.loop_pid, busy.loop_start_ticks), message="the loop to die")
        dog = make_watchdog(project)
        try:
            assert [(a.agent, a.kind) for a in dog.tick()] == [(first.name, "readopted")]
        finally:
            dog.close()
        assert settled(project, first.name).state == "completed"
        rows = turns_of(project, first.name)
        assert [r["status"] for r in rows] == ["failed", "ok"], rows
        assert rows[0]["cost_usd"] == pytest.approx(0.25), "the dead turn's row carries what it was estimated at"
        spent = conn.execute("SELECT spent_usd FROM budgets WHERE scope = 'agent' AND name = ?",
                             (first.name,)).fetchone()[0]
        assert spent == pytest.approx(sum(r["cost_usd"] or 0 for r in rows))
    finally:
        conn.close()
