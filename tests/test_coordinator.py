"""The coordinator: started at the project root, mailed, asked, persistent, stopped.

Real agent loops, real `ov` subprocesses and the scripted runtime; the scripted
coordinator drives `ov sling` through Bash exactly as a model would.
"""

from __future__ import annotations

import json
import time
import typing as t
from pathlib import Path

import pytest

from agent_helpers import agent_state, wait_for
from conftest import run_ov
from overstory.paths import ProjectPaths
from overstory.runtimes.scripted.scenarios import default_scenario
from overstory.store import mail, runs, sessions
from overstory.store.db import open_state

# ---- helpers shared with test_hierarchy.py and test_runs.py --------------------------------


def write_local_config(project: ProjectPaths, **sections: t.Any) -> None:
    import yaml

    project.local_config_file.write_text(yaml.safe_dump(sections))


@pytest.fixture
def team(project: ProjectPaths) -> t.Iterator[ProjectPaths]:
    """A project tuned for quick scripted runs; every agent still active afterwards is stopped."""
    write_local_config(project, runtime={"default": "scripted"},
                       turns={"retry_backoff": 0.05, "kill_grace": 1, "max_concurrent": 8})
    yield project
    stop_everything(project)


def stop_everything(project: ProjectPaths) -> None:
    from overstory.agents.stop import stop_agent

    conn = open_state(project.state_db)
    try:
        for agent in sessions.list_sessions(conn, include_terminal=False):
            try:
                stop_agent(project, conn, agent.name, force=True, kill_grace=0.5)
            except Exception:  # noqa: BLE001 - best effort: the test already has its verdict
                pass
    finally:
        conn.close()


def scenario(path: Path, agents: dict[str, list[dict[str, t.Any]]]) -> Path:
    """One scenario file for several agents, keyed by agent-name glob."""
    path.write_text(json.dumps({"agents": {name: {"turns": turns} for name, turns in agents.items()}}))
    return path


def wait_state(project: ProjectPaths, name: str, states: t.Collection[str], timeout: float = 60) -> sessions.Session:
    def reached() -> sessions.Session | None:
        agent = agent_state(project, name)
        return agent if agent is not None and agent.state in states else None

    return wait_for(reached, timeout, message=f"{name} to reach {sorted(states)}")


def wait_idle(project: ProjectPaths, name: str, turns: int, timeout: float = 60) -> sessions.Session:
    """Until ``name`` has finished ``turns`` turns and waits between turns with an empty inbox."""
    def idle() -> sessions.Session | None:
        conn = open_state(project.state_db)
        try:
            agent = sessions.get(conn, name)
            pending = mail.pending_count(conn, name)
        finally:
            conn.close()
        ok = agent is not None and agent.turns >= turns and agent.state == "between_turns" and pending == 0
        return agent if ok else None

    return wait_for(idle, timeout, message=f"{name} idle after {turns} turn(s)")


def mails(project: ProjectPaths, **where: t.Any) -> list[mail.Message]:
    conn = open_state(project.state_db)
    try:
        return mail.list_messages(conn, limit=None, **where)
    finally:
        conn.close()


def sling_cmd(capability: str, task: str, scenario_path: Path, *extra: str) -> str:
    words = ["ov", "sling", capability, task, "--runtime", "scripted", "--scenario", str(scenario_path), *extra]
    return " ".join(words)


READY = [{"actions": [{"text": "ready"}], "result": "ready"}]
# A builder that writes, commits and reports worker_done (the built-in scripted builder).
BUILDER_DONE = default_scenario("builder", "task")["turns"]


# ---- start ------------------------------------------------------------------------------------


def test_start_runs_at_the_root_with_its_instructions_passed_as_flags(team: ProjectPaths, tmp_path: Path) -> None:
    path = scenario(tmp_path / "s.json", {"coordinator": READY})
    started = run_ov("coordinator", "start", "--scenario", str(path), "--json", cwd=team.root)
    assert started.returncode == 0, started.stderr
    info = json.loads(started.stdout)
    assert info["name"] == "coordinator" and info["run_created"] is True and info["run_id"].startswith("run-")

    agent = wait_idle(team, "coordinator", 1)
    assert agent.capability == "coordinator" and agent.parent == "operator" and agent.depth == 0
    assert agent.worktree is None and agent.branch is None and agent.run_id == info["run_id"]
    # Nothing is written into the user's own .claude/ or worktrees.
    assert not (team.root / ".claude").exists()
    assert not team.worktree("coordinator").exists()
    run_dir = team.run_dir / "coordinator"
    instructions = (run_dir / "CLAUDE.md").read_text()
    assert "# Role: coordinator" in instructions and "ov sling" in instructions
    hooks = json.loads((run_dir / "settings.json").read_text())
    assert "guard" in hooks["hooks"]["PreToolUse"][0]["hooks"][0]["command"]
    # Every turn gets them as --append-system-prompt-file and --settings, and nothing else counts.
    command = json.loads(next((team.logs_dir / "coordinator").glob("*/command.json")).read_text())
    assert command[command.index("--append-system-prompt-file") + 1] == str(run_dir / "CLAUDE.md")
    # Headless turns get the HTTP hooks the loop serves (endpoint.hooks), made from settings.json.
    assert command[command.index("--settings") + 1] == str(run_dir / "settings.http.json")
    http = json.loads((run_dir / "settings.http.json").read_text())["hooks"]["PreToolUse"][0]["hooks"][0]
    assert http["type"] == "http" and http["onFailure"] == "block"
    assert command[command.index("--setting-sources") + 1] == ""
    # A finished turn does not complete a persistent agent.
    assert agent_state(team, "coordinator").state == "between_turns"


def test_only_one_coordinator_at_a_time(team: ProjectPaths, tmp_path: Path) -> None:
    path = scenario(tmp_path / "s.json", {"coordinator": READY})
    assert run_ov("coordinator", "start", "--scenario", str(path), cwd=team.root).returncode == 0
    again = run_ov("coordinator", "start", "--scenario", str(path), cwd=team.root)
    assert again.returncode == 1
    assert "already running" in again.stderr and "ov coordinator stop" in again.stderr
    assert len(again.stderr.strip().splitlines()) == 1
    conn = open_state(team.state_db)
    try:
        assert conn.execute("SELECT count(*) FROM runs").fetchone()[0] == 1
    finally:
        conn.close()


def test_an_agent_cannot_start_a_coordinator(team: ProjectPaths) -> None:
    refused = run_ov("coordinator", "start", cwd=team.root,
                     env={"OVERSTORY_AGENT_NAME": "lead-x", "OVERSTORY_CAPABILITY": "lead"})
    assert refused.returncode == 1 and "only the operator starts the coordinator" in refused.stderr
    assert agent_state(team, "coordinator") is None


def test_a_failed_start_leaves_no_run(team: ProjectPaths) -> None:
    failed = run_ov("coordinator", "start", cwd=team.root, env={"OV_TEST_FAIL_AT": "session"})
    assert failed.returncode == 1 and "injected failure" in failed.stderr
    conn = open_state(team.state_db)
    try:
        assert conn.execute("SELECT count(*) FROM runs").fetchone()[0] == 0
        assert sessions.get(conn, "coordinator") is None
    finally:
        conn.close()
    assert not (team.run_dir / "coordinator").exists()


def test_the_coordinator_is_read_only_through_its_settings_file(team: ProjectPaths, tmp_path: Path) -> None:
    path = scenario(tmp_path / "s.json", {"coordinator": [
        {"actions": [{"write": {"path": "notes.md", "content": "x"}}, {"text": "tried"}], "result": "tried"}]})
    assert run_ov("coordinator", "start", "--scenario", str(path), cwd=team.root).returncode == 0
    wait_idle(team, "coordinator", 1)
    assert not (team.root / "notes.md").exists()
    stdout = next((team.logs_dir / "coordinator").glob("*/stdout.ndjson")).read_text()
    assert "read-only" in stdout and '"is_error": true' in stdout


# ---- send, ask ----------------------------------------------------------------------------------


def test_send_reaches_the_coordinator_which_slings_a_builder_into_the_run(team: ProjectPaths, tmp_path: Path) -> None:
    path = team.ov_dir / "team.json"  # agents read it from inside their sandbox: .overstory/ is visible there
    scenario(path, {
        "coordinator": [*READY,
                        {"actions": [{"expect_in_prompt": "add greet"},
                                     {"bash": sling_cmd("builder", "greet", path, "--prompt", "'write greet'")}],
                         "result": "slung builder-greet"}],
        "builder-*": BUILDER_DONE,
    })
    assert run_ov("coordinator", "start", "--scenario", str(path), cwd=team.root).returncode == 0
    wait_idle(team, "coordinator", 1)  # else the first turn would take the objective along with its dispatch
    sent = run_ov("coordinator", "send", "add greet and its test", cwd=team.root)
    assert sent.returncode == 0 and "sent #" in sent.stdout
    builder = wait_state(team, "builder-greet", {"completed"})
    coordinator = agent_state(team, "coordinator")
    assert builder.parent == "coordinator" and builder.depth == 1 and builder.run_id == coordinator.run_id
    objective = mails(team, to="coordinator", type="dispatch")[-1]
    assert objective.subject == "objective: add greet and its test" and objective.sender == "operator"
    assert objective.payload["task_id"] == "coordination" and objective.payload["capability"] == "coordinator"


def test_ask_prints_the_reply_in_the_same_thread(team: ProjectPaths, tmp_path: Path) -> None:
    reply = ("ov mail reply $(ov mail list --to coordinator --type question | tail -n 1 | cut -d ' ' -f 1 "
             "| tr -d '#') --body pong")
    path = scenario(tmp_path / "s.json", {"coordinator": [
        *READY, {"actions": [{"expect_in_prompt": "ping"}, {"bash": reply}], "result": "answered"}]})
    assert run_ov("coordinator", "start", "--scenario", str(path), cwd=team.root).returncode == 0
    wait_idle(team, "coordinator", 1)
    asked = run_ov("coordinator", "ask", "ping", "--timeout", "60", "--json", cwd=team.root)
    assert asked.returncode == 0, asked.stderr
    answer = json.loads(asked.stdout)
    assert answer["reply"]["body"] == "pong" and answer["reply"]["to"] == "operator"
    assert answer["reply"]["thread_id"] == answer["question_id"] and answer["reply"]["type"] == "result"
    assert answer["reply"]["read_at"] is not None
    plain = mails(team, to="operator", type="result")
    assert [m.body for m in plain] == ["pong"]


def test_ask_times_out_with_a_clear_message(team: ProjectPaths, tmp_path: Path) -> None:
    path = scenario(tmp_path / "s.json", {"coordinator": [*READY, {"actions": [], "result": "not answering"}]})
    assert run_ov("coordinator", "start", "--scenario", str(path), cwd=team.root).returncode == 0
    asked = run_ov("coordinator", "ask", "ping", "--timeout", "1", cwd=team.root)
    assert asked.returncode == 124, "`ov wait`'s exit code for a timeout"
    assert "no answer from the coordinator within 1s" in asked.stderr and "stays in its inbox" in asked.stderr
    assert asked.stdout == ""


def test_ask_of_a_coordinator_out_of_budget_exits_4(team: ProjectPaths, tmp_path: Path) -> None:
    path = scenario(tmp_path / "s.json", {"coordinator": [*READY, {"actions": [], "result": "pong"}]})
    started = run_ov("coordinator", "start", "--scenario", str(path), "--budget-turns", "1", cwd=team.root)
    assert started.returncode == 0, started.stderr
    wait_idle(team, "coordinator", 1)
    asked = run_ov("coordinator", "ask", "ping", "--timeout", "60", cwd=team.root)
    assert asked.returncode == 4, asked.stderr
    assert "the coordinator is parked: budget: " in asked.stderr and "max_turns 1 reached" in asked.stderr


def test_ask_without_a_coordinator_fails_at_once(project: ProjectPaths) -> None:
    began = time.monotonic()
    asked = run_ov("coordinator", "ask", "ping", "--timeout", "5", cwd=project.root)
    assert asked.returncode == 1
    assert asked.stderr.strip() == "ov: error: no coordinator is running; start one with `ov coordinator start`"
    assert time.monotonic() - began < 5, "it must not wait for the timeout"
    assert mails(project) == [], "nothing was sent"
    sent = run_ov("coordinator", "send", "anything", cwd=project.root)
    assert sent.returncode == 1 and "no coordinator is running" in sent.stderr


def test_ask_gives_up_when_the_coordinator_stops(team: ProjectPaths, tmp_path: Path) -> None:
    from overstory.agents import coordinator
    from overstory.agents.stop import stop_agent

    path = scenario(tmp_path / "s.json", {"coordinator": [*READY, {"actions": [{"sleep": 30}], "result": "late"}]})
    assert run_ov("coordinator", "start", "--scenario", str(path), cwd=team.root).returncode == 0
    wait_idle(team, "coordinator", 1)
    conn = open_state(team.state_db)
    try:
        def stop_now(_question_id: int) -> None:
            stop_agent(team, conn, "coordinator", force=True, kill_grace=0.5)

        with pytest.raises(coordinator.NoReply, match="stopped") as raised:
            coordinator.ask(conn, "ping", timeout=30, env={}, on_sent=stop_now)
        assert raised.value.exit_code == 1
    finally:
        conn.close()


# ---- status, stop -------------------------------------------------------------------------------


def test_status_and_stop_complete_the_run(team: ProjectPaths, tmp_path: Path) -> None:
    path = scenario(tmp_path / "s.json", {"coordinator": READY})
    nothing = run_ov("coordinator", "status", "--json", cwd=team.root)
    assert nothing.returncode == 0 and json.loads(nothing.stdout)["running"] is False
    assert run_ov("coordinator", "start", "--scenario", str(path), cwd=team.root).returncode == 0
    wait_idle(team, "coordinator", 1)
    shown = json.loads(run_ov("coordinator", "status", "--json", cwd=team.root).stdout)
    assert shown["running"] is True and shown["coordinator"]["state"] == "between_turns"
    assert shown["run"]["status"] == "open"
    stopped = run_ov("coordinator", "stop", "--json", cwd=team.root)
    assert stopped.returncode == 0, stopped.stderr
    result = json.loads(stopped.stdout)
    assert result["run_status"] == "completed" and result["still_active"] == []
    assert agent_state(team, "coordinator").state == "completed"
    again = run_ov("coordinator", "stop", cwd=team.root)
    assert again.returncode == 1 and "no coordinator is running" in again.stderr
    # A new start opens a new run.
    restarted = json.loads(run_ov("coordinator", "start", "--scenario", str(path), "--json", cwd=team.root).stdout)
    assert restarted["run_created"] is True and restarted["run_id"] != shown["run"]["id"]


def test_stop_leaves_the_run_open_for_working_agents_and_start_rejoins_it(team: ProjectPaths, tmp_path: Path) -> None:
    path = team.ov_dir / "team.json"  # agents read it from inside their sandbox: .overstory/ is visible there
    scenario(path, {
        "coordinator": [*READY, {"actions": [{"bash": sling_cmd("builder", "slow", path)}], "result": "slung"}],
        "builder-*": [{"actions": [{"sleep": 30}], "result": "late"}],
    })
    first = json.loads(run_ov("coordinator", "start", "--scenario", str(path), "--json", cwd=team.root).stdout)
    wait_idle(team, "coordinator", 1)
    assert run_ov("coordinator", "send", "go", cwd=team.root).returncode == 0
    wait_state(team, "builder-slow", {"in_turn"})
    stopped = run_ov("coordinator", "stop", cwd=team.root)
    assert stopped.returncode == 0, stopped.stderr
    assert "stays open: builder-slow still active" in stopped.stdout
    assert agent_state(team, "builder-slow").state == "in_turn", "its child keeps working"
    second = json.loads(run_ov("coordinator", "start", "--scenario", str(path), "--json", cwd=team.root).stdout)
    assert second["run_created"] is False and second["run_id"] == first["run_id"]
    everything = run_ov("coordinator", "stop", "--all", "--force", "--json", cwd=team.root)
    assert everything.returncode == 0, everything.stderr
    result = json.loads(everything.stdout)
    assert [a["agent"] for a in result["stopped_agents"]] == ["builder-slow"]
    assert result["run_status"] == "completed"
    assert agent_state(team, "builder-slow").state == "completed"
    conn = open_state(team.state_db)
    try:
        assert runs.get_run(conn, first["run_id"]).status == "completed"
    finally:
        conn.close()
