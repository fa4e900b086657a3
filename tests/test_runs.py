"""Runs: joining, the once-per-wave summary, `ov run list|show|complete`."""

from __future__ import annotations

import json
import threading
import time
import typing as t
from pathlib import Path

import pytest

from agent_helpers import wait_for, wait_terminal
from conftest import run_ov
from overstory.paths import ProjectPaths
from overstory.store import runs, sessions
from overstory.store.db import open_state
from test_coordinator import (
    BUILDER_DONE,
    READY,
    mails,
    scenario,
    sling_cmd,
    team,  # noqa: F401 - fixture
    wait_idle,
)

# ---- the summary, on rows (no processes) ---------------------------------------------------------


def _agent(conn: t.Any, name: str, capability: str, run_id: str | None, parent: str = "coordinator") -> int:
    return sessions.create_session(conn, name=name, capability=capability, task_id=name, runtime="scripted",
                                   actor="test", parent=parent, depth=0 if capability == "coordinator" else 1,
                                   run_id=run_id)


def _finish(conn: t.Any, name: str, state: str = "completed", reason: str | None = None) -> None:
    agent = sessions.get(conn, name)
    assert sessions.transition(conn, name, agent.generation, state, actor="test", reason=reason).ok


@pytest.fixture
def open_run(project: ProjectPaths, state_db: t.Any) -> runs.Run:
    run, created = runs.open_or_join(state_db, "coordinator")
    assert created
    _agent(state_db, "coordinator", "coordinator", run.id, parent="operator")
    return run


def _summaries_sent_concurrently(project: ProjectPaths, run_id: str, callers: int = 8) -> list[int | None]:
    results: list[int | None] = []
    barrier = threading.Barrier(callers)

    def call() -> None:
        conn = open_state(project.state_db)
        try:
            barrier.wait()
            results.append(runs.maybe_send_summary(conn, run_id))
        finally:
            conn.close()

    threads = [threading.Thread(target=call) for _ in range(callers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


def test_the_summary_waits_for_every_agent_and_is_sent_once(project: ProjectPaths, state_db: t.Any,
                                                            open_run: runs.Run) -> None:
    assert runs.maybe_send_summary(state_db, open_run.id) is None, "no agents yet: nothing to report"
    _agent(state_db, "builder-a", "builder", open_run.id)
    _agent(state_db, "scout-b", "scout", open_run.id)
    _finish(state_db, "builder-a")
    assert runs.maybe_send_summary(state_db, open_run.id) is None, "scout-b still works"
    _finish(state_db, "scout-b", "zombie", reason="stalled for 900s")
    state_db.execute("INSERT INTO mail(sender, recipient, type, subject, created_at) VALUES "
                     "('builder-a', 'coordinator', 'worker_done', 'a: greet() added', ?)", (int(time.time() * 1000),))

    results = _summaries_sent_concurrently(project, open_run.id)
    sent = [r for r in results if r is not None]
    assert len(sent) == 1, results
    summary = mails(project, to="coordinator", type="status")
    assert len(summary) == 1 and summary[0].sender == "ov"
    assert summary[0].subject == f"run {open_run.id}: all 2 agent(s) finished (1 completed, 1 zombie)"
    body = summary[0].body
    assert "- builder-a (builder, task builder-a): completed" in body and "[worker_done] a: greet() added" in body
    assert "- scout-b (scout, task scout-b): zombie (stalled for 900s)" in body
    assert [a["name"] for a in summary[0].payload["agents"]] == ["builder-a", "scout-b"]
    assert runs.get_run(state_db, open_run.id).summary_sent_at is not None
    assert runs.maybe_send_summary(state_db, open_run.id) is None


def test_a_new_wave_gets_its_own_summary(project: ProjectPaths, state_db: t.Any, open_run: runs.Run) -> None:
    _agent(state_db, "builder-a", "builder", open_run.id)
    _finish(state_db, "builder-a")
    assert runs.maybe_send_summary(state_db, open_run.id) is not None
    _agent(state_db, "builder-c", "builder", open_run.id)  # possibly within the same millisecond
    assert runs.maybe_send_summary(state_db, open_run.id) is None
    _finish(state_db, "builder-c")
    assert [r for r in _summaries_sent_concurrently(project, open_run.id) if r is not None] != []
    second = mails(project, to="coordinator", type="status")[-1]
    assert "all 1 agent(s) finished" in second.subject and "builder-c" in second.body
    assert "builder-a" not in second.body and "1 earlier agent(s)" in second.body
    assert len(runs.summaries(state_db, open_run.id)) == 2
    assert runs.maybe_send_summary(state_db, open_run.id) is None


def test_an_agent_that_joined_while_the_summary_was_written_is_not_lost(project: ProjectPaths, state_db: t.Any,
                                                                         open_run: runs.Run) -> None:
    _agent(state_db, "builder-a", "builder", open_run.id)
    _finish(state_db, "builder-a")
    assert runs.maybe_send_summary(state_db, open_run.id) is not None
    # `ov sling` stamps created_at before it takes the write lock: the row can look older than the summary.
    _agent(state_db, "builder-late", "builder", open_run.id)
    state_db.execute("UPDATE sessions SET created_at = created_at - 5000 WHERE name = 'builder-late'")
    _finish(state_db, "builder-late")
    assert runs.maybe_send_summary(state_db, open_run.id) is not None
    assert "builder-late" in mails(project, to="coordinator", type="status")[-1].body


def test_no_summary_without_an_active_coordinator_or_an_open_run(project: ProjectPaths, state_db: t.Any,
                                                                 open_run: runs.Run) -> None:
    _agent(state_db, "builder-a", "builder", open_run.id)
    _finish(state_db, "builder-a")
    _finish(state_db, "coordinator")
    assert runs.maybe_send_summary(state_db, open_run.id) is None
    runs.complete(state_db, open_run.id)
    assert runs.maybe_send_summary(state_db, open_run.id) is None
    assert runs.maybe_send_summary(state_db, "run-nope") is None
    assert mails(project, type="status") == []


# ---- complete, resolve, list ------------------------------------------------------------------------


def test_complete_refuses_while_agents_work(project: ProjectPaths, state_db: t.Any, open_run: runs.Run) -> None:
    _agent(state_db, "builder-a", "builder", open_run.id)
    with pytest.raises(runs.RunStillActive, match="builder-a, coordinator"):
        runs.complete(state_db, open_run.id)
    refused = run_ov("run", "complete", cwd=project.root)
    assert refused.returncode == 1 and "still has 2 active agent(s)" in refused.stderr and "--force" in refused.stderr
    forced = run_ov("run", "complete", "--force", "--json", cwd=project.root)
    assert forced.returncode == 0, forced.stderr
    assert json.loads(forced.stdout)["status"] == "completed" and json.loads(forced.stdout)["changed"] is True
    none_open = run_ov("run", "complete", cwd=project.root)
    assert none_open.returncode == 1 and "no run is open" in none_open.stderr
    again = run_ov("run", "complete", open_run.id, cwd=project.root)
    assert again.returncode == 0 and "was already completed" in again.stdout
    run, created = runs.open_or_join(state_db, "coordinator")
    assert created and run.id != open_run.id


def test_resolve_by_prefix(project: ProjectPaths, state_db: t.Any) -> None:
    with pytest.raises(runs.RunNotFound, match="no runs yet"):
        runs.resolve(state_db, None)
    for run_id, started in (("run-20260101-000000-aaaa", 1), ("run-20260101-000000-aabb", 2),
                            ("run-20260202-000000-cccc", 3)):
        state_db.execute("INSERT INTO runs(id, status, started_at, completed_at) VALUES (?, 'completed', ?, ?)",
                         (run_id, started, started))
    assert runs.resolve(state_db, "run-20260202").id == "run-20260202-000000-cccc"
    assert runs.resolve(state_db, None).id == "run-20260202-000000-cccc", "no open run: the newest"
    with pytest.raises(runs.RunNotFound, match="matches 2 runs"):
        runs.resolve(state_db, "run-20260101")
    with pytest.raises(runs.RunNotFound, match="no run 'run-1999'"):
        runs.resolve(state_db, "run-1999")
    with pytest.raises(runs.RunNotFound):
        runs.resolve(state_db, "run-2026010_")  # LIKE wildcards are taken literally
    shown = run_ov("run", "show", "run-2026", cwd=project.root)
    assert shown.returncode == 1 and "matches 3 runs" in shown.stderr


# ---- a real run --------------------------------------------------------------------------------------


def test_a_run_accounts_for_every_turn_and_summarises_once(team: ProjectPaths, tmp_path: Path) -> None:  # noqa: F811
    path = team.ov_dir / "team.json"  # agents read it from inside their sandbox: .overstory/ is visible there
    scenario(path, {
        "coordinator": [*READY, {"actions": [{"bash": sling_cmd("builder", "one", path)},
                                             {"bash": sling_cmd("builder", "two", path)}], "result": "slung"}],
        "builder-*": BUILDER_DONE,
    })
    started = json.loads(run_ov("coordinator", "start", "--scenario", str(path), "--json", cwd=team.root).stdout)
    run_id = started["run_id"]
    wait_idle(team, "coordinator", 1)
    assert run_ov("coordinator", "send", "two builders please", cwd=team.root).returncode == 0
    for name in ("builder-one", "builder-two"):
        assert wait_terminal(team, name).state == "completed"
    summary = wait_for(lambda: [m for m in mails(team, to="coordinator", type="status") if m.sender == "ov"],
                       message="the run summary")
    assert "all 2 agent(s) finished (2 completed)" in summary[0].subject
    # The summary is the last mail this run produces: once its turn is over, the run is quiet.
    wait_for(lambda: [m for m in mails(team, to="coordinator", type="status") if m.sender == "ov"][0].read_at,
             message="the summary's turn")
    wait_idle(team, "coordinator", 3)
    conn = open_state(team.state_db)
    try:
        assert runs.maybe_send_summary(conn, run_id) is None
        expected_turns = conn.execute("SELECT count(*), sum(cost_usd) FROM turns").fetchone()
        session_cost = conn.execute("SELECT sum(cost_usd) FROM sessions").fetchone()[0]
    finally:
        conn.close()
    assert len([m for m in mails(team, to="coordinator", type="status") if m.sender == "ov"]) == 1

    shown = run_ov("run", "show", "--json", cwd=team.root)
    assert shown.returncode == 0, shown.stderr
    report = json.loads(shown.stdout)
    assert report["run"]["id"] == run_id and report["run"]["status"] == "open"
    assert {a["name"] for a in report["agents"]} == {"coordinator", "builder-one", "builder-two"}
    totals = report["totals"]
    assert totals["turns"] == expected_turns[0] == len(report["turns"])
    assert totals["cost_usd"] == pytest.approx(expected_turns[1]) and totals["cost_usd"] == pytest.approx(session_cost)
    assert totals["cost_usd"] > 0 and totals["input_tokens"] > 0
    assert sum(a["turns"] for a in report["agents"]) == totals["turns"]
    builder = next(a for a in report["agents"] if a["name"] == "builder-one")
    assert builder["state"] == "completed" and builder["turns"] == 1 and builder["ended_at"] is not None
    assert builder["mail_sent"] >= 1 and builder["mail_received"] == 1 and builder["duration_seconds"] > 0
    assert report["mail"]["by_type"]["worker_done"] == 2

    text = run_ov("run", "show", "--turns", cwd=team.root)
    assert text.returncode == 0 and f"run {run_id}: open" in text.stdout and "builder-two" in text.stdout
    assert f"{totals['turns']} turn(s)" in text.stdout
    listed = json.loads(run_ov("run", "list", "--json", cwd=team.root).stdout)["runs"]
    assert [(r["id"], r["agents"], r["active"]) for r in listed] == [(run_id, 3, 1)]
    assert run_ov("coordinator", "stop", cwd=team.root).returncode == 0
    assert json.loads(run_ov("run", "list", "--json", cwd=team.root).stdout)["runs"][0]["status"] == "completed"


def test_agents_slung_without_an_open_run_join_none(team: ProjectPaths) -> None:  # noqa: F811
    slung = run_ov("sling", "builder", "solo", "--json", cwd=team.root)
    assert slung.returncode == 0, slung.stderr
    assert json.loads(slung.stdout)["run_id"] is None
    listed = run_ov("run", "list", cwd=team.root)
    assert listed.returncode == 0 and "no runs yet" in listed.stdout


def test_the_capability_lists_live_in_one_place() -> None:
    """Issue 32: what each capability may do is written once, in overstory.capabilities; no other module spells
    out a set of two or more capability names (it would drift, as the monitor's did)."""
    import ast

    from overstory import capabilities

    names = set(capabilities.CAPABILITIES)
    source = Path(capabilities.__file__).parent
    found = []
    for path in sorted(source.rglob("*.py")):
        if path.name == "capabilities.py" and path.parent == source:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Set | ast.Tuple | ast.List) and len(node.elts) >= 2:
                values = [e.value for e in node.elts if isinstance(e, ast.Constant)]
                if len(values) == len(node.elts) and set(values) <= names:
                    found.append(f"{path.relative_to(source)}:{node.lineno}: {values}")
    assert found == [], "say it in overstory/capabilities.py and import it:\n" + "\n".join(found)


def test_a_monitor_is_persistent_as_its_role_says(project: ProjectPaths, state_db: t.Any,
                                                  open_run: runs.Run) -> None:
    """agents/monitor.md: persistent, never worker_done. So an active monitor blocks no run summary and
    idle handling never nudges it; and the role files and the one capability table agree."""
    from overstory import capabilities
    from overstory.agents import idle
    from overstory.resources import shipped_agents_dir
    from overstory.store import turns

    _agent(state_db, "monitor-1", "monitor", open_run.id)
    _agent(state_db, "builder-a", "builder", open_run.id)
    _finish(state_db, "builder-a")
    assert runs.maybe_send_summary(state_db, open_run.id) is not None, "the monitor still watches: no matter"

    monitor = sessions.get(state_db, "monitor-1")
    assert sessions.transition(state_db, "monitor-1", monitor.generation, "between_turns", actor="test").ok
    long_ago = int(time.time() * 1000) - 3_600_000
    turns.start(state_db, "t-1", agent="monitor-1", generation=monitor.generation, number=1, attempt=0,
                resumed=False, started_ms=long_ago, log_dir="/nowhere")
    turns.finish(state_db, "t-1", "ok", input_tokens=0, output_tokens=0, cost_usd=0.0, tool_calls=0,
                 session_id=None, error=None)
    monitor = sessions.get(state_db, "monitor-1")
    assert idle.check(state_db, monitor, idle_nudge=0.001, max_nudges=2, now=int(time.time() * 1000) + 60_000) is None
    assert mails(project, to="monitor-1", type="nudge") == []

    for capability in capabilities.CAPABILITIES:
        role = (shipped_agents_dir() / f"{capability}.md").read_text(encoding="utf-8").lower()
        says_persistent = "do not send `worker_done`" in role or "never finish with `worker_done`" in role
        assert says_persistent == (capability in capabilities.PERSISTENT), capability
        assert (capabilities.TERMINAL_MAIL_TYPES[capability] == frozenset()) == says_persistent, capability
