"""`ov status`: the stable JSON document, the text view, the hot-path imports, and no writes."""

from __future__ import annotations

import json
import subprocess
import sys
import typing as t

from click.testing import CliRunner

from conftest import run_ov
from overstory.paths import ProjectPaths
from overstory.store import mail, sessions
from overstory.store import turns as turn_rows
from overstory.store.lifecycle import declare_zombie

AGENT_KEYS = {"name", "capability", "state", "state_reason", "task_id", "parent", "depth", "turns", "last_activity",
              "idle_seconds", "input_tokens", "output_tokens", "cost_usd", "current_tool", "runtime", "mode",
              "branch", "generation", "retries", "pending_mail", "loop_alive", "run_id", "park_kind", "park_until",
              "budget", "node"}
TOTAL_KEYS = {"agents", "active", "by_state", "turns", "input_tokens", "output_tokens", "cost_usd"}


def _agent(conn: t.Any, name: str, state: str = "booting", **fields: t.Any) -> None:
    generation = sessions.create_session(conn, name=name, capability="builder", task_id=f"task-{name}",
                                         runtime="scripted", actor="test", parent="lead-1", depth=2,
                                         branch=f"ov/{name}")
    if state == "zombie":
        found = sessions.get(conn, name)
        assert found is not None and declare_zombie(conn, found, "test", actor="test").ok
    elif state != "booting":
        assert sessions.transition(conn, name, generation, state, actor="test").ok
    if fields:
        sessions.update_fields(conn, name, generation, **fields)


def _invoke(project: ProjectPaths, *args: str) -> t.Any:
    from overstory.cli.main import cli

    result = CliRunner().invoke(cli, ["--project", str(project.root), "status", *args], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


def test_json_document_has_the_documented_shape(project: ProjectPaths, state_db: t.Any) -> None:
    _agent(state_db, "busy", "in_turn", input_tokens=1200, output_tokens=300, cost_usd=0.25, current_tool="Bash",
           turns=3)
    _agent(state_db, "waiting", "between_turns", cost_usd=0.5)
    _agent(state_db, "dead", "zombie")
    _agent(state_db, "done", "completed")
    mail.send(state_db, sender="operator", to="waiting", subject="one")
    mail.send(state_db, sender="operator", to="waiting", subject="two")
    mail.claim(state_db, "busy", "turn-1")  # claimed mail is not pending
    busy_generation = t.cast(sessions.Session, sessions.get(state_db, "busy")).generation
    for number, node in ((1, "node-a"), (2, "node-b"), (3, None)):  # the latest turn that knows its node
        turn_rows.start(state_db, f"turn-{number}", agent="busy", generation=busy_generation, number=number,
                        attempt=0, resumed=False, started_ms=number * 1000, log_dir="")
        turn_rows.mark_running(state_db, f"turn-{number}", pid=None, pgid=None, node=node)

    document = json.loads(_invoke(project, "--json"))
    assert set(document) == {"generated_at", "agents", "mail", "runs", "waiting", "scope_overlaps", "groups",
                            "totals"}
    assert document["waiting"] == [], "no approval gates"
    by_name = {a["name"]: a for a in document["agents"]}
    assert sorted(by_name) == ["busy", "dead", "waiting"], "completed hidden, zombie shown"
    for agent in document["agents"]:
        assert set(agent) == AGENT_KEYS
        assert agent["last_activity"].endswith("Z")
    busy = by_name["busy"]
    assert (busy["state"], busy["capability"], busy["task_id"], busy["parent"], busy["depth"]) == (
        "in_turn", "builder", "task-busy", "lead-1", 2)
    assert (busy["turns"], busy["input_tokens"], busy["output_tokens"], busy["cost_usd"], busy["current_tool"]) == (
        3, 1200, 300, 0.25, "Bash")
    assert busy["loop_alive"] is False, "no loop was ever started for it"
    assert busy["node"] == "node-b", "where its latest turn with a known node ran"
    assert by_name["waiting"]["node"] is None, "it never ran a turn"
    assert by_name["dead"]["loop_alive"] is None, "terminal agents have no loop to check"
    assert document["mail"] == {"pending": 3, "by_agent": {"lead-1": 1, "waiting": 2}}  # lead-1: worker_died
    assert set(document["totals"]) == TOTAL_KEYS
    assert document["totals"]["agents"] == 4 and document["totals"]["active"] == 2
    assert document["totals"]["by_state"] == {"between_turns": 1, "completed": 1, "in_turn": 1, "zombie": 1}
    assert document["totals"]["cost_usd"] == 0.75
    everything = json.loads(_invoke(project, "--json", "--all"))
    assert sorted(a["name"] for a in everything["agents"]) == ["busy", "dead", "done", "waiting"]


def test_runs_are_listed(project: ProjectPaths, state_db: t.Any) -> None:
    state_db.execute("INSERT INTO runs(id, coordinator, status, started_at) VALUES ('run-1', 'coordinator', 'open', 1)")
    _agent(state_db, "member")
    state_db.execute("UPDATE sessions SET run_id = 'run-1'")
    runs = json.loads(_invoke(project, "--json"))["runs"]
    assert runs == [{"id": "run-1", "coordinator": "coordinator", "status": "open",
                     "started_at": "1970-01-01T00:00:00.001Z", "completed_at": None, "agents": 1, "budget": None}]
    assert "run run-1: open, 1 agents" in _invoke(project)


def test_text_view_marks_agents_without_a_loop(project: ProjectPaths, state_db: t.Any) -> None:
    _agent(state_db, "orphan", "between_turns", cost_usd=1.5)
    text = _invoke(project)
    assert "orphan" in text and "between_turns!" in text and "$1.5000" in text
    assert "agent loop is not running" in text
    assert "no agents" in _invoke_empty(project)


def _invoke_empty(project: ProjectPaths) -> str:
    from overstory.store.db import open_state

    conn = open_state(project.state_db)
    conn.execute("DELETE FROM sessions")
    conn.close()
    return str(_invoke(project))


def test_status_never_writes(project: ProjectPaths, state_db: t.Any) -> None:
    _agent(state_db, "a", "in_turn")
    _agent(state_db, "b", "between_turns")
    mail.send(state_db, sender="operator", to="a", subject="hello")

    def snapshot() -> list[t.Any]:
        return [list(map(tuple, state_db.execute(f"SELECT * FROM {table} ORDER BY 1").fetchall()))
                for table in ("sessions", "transitions", "mail", "turns", "runs", "generations")]

    before = snapshot()
    changes = state_db.execute("PRAGMA data_version").fetchone()[0]
    for args in ((), ("--json",), ("--all",), ("--json", "--all")):
        assert run_ov("status", *args, cwd=project.root).returncode == 0
    assert snapshot() == before
    assert state_db.execute("PRAGMA data_version").fetchone()[0] == changes, "another connection committed a write"


def test_status_json_imports_nothing_heavy(project: ProjectPaths, state_db: t.Any) -> None:
    _agent(state_db, "a", "in_turn")
    probe = (
        "import sys, io, contextlib\n"
        "from overstory.cli.main import main\n"
        f"sys.argv = ['ov', '--project', {str(project.root)!r}, 'status', '--json']\n"
        "out = io.StringIO()\n"
        "try:\n"
        "    with contextlib.redirect_stdout(out):\n"
        "        main()\n"
        "except SystemExit as exc:\n"
        "    assert exc.code == 0, exc.code\n"
        "assert '\"agents\"' in out.getvalue()\n"
        "print(' '.join(sorted(sys.modules)))\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    loaded = set(done.stdout.split())
    assert "overstory.cli.status" in loaded and "overstory.views.status" in loaded
    heavy = {"rich", "pydantic", "yaml", "git", "libtmux", "anthropic", "overstory.config.model", "overstory.ui",
             "overstory.watchdog.daemon", "overstory.store.mail_payloads"}
    assert not heavy & loaded, heavy & loaded
