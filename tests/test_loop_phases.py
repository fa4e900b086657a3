"""`ov loop --spec` with phases: gates, checkpoints, a critic that asks for a phase again, tool allow-lists.

Real loop processes, real critics (reviewer agents slung by the loop through `ov sling`),
real guards and git; the scripted runtime stands in for the model of the loop and of
its critics (one scenario file: critics are picked by name).
"""

from __future__ import annotations

import json

import pytest
import yaml

from agent_helpers import agent_state, mail_rows, wait_for
from conftest import run_git, run_ov
from overstory import procs
from overstory.store.db import open_events, open_state
from test_loop import CHECK, FIX, calc, records, settled  # noqa: F401 - calc is a fixture
from test_watchdog import make_watchdog

REPORT = {"bash": "ov mail send --type worker_done --subject reviewed --body done"}


def verdict(word: str, notes: str) -> dict:
    payload = json.dumps({"verdict": word, "notes": notes})
    return {"bash": f"ov mail send --to ${{OVERSTORY_PARENT}} --type result --subject 'verdict: {word}' "
                    f"--payload '{payload}'"}


SPEC = {
    "objective": "Document, fix and finish the calculator.",
    "constraints": ["keep calc.py's add() signature"],
    "critic": "reviewer",
    "phases": [
        {"name": "design", "objective": "Write two design notes under docs/.", "gate": "files: docs/*.md >= 2",
         "tools": ["Read", "Write", "Glob"]},
        {"name": "build", "objective": "Make test_calc.py pass.", "gate": CHECK},
        {"name": "finish", "objective": "Write NOTES.md.", "gate": "test -f NOTES.md", "max_iterations": 2},
    ],
}


def test_three_phases_with_gates_checkpoints_a_critic_retry_and_a_tool_allow_list(calc, tmp_path):
    iterations = [
        {"actions": [{"bash": "touch not-allowed.txt"},
                     {"write": {"path": "docs/a.md", "content": "# a\n"}},
                     {"write": {"path": "docs/b.md", "content": "# b\n"}},
                     {"write": {"path": ".overstory-progress.md", "content": "# design notes written\n"}}],
         "result": "Design done. LOOP_DONE"},
        {"actions": [{"expect_in_prompt": "Phase 2 of 3: build"}, {"expect_in_prompt": "design: design notes written"},
                     *FIX], "result": "Build done. LOOP_DONE"},
        {"actions": [{"expect_in_prompt": "run 2: a critic asked for it again"},
                     {"expect_in_prompt": "give add() a docstring"},
                     {"edit": {"path": "calc.py", "old": "def add(a, b):\n", "new": "def add(a, b):\n    \"\"\"a + b\"\"\"\n"}},
                     {"bash": "git commit -q -am docstring"}], "result": "Docstring added. LOOP_DONE"},
        {"actions": [{"expect_in_prompt": "Phase 3 of 3: finish"},
                     {"write": {"path": "NOTES.md", "content": "done\n"}}], "result": "Finished. LOOP_DONE"},
    ]
    scenario = tmp_path / "phases.yaml"
    scenario.write_text(yaml.safe_dump({"agents": {
        "*-critic-2-1": {"turns": [{"actions": [verdict("retry", "give add() a docstring"), REPORT], "result": "x"}]},
        "*-critic-*": {"turns": [{"actions": [{"expect_in_prompt": "```diff"}, verdict("pass", "fine"), REPORT],
                                  "result": "passed"}]},
        "builder-*": {"iterations": iterations},
    }}, sort_keys=False))  # the first pattern that matches a name wins
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(SPEC))
    done = run_ov("loop", "builder", "t1", "--spec", str(spec), "--runtime", "scripted", "--scenario", str(scenario),
                  cwd=calc.root)
    assert done.returncode == 0, done.stderr
    agent = settled(calc, timeout=180)
    assert agent.state == "completed", agent.state_reason

    rows = records(calc)
    assert [(r["number"], r["phase"], r["phase_round"], r["check_exit"]) for r in rows] == [
        (1, "design", 0, 0), (2, "build", 0, 0), (3, "build", 1, 0), (4, "finish", 0, 0)]
    conn = open_state(calc.state_db)
    marks = [dict(r) for r in conn.execute("SELECT * FROM loop_checkpoints WHERE name = 'builder-t1' ORDER BY seq")]
    critics = [r[0] for r in conn.execute("SELECT name FROM sessions WHERE parent = 'builder-t1' ORDER BY created_at")]
    conn.close()
    assert [(m["phase"], m["phase_round"], m["verdict"]) for m in marks] == [
        ("design", 0, "pass"), ("build", 0, "retry"), ("build", 1, "pass"), ("finish", 0, "pass")]
    for mark in marks:
        assert run_git(calc.root, "rev-parse", mark["ref"]).strip() == mark["commit_sha"]
    assert critics == ["builder-t1-critic-1-1", "builder-t1-critic-2-1", "builder-t1-critic-2-2",
                       "builder-t1-critic-3-1"]
    first_checkpoint_files = run_git(calc.root, "show", "--name-only", "--format=", marks[0]["commit_sha"]).split()
    assert sorted(first_checkpoint_files) == ["docs/a.md", "docs/b.md"], "ov committed the phase's work, not ov's files"

    # The guard refused the tool outside phase 1's allow-list: the Bash call never ran.
    worktree = calc.worktree("builder-t1")
    assert not (worktree / "not-allowed.txt").exists()
    events = open_events(calc.events_db)
    denied = [json.loads(r[0]) for r in events.execute(
        "SELECT data FROM events WHERE agent = 'builder-t1' AND kind = 'tool_end' AND turn_id = ?", (rows[0]["turn_id"],))]
    events.close()
    refusals = [d["output"] for d in denied if d.get("is_error")]
    assert len(refusals) == 1 and "Bash is not allowed in phase 'design'" in refusals[0]
    assert "Read, Write, Glob" in refusals[0]
    assert len(mail_rows(calc, type="worker_done", recipient="operator")) == 1
    status = json.loads(run_ov("loop", "status", "builder-t1", "--json", cwd=calc.root).stdout)
    assert status["phases"] == ["design", "build", "finish"] and len(status["checkpoints"]) == 4


def test_a_critic_that_escalates_parks_the_loop_and_resume_goes_on(calc, tmp_path):
    scenario = tmp_path / "escalate.yaml"
    scenario.write_text(yaml.safe_dump({"agents": {
        "*-critic-*": {"turns": [{"actions": [verdict("escalate", "the design needs a person"), REPORT],
                                  "result": "escalated"}]},
        "builder-*": {"iterations": [{"actions": FIX, "result": "LOOP_DONE"}]},
    }}, sort_keys=False))
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump({"objective": "fix add", "check": CHECK, "critic": "reviewer"}))
    done = run_ov("loop", "builder", "t1", "--spec", str(spec), "--runtime", "scripted", "--scenario", str(scenario),
                  cwd=calc.root)
    assert done.returncode == 0, done.stderr
    agent = settled(calc)
    assert agent.state == "parked" and agent.park_kind == "loop"
    assert agent.state_reason == "loop: the critic escalated phase 'main': the design needs a person"
    assert len(mail_rows(calc, type="escalation")) == 1
    assert run_ov("resume", "builder-t1", cwd=calc.root).returncode == 0
    agent = settled(calc)
    assert agent.state == "completed", agent.state_reason
    assert len(records(calc)) == 1, "resuming after the critic goes on; the phase is not run again"


@pytest.mark.parametrize("step", ["loop_judged", "loop_critic"])
def test_a_loop_killed_at_a_phase_boundary_makes_one_checkpoint_and_one_critic(calc, tmp_path, step):
    """Killed (SIGKILL) after judging the iteration, or after naming its critic but before slinging it; the
    watchdog restarts the loop, which finishes the boundary once."""
    scenario = tmp_path / "boundary.yaml"
    scenario.write_text(yaml.safe_dump({"agents": {
        "*-critic-*": {"turns": [{"actions": [verdict("pass", "fine"), REPORT], "result": "passed"}]},
        "builder-*": {"iterations": [{"actions": FIX, "result": "LOOP_DONE"}]},
    }}, sort_keys=False))
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump({"objective": "fix add", "check": CHECK, "critic": "reviewer"}))
    done = run_ov("loop", "builder", "t1", "--spec", str(spec), "--runtime", "scripted", "--scenario", str(scenario),
                  cwd=calc.root, env={"OV_TEST_KILL_AT": step})
    assert done.returncode == 0, done.stderr
    marker = calc.run_dir / "builder-t1" / f"killed-at-{step}"
    first = wait_for(lambda: marker.exists() and (a := agent_state(calc, "builder-t1")) and a, 60,
                     message=f"the loop to die at {step}")
    wait_for(lambda: not procs.is_alive(first.loop_pid, first.loop_start_ticks), 30, message="the loop to be gone")
    dog = make_watchdog(calc)
    try:
        assert [(a.agent, a.kind) for a in dog.tick()] == [("builder-t1", "readopted")]
    finally:
        dog.close()
    agent = settled(calc)
    assert agent.state == "completed", agent.state_reason
    conn = open_state(calc.state_db)
    marks = conn.execute("SELECT count(*) FROM loop_checkpoints WHERE name = 'builder-t1'").fetchone()[0]
    critics = [r[0] for r in conn.execute("SELECT name FROM sessions WHERE parent = 'builder-t1'")]
    conn.close()
    assert marks == 1 and critics == ["builder-t1-critic-1-1"]
    assert len(records(calc)) == 1 and len(mail_rows(calc, type="worker_done", recipient="operator")) == 1
