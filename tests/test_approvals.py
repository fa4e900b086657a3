"""Approval gates (issue 17): the guard asks first, a person or a parent decides, the watchdog times out.

Real agent loops on the scripted runtime (every tool call goes through the real `ov
guard`), real git with a bare remote, real SQLite, real `ov` commands. The real-claude
version of the push check is tests/e2e/test_approvals_claude.py.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import typing as t
from pathlib import Path

import pytest

from conftest import run_ov
from durable_helpers import kill_everything, make_remote, pushes, row, shared, wait_for
from overstory.paths import ProjectPaths
from overstory.store import sessions
from test_watchdog import start_agent, write_local_config

PUSH = "git push origin ${OVERSTORY_BRANCH}"
DONE = "ov mail send --type worker_done --subject done --body finished"


@pytest.fixture
def gated(project: ProjectPaths, tmp_path: Path) -> t.Iterator[tuple[ProjectPaths, Path]]:
    write_local_config(project, guards={"push_remotes": ["origin"]},
                       approvals={"rules": [{"match": "Bash(git push*)", "reason": "pushing leaves the machine"}]},
                       turns={"retry_backoff": 0.1, "kill_grace": 1, "max_concurrent": 8},
                       watchdog={"interval": 0.3}, sandbox={"writable": [str(shared(tmp_path))]})
    log = make_remote(project, shared(tmp_path))  # the remote is outside the project: bound writable
    yield project, log
    kill_everything(project)


def approvals_of(conn: t.Any, name: str) -> list[dict[str, t.Any]]:
    return [dict(r) for r in conn.execute("SELECT * FROM approvals WHERE agent = ? ORDER BY requested_at", (name,))]


def events(project: ProjectPaths, kind: str) -> list[dict[str, t.Any]]:
    from overstory.store.db import open_events

    conn = open_events(project.events_db)
    try:
        return [dict(r) for r in conn.execute("SELECT * FROM events WHERE kind = ? ORDER BY id", (kind,))]
    finally:
        conn.close()


def push_scenario(second_turn: list[dict[str, t.Any]]) -> dict[str, t.Any]:
    return {"turns": [
        {"actions": [{"write": {"path": "work.txt", "content": "done\n"}},
                     {"bash": "git add work.txt && git commit -qm work"},
                     {"bash": PUSH}], "result": "waiting for approval"},
        {"actions": second_turn, "result": "done"},
    ]}


def parked_for_approval(conn: t.Any, name: str) -> sessions.Session:
    return wait_for(lambda: (a := row(conn, name)).state == "parked" and a, 60, f"{name} to park")


def test_approve_lets_exactly_that_call_run_once(gated: tuple[ProjectPaths, Path], state_db: t.Any) -> None:
    project, log = gated
    name = start_agent(project, state_db, "ship", push_scenario([
        {"expect_in_prompt": "approved: you may now run"}, {"bash": PUSH}, {"bash": "git push origin HEAD"},
        {"bash": DONE}]))
    agent = parked_for_approval(state_db, name)
    assert agent.park_kind == "approval"
    [gate] = approvals_of(state_db, name)
    assert gate["status"] == "pending" and agent.state_reason == f"approval {gate['id']}"
    assert pushes(log) == {}, "the push waits for the decision"
    gates = state_db.execute("SELECT * FROM mail WHERE type = 'decision_gate'").fetchall()
    assert [(m["recipient"], json.loads(m["payload"])["approval_id"]) for m in gates] == [("operator", gate["id"])]
    assert f"ov approve {gate['id']}" in gates[0]["body"]
    denied = [r for r in state_db.execute("SELECT * FROM tool_calls WHERE agent = ? AND input LIKE '%git push%'",
                                          (name,))]
    assert [r["status"] for r in denied] == ["denied"]
    assert f"waiting for approval `{gate['id']}`: end your turn" in denied[0]["reason"]
    listed = run_ov("approvals", "--json", cwd=project.root)
    assert [a["id"] for a in json.loads(listed.stdout)] == [gate["id"]]

    done = run_ov("approve", gate["id"], "--note", "ship it", cwd=project.root)
    assert done.returncode == 0, done.stderr
    wait_for(lambda: row(state_db, name).is_terminal, 60, "the agent to finish")
    assert row(state_db, name).state == "completed"
    branch = row(state_db, name).branch
    assert pushes(log) == {f"refs/heads/{branch}": 1}
    calls = [(r["status"], json.loads(r["input"])["command"]) for r in state_db.execute(
        "SELECT * FROM tool_calls WHERE agent = ? AND input LIKE '%git push%' ORDER BY id", (name,))]
    # The approved call ran; a different push (HEAD) needed its own approval and was held.
    assert [s for s, _ in calls] == ["denied", "succeeded", "denied"]
    assert len(approvals_of(state_db, name)) == 2 and approvals_of(state_db, name)[0]["used_at"]
    twice = run_ov("approve", gate["id"], cwd=project.root)
    assert twice.returncode == 1 and "already approved" in twice.stderr and "Traceback" not in twice.stderr
    assert [e["kind"] for e in events(project, "approval_approved")] == ["approval_approved"]
    assert len(events(project, "approval_requested")) == 2
    # ov trace and ov status show them.
    trace = json.loads(run_ov("trace", name, "--json", cwd=project.root).stdout)
    first = trace["approvals"][0]
    assert (first["id"], first["status"], first["decided_by"]) == (gate["id"], "approved", "operator")
    assert f"approval {gate['id']} `git push origin {branch}`: approved by operator" in run_ov(
        "trace", name, cwd=project.root).stdout
    status = run_ov("status", cwd=project.root).stdout
    waiting = json.loads(run_ov("status", "--json", cwd=project.root).stdout)["waiting"]
    assert [w["id"] for w in waiting] == [approvals_of(state_db, name)[1]["id"]], "the HEAD push still waits"
    assert status.startswith("waiting for you:\n  " + waiting[0]["id"])


def test_reject_tells_the_agent_why_and_it_goes_on(gated: tuple[ProjectPaths, Path], state_db: t.Any) -> None:
    """Also: a notification target that refuses connections changes nothing for the agent."""
    import socket
    import subprocess

    from conftest import ov_command

    project, log = gated
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        refusing = sock.getsockname()[1]
    write_local_config(project, guards={"push_remotes": ["origin"]}, watchdog={"interval": 0.3},
                       approvals={"rules": [{"match": "Bash(git push*)"}]}, turns={"max_concurrent": 8},
                       notify={"targets": [f"json://127.0.0.1:{refusing}/hook"]})
    watchdog = subprocess.Popen([*ov_command(), "watchdog"], cwd=project.root, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
    try:
        name = start_agent(project, state_db, "nope", push_scenario([
            {"expect_in_prompt": "not before the review"}, {"bash": DONE}]))
        parked_for_approval(state_db, name)
        wait_for(lambda: events(project, "notify_failed"), 30, "the failed notification to be recorded")
    finally:
        watchdog.terminate()
        watchdog.wait(30)
    outbox = state_db.execute("SELECT attempts, sent_at FROM notify_outbox WHERE kind = 'approval_requested'"
                              ).fetchone()
    assert outbox["attempts"] >= 1 and outbox["sent_at"] is None
    [gate] = approvals_of(state_db, name)
    missing = run_ov("reject", gate["id"], cwd=project.root)
    assert missing.returncode == 2, "--reason is required"
    done = run_ov("reject", gate["id"], "--reason", "not before the review", cwd=project.root)
    assert done.returncode == 0, done.stderr
    wait_for(lambda: row(state_db, name).is_terminal, 60, "the agent to finish")
    assert row(state_db, name).state == "completed" and pushes(log) == {}
    late = run_ov("approve", gate["id"], cwd=project.root)
    assert late.returncode == 1 and "already rejected" in late.stderr


def test_a_loop_killed_between_the_turn_and_the_park_parks_on_restart(gated: tuple[ProjectPaths, Path],
                                                                      state_db: t.Any) -> None:
    """The gate and its mail are committed by the guard; the loop dies before parking the agent.
    The watchdog restarts the loop, which parks the agent; deciding then works as usual."""
    import subprocess

    from conftest import ov_command
    from overstory.agents.loop import FAULT_ENV, spawn_loop

    project, log = gated
    name = start_agent(project, state_db, "crash", push_scenario([
        {"expect_in_prompt": "approved: you may now run"}, {"bash": PUSH}, {"bash": DONE}]), start=False)
    agent = row(state_db, name)
    pid, ticks = spawn_loop(project, name, agent.generation, {**os.environ, FAULT_ENV: "approval_park"})
    sessions.update_fields(state_db, name, agent.generation, loop_pid=pid, loop_start_ticks=ticks)
    wait_for(lambda: approvals_of(state_db, name) and not __import__("overstory.procs").procs.is_alive(pid, ticks),
             60, "the loop to die after asking")
    assert row(state_db, name).state == "in_turn"
    watchdog = subprocess.Popen([*ov_command(), "watchdog"], cwd=project.root, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
    try:
        parked_for_approval(state_db, name)
        [gate] = approvals_of(state_db, name)
        assert state_db.execute("SELECT count(*) FROM mail WHERE type = 'decision_gate'").fetchone()[0] == 1
        assert run_ov("approve", gate["id"], cwd=project.root).returncode == 0
        wait_for(lambda: row(state_db, name).is_terminal, 60, "the agent to finish")
    finally:
        watchdog.terminate()
        watchdog.wait(30)
    assert row(state_db, name).state == "completed"
    assert pushes(log) == {f"refs/heads/{row(state_db, name).branch}": 1}


def _expire_in(root: str, barrier: t.Any, out: t.Any) -> None:
    from overstory.agents.approvals import expire_due
    from overstory.store.db import open_state

    conn = open_state(Path(root) / ".overstory" / "state.db")
    barrier.wait()
    out.put(expire_due(conn))


def test_a_timeout_expires_once_even_with_two_watchdogs(gated: tuple[ProjectPaths, Path], state_db: t.Any) -> None:
    project, log = gated
    write_local_config(project, guards={"push_remotes": ["origin"]}, turns={"max_concurrent": 8},
                       approvals={"rules": [{"match": "Bash(git push*)", "timeout": 3}]})
    name = start_agent(project, state_db, "slow", push_scenario([
        {"expect_in_prompt": "rejected (no answer in time)"}, {"bash": DONE}]))
    parked_for_approval(state_db, name)
    [gate] = approvals_of(state_db, name)
    assert gate["deadline"] - gate["requested_at"] == 3000
    wait_for(lambda: __import__("time").time() * 1000 > gate["deadline"] + 50, 10, "the deadline")
    ctx = multiprocessing.get_context("fork")
    barrier, out = ctx.Barrier(2), ctx.Queue()
    racers = [ctx.Process(target=_expire_in, args=(str(project.root), barrier, out)) for _ in range(2)]
    for racer in racers:
        racer.start()
    results = [out.get(timeout=30) for _ in racers]
    for racer in racers:
        racer.join(10)
    assert sorted(len(r) for r in results) == [0, 1], results
    assert len(events(project, "approval_expired")) == 1
    wait_for(lambda: row(state_db, name).is_terminal, 60, "the agent to finish")
    assert row(state_db, name).state == "completed" and pushes(log) == {}
    told = state_db.execute("SELECT * FROM mail WHERE recipient = ? AND subject LIKE 'rejected (no answer%'",
                            (name,)).fetchall()
    assert len(told) == 1
    late = run_ov("approve", gate["id"], cwd=project.root)
    assert late.returncode == 1 and "expired" in late.stderr


def test_the_parent_coordinator_approves_from_its_own_turn_and_a_sibling_is_refused(
        gated: tuple[ProjectPaths, Path], state_db: t.Any) -> None:
    from overstory.agents.loop import spawn_loop
    from overstory.agents.spawn import SlingRequest, sling
    from test_watchdog import load

    project, log = gated
    scenario = project.root.parent / "scenario-coordinator.json"
    scenario.write_text(json.dumps({"turns": []}))
    lead = sling(project, load(project), state_db, SlingRequest(  # the coordinator: at the project root
        capability="coordinator", task_id="run", runtime="scripted", scenario=scenario, at_project_root=True),
        start=False).name
    child = start_agent(project, state_db, "kid", push_scenario([{"bash": PUSH}, {"bash": DONE}]), parent=lead)
    other = start_agent(project, state_db, "other", {"turns": []}, capability="lead", parent=lead, start=False)
    parked_for_approval(state_db, child)
    [gate] = approvals_of(state_db, child)
    mail = state_db.execute("SELECT recipient FROM mail WHERE type = 'decision_gate'").fetchall()
    assert [m[0] for m in mail] == [lead], "the parent decides by default"

    def run_turn_of(name: str, command: str) -> None:
        """Give ``name`` a turn that runs ``command`` (its scenario is written now that the id is known)."""
        agent = row(state_db, name)
        scenario = Path(agent.spec["scenario"])  # the copy `ov sling` keeps in the agent's run dir
        scenario.write_text(json.dumps({"turns": [{"actions": [{"bash": command}], "result": "decided"}]}))
        pid, ticks = spawn_loop(project, name, agent.generation, dict(os.environ))
        sessions.update_fields(state_db, name, agent.generation, loop_pid=pid, loop_start_ticks=ticks)
        wait_for(lambda: row(state_db, name).turns >= 1, 60, f"{name}'s turn")

    run_turn_of(other, f"ov approve {gate['id']} --note mine")
    refused = [r for r in state_db.execute("SELECT * FROM tool_calls WHERE agent = ? AND input LIKE '%ov approve%'",
                                           (other,))]
    assert refused and f"{other} may not decide {gate['id']}" in (refused[0]["receipt"] or ""), refused
    assert approvals_of(state_db, child)[0]["status"] == "pending"
    run_turn_of(lead, f"ov approve {gate['id']} --note 'go ahead'")
    wait_for(lambda: row(state_db, child).is_terminal, 60, "the child to finish")
    decided = approvals_of(state_db, child)[0]
    assert (decided["status"], decided["decided_by"], decided["note"]) == ("approved", lead, "go ahead")
    assert row(state_db, child).state == "completed"
    assert pushes(log) == {f"refs/heads/{row(state_db, child).branch}": 1}


def test_on_timeout_escalate_asks_the_next_ancestor_then_the_operator(gated: tuple[ProjectPaths, Path],
                                                                     state_db: t.Any) -> None:
    from overstory.agents.approvals import expire_due
    from overstory.store import approvals

    project, _log = gated
    lead = start_agent(project, state_db, "boss", {"turns": []}, capability="lead", start=False)
    write_local_config(project, guards={"push_remotes": ["origin"]}, turns={"max_concurrent": 8},
                       approvals={"rules": [{"match": "Bash(git push*)", "timeout": 1}], "on_timeout": "escalate"})
    child = start_agent(project, state_db, "esc", push_scenario([{"bash": DONE}]), parent=lead)
    parked_for_approval(state_db, child)
    [gate] = approvals_of(state_db, child)
    assert gate["decider"] == lead
    later = gate["deadline"] + 1
    assert expire_due(state_db, now=later) == [(gate["id"], "escalated to operator")]
    assert expire_due(state_db, now=later) == [], "once per deadline"
    up = approvals.get(state_db, gate["id"])
    assert (up["decider"], up["status"], up["escalations"]) == ("operator", "pending", 1)
    to_operator = state_db.execute("SELECT * FROM mail WHERE type = 'decision_gate' AND recipient = 'operator'"
                                   ).fetchall()
    assert len(to_operator) == 1 and "escalated" in to_operator[0]["body"]
    assert expire_due(state_db, now=up["deadline"] + 1) == [(gate["id"], "expired")], "the operator is the top"
    wait_for(lambda: row(state_db, child).is_terminal, 60, "the child to finish")


# ---- the gate inside `ov guard`, one process per call (as the hook runs it) ----------------------------

HEAVY = ["pydantic", "rich", "git", "libtmux", "anthropic", "yaml", "apprise"]
GUARD = ("import json, sys\nfrom overstory.cli.main import main\nsys.argv = ['ov', 'guard']\n"
         "try:\n    main()\nexcept SystemExit as e:\n    code = e.code\nelse:\n    code = 0\n"
         f"print('HEAVY=' + json.dumps(sorted(m for m in {HEAVY!r} if m in sys.modules)), file=sys.stderr)\n"
         "sys.exit(code)\n")


def guard_call(project: ProjectPaths, tool: str, tool_input: dict[str, t.Any], *, root: Path | None = None
               ) -> tuple[str, list[str]]:
    import subprocess
    import sys

    from overstory.agents.gate import spec_env

    env = {**os.environ, "OVERSTORY_AGENT_NAME": "builder-g", "OVERSTORY_PROJECT_ROOT": str(root or project.root),
           "OVERSTORY_GENERATION": "1", "OVERSTORY_TASK_ID": "g", "OVERSTORY_CAPABILITY": "builder",
           "OVERSTORY_WORKTREE": str(project.root), "OVERSTORY_TURN_ID": "turn-1",
           "OVERSTORY_APPROVALS": spec_env([{"match": "mcp__*__deploy*", "reason": "deploys are ours"}],
                                           decider="operator", timeout=600, on_timeout="reject")}
    hook = {"hook_event_name": "PreToolUse", "tool_name": tool, "tool_input": tool_input, "cwd": str(project.root),
            "session_id": "s", "tool_use_id": "toolu_1"}
    done = subprocess.run([sys.executable, "-c", GUARD], input=json.dumps(hook), capture_output=True, text=True,
                          env=env, timeout=60, check=False)
    heavy = json.loads(done.stderr.split("HEAVY=")[-1].strip())
    reason = json.loads(done.stdout)["hookSpecificOutput"]["permissionDecisionReason"] if done.stdout.strip() else ""
    return reason, heavy


def test_the_guard_asks_once_allows_the_approved_call_once_and_stays_light(project: ProjectPaths,
                                                                            state_db: t.Any, tmp_path: Path) -> None:
    from overstory.agents.approvals import decide

    sessions.create_session(state_db, name="builder-g", capability="builder", task_id="g", runtime="scripted",
                            actor="test")
    deploy = {"service": "web", "version": "1.2"}
    reason, heavy = guard_call(project, "mcp__prod__deploy", deploy)
    assert heavy == [], "`ov guard` with a gate imports nothing heavy"
    [gate] = [dict(r) for r in state_db.execute("SELECT * FROM approvals")]
    assert reason.startswith(f"ov: waiting for approval `{gate['id']}`: end your turn; you will be told the answer")
    again, _ = guard_call(project, "mcp__prod__deploy", deploy)
    assert "asked already" in again and state_db.execute("SELECT count(*) FROM approvals").fetchone()[0] == 1
    assert state_db.execute("SELECT count(*) FROM mail WHERE type = 'decision_gate'").fetchone()[0] == 1
    from overstory.store.approvals import ApprovalError

    with pytest.raises(ApprovalError, match="builder-g may not decide"):
        decide(state_db, gate["id"], approve=True, by="builder-g")  # nobody approves its own request
    decide(state_db, gate["id"], approve=True, by="operator")
    other, _ = guard_call(project, "mcp__prod__deploy", {"service": "db", "version": "1.2"})
    assert "waiting for approval" in other, "a different call needs its own approval"
    allowed, heavy = guard_call(project, "mcp__prod__deploy", deploy)
    assert allowed == "" and heavy == []
    assert state_db.execute("SELECT used_at FROM approvals WHERE id = ?", (gate["id"],)).fetchone()[0]
    once_more, _ = guard_call(project, "mcp__prod__deploy", deploy)
    assert "waiting for approval" in once_more, "an approval allows the call once"
    untouched, _ = guard_call(project, "mcp__prod__status", {})
    assert untouched == ""
    # Fail closed: a gate whose state cannot be opened refuses the call.
    broken, _ = guard_call(project, "mcp__prod__deploy", deploy, root=tmp_path / "nowhere")
    assert "could not be opened" in broken


def test_a_turn_past_spend_over_usd_waits_for_an_approval(gated: tuple[ProjectPaths, Path], state_db: t.Any) -> None:
    project, _log = gated
    write_local_config(project, approvals={"spend_over_usd": 0.5}, turns={"max_concurrent": 8})
    name = start_agent(project, state_db, "spend", {"turns": [
        {"actions": [{"usage": {"input_tokens": 10, "output_tokens": 10, "cost_usd": 1.0}}], "result": "spent"},
        {"actions": [{"expect_in_prompt": "keep going"}, {"bash": DONE}], "result": "done"}]})
    wait_for(lambda: row(state_db, name).turns == 1 and row(state_db, name).state == "between_turns", 60,
             "the first turn")
    assert row(state_db, name).cost_usd >= 1.0
    assert run_ov("mail", "send", "--to", name, "--subject", "keep going", "--body", "more",
                  cwd=project.root).returncode == 0
    agent = parked_for_approval(state_db, name)
    [gate] = approvals_of(state_db, name)
    assert gate["tool"] == "Turn" and agent.state_reason == f"approval {gate['id']}" and agent.turns == 1
    assert run_ov("approve", gate["id"], cwd=project.root).returncode == 0
    wait_for(lambda: row(state_db, name).is_terminal, 60, "the agent to finish")
    assert row(state_db, name).state == "completed" and row(state_db, name).turns == 2


def test_a_rejected_spend_parks_for_budget_and_ov_resume_asks_again(gated: tuple[ProjectPaths, Path],
                                                                   state_db: t.Any) -> None:
    project, _log = gated
    write_local_config(project, approvals={"spend_over_usd": 0.5}, turns={"max_concurrent": 8})
    name = start_agent(project, state_db, "spent", {"turns": [
        {"actions": [{"usage": {"input_tokens": 10, "output_tokens": 10, "cost_usd": 1.0}}], "result": "spent"},
        {"actions": [{"bash": DONE}], "result": "done"}]})
    wait_for(lambda: row(state_db, name).turns == 1 and row(state_db, name).state == "between_turns", 60,
             "the first turn")
    run_ov("mail", "send", "--to", name, "--subject", "keep going", "--body", "more", cwd=project.root)
    parked_for_approval(state_db, name)
    [gate] = approvals_of(state_db, name)
    assert run_ov("reject", gate["id"], "--reason", "too expensive", cwd=project.root).returncode == 0
    agent = wait_for(lambda: (a := row(state_db, name)).state == "parked" and a.park_kind == "budget" and a, 60,
                     "the budget park")
    assert "too expensive" in agent.state_reason and agent.turns == 1, "no turn past the spend"
    missing = run_ov("approve", "apr-nope", cwd=project.root)
    assert missing.returncode == 1 and "no approval apr-nope" in missing.stderr
    assert run_ov("resume", name, cwd=project.root).returncode == 0
    wait_for(lambda: len(approvals_of(state_db, name)) == 2 and row(state_db, name).state == "parked", 60,
             "a new request after ov resume")
    assert approvals_of(state_db, name)[1]["status"] == "pending" and row(state_db, name).turns == 1


def test_a_stopped_agents_gate_is_dropped_by_the_watchdog(gated: tuple[ProjectPaths, Path], state_db: t.Any) -> None:
    from overstory.agents.approvals import expire_due

    project, _log = gated
    name = start_agent(project, state_db, "stopped", push_scenario([{"bash": DONE}]))
    parked_for_approval(state_db, name)
    assert run_ov("stop", name, cwd=project.root).returncode == 0
    [gate] = approvals_of(state_db, name)
    assert expire_due(state_db) == [(gate["id"], "dropped")]
    assert approvals_of(state_db, name)[0]["status"] == "expired"
    assert json.loads(run_ov("status", "--json", cwd=project.root).stdout)["waiting"] == []
