"""The budget circuit breaker inside a turn: every bill priced as it arrives, and no tool call after it.

Store- and parser-level rules on real SQLite files, then real agents on the scripted runtime (real
loops, process groups, hooks and `ov` commands). The same check with the real claude CLI is in
tests/e2e/test_budget_breaker_claude.py.
"""

from __future__ import annotations

import json
import select
import subprocess
import sys
import threading
import time
import types
from pathlib import Path

import pytest

from agent_helpers import agent_state, mail_rows
from overstory.agents.spending import ToolCallGate, TurnMeter
from overstory.agents.turn_stream import _LineReader, _pump
from overstory.clock import now_ms
from overstory.runtimes.claude.stream import TurnStream
from overstory.runtimes.opencode.stream import OpenCodeTurnStream
from overstory.store import budgets, sessions
from overstory.store.db import open_events, open_state
from overstory.store.tool_count import count_tool_call
from test_cost_control import REPORT, events, settled, start, turns_of

FIXTURES = Path(__file__).parent / "fixtures" / "stream"
NO_PRICES = types.SimpleNamespace(prices={})


@pytest.fixture
def conn(tmp_path):
    connection = open_state(tmp_path / "state.db")
    yield connection
    connection.close()


def agent(conn, name="builder-a", *, run_id=None, limits=None, state="in_turn"):
    generation = sessions.create_session(conn, name=name, capability="builder", task_id=name, runtime="claude",
                                         actor="test", parent="operator", run_id=run_id)
    budgets.create_agent(conn, name, generation, run_id=run_id, limits=limits)
    assert sessions.transition(conn, name, generation, state, actor="test").ok
    return sessions.get(conn, name)


def assistant_line(message_id: str, input_tokens: int, block: dict) -> str:
    return json.dumps({"type": "assistant", "message": {
        "id": message_id, "model": "claude-sonnet-5-5", "content": [block],
        "usage": {"input_tokens": input_tokens, "output_tokens": 1}}})


def tool_use(number: int) -> dict:
    return {"type": "tool_use", "id": f"toolu_{number}", "name": "Bash", "input": {"command": f"echo {number}"}}


# ---- the meter ------------------------------------------------------------------------


def test_a_bill_that_comes_with_a_tool_call_is_priced_and_stops_the_turn(conn):
    a = agent(conn, limits={"max_usd": 0.5})
    meter = TurnMeter(conn, a, NO_PRICES)
    stream = TurnStream()
    cheap = stream.feed(assistant_line("msg_1", 1000, tool_use(1)), now=0.0)
    assert [p.kind for p in cheap] == ["tool_start"]
    assert meter.poll(stream, cheap, now=0.0) is None
    # The next message is another tool call, in the same read as the first one's result: $0.80 on sonnet.
    batch = stream.feed(json.dumps({"type": "user", "message": {"content": [
        {"type": "tool_result", "tool_use_id": "toolu_1", "content": "1"}]}}), now=0.1)
    batch += stream.feed(assistant_line("msg_2", 400_000, tool_use(2)), now=0.1)
    assert [p.kind for p in batch] == ["tool_end", "tool_start"]
    stop = meter.poll(stream, batch, now=0.1)
    assert stop is not None and stop.status == "budget", meter.estimate
    assert stop.reason.startswith("budget: max_usd 0.50 reached (0.80"), stop.reason
    assert budgets.get_agent(conn, a.name, a.generation).live_usd == pytest.approx(0.802, abs=0.001)


def test_a_repeated_usage_report_is_not_priced_again(conn):
    a = agent(conn, limits={"max_usd": 5})
    meter = TurnMeter(conn, a, NO_PRICES)
    stream = TurnStream()
    for block in ({"type": "text", "text": "a"}, tool_use(1)):  # one message, its usage on each of its blocks
        meter.poll(stream, stream.feed(assistant_line("msg_1", 100_000, block)), now=0.0)
    assert stream.live_reports == 1 and meter.estimate == pytest.approx(0.20001)


def test_a_dollar_figure_the_runtime_reports_counts_as_it_arrives(conn):
    a = agent(conn, limits={"max_usd": 0.5})
    meter = TurnMeter(conn, a, NO_PRICES, model="claude-sonnet-5-5")
    stream = OpenCodeTurnStream()
    finished = {"type": "step_finish", "sessionID": "ses_1", "part": {
        "reason": "tool-calls", "tokens": {"input": 100_000, "output": 0, "reasoning": 0, "cache": {}}, "cost": 0}}
    assert meter.poll(stream, stream.feed(json.dumps(finished)), now=0.0) is None
    assert meter.estimate == pytest.approx(0.2)  # priced as the model the turn was started with
    assert list(meter.usage_of(stream)) == ["claude-sonnet-5-5"]  # and recorded under its name in the turn row
    finished["part"] = {**finished["part"], "cost": 0.4}
    stop = meter.poll(stream, stream.feed(json.dumps(finished)), now=0.1)
    assert stop is not None and stop.reason.startswith("budget: max_usd 0.50 reached (0.60")


def test_opencode_reports_each_steps_usage_as_it_ends():
    stream = OpenCodeTurnStream()
    reports = []
    for line in (FIXTURES / "opencode-tool_turn.jsonl").read_text().splitlines():
        stream.feed(line)
        reports.append((stream.live_reports, dict(stream.live_usage())))
    steps = [r for r in reports if r[0]]
    assert steps and steps[0][0] == 1 and steps[0][1][""].total > 0, "the first step's tokens before the turn ends"
    final = stream.live_usage()[""]
    assert final.input + final.cache_read + final.cache_write == stream.usage().input_tokens
    assert final.output == stream.usage().output_tokens and stream.live_cost_usd() == 0.0


def test_sling_says_when_a_runtime_lets_ov_check_dollars_only_between_turns(conn, tmp_path):
    from overstory.agents.budgeting import agent_limits
    from overstory.config.model import load_config
    from overstory.runtimes import get_runtime

    config = load_config(tmp_path / "no-config.yaml")  # the default budgets: a wall clock, no tool-call limit
    unlimited = tmp_path / "no-limits.yaml"
    unlimited.write_text("budgets:\n  agent: {max_usd: null, max_turns: null, max_wallclock: null}\n")
    bare = load_config(unlimited)
    for name in ("codex", "gemini"):
        _, notes = agent_limits(conn, config, None, {"max_usd": 1}, get_runtime(name))
        assert notes == [f"{name} reports usage only when a turn ends: max_usd is checked between turns, and "
                         "only max_wallclock bounds one turn's spend; add --max-tool-calls"]
        _, notes = agent_limits(conn, bare, None, {"max_usd": 1}, get_runtime(name))
        assert notes == [f"{name} reports usage only when a turn ends: max_usd is checked between turns, and "
                         "nothing bounds one turn's spend; add --max-tool-calls"]
        assert agent_limits(conn, config, None, {"max_usd": 1, "max_tool_calls": 20}, get_runtime(name))[1] == []
    for name in ("claude", "opencode", "scripted"):
        assert agent_limits(conn, config, None, {"max_usd": 1}, get_runtime(name))[1] == []


# ---- the guard's count ------------------------------------------------------------------


def test_the_guard_refuses_every_call_once_the_estimate_crossed_the_dollar_limit(conn, tmp_path):
    a = agent(conn, limits={"max_usd": 0.5})
    db = str(tmp_path / "state.db")
    assert count_tool_call(db, a.name, a.generation) is None
    budgets.set_live(conn, a.name, a.generation, 0.8)  # the turn runner's estimate of the turn in progress
    reason = count_tool_call(db, a.name, a.generation)
    assert reason is not None and reason.startswith("budget: max_usd reached (this agent's budget allows $0.50")
    row = budgets.get_agent(conn, a.name, a.generation)
    assert (row.tool_calls, row.refused_tool_calls) == (1, 1)


def test_the_guard_refuses_calls_of_every_agent_of_a_run_past_its_dollars(conn, tmp_path):
    budgets.ensure_run(conn, "run-1", started_at=now_ms(), limits={"max_usd": 1.0})
    a = agent(conn, "builder-a", run_id="run-1")
    b = agent(conn, "builder-b", run_id="run-1")
    db = str(tmp_path / "state.db")
    budgets.set_live(conn, a.name, a.generation, 0.6)
    assert count_tool_call(db, b.name, b.generation) is None
    budgets.settle_turn(conn, a.name, a.generation, 0.6)
    budgets.set_live(conn, b.name, b.generation, 0.5)
    reason = count_tool_call(db, a.name, a.generation)
    assert reason is not None and "run run-1's budget allows $1.00 and $1.10 is spent" in reason


# ---- the gate ---------------------------------------------------------------------------


def asking(gate: ToolCallGate, reports: int = 0) -> tuple[threading.Thread, list]:
    answers: list = []
    thread = threading.Thread(target=lambda: answers.append(gate.ask(timeout=30, reports=reports)), daemon=True)
    thread.start()
    return thread, answers


def test_a_tool_call_waits_at_the_gate_until_the_stream_is_priced_and_is_refused_after_a_crossing(conn):
    gate = ToolCallGate()
    try:
        assert gate.ask() is None, "no turn: nothing waits"
        gate.open_turn(watch=True)
        thread, answers = asking(gate)
        assert select.select([gate.fileno()], [], [], 10)[0], "the turn runner is woken"
        ticket = gate.take()
        assert ticket == 1 and answers == [], "the call waits for its answer"
        gate.answer(ticket, None)
        thread.join(10)
        assert answers == [None]
        thread, answers = asking(gate)
        select.select([gate.fileno()], [], [], 10)
        a = agent(conn, limits={"max_usd": 0.5})
        budgets.set_live(conn, a.name, a.generation, 0.6)
        stop = TurnMeter(conn, a, NO_PRICES).check()
        gate.answer(gate.take(), stop)
        thread.join(10)
        assert answers and answers[0].startswith("ov: budget: max_usd 0.50 reached"), answers
        gate.close_turn(stop)
        assert gate.ask().startswith("ov: budget"), "the stopped turn's late hooks are refused"
        gate.open_turn(watch=False)
        assert gate.ask() is None, "a turn without a dollar limit never waits"
    finally:
        gate.close()


def test_the_turn_runner_prices_what_the_runtime_printed_before_a_call_asked_then_answers_it(conn, tmp_path):
    """The race the gate closes: the runtime printed the bill, then its hook asked, before the runner read it."""
    a = agent(conn, limits={"max_usd": 0.5}, state="between_turns")
    line = assistant_line("msg_1", 400_000, tool_use(1))
    code = f"import os, time; os.write(1, {(line + chr(10)).encode()!r}); time.sleep(60)"
    runtime = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, start_new_session=True)
    gate = ToolCallGate()
    events = open_events(tmp_path / "events.db")
    try:
        assert select.select([runtime.stdout], [], [], 30)[0], "the bill is in the pipe"
        gate.open_turn(watch=True)
        thread, answers = asking(gate)
        assert select.select([gate.fileno()], [], [], 10)[0], "the call asked"
        meter = TurnMeter(conn, a, NO_PRICES)
        with open(tmp_path / "stdout.ndjson", "wb") as raw:
            status, reason = _pump(_LineReader(runtime.stdout, gate), raw, runtime, TurnStream(), conn, events, a,
                                   "turn-1", meter, stall_timeout=30, should_stop=lambda: False)
        assert status == "budget" and reason.startswith("budget: max_usd 0.50 reached (0.80")
        thread.join(10)  # answered by the runner itself, before the turn is closed
        assert answers and answers[0].startswith("ov: budget: max_usd 0.50 reached"), answers
    finally:
        runtime.kill()
        runtime.wait()
        gate.close()
        events.close()


def test_a_call_that_counted_more_bills_than_the_stream_shows_waits_for_them(conn, tmp_path):
    """OpenCode prints its events from an event subscription, so a step's bill can reach stdout after the next
    step's tool call asked. ov's plugin counts the bills it saw (``ov_bills_seen``); the runner holds that call
    until the stream shows them. Here the bill is printed a second after the call asked: before this rule the
    call was answered at once, allowed."""
    a = agent(conn, limits={"max_usd": 0.5}, state="between_turns")
    start = {"type": "step_start", "sessionID": "ses_1", "part": {"type": "step-start"}}
    bill = {"type": "step_finish", "sessionID": "ses_1", "part": {
        "type": "step-finish", "reason": "tool-calls", "cost": 0.8, "tokens": {"input": 10, "output": 1}}}
    code = (f"import os, time; os.write(1, {(json.dumps(start) + chr(10)).encode()!r}); time.sleep(1.5); "
            f"os.write(1, {(json.dumps(bill) + chr(10)).encode()!r}); time.sleep(60)")
    runtime = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, start_new_session=True)
    gate = ToolCallGate()
    events = open_events(tmp_path / "events.db")
    try:
        gate.open_turn(watch=True)
        thread, answers = asking(gate, reports=1)
        meter = TurnMeter(conn, a, NO_PRICES)
        with open(tmp_path / "stdout.ndjson", "wb") as raw:
            status, reason = _pump(_LineReader(runtime.stdout, gate), raw, runtime, OpenCodeTurnStream(), conn, events,
                                   a, "turn-1", meter, stall_timeout=30, should_stop=lambda: False)
        assert status == "budget" and reason.startswith("budget: max_usd 0.50 reached (0.80"), (status, reason)
        thread.join(10)
        assert answers and answers[0].startswith("ov: budget: max_usd 0.50 reached"), answers
    finally:
        runtime.kill()
        runtime.wait()
        gate.close()
        events.close()


def test_the_hook_input_says_how_many_bills_the_runtime_had_made():
    from overstory.endpoint.routes import _bills_seen

    assert _bills_seen(json.dumps({"tool": "bash", "ov_bills_seen": 3})) == 3
    for text in ('{"tool": "bash"}', '{"ov_bills_seen": -1}', '{"ov_bills_seen": true}', '{"ov_bills_seen": "9"}',
                 '["ov_bills_seen"]', 'not json "ov_bills_seen"'):
        assert _bills_seen(text) == 0, text


def test_closing_the_turn_answers_every_waiting_call(conn):
    gate = ToolCallGate()
    try:
        gate.open_turn(watch=True)
        thread, answers = asking(gate)
        while not gate.take():
            time.sleep(0.01)
        gate.close_turn(None)
        thread.join(10)
        assert answers == [None]
    finally:
        gate.close()


# ---- real agents (scripted runtime) -----------------------------------------------------------


def test_a_reported_dollar_figure_crosses_the_limit_in_the_middle_of_a_turn(project, tmp_path):
    marker = project.worktree("builder-t1") / "after-the-bill"
    start(project, tmp_path, [{"actions": [{"usage": {"cost_usd": 0.8, "text": "that was expensive"}},
                                           {"bash": "touch after-the-bill"}, {"sleep": 20}, REPORT]}],
          budget={"max_usd": 0.5})
    agent = settled(project, "builder-t1")
    assert agent.state == "parked" and agent.park_kind == "budget", agent.state_reason
    assert agent.state_reason.startswith("budget: max_usd 0.50 reached (0.8"), agent.state_reason
    assert not marker.exists(), "the tool call after the bill ran"
    assert mail_rows(project, type="worker_done") == []
    (turn,) = turns_of(project, "builder-t1")
    assert turn["status"] == "budget" and turn["cost_usd"] >= 0.8
    assert len(events(project, "builder-t1", "budget_crossed")) == 1


def test_worker_done_on_the_message_whose_bill_crosses_the_limit_never_goes_out(project, tmp_path):
    # The bill rides on the report's own tool call: the player runs its hook right after printing it.
    start(project, tmp_path, [{"actions": [{"bash": "true"}, {**REPORT, "usage": {"cost_usd": 0.8}},
                                           {"sleep": 20}]}], budget={"max_usd": 0.5})
    agent = settled(project, "builder-t1")
    assert agent.state == "parked" and agent.park_kind == "budget", (agent.state, agent.state_reason)
    assert mail_rows(project, type="worker_done") == [], "worker_done went out after the limit"
    assert agent_state(project, "builder-t1").state == "parked"
    ended = events(project, "builder-t1", "tool_end")
    assert len(ended) <= 2 and all("done builder-t1" not in (e["summary"] or "") for e in ended)

