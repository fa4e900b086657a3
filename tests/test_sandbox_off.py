"""With ``sandbox.mode: off`` ov refuses what it cannot check (issue 28, item 16).

- `ov approve` run inside an agent's turn goes through the agent's endpoint. Without it (the
  agent dropped the endpoint's variables, and its own name, in a script) it used to decide on
  the databases as whoever the environment named, or as the operator when it named no one.
- `ov guard` in a turn whose endpoint cannot be reached (the agent's loop was killed) used to
  let the call through, uncounted and unrecorded.
- `ov doctor` says what the mode gives up.

Real agents on the scripted runtime, their loops killed with SIGKILL, the real `ov` commands.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import typing as t
from pathlib import Path

import pytest

from conftest import ov_command, run_git, run_ov
from durable_helpers import kill_everything, row, wait_for
from overstory import procs
from overstory.paths import ProjectPaths
from test_watchdog import write_local_config

SNEAK = """unset OVERSTORY_ENDPOINT OVERSTORY_ENDPOINT_TOKEN OVERSTORY_AGENT_NAME
id=$(ov approvals --json | python3 -c 'import json, sys; print(json.load(sys.stdin)[0]["id"])')
ov approve "$id" --note "approved by nobody" > approve.out 2>&1
echo "exit $?" >> approve.out
"""


@pytest.fixture
def unsandboxed(project: ProjectPaths) -> t.Iterator[ProjectPaths]:
    script = project.root / "deploy.sh"
    script.write_text("#!/bin/sh\necho deployed\n")
    script.chmod(0o755)
    run_git(project.root, "add", "deploy.sh")
    run_git(project.root, "commit", "-qm", "a deploy script")
    write_local_config(project, sandbox={"mode": "off"}, turns={"retry_backoff": 0.1, "kill_grace": 1,
                                                                "max_concurrent": 8})
    yield project
    kill_everything(project)


def _sling(project: ProjectPaths, task: str, turns: list[dict[str, t.Any]], *extra: str) -> str:
    scenario = project.root.parent / f"{task}.json"
    scenario.write_text(json.dumps({"turns": turns}))
    done = run_ov("sling", "builder", task, "--runtime", "scripted", "--scenario", str(scenario), *extra, "--json",
                  cwd=project.root)
    assert done.returncode == 0, done.stderr
    return str(json.loads(done.stdout)["name"])


def test_ov_approve_inside_an_agent_without_its_endpoint_is_refused(unsandboxed: ProjectPaths,
                                                                     state_db: t.Any) -> None:
    project = unsandboxed
    gated = _sling(project, "gated", [{"actions": [{"bash": "./deploy.sh"}], "result": "waiting"}],
                   "--approve", "Bash(./deploy.sh*)")
    wait_for(lambda: row(state_db, gated).state == "parked", 60, "the gated agent to park for its approval")
    [approval] = [r[0] for r in state_db.execute("SELECT id FROM approvals WHERE status = 'pending'")]

    # An agent's script drops its endpoint and its name, and asks ov to approve as if it were the operator.
    sneak = _sling(project, "sneak", [{"actions": [{"write": {"path": "sneak.sh", "content": SNEAK}},
                                                   {"bash": "sh sneak.sh"}], "result": "done"}])
    out = Path(row(state_db, sneak).worktree or "") / "approve.out"
    wait_for(lambda: out.is_file() and "exit" in out.read_text(), 60, "the script to run")
    lines = out.read_text().splitlines()
    assert lines[-1] == "exit 1", lines
    assert lines[:-1] == [f"ov: error: refused: this runs inside agent {sneak}'s turn, where a decision goes only "
                          "through the agent's endpoint (OVERSTORY_ENDPOINT), and none is in this environment; ov "
                          "does not take a name from the environment as proof of who decides"], lines
    assert state_db.execute("SELECT status FROM approvals WHERE id = ?", (approval,)).fetchone()[0] == "pending"

    # Outside any agent a name in the environment is not taken either; the operator decides as before.
    named = run_ov("approve", approval, cwd=project.root, env={"OVERSTORY_AGENT_NAME": sneak})
    assert named.returncode == 1 and named.stderr.count("\n") == 1 and "refused: this runs inside agent" in named.stderr
    operator = run_ov("approve", approval, cwd=project.root)
    assert operator.returncode == 0, operator.stderr
    decided = state_db.execute("SELECT status, decided_by FROM approvals WHERE id = ?", (approval,)).fetchone()
    assert tuple(decided) == ("approved", "operator")


def _counted(conn: t.Any, name: str) -> tuple[int, int]:
    calls = conn.execute("SELECT tool_calls FROM budgets WHERE name = ?", (name,)).fetchone()
    rows = conn.execute("SELECT count(*) FROM tool_calls WHERE agent = ?", (name,)).fetchone()
    return (calls[0] if calls else 0), rows[0]


def _cmdline(pid: int) -> bytes:
    """A process's command line; empty once it has exited (the loop's `sleep 0.05` children come and go)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except (FileNotFoundError, ProcessLookupError):
        return b""


def test_ov_guard_refuses_a_call_when_the_agents_endpoint_cannot_be_reached(unsandboxed: ProjectPaths,
                                                                             state_db: t.Any) -> None:
    project = unsandboxed
    name = _sling(project, "waiter", [{"actions": [{"bash": "while [ ! -e go ]; do sleep 0.05; done"}],
                                       "result": "done"}])
    agent = wait_for(lambda: (a := row(state_db, name)).current_turn_id and a, 60, "the turn to start")
    waiting = wait_for(lambda: [p for p in procs.tagged_processes(agent.current_turn_id or "")
                                if b"while [ ! -e go ]" in _cmdline(p)], 60, "the turn's tool call to run")
    turn_env = procs.environ_of(waiting[0])  # what the runtime gives `ov guard` in this turn
    assert turn_env.get("OVERSTORY_ENDPOINT") and turn_env.get("OVERSTORY_AGENT_NAME") == name
    hook = json.dumps({"hook_event_name": "PreToolUse", "session_id": "s", "cwd": agent.worktree,
                       "tool_name": "Bash", "tool_input": {"command": "echo hi > note.txt"}})

    def guard() -> subprocess.CompletedProcess[str]:
        return subprocess.run([*ov_command(), "guard"], input=hook, cwd=agent.worktree, env=turn_env,
                              capture_output=True, text=True, timeout=60)

    before = _counted(state_db, name)
    allowed = guard()  # the loop answers: allowed, counted and recorded
    assert (allowed.returncode, allowed.stdout) == (0, ""), allowed.stderr
    counted = _counted(state_db, name)
    assert counted == (before[0] + 1, before[1] + 1)

    loop = row(state_db, name)
    os.kill(loop.loop_pid or 0, signal.SIGKILL)
    wait_for(lambda: not procs.is_alive(loop.loop_pid, loop.loop_start_ticks), 30, "the loop to die")
    refused = guard()
    assert refused.returncode == 0, refused.stderr
    reason = json.loads(refused.stdout)["hookSpecificOutput"]
    assert reason["permissionDecision"] == "deny"
    assert reason["permissionDecisionReason"].startswith("ov: refused: ov could not be reached to count and record "
                                                         "this call (cannot reach ov through ")
    assert _counted(state_db, name) == counted, "nothing was counted or recorded"


def test_ov_doctor_says_what_the_sandbox_off_mode_gives_up(unsandboxed: ProjectPaths) -> None:
    doctor = run_ov("doctor", cwd=unsandboxed.root)
    [line] = [x for x in doctor.stdout.splitlines() if x.startswith("[warn] sandbox off: ")]
    assert "write ov's databases" in line and "refused: `ov approve`/`ov reject` inside an agent" in line
    from overstory.sandbox.probe import probe

    if probe().ok:  # with bubblewrap there, the line goes away
        write_local_config(unsandboxed, sandbox={"mode": "auto"})
        assert "sandbox off" not in run_ov("doctor", "--json", cwd=unsandboxed.root).stdout
