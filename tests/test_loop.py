"""`ov loop` with real agent processes: iterations in fresh sessions, ov's own check, parking, crashes.

The scripted runtime stands in for the model (it prints the stream-json the real CLI
prints and really writes files and runs commands; ``iterations:`` in its scenario plays
one script per iteration). The loops, process groups, guards, git, SQLite and the `ov`
commands are the real ones. The same loop with the real claude CLI is in
tests/e2e/test_loop_claude.py.
"""

from __future__ import annotations

import json
import os
import signal
import typing as t

import pytest
import yaml

from agent_helpers import agent_state, mail_rows, wait_for
from conftest import run_git, run_ov
from overstory import procs
from overstory.paths import ProjectPaths
from overstory.store.db import open_events, open_state
from test_watchdog import make_watchdog, write_local_config

BUGGY = {"calc.py": "def add(a, b):\n    return a - b\n",
         "test_calc.py": "from calc import add\nassert add(1, 1) == 2, f'add(1, 1) gave {add(1, 1)}'\nprint('ok')\n"}
FIX = [{"edit": {"path": "calc.py", "old": "a - b", "new": "a + b"}},
       {"bash": "git add calc.py && git commit -q -m 'fix add'"}]
CHECK = "python3 test_calc.py"


@pytest.fixture
def calc(project: ProjectPaths) -> ProjectPaths:
    """A project whose test fails until add() is fixed; quick retries."""
    for name, text in BUGGY.items():
        (project.root / name).write_text(text)
    run_git(project.root, "add", "-A")
    run_git(project.root, "commit", "-q", "-m", "calc with a bug")
    write_local_config(project, turns={"retry_backoff": 0.05, "kill_grace": 1, "max_retries": 3},
                       watchdog={"interval": 0.2})
    return project


def scenario(tmp_path, iterations: list[dict[str, t.Any]], **agents: t.Any) -> str:
    path = tmp_path / "loop-scenario.yaml"
    path.write_text(yaml.safe_dump({"agents": {**agents, "builder-*": {"iterations": iterations}}}))
    return str(path)


def ov_loop(project: ProjectPaths, *args: str) -> None:
    done = run_ov("loop", "builder", "t1", "--runtime", "scripted", *args, cwd=project.root)
    assert done.returncode == 0, done.stderr


def records(project: ProjectPaths, name: str = "builder-t1") -> list[dict[str, t.Any]]:
    conn = open_state(project.state_db)
    try:
        return [dict(r) for r in conn.execute("SELECT * FROM loop_iterations WHERE name = ? ORDER BY number, attempt",
                                              (name,))]
    finally:
        conn.close()


def loop_row(project: ProjectPaths, name: str = "builder-t1") -> dict[str, t.Any]:
    conn = open_state(project.state_db)
    try:
        return dict(conn.execute("SELECT * FROM loops WHERE name = ?", (name,)).fetchone())
    finally:
        conn.close()


def settled(project: ProjectPaths, name: str = "builder-t1", timeout: float = 90) -> t.Any:
    return wait_for(lambda: (a := agent_state(project, name)) and (a.is_terminal or a.state == "parked") and a,
                    timeout, interval=0.2, message=f"{name} to settle")


def prompts(project: ProjectPaths, name: str = "builder-t1") -> list[str]:
    rows = records(project, name)
    return [(project.logs_dir / name / row["turn_id"] / "prompt.txt").read_text() for row in rows]


def events(project: ProjectPaths, kind: str, agent: str = "builder-t1") -> list[dict[str, t.Any]]:
    conn = open_events(project.events_db)
    try:
        rows = conn.execute("SELECT summary, data FROM events WHERE agent = ? AND kind = ? ORDER BY id",
                            (agent, kind)).fetchall()
        return [{"summary": r[0], "data": json.loads(r[1]) if r[1] else None} for r in rows]
    finally:
        conn.close()


def test_a_promise_with_a_failing_check_runs_another_iteration_with_its_output(calc, tmp_path):
    plan = scenario(tmp_path, [
        {"actions": [{"write": {"path": ".overstory-progress.md", "content": "# looked at calc.py\n"}}],
         "result": "All done, I think. LOOP_DONE"},
        {"actions": [{"expect_in_prompt": "add(1, 1) gave 0"}, {"expect_in_prompt": "# looked at calc.py"},
                     *FIX, {"write": {"path": ".overstory-progress.md", "content": "# add() fixed\n"}}],
         "result": "Fixed add. LOOP_DONE"},
    ])
    ov_loop(calc, "--prompt", "make test_calc.py pass", "--check", CHECK, "--scenario", plan)
    agent = settled(calc)
    assert agent.state == "completed", agent.state_reason
    rows = records(calc)
    assert [(r["number"], r["attempt"], r["status"]) for r in rows] == [(1, 1, "done"), (2, 1, "done")]
    assert [(r["promise_seen"], r["check_exit"]) for r in rows] == [(1, 1), (1, 0)]
    assert rows[0]["session_id"] and rows[1]["session_id"] and rows[0]["session_id"] != rows[1]["session_id"]
    assert [r["progress"] for r in rows] == ["looked at calc.py", "add() fixed"]
    assert "another iteration" in rows[0]["outcome"]
    first, second = prompts(calc)
    assert "Iteration 1 of at most 20" in first and "make test_calc.py pass" in first
    assert "Iteration 2 of at most 20" in second and "AssertionError: add(1, 1) gave 0" in second
    turns = open_state(calc.state_db).execute("SELECT resumed FROM turns WHERE agent = 'builder-t1'").fetchall()
    assert [r[0] for r in turns] == [0, 0], "every iteration is a fresh session, never --resume"
    done = mail_rows(calc, type="worker_done")
    assert len(done) == 1 and done[0]["sender"] == "builder-t1" and done[0]["recipient"] == "operator"
    assert json.loads(done[0]["payload"])["files_modified"] == ["calc.py"]
    worktree = calc.worktree("builder-t1")
    assert "progress" not in run_git(worktree, "ls-files") and run_git(worktree, "status", "--porcelain") == ""
    status = run_ov("loop", "status", "builder-t1", "--json", cwd=calc.root)
    document = json.loads(status.stdout)
    assert document["iterations"] == 2 and [r["check_exit"] for r in document["records"]] == [1, 0]
    assert len(document["checkpoints"]) == 1
    text = run_ov("loop", "status", "builder-t1", cwd=calc.root).stdout
    assert "completed" in text and "add() fixed" in text
    assert run_git(calc.root, "for-each-ref", "refs/ov/checkpoints/builder-t1/").count("\n") == 1
    cleaned = run_ov("stop", "builder-t1", "--clean", "--force", cwd=calc.root)
    assert cleaned.returncode == 0, cleaned.stderr
    assert run_git(calc.root, "for-each-ref", "refs/ov/checkpoints/") == "", "its checkpoints went with its branch"


def test_a_green_check_without_the_promise_is_not_done(calc, tmp_path):
    plan = scenario(tmp_path, [{"actions": FIX, "result": "Fixed, but let me look again tomorrow."},
                               {"actions": [], "result": "Looked again. LOOP_DONE"}])
    ov_loop(calc, "--prompt", "fix add", "--check", CHECK, "--scenario", plan)
    assert settled(calc).state == "completed"
    assert [(r["promise_seen"], r["check_exit"]) for r in records(calc)] == [(0, 0), (1, 0)]


def test_the_same_failure_three_times_parks_once_and_add_iterations_continues(calc, tmp_path):
    stuck = {"actions": [{"text": "trying"}], "result": "LOOP_DONE"}
    plan = scenario(tmp_path, [stuck, stuck, stuck, {"actions": FIX, "result": "really fixed. LOOP_DONE"}])
    ov_loop(calc, "--prompt", "fix add", "--check", CHECK, "--scenario", plan, "--max-iterations", "3")
    agent = settled(calc)
    assert agent.state == "parked" and agent.park_kind == "loop", agent.state_reason
    assert agent.state_reason.startswith("loop: the same check failure 3 times in a row")
    assert [r["check_exit"] for r in records(calc)] == [1, 1, 1]
    escalations = mail_rows(calc, type="escalation")
    assert len(escalations) == 1 and escalations[0]["recipient"] == "operator"
    assert run_ov("wait", "builder-t1", "--timeout", "5", cwd=calc.root).returncode == 4

    refused = run_ov("resume", "builder-t1", cwd=calc.root)
    assert refused.returncode == 1 and "max_iterations 3 reached" in refused.stderr
    resumed = run_ov("resume", "builder-t1", "--add-iterations", "2", cwd=calc.root)
    assert resumed.returncode == 0, resumed.stderr
    agent = settled(calc)
    assert agent.state == "completed", agent.state_reason
    assert [(r["number"], r["check_exit"]) for r in records(calc)] == [(1, 1), (2, 1), (3, 1), (4, 0)]
    assert loop_row(calc)["max_iterations"] == 5
    assert len(mail_rows(calc, type="escalation")) == 1


def test_max_iterations_parks_with_one_escalation(calc, tmp_path):
    plan = scenario(tmp_path, [{"actions": [{"write": {"path": f"try{i}.txt", "content": str(i)}}], "result": "hm"}
                               for i in range(3)])
    ov_loop(calc, "--prompt", "fix add", "--check", CHECK, "--scenario", plan, "--max-iterations", "2")
    agent = settled(calc)
    assert agent.state == "parked" and agent.state_reason == "loop: max_iterations 2 reached without completion"
    assert len(records(calc)) == 2 and len(mail_rows(calc, type="escalation")) == 1
    assert json.loads(mail_rows(calc, type="escalation")[0]["payload"])["kind"] == "loop"


def test_the_loop_budget_parks_it(calc, tmp_path):
    big = {"usage": {"input_tokens": 200_000, "output_tokens": 0, "model": "claude-opus-4-8", "cost_usd": 1.0}}
    plan = scenario(tmp_path, [{"actions": [big], "result": "spent"}, {"actions": [big], "result": "spent"}])
    ov_loop(calc, "--prompt", "fix add", "--check", CHECK, "--scenario", plan, "--max-usd", "1.5")
    agent = settled(calc)
    assert agent.state == "parked" and agent.park_kind == "budget", agent.state_reason
    assert len(mail_rows(calc, type="escalation")) == 1


def test_kill_9_of_the_loop_mid_iteration_retries_it_without_resetting_the_count(calc, tmp_path):
    marker_dir = tmp_path / "shared"  # bound writable into the agent's sandbox: the test sees the marker
    marker_dir.mkdir()
    write_local_config(calc, turns={"retry_backoff": 0.05, "kill_grace": 1, "max_retries": 3},
                       watchdog={"interval": 0.2}, sandbox={"writable": [str(marker_dir)]})
    marker = marker_dir / "slept-once"
    plan = scenario(tmp_path, [
        {"actions": [{"write": {"path": ".overstory-progress.md", "content": "# one\n"}}], "result": "not yet"},
        {"actions": [{"sleep": 60, "once": str(marker)}, *FIX], "result": "LOOP_DONE"},
    ])
    ov_loop(calc, "--prompt", "fix add", "--check", CHECK, "--scenario", plan)
    busy = wait_for(lambda: (a := agent_state(calc, "builder-t1")) and a.state == "in_turn" and marker.exists()
                    and a.turn_pgid and a, 60, message="iteration 2 to be mid-turn")
    os.kill(busy.loop_pid, signal.SIGKILL)
    wait_for(lambda: not procs.is_alive(busy.loop_pid, busy.loop_start_ticks), message="the loop to die")
    dog = make_watchdog(calc)
    try:
        actions = dog.tick()
    finally:
        dog.close()
    assert [(a.agent, a.kind) for a in actions] == [("builder-t1", "readopted")], actions
    assert not procs.group_alive(busy.turn_pgid, busy.turn_start_ticks), "the orphaned turn was killed"
    agent = settled(calc)
    assert agent.state == "completed", agent.state_reason
    rows = records(calc)
    assert [(r["number"], r["attempt"], r["status"]) for r in rows] == [
        (1, 1, "done"), (2, 1, "interrupted"), (2, 2, "done")]
    assert loop_row(calc)["iterations"] == 2
    assert "attempt 2" in prompts(calc)[2]
    assert mail_rows(calc, type="worker_died") == []


def test_bad_loop_requests_are_one_line_and_create_nothing(calc, tmp_path):
    bad_spec = tmp_path / "bad.yaml"
    bad_spec.write_text("objective: x\nphases:\n  - {name: a, objective: b, gate: 'files: *.py > 2'}\n")
    cases = [
        (["loop", "builder", "t1"], 2, "--prompt TEXT or --spec FILE"),
        (["loop", "builder", "t1", "--prompt", "x", "--spec", str(bad_spec)], 2, "not both"),
        (["loop", "builder", "t1", "--spec", str(bad_spec)], 1, "files: <glob> >= N"),
        (["loop", "builder", "t1", "--spec", "/dev/zero"], 2, "larger than the limit"),
        (["loop", "coordinator", "t1", "--prompt", "x"], 2, "does not loop"),
        (["loop", "status", "nobody"], 1, "no loop named 'nobody'"),
        (["loop", "status", "nobody", "--check", "x"], 2, "takes only --json"),
        (["resume", "nobody", "--add-iterations", "2"], 1, "no agent named"),
    ]
    for args, code, text in cases:
        done = run_ov(*args, cwd=calc.root)
        assert done.returncode == code and text in done.stderr, (args, done.returncode, done.stderr)
        assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr
    assert run_git(calc.root, "branch", "--list", "ov/*") == "" and agent_state(calc, "builder-t1") is None
