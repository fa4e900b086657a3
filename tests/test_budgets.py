"""Budgets, prices, quota windows and parking: the store-level rules (real SQLite files, no agents)."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from overstory.clock import now_ms
from overstory.runtimes.base import AUTH, RATE_LIMIT
from overstory.runtimes.claude.stream import TurnStream
from overstory.runtimes.prices import DEFAULT_PRICES, PriceTable, Tokens
from overstory.store import budgets, lifecycle, mail, quota, sessions
from overstory.store.db import open_state
from overstory.store.tool_count import count_tool_call

FIXTURES = Path(__file__).parent / "fixtures" / "stream"


@pytest.fixture
def conn(tmp_path):
    connection = open_state(tmp_path / "state.db")
    yield connection
    connection.close()


def agent(conn, name="builder-a", *, run_id=None, limits=None, parent="operator", provider="claude",
          state="between_turns"):
    generation = sessions.create_session(conn, name=name, capability="builder", task_id=name, runtime="claude",
                                         actor="test", parent=parent, run_id=run_id, provider=provider)
    budgets.create_agent(conn, name, generation, run_id=run_id, limits=limits)
    if state != "booting":
        assert sessions.transition(conn, name, generation, state, actor="test").ok
    return sessions.get(conn, name)


# ---- prices ---------------------------------------------------------------------------


def test_prices_find_models_by_their_runtime_spellings():
    table = PriceTable()
    assert table.lookup("claude-opus-4-8[1m]").entry == "claude-opus-4-8"        # init.model of 2.1.197
    assert table.lookup("claude-haiku-4-5-20251001").entry == "claude-haiku-4-5"  # dated id
    assert table.lookup("sonnet").entry == "claude-sonnet-5-5"                    # alias, as 2.1.330 resolves it
    found = table.lookup("claude-sonnet-4-5-experimental")
    assert found.entry == "claude-sonnet-4-5" and not found.guessed
    # 1M input + 1M output of claude-opus-5-5: what claude 2.1.330 itself reported against the mock.
    assert found.price.cost(Tokens(0, 0)) == 0
    assert PriceTable().lookup("claude-opus-5-5").price.cost(Tokens(1_000_000, 1_000_000)) == pytest.approx(24.0)


def test_an_unknown_model_is_priced_as_the_most_expensive_and_says_so():
    table = PriceTable()
    found = table.lookup("gpt-9")
    top = max(DEFAULT_PRICES.values(), key=lambda p: p["output_per_mtok"])
    assert found.guessed and found.price.output == top["output_per_mtok"]
    cost, notes = table.cost({"gpt-9": Tokens(1_000_000, 0), "<synthetic>": Tokens()})
    assert cost == pytest.approx(top["input_per_mtok"]) and len(notes) == 1
    assert "unknown model 'gpt-9'" in notes[0] and "config `prices`" in notes[0]


def test_config_prices_add_models_and_default_the_cache_prices():
    table = PriceTable({"my-model": {"input_per_mtok": 100, "output_per_mtok": 200}})
    price = table.lookup("my-model").price
    assert (price.input, price.output, price.cache_read, price.cache_write) == (100, 200, 10, 125)
    assert table.most_expensive == "my-model"
    assert not table.lookup("claude-opus-4-8").guessed  # the built-in table is still there


# ---- budgets --------------------------------------------------------------------------


def test_agent_counters_roll_up_into_the_run(conn):
    budgets.ensure_run(conn, "run-1", started_at=now_ms(), limits={"max_usd": 10})
    a = agent(conn, "builder-a", run_id="run-1")
    b = agent(conn, "builder-b", run_id="run-1")
    budgets.set_live(conn, a.name, a.generation, 1.5)
    budgets.settle_turn(conn, b.name, b.generation, 2.0)
    assert budgets.begin_turn(conn, a.name, a.generation) is None
    run = budgets.get_run(conn, "run-1")
    assert (run.spent_usd, run.live_usd, run.turns) == (2.0, 1.5, 1)
    budgets.settle_turn(conn, a.name, a.generation, 1.25)  # the real figure replaces the estimate
    run = budgets.get_run(conn, "run-1")
    assert (run.spent_usd, run.live_usd) == (3.25, 0.0)


def test_crossing_reasons_name_the_limit_and_the_figures(conn):
    budgets.ensure_run(conn, "run-1", started_at=now_ms(), limits={"max_usd": 3})
    a = agent(conn, run_id="run-1", limits={"max_usd": 2.0})
    budgets.set_live(conn, a.name, a.generation, 2.04)
    crossing = budgets.check(conn, a.name, a.generation)
    assert crossing.reason == "budget: max_usd 2.00 reached (2.04)" and crossing.scope == "agent"
    budgets.raise_limits(conn, "agent", a.name, a.generation, add_usd=5)
    budgets.settle_turn(conn, a.name, a.generation, 3.1)
    crossing = budgets.check(conn, a.name, a.generation)
    assert crossing.reason == "budget: run run-1 max_usd 3.00 reached (3.10)"


def test_no_turn_starts_past_max_turns_and_a_refund_gives_one_back(conn):
    a = agent(conn, limits={"max_turns": 2})
    assert budgets.begin_turn(conn, a.name, a.generation) is None
    assert budgets.begin_turn(conn, a.name, a.generation) is None
    crossing = budgets.begin_turn(conn, a.name, a.generation)
    assert crossing.limit == "max_turns" and crossing.reason == "budget: max_turns 2 reached (2)"
    assert budgets.get_agent(conn, a.name, a.generation).turns == 2
    budgets.refund_turn(conn, a.name, a.generation)
    assert budgets.begin_turn(conn, a.name, a.generation) is None
    # During a turn, the turn count is not a reason to stop it.
    assert budgets.check(conn, a.name, a.generation) is None


def test_a_child_never_gets_more_than_its_run_has_left(conn):
    run = budgets.ensure_run(conn, "run-1", started_at=now_ms() - 600_000,
                             limits={"max_usd": 10, "max_wallclock": 3600, "max_turns": 5})
    conn.execute("UPDATE budgets SET spent_usd = 7 WHERE scope = 'run'")
    run = budgets.get_run(conn, "run-1")
    limits, notes = budgets.clamp_to_run({"max_usd": 5, "max_turns": None}, run, now_ms())
    assert limits["max_usd"] == pytest.approx(3) and limits["max_turns"] == 5
    assert 2990 < limits["max_wallclock"] <= 3000
    assert len(notes) == 1 and "max_usd lowered from 5.00 to 3.00" in notes[0]


def test_more_wall_clock_counts_from_now(conn):
    a = agent(conn, limits={"max_wallclock": 60})
    conn.execute("UPDATE budgets SET started_at = ? WHERE name = ?", (now_ms() - 3_600_000, a.name))
    assert budgets.check(conn, a.name, a.generation).limit == "max_wallclock"
    raised = budgets.raise_limits(conn, "agent", a.name, a.generation, add_seconds=1800)
    assert 5390 < raised.max_wallclock < 5410  # the hour parked, plus thirty minutes from now
    assert budgets.check(conn, a.name, a.generation) is None
    unlimited = agent(conn, "builder-b")
    assert budgets.raise_limits(conn, "agent", unlimited.name, unlimited.generation, add_usd=5).max_usd is None


# ---- tool calls (the guard's one statement) --------------------------------------------


def test_tool_calls_are_counted_and_the_one_past_the_limit_is_refused(conn, tmp_path):
    a = agent(conn, limits={"max_tool_calls": 2})
    db = str(tmp_path / "state.db")
    assert count_tool_call(db, a.name, a.generation) is None
    assert count_tool_call(db, a.name, a.generation) is None
    reason = count_tool_call(db, a.name, a.generation)
    assert reason.startswith("budget: max_tool_calls reached") and "all 2 are used" in reason
    row = budgets.get_agent(conn, a.name, a.generation)
    assert (row.tool_calls, row.refused_tool_calls) == (2, 1)
    crossing = budgets.check(conn, a.name, a.generation, refused_since=0)
    assert crossing.reason == "budget: max_tool_calls 2 reached (2)"
    assert budgets.check(conn, a.name, a.generation, refused_since=1) is None  # no refusal in this turn


def test_the_run_limit_refuses_tool_calls_of_every_agent(conn, tmp_path):
    budgets.ensure_run(conn, "run-1", started_at=now_ms(), limits={"max_tool_calls": 3})
    a = agent(conn, "builder-a", run_id="run-1")
    b = agent(conn, "builder-b", run_id="run-1")
    db = str(tmp_path / "state.db")
    assert [count_tool_call(db, n, 1) for n in ("builder-a", "builder-b", "builder-a")] == [None, None, None]
    reason = count_tool_call(db, "builder-b", b.generation)
    assert "run run-1's budget allows 3 tool calls" in reason
    assert budgets.get_run(conn, "run-1").tool_calls == 3
    assert budgets.check(conn, b.name, b.generation, refused_since=0).scope == "run"
    assert budgets.check(conn, a.name, a.generation, refused_since=0) is None


def test_the_guard_count_allows_when_there_is_nothing_to_count(conn, tmp_path):
    assert count_tool_call(str(tmp_path / "missing.db"), "x", 1) is None
    assert not (tmp_path / "missing.db").exists(), "the guard must never create a database"
    assert count_tool_call(str(tmp_path / "state.db"), "nobody", 1) is None
    old = tmp_path / "old.db"
    sqlite3.connect(old).execute("CREATE TABLE sessions (name TEXT)").connection.close()
    assert count_tool_call(str(old), "x", 1) is None  # a database from before budgets


# ---- parking --------------------------------------------------------------------------


def test_park_releases_claimed_mail_and_escalates_once(conn):
    a = agent(conn, parent="lead-1")
    mail.send(conn, sender="operator", to=a.name, subject="task", allow_unknown=True)
    assert len(mail.claim(conn, a.name, "turn-1")) == 1
    outcome = lifecycle.park(conn, a, "budget", "budget: max_usd 2.00 reached (2.04)", actor="test",
                             details={"limit": "max_usd"})
    assert outcome.ok
    parked = sessions.get(conn, a.name)
    assert (parked.state, parked.park_kind, parked.state_reason) == ("parked", "budget",
                                                                     "budget: max_usd 2.00 reached (2.04)")
    assert mail.pending_count(conn, a.name) == 1, "the claimed mail is unread again"
    escalations = mail.list_messages(conn, type="escalation")
    assert len(escalations) == 1 and escalations[0].recipient == "lead-1"
    assert escalations[0].payload["details"] == {"limit": "max_usd"}
    assert not lifecycle.park(conn, parked, "budget", "again", actor="test").ok  # parked -> parked is no move
    assert len(mail.list_messages(conn, type="escalation")) == 1


def test_unpark_only_when_due_and_never_cuts_a_new_park_short(conn):
    a = agent(conn)
    lifecycle.park(conn, a, "quota", "quota: claude limited", actor="test", until_ms=now_ms() + 60_000,
                   escalate=False)
    a = sessions.get(conn, a.name)
    assert lifecycle.unpark(conn, a, actor="test", reason="due", due_at=now_ms()) is None
    assert lifecycle.unpark(conn, a, actor="test", reason="x", kinds={"budget"}) is None
    assert lifecycle.unpark(conn, a, actor="test", reason="due", due_at=now_ms() + 61_000).ok
    back = sessions.get(conn, a.name)
    assert (back.state, back.park_kind, back.park_until) == ("between_turns", None, None)


def test_a_park_in_the_middle_of_an_unpark_wins(conn, tmp_path, monkeypatch):
    """Between unpark's read and its swap, another process un-parks and parks the agent again."""
    a = agent(conn)
    lifecycle.park(conn, a, "quota", "q", actor="test", until_ms=1, escalate=False)
    other = open_state(tmp_path / "state.db")
    real_transition = sessions.transition
    raced = []

    def racing_transition(*args, **kwargs):
        if not raced:
            raced.append(True)
            assert real_transition(other, a.name, a.generation, "between_turns", actor="other", reason="due").ok
            fresh = sessions.get(other, a.name)
            assert lifecycle.park(other, fresh, "quota", "q2", actor="other", until_ms=now_ms() + 60_000,
                                  escalate=False).ok
        return real_transition(*args, **kwargs)

    monkeypatch.setattr(sessions, "transition", racing_transition)
    try:
        assert lifecycle.unpark(conn, sessions.get(conn, a.name), actor="test", reason="due", due_at=now_ms()) is None
    finally:
        other.close()
    final = sessions.get(conn, a.name)
    assert (final.state, final.state_reason) == ("parked", "q2"), "the new park stands"


# ---- quota windows --------------------------------------------------------------------


def test_backoff_doubles_up_to_the_cap_and_a_reset_time_wins(conn):
    now = 1_000_000_000
    steps = []
    for _ in range(7):
        window = quota.close_window(conn, "claude", reset_at_ms=None, reason="429", backoff_initial=60,
                                    backoff_max=1800, now=now)
        steps.append((window.until_ms - now) // 1000)
        now = window.until_ms  # the next limit comes right after the window opened again
    assert steps == [60, 120, 240, 480, 960, 1800, 1800]
    shared = quota.close_window(conn, "claude", reset_at_ms=None, reason="429", backoff_initial=60,
                                backoff_max=1800, now=now - 5)
    assert shared.until_ms == now, "a window still closed is shared, not extended"
    reset = quota.close_window(conn, "claude", reset_at_ms=now + 20_000, reason="usage", backoff_initial=60,
                               backoff_max=1800, now=now)
    assert reset.until_ms == now + 20_000 and reset.reset_known
    assert "quota: claude limited until" in reset.describe()


def test_one_window_parks_every_idle_agent_of_the_provider_staggered(conn):
    hit = agent(conn, "builder-a", state="in_turn")
    idle = agent(conn, "builder-b")
    busy = agent(conn, "builder-c", state="in_turn")
    other = agent(conn, "builder-d", provider="other")
    window = quota.close_window(conn, "claude", reset_at_ms=now_ms() + 20_000, reason="limit", backoff_initial=60,
                                backoff_max=1800)
    assert quota.park_agent(conn, hit, window, actor="test", stagger=5).ok
    assert quota.park_provider(conn, window, actor="test", stagger=5, except_agent=hit.name) == [idle.name]
    rows = {a.name: a for a in sessions.list_sessions(conn)}
    assert rows[hit.name].park_until == window.until_ms
    assert rows[idle.name].park_until == window.until_ms + 5000
    assert rows[busy.name].state == "in_turn", "a turn in progress is not interrupted"
    assert rows[other.name].state == "between_turns"
    assert mail.list_messages(conn, type="escalation") == [], "a quota park tells nobody: it ends by itself"
    due = quota.due_for_unpark(conn, now=window.until_ms + 1)
    assert [a.name for a in due] == [hit.name]
    assert quota.current(conn, "claude") is not None
    quota.forget(conn, "claude")
    assert quota.current(conn, "claude") is not None, "forget never opens a closed window early"


# ---- what the real CLI prints (claude 2.1.330 against the mock) -------------------------


def parse(name: str) -> TurnStream:
    stream = TurnStream()
    for line in (FIXTURES / f"{name}.jsonl").read_text().splitlines():
        stream.feed(line)
    return stream


def test_a_usage_limit_with_an_oauth_login_carries_its_reset_time():
    stream = parse("usage_limit_oauth_2_1_330")
    failure = stream.failure(resumed=False)
    assert failure.kind == RATE_LIMIT and failure.reset_at_ms == 1795452408 * 1000
    assert "5-hour limit" in failure.reason


def test_a_429_without_retries_is_a_rate_limit_with_no_reset_time():
    failure = parse("rate_limit_noretry_2_1_330").failure(resumed=False)
    assert failure.kind == RATE_LIMIT and failure.reset_at_ms is None


@pytest.mark.parametrize("name", ["not_logged_in_2_1_330", "auth_403_2_1_330", "auth_401_retried_2_1_330"])
def test_auth_failures_are_auth_not_transient(name):
    failure = parse(name).failure(resumed=False)
    assert failure.kind == AUTH, failure


def test_the_first_authentication_retry_is_enough_to_stop_the_turn():
    stream = TurnStream()
    lines = (FIXTURES / "auth_401_retried_2_1_330.jsonl").read_text().splitlines()
    stream.feed(lines[0])
    assert stream.early_failure() is None
    stream.feed(lines[1])  # the first api_retry, ~0.5 s into a turn the CLI would retry for ~3 minutes
    early = stream.early_failure()
    assert early is not None and early.kind == AUTH and "401" in early.reason


def test_live_usage_counts_each_api_message_once():
    stream = TurnStream()
    message = {"id": "msg_1", "model": "claude-opus-5-5",
               "usage": {"input_tokens": 1000, "output_tokens": 1, "cache_read_input_tokens": 50}}
    for block in ({"type": "text", "text": "a"}, {"type": "tool_use", "id": "t1", "name": "Bash", "input": {}}):
        stream.feed(json.dumps({"type": "assistant", "message": {**message, "content": [block]}}))
    stream.feed(json.dumps({"type": "assistant", "message": {**message, "id": "msg_2", "content": []}}))
    assert stream.live_usage() == {"claude-opus-5-5": Tokens(2000, 2, 100, 0)}
