"""Budgets of a sandboxed turn: the guard's tool-call count and a budget stop, with every turn in bubblewrap.

The scripted runtime stands in for the model (it prints the stream-json the real CLI prints
and calls the same `ov guard` hook for each tool call); the loop, the endpoint, bubblewrap,
the process groups and SQLite are the real ones. Inside the sandbox state.db is read-only,
so the guard's count must travel through the agent's endpoint to reach it.
"""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path

from agent_helpers import agent_state, wait_for, write_scenario
from overstory import procs
from overstory.agents.spawn import SlingRequest, sling
from overstory.config.model import load_config
from overstory.paths import ProjectPaths
from overstory.store.db import open_events, open_state
from sandbox_helpers import processes_with, requires_bwrap

REPORT = {"bash": 'ov mail send --type worker_done --subject "done ${OVERSTORY_AGENT_NAME}" --body ok'}
# $1.00: claude-opus-4-8 costs $5 per million input tokens (tests/fixtures/CLAUDE_PROBE_NOTES.md, F).
BIG = {"input_tokens": 200_000, "output_tokens": 0, "model": "claude-opus-4-8"}


def hidden(command: str) -> str:
    """A shell command the guard cannot read (base64 in a python -c, allowed for writers): the kernel's turn."""
    encoded = base64.b64encode(command.encode()).decode()
    return f"python3 -c \"import base64,subprocess;subprocess.run(base64.b64decode('{encoded}').decode(),shell=True)\""


def start(project: ProjectPaths, tmp_path: Path, actions: list[dict], budget: dict) -> str:
    scenario = write_scenario(tmp_path / "scenario.json", [{"actions": actions}])
    environ = {**os.environ, "OV_TURNS_KILL_GRACE": "1"}
    config = load_config(project.config_file, project.local_config_file, environ=environ)
    conn = open_state(project.state_db)
    try:
        return sling(project, config, conn, SlingRequest(capability="builder", task_id="t1", runtime="scripted",
                                                         scenario=scenario, budget=budget), environ).name
    finally:
        conn.close()


def settled(project: ProjectPaths, name: str) -> object:
    return wait_for(lambda: (a := agent_state(project, name)) and (a.is_terminal or a.state == "parked") and a,
                    90, message=f"{name} to settle")


def only_turn(project: ProjectPaths, name: str) -> dict:
    conn = open_state(project.state_db)
    try:
        rows = [dict(r) for r in conn.execute("SELECT * FROM turns WHERE agent = ?", (name,))]
    finally:
        conn.close()
    assert len(rows) == 1, rows
    argv = json.loads((Path(rows[0]["log_dir"]) / "command.json").read_text())
    assert Path(argv[0]).name == "bwrap" and "--unshare-pid" in argv, "the turn ran inside bubblewrap"
    return rows[0]


def events(project: ProjectPaths, name: str, kind: str) -> list[dict]:
    conn = open_events(project.events_db)
    try:
        return [json.loads(r[0]) if r[0] else {} for r in
                conn.execute("SELECT data FROM events WHERE agent = ? AND kind = ? ORDER BY id", (name, kind))]
    finally:
        conn.close()


@requires_bwrap
def test_a_sandboxed_guard_counts_through_the_endpoint_and_refuses_the_call_past_the_limit(
        project: ProjectPaths, tmp_path: Path) -> None:
    name = start(project, tmp_path, [{"bash": "true"}, {"bash": "true"}, {"bash": "touch third-ran"},
                                     {"sleep": 20}, REPORT], budget={"max_tool_calls": 2})
    agent = settled(project, name)
    assert agent.state == "parked" and agent.state_reason == "budget: max_tool_calls 2 reached (2)"
    assert not (project.worktree(name) / "third-ran").exists(), "the call past the limit never ran"
    conn = open_state(project.state_db)
    try:
        row = conn.execute("SELECT tool_calls, refused_tool_calls FROM budgets WHERE name = ?", (name,)).fetchone()
    finally:
        conn.close()
    assert tuple(row) == (2, 1), "the counts written from inside the sandbox reached state.db"
    assert only_turn(project, name)["status"] == "budget"


@requires_bwrap
def test_a_budget_stop_of_a_sandboxed_turn_kills_every_process_it_started(project: ProjectPaths,
                                                                          tmp_path: Path) -> None:
    token = f"ov-budget-leftover-{os.getpid()}"
    # Two leftovers: one in the turn's own group, one that left it (new session, no turn id in its environment).
    spawn = (f"python3 -c 'import time; time.sleep(300)' {token}-group >/dev/null 2>&1 & "
             f"env -u OVERSTORY_TURN_ID setsid python3 -c 'import time; time.sleep(300)' {token}-setsid "
             ">/dev/null 2>&1 &")
    once = "spent-once"  # in the agent's state dir: the sandbox's /tmp is private to each turn
    name = start(project, tmp_path, [{"bash": hidden(spawn)}, {"sleep": 4}, {"usage": BIG, "once": str(once)},
                                     {"sleep": 60}, REPORT], budget={"max_usd": 0.5})
    wait_for(lambda: len(processes_with(token)) == 2, 60, message="both leftovers to be running")
    agent = settled(project, name)
    assert agent.state == "parked" and agent.park_kind == "budget"
    turn = only_turn(project, name)
    assert turn["status"] == "budget"
    assert events(project, name, "turn_stopped")[0]["pgid"] == turn["pgid"]
    assert not procs.group_members(turn["pgid"]), "bwrap's process group is gone"
    assert wait_for(lambda: processes_with(token) == [], 10, message="the leftovers to die") is not None
