"""`ov budget`, `ov costs`, `ov resume`, `ov run resume`, `ov status`/`ov watch` with budgets, and the config keys.

Rows are written straight into a real state.db (no agent processes): these are the
commands' views and their errors.
"""

from __future__ import annotations

import contextlib
import io
import json
import typing as t

import pytest

from overstory.clock import now_ms
from overstory.config.model import load_config
from overstory.errors import ConfigError
from overstory.store import budgets, lifecycle, runs, sessions, turns
from overstory.views.waiting import EXIT_AUTH, EXIT_BUDGET, EXIT_OK, EXIT_QUOTA, EXIT_ZOMBIE, code_of, outcome_code


def invoke(project, *args: str, code: int = 0) -> str:
    """Run `ov ARGS` in-process through the real entry point (errors become one line and an exit code)."""
    from overstory.cli.main import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main(["--project", str(project.root), *args])
        except SystemExit as exit_:
            got = exit_.code or 0
    assert got == code, out.getvalue() + err.getvalue()
    return out.getvalue() + err.getvalue()


def make_agent(conn, name, *, capability="builder", run_id=None, limits=None, state="between_turns"):
    generation = sessions.create_session(conn, name=name, capability=capability, task_id=name, runtime="claude",
                                         actor="test", run_id=run_id, provider="claude")
    budgets.create_agent(conn, name, generation, run_id=run_id, limits=limits)
    if state != "booting":
        sessions.transition(conn, name, generation, state, actor="test")
    return sessions.get(conn, name)


def add_turn(conn, agent, turn_id, *, cost, estimated=False, model="claude-opus-5-5", by_model=None, tools=2):
    turns.start(conn, turn_id, agent=agent.name, generation=agent.generation, number=1, attempt=0, resumed=False,
                started_ms=now_ms(), log_dir="/tmp")
    turns.label(conn, turn_id, capability=agent.capability, run_id=agent.run_id, model=model)
    turns.finish(conn, turn_id, "budget" if estimated else "ok", input_tokens=1300, output_tokens=40, cost_usd=cost,
                 tool_calls=tools, session_id="s", error=None)
    turns.record_costs(conn, turn_id, model=model, cache_read_tokens=200, cache_write_tokens=100,
                       cost_estimated=estimated, usage_by_model=by_model)


def test_budget_shows_limit_used_and_left(project, state_db):
    agent = make_agent(state_db, "builder-a", limits={"max_usd": 2, "max_tool_calls": 10, "max_wallclock": 5400})
    budgets.settle_turn(state_db, agent.name, agent.generation, 0.5)
    budgets.set_live(state_db, agent.name, agent.generation, 0.25)
    text = invoke(project, "budget", "builder-a")
    assert "usd         limit     2.00  used   0.7500  left     1.25" in text
    assert "$0.2500 of it estimated" in text and "wallclock   limit      90m" in text
    document = json.loads(invoke(project, "budget", "builder-a", "--json"))
    usd = document["budgets"][0]["limits"]["usd"]
    assert (usd["limit"], usd["used"], usd["left"], usd["live_estimate"]) == (2.0, 0.75, 1.25, 0.25)
    assert document["budgets"][0]["limits"]["turns"]["limit"] is None
    assert "no agent named" in invoke(project, "budget", "nobody", code=1)
    assert "not both" in invoke(project, "budget", "builder-a", "--run", "x", code=2)


def test_budget_of_a_run_lists_its_agents(project, state_db):
    run, _ = runs.open_or_join(state_db, "coordinator")
    budgets.ensure_run(state_db, run.id, started_at=run.started_at, limits={"max_usd": 20})
    make_agent(state_db, "builder-a", run_id=run.id)
    document = json.loads(invoke(project, "budget", "--run", run.id[:12], "--json"))
    assert [b["name"] for b in document["budgets"]] == [run.id, "builder-a"]
    assert document["budgets"][0]["limits"]["usd"]["limit"] == 20


def test_costs_group_real_and_estimated_dollars(project, state_db):
    run, _ = runs.open_or_join(state_db, "coordinator")
    a = make_agent(state_db, "builder-a", run_id=run.id)
    s = make_agent(state_db, "scout-s", capability="scout")
    add_turn(state_db, a, "t1", cost=1.0)
    add_turn(state_db, a, "t2", cost=0.5, estimated=True,
             by_model={"claude-opus-5-5": {"input": 900, "output": 40, "cache_read": 200, "cache_write": 100,
                                           "cost_usd": None},
                       "claude-haiku-4-5": {"input": 1_000_000, "output": 0, "cache_read": 0, "cache_write": 0,
                                            "cost_usd": None}})
    add_turn(state_db, s, "t3", cost=0.25)
    add_turn(state_db, s, "t4", cost=0.0, estimated=True, model="mystery-model")
    by_agent = json.loads(invoke(project, "costs", "--json"))
    assert len(by_agent["estimates_of_unknown_models"]) == 1
    assert "unknown model 'mystery-model'" in by_agent["estimates_of_unknown_models"][0]
    rows = {r["agent"]: r for r in by_agent["groups"]}
    assert rows["builder-a"]["usd_real"] == 1.0 and rows["builder-a"]["usd_estimated"] == 0.5
    assert rows["builder-a"]["turns"] == 2 and rows["builder-a"]["tool_calls"] == 4
    assert rows["builder-a"]["input_tokens"] == 2000 and rows["builder-a"]["cache_read_tokens"] == 400
    assert by_agent["totals"]["usd"] == 1.75 and by_agent["totals"]["turns"] == 4
    by_cap = {r["capability"]: r["usd"] for r in json.loads(invoke(project, "costs", "--by", "capability",
                                                                     "--json"))["groups"]}
    assert by_cap == {"builder": 1.5, "scout": 0.25}  # the mystery turn cost nothing
    by_run = {r["run"]: r["turns"] for r in json.loads(invoke(project, "costs", "--by", "run", "--json"))["groups"]}
    assert by_run == {run.id: 2, "(none)": 2}
    by_model = {r["model"]: r for r in json.loads(invoke(project, "costs", "--by", "model", "--json"))["groups"]}
    assert by_model["claude-haiku-4-5"]["usd_estimated"] == pytest.approx(1.0)  # priced from the table: $1/M
    text = invoke(project, "costs")
    assert "est." in text and "total" in text and "unknown model 'mystery-model'" in text
    assert "claude-opus-5-5" in invoke(project, "costs", "--prices")
    assert json.loads(invoke(project, "costs", "--since", "1h", "--json"))["totals"]["turns"] == 4
    assert "--since" in invoke(project, "costs", "--since", "yesterday-ish", code=2)


def test_status_and_watch_show_spend_against_budget_and_why(project, state_db):
    parked = make_agent(state_db, "builder-a", limits={"max_usd": 2})
    budgets.settle_turn(state_db, parked.name, parked.generation, 2.04)
    lifecycle.park(state_db, parked, "budget", "budget: max_usd 2.00 reached (2.04)", actor="test")
    make_agent(state_db, "builder-b", state="completed")
    text = invoke(project, "status", "--all")
    assert "parked:budget" in text and "$2.0400/2.00" in text and "budget: max_usd 2.00 reached (2.04)" in text
    document = json.loads(invoke(project, "status", "--json"))
    agent = document["agents"][0]
    assert agent["park_kind"] == "budget" and agent["budget"]["usd"] == {"limit": 2.0, "used": 2.04,
                                                                          "live_estimate": 0.0}
    frame = invoke(project, "watch", "--once", "--width", "160")
    assert "parked:budget" in frame and "2.0400/2.00" in frame and "max_usd 2.00 reached" in frame


def test_resume_refuses_while_the_limit_is_still_reached(project, state_db):
    a = make_agent(state_db, "builder-a", limits={"max_usd": 2})
    budgets.settle_turn(state_db, a.name, a.generation, 2.5)
    lifecycle.park(state_db, a, "budget", "budget: max_usd 2.00 reached (2.50)", actor="test")
    out = invoke(project, "resume", "builder-a", "--add-usd", "0.25", code=1)
    assert "stays parked: budget: max_usd 2.25 reached (2.50)" in out and "--add-usd" in out
    assert sessions.get(state_db, "builder-a").state == "parked"
    out = invoke(project, "resume", "builder-a", "--add-usd", "1")
    assert "resumed builder-a" in out and sessions.get(state_db, "builder-a").state == "between_turns"
    assert "not parked" in invoke(project, "resume", "builder-a")
    assert "no agent named" in invoke(project, "resume", "nobody", code=1)
    assert "Invalid value" in invoke(project, "resume", "builder-a", "--add-time", "soon", code=2)


def test_an_agent_cannot_resume_past_its_runs_budget(project, state_db):
    run, _ = runs.open_or_join(state_db, "coordinator")
    budgets.ensure_run(state_db, run.id, started_at=run.started_at, limits={"max_usd": 1})
    a = make_agent(state_db, "builder-a", run_id=run.id)
    budgets.settle_turn(state_db, a.name, a.generation, 1.2)
    lifecycle.park(state_db, a, "budget", "budget: run", actor="test", escalate=False)
    assert f"ov run resume {run.id}" in invoke(project, "resume", "builder-a", code=1)
    assert "stays parked" in invoke(project, "run", "resume", run.id, "--add-usd", "0.1", code=1)
    out = invoke(project, "run", "resume", run.id, "--add-usd", "5")
    assert "resumed 1 agent(s): builder-a" in out and sessions.get(state_db, "builder-a").state == "between_turns"


def test_sling_refuses_an_agent_for_a_run_with_nothing_left(project, state_db):
    from overstory.agents.budgeting import BudgetExhausted, agent_limits

    run, _ = runs.open_or_join(state_db, "coordinator")
    budgets.ensure_run(state_db, run.id, started_at=run.started_at, limits={"max_usd": 1, "max_turns": 10})
    config = load_config(project.config_file)
    limits, notes = agent_limits(state_db, config, run.id, {"max_usd": 5})
    assert limits["max_usd"] == 1 and limits["max_turns"] == 10 and notes
    state_db.execute("UPDATE budgets SET spent_usd = 1 WHERE scope = 'run'")
    with pytest.raises(BudgetExhausted, match="has no budget left"):
        agent_limits(state_db, config, run.id, None)


def test_budget_config_takes_durations_and_environment_overrides(project, tmp_path):
    config_file = tmp_path / "config.yaml"
    config_file.write_text("budgets:\n  agent:\n    max_usd: 2\n    max_wallclock: 90m\n  run:\n    max_turns: 50\n"
                           "prices:\n  my-model: {input_per_mtok: 1, output_per_mtok: 2}\n")
    config = load_config(config_file, environ={"OV_BUDGETS_RUN": '{"max_usd": 20}', "OV_TURNS_IDLE_NUDGE": "30"})
    assert config.budgets.agent.max_wallclock == 5400 and config.budgets.agent.max_usd == 2
    assert config.budgets.run.max_usd == 20 and config.turns.idle_nudge == 30
    assert config.prices["my-model"].cache_read_per_mtok is None
    config_file.write_text("budgets:\n  agent:\n    max_wallclock: soon\n")
    with pytest.raises(ConfigError, match="max_wallclock"):
        load_config(config_file, environ={})
    config_file.write_text("budgets:\n  agent:\n    max_usd: -1\n")
    with pytest.raises(ConfigError, match="max_usd"):
        load_config(config_file, environ={})


def test_exit_codes_follow_one_contract(state_db):
    def agent(name: str, state: str, kind: str | None = None) -> t.Any:
        found = make_agent(state_db, name)
        if state == "parked":
            lifecycle.park(state_db, found, kind, f"{kind}: x", actor="test", escalate=False)
        elif state != "between_turns":
            sessions.transition(state_db, name, found.generation, state, actor="test")
        return sessions.get(state_db, name)

    done, dead = agent("a", "completed"), agent("b", "zombie")
    budget, quota, auth = agent("c", "parked", "budget"), agent("d", "parked", "quota"), agent("e", "parked", "auth")
    assert [code_of(a) for a in (done, dead, budget, quota, auth)] == [EXIT_OK, EXIT_ZOMBIE, EXIT_BUDGET, EXIT_QUOTA,
                                                                         EXIT_AUTH] == [0, 3, 4, 5, 6]
    assert code_of(agent("f", "between_turns")) is None
    assert outcome_code([done, dead, budget]) == 4 and outcome_code([quota, auth, done]) == 6
    assert outcome_code([]) == 0


def test_ov_serve_routes_reach_the_same_core(project, state_db):
    """`ov serve`'s resume, costs and budget routes call the functions `ov resume`/`costs`/`budget` call."""
    from starlette.testclient import TestClient

    from overstory.serve_token import ensure_token
    from overstory.ui.serve.app import create_app

    a = make_agent(state_db, "builder-a", limits={"max_usd": 2})
    add_turn(state_db, a, "t1", cost=2.5)
    budgets.settle_turn(state_db, a.name, a.generation, 2.5)
    lifecycle.park(state_db, a, "budget", "budget: max_usd 2.00 reached (2.50)", actor="test")
    token = ensure_token(project).value
    with TestClient(create_app(project, token=token, cookie_name="c"), base_url="http://127.0.0.1",
                    headers={"Authorization": f"Bearer {token}"}) as api:
        detail = api.get("/api/agents/builder-a").json()
        assert detail["budget"]["limits"]["usd"] == {"limit": 2.0, "used": 2.5, "left": 0.0, "settled": 2.5,
                                                     "live_estimate": 0.0}
        costs = api.get("/api/costs?by=capability&since=1h").json()
        assert costs["groups"][0]["capability"] == "builder" and costs["totals"]["usd"] == 2.5
        assert api.get("/api/costs?since=whenever").status_code == 400
        refused = api.post("/api/agents/builder-a/resume", json={"add_usd": 0.1})
        assert refused.status_code >= 400 and "stays parked" in refused.json()["error"]
        assert api.post("/api/agents/builder-a/resume", json={"add_time": "soon"}).status_code == 400
        resumed = api.post("/api/agents/builder-a/resume", json={"add_usd": 1, "add_time": "30m"})
        assert resumed.status_code == 200 and resumed.json()["unparked"] is True
    assert sessions.get(state_db, "builder-a").state == "between_turns"
