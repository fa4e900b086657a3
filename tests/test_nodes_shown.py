"""Where each turn ran (its ``node``: a Ray node id, or this machine's host name) in `ov watch`, `ov trace` and
`ov serve`'s API, as `ov status --json` has it. Turns on a real cluster: ``test_turns_on_ray.py``."""

from __future__ import annotations

import json
import os
import sqlite3
import typing as t

import pytest
from starlette.testclient import TestClient

from conftest import run_ov
from overstory.paths import ProjectPaths
from overstory.serve_token import ensure_token
from overstory.store import turns
from overstory.ui.serve.app import create_app
from test_serve_api import BASE, add_agent, bearer

RAY_NODE = "3f9c0a1b" + "7e" * 24  # a Ray node id: 56 hex digits
HERE = os.uname().nodename


def ran_on(conn: sqlite3.Connection, name: str, node: str, turn_id: str, started_ms: int = 1_000) -> None:
    generation = add_agent(conn, name, state="in_turn")
    turns.start(conn, turn_id, agent=name, generation=generation, number=1, attempt=0, resumed=False,
                started_ms=started_ms, log_dir="x")
    turns.set_node(conn, turn_id, node)
    turns.finish(conn, turn_id, "ok", input_tokens=1, output_tokens=1, cost_usd=0.0, tool_calls=0, session_id="s",
                 error=None)


def test_watch_shows_a_node_column_when_a_turn_ran_on_another_machine(project: ProjectPaths,
                                                                       state_db: sqlite3.Connection) -> None:
    ran_on(state_db, "builder-here", HERE, "turn-h")
    alone = run_ov("watch", "--once", "--width", "140", cwd=project.root)
    assert alone.returncode == 0, alone.stderr
    assert "NODE" not in alone.stdout  # every turn ran here: nothing to tell apart
    ran_on(state_db, "builder-away", RAY_NODE, "turn-a")
    both = run_ov("watch", "--once", "--width", "140", cwd=project.root)
    assert both.returncode == 0, both.stderr
    assert "NODE" in both.stdout
    rows = {line.split()[0]: line for line in both.stdout.splitlines() if line.strip().startswith("builder-")}
    assert RAY_NODE[:8] in rows["builder-away"] and RAY_NODE not in both.stdout  # a Ray id by its first 8
    assert HERE in rows["builder-here"]


def test_trace_shows_the_node_of_each_turn(project: ProjectPaths, state_db: sqlite3.Connection) -> None:
    ran_on(state_db, "builder-away", RAY_NODE, "turn-a")
    text = run_ov("trace", "builder-away", cwd=project.root)
    assert text.returncode == 0, text.stderr
    started = [line for line in text.stdout.splitlines() if "started (turn-a)" in line]
    assert len(started) == 1 and started[0].endswith(f"; on node {RAY_NODE}"), text.stdout
    document = json.loads(run_ov("trace", "builder-away", "--json", cwd=project.root).stdout)
    assert [turn["node"] for turn in document["turns"]] == [RAY_NODE]
    assert [e["node"] for e in document["timeline"] if e["kind"] == "turn_start"] == [RAY_NODE]


@pytest.fixture
def api(project: ProjectPaths) -> t.Iterator[TestClient]:
    token = ensure_token(project).value
    with TestClient(create_app(project, token=token, cookie_name="c"), base_url=BASE,
                    headers=bearer(token)) as client:
        yield client


def test_the_api_gives_each_agents_node_and_each_turns(api: TestClient, state_db: sqlite3.Connection) -> None:
    ran_on(state_db, "builder-away", RAY_NODE, "turn-a")
    ran_on(state_db, "builder-here", HERE, "turn-h", started_ms=2_000)
    detail = api.get("/api/agents/builder-away").json()
    assert detail["node"] == RAY_NODE
    assert [(t["id"], t["node"]) for t in detail["turn_list"]] == [("turn-a", RAY_NODE)]
    listed = {a["name"]: a["node"] for a in api.get("/api/agents").json()}
    assert listed == {"builder-away": RAY_NODE, "builder-here": HERE}
    assert {a["name"]: a["node"] for a in api.get("/api/status").json()["agents"]} == listed


def test_the_watchdog_leaves_a_local_turn_to_its_own_rules(project: ProjectPaths, state_db: sqlite3.Connection) -> None:
    """``remote_turns.settle`` speaks only for turns on a cluster: a local one (or a configuration that does not
    load, where no executor can be built) is the watchdog's process-group business, as before executors."""
    from overstory.store import sessions
    from overstory.watchdog import remote_turns

    ran_on(state_db, "builder-here", HERE, "turn-h")
    agent = sessions.get(state_db, "builder-here")
    assert agent is not None and agent.turn_pgid is None
    assert remote_turns.settle(project, agent, "turn-h", grace=0) is None  # executor.kind local
    project.local_config_file.write_text("executor: {kind: ray}\n", encoding="utf-8")  # invalid: no address
    assert remote_turns.settle(project, agent, "turn-h", grace=0) is None
