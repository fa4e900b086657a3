"""The agent state machine (ARCHITECTURE §5) against a real SQLite file.

A small Python model of one agent name is driven alongside the real store by
hypothesis; every outcome the store returns must be the one the model predicts, and
the recorded history must only ever use the edges written out below (``EDGES``): the oracle is
this file's own table, not the code's ``ALLOWED_FROM``, so a change to the code's table fails here
until the design changes too.
"""

from __future__ import annotations

import sqlite3
import typing as t
import uuid
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from overstory.errors import AgentExists
from overstory.store import sessions
from overstory.store.db import open_state
from overstory.store.sessions import (
    ALLOWED_FROM,
    STATES,
    TERMINAL_STATES,
    IllegalTransition,
    NotFound,
    Ok,
    StaleGeneration,
)

# ARCHITECTURE §5, written out: state -> the states it may be entered from. `booting` is entered only
# by a new generation; `completed` is terminal and sticky; `zombie` can only complete.
EDGES: dict[str, set[str]] = {
    "booting": set(),
    "in_turn": {"booting", "between_turns", "stalled", "parked"},
    "between_turns": {"booting", "in_turn", "stalled", "parked"},
    "working": {"booting", "stalled", "parked"},
    "stalled": {"booting", "in_turn", "between_turns", "working"},
    "parked": {"booting", "in_turn", "between_turns", "working", "stalled"},
    "completed": {"booting", "in_turn", "between_turns", "working", "stalled", "parked", "zombie"},
    "zombie": {"booting", "in_turn", "between_turns", "working", "stalled", "parked"},
}

PROPERTY_SETTINGS = settings(
    max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@pytest.fixture(scope="module")
def conn(tmp_path_factory: pytest.TempPathFactory) -> t.Iterator[sqlite3.Connection]:
    """One real state.db shared by every example; each example uses fresh agent names."""
    connection = open_state(tmp_path_factory.mktemp("sm") / "state.db")
    yield connection
    connection.close()


def fresh_name() -> str:
    return f"agent-{uuid.uuid4().hex[:10]}"


def spawn(conn: sqlite3.Connection, name: str) -> int:
    return sessions.create_session(conn, name=name, capability="builder", task_id="task-1", runtime="scripted",
                                   actor="test")


def history_rows(conn: sqlite3.Connection, name: str) -> list[dict[str, t.Any]]:
    return sessions.history(conn, name)


def assert_history_legal(rows: list[dict[str, t.Any]]) -> None:
    """Every row is a spawn (None -> booting) or an edge the table allows, and chains per generation."""
    last_to: dict[int, str] = {}
    for row in rows:
        generation, prev, to = row["generation"], row["from_state"], row["to_state"]
        if prev is None:
            assert to == "booting", row
            assert generation not in last_to, f"generation {generation} spawned twice: {row}"
        else:
            assert prev in EDGES[to], f"forbidden edge {prev} -> {to}: {row}"
            assert last_to.get(generation) == prev, f"history of generation {generation} is not continuous: {row}"
        last_to[generation] = to
    generations = [row["generation"] for row in rows]
    assert generations == sorted(generations), "a generation went backwards"


# ---- the table itself -------------------------------------------------------


def test_the_code_has_the_designed_table() -> None:
    assert list(STATES) == list(EDGES)
    assert {to: set(sources) for to, sources in ALLOWED_FROM.items()} == EDGES


def test_the_written_table_keeps_the_design_rules() -> None:
    for to, predecessors in EDGES.items():
        assert to not in predecessors, f"{to} -> {to} would be a no-op write"
        assert "completed" not in predecessors, f"completed -> {to} is allowed"
        assert ("zombie" in predecessors) == (to == "completed"), f"zombie -> {to}"


@pytest.mark.parametrize("prev", list(EDGES))
@pytest.mark.parametrize("to", list(EDGES))
def test_is_allowed_agrees_with_the_written_table(prev: str, to: str) -> None:
    assert sessions.is_allowed(prev, to) == (prev in EDGES[to])


def test_transition_table_rows_match_the_written_table() -> None:
    rows = sessions.transition_table()
    assert [to for to, _ in rows] == list(EDGES)
    assert all(sorted(EDGES[to]) == sources for to, sources in rows)


# ---- random sequences against the store ------------------------------------

# A step is ("move", to-state, which generation to claim) or ("respawn", …) or ("discard", …).
CLAIMS = ("current", "current", "current", "older", "newer")
step_strategy = st.one_of(
    st.tuples(st.just("move"), st.sampled_from(STATES), st.sampled_from(CLAIMS)),
    st.tuples(st.just("respawn"), st.none(), st.none()),
    st.tuples(st.just("discard"), st.none(), st.none()),
)


@PROPERTY_SETTINGS
@given(steps=st.lists(step_strategy, min_size=1, max_size=40))
def test_random_sequences_follow_the_table(conn: sqlite3.Connection, steps: list[tuple[str, t.Any, t.Any]]) -> None:
    name = fresh_name()
    generation = spawn(conn, name)
    state: str | None = "booting"  # None: the row was discarded
    version = 0
    highest_generation = generation
    for kind, to, claim in steps:
        if kind == "respawn":
            if state is not None and state not in TERMINAL_STATES:
                with pytest.raises(AgentExists):
                    spawn(conn, name)
                continue
            new_generation = spawn(conn, name)
            assert new_generation == highest_generation + 1, "generations must never be reused"
            generation = highest_generation = new_generation
            state, version = "booting", 0
            continue
        if kind == "discard":
            if state == "booting":  # what a half-failed spawn undoes
                sessions.discard_session(conn, name, generation)
                state = None
            continue
        claimed = {"current": generation, "older": generation - 1, "newer": generation + 1}[claim]
        outcome = sessions.transition(conn, name, claimed, to, actor="test", reason=f"step to {to}")
        if state is None:
            assert outcome == NotFound()
        elif claimed != generation:
            assert outcome == StaleGeneration(current=generation)
        elif state not in EDGES[to]:
            assert outcome == IllegalTransition(prev=state)
        else:
            version += 1
            assert outcome == Ok(prev=state, version=version)
            state = to
        row = sessions.get(conn, name)
        if state is None:
            assert row is None
        else:
            assert row is not None
            assert (row.state, row.generation, row.version) == (state, generation, version)

    assert_history_legal(history_rows(conn, name))
    stored = conn.execute("SELECT generation FROM generations WHERE name = ?", (name,)).fetchone()[0]
    assert stored == highest_generation


@PROPERTY_SETTINGS
@given(path=st.lists(st.sampled_from(STATES), max_size=12), attempts=st.lists(st.sampled_from(STATES), min_size=1))
def test_completed_is_sticky_in_the_store(conn: sqlite3.Connection, path: list[str], attempts: list[str]) -> None:
    """Whatever route led to `completed`, no later write moves the agent again."""
    name = fresh_name()
    generation = spawn(conn, name)
    for to in [*path, "completed"]:
        sessions.transition(conn, name, generation, to, actor="test")
    assert sessions.get(conn, name).state == "completed"  # type: ignore[union-attr]
    rows_before = len(history_rows(conn, name))
    for to in attempts:
        assert sessions.transition(conn, name, generation, to, actor="test") == IllegalTransition(prev="completed")
    assert sessions.get(conn, name).state == "completed"  # type: ignore[union-attr]
    assert len(history_rows(conn, name)) == rows_before


@PROPERTY_SETTINGS
@given(respawns=st.integers(min_value=1, max_value=5), to=st.sampled_from(STATES),
       data=st.data())
def test_old_generation_is_always_stale(conn: sqlite3.Connection, respawns: int, to: str, data: st.DataObject) -> None:
    name = fresh_name()
    generation = spawn(conn, name)
    for _ in range(respawns):
        sessions.transition(conn, name, generation, "completed", actor="test")
        generation = spawn(conn, name)
    old = data.draw(st.integers(min_value=-3, max_value=generation - 1), label="old generation")
    before = sessions.get(conn, name)
    assert sessions.transition(conn, name, old, to, actor="stale writer") == StaleGeneration(current=generation)
    assert sessions.update_fields(conn, name, old, current_tool="Bash") is False
    after = sessions.get(conn, name)
    assert (after.state, after.version, after.current_tool) == (before.state, before.version, before.current_tool)  # type: ignore[union-attr]


# ---- typed outcomes ---------------------------------------------------------


def test_typed_outcomes(conn: sqlite3.Connection) -> None:
    name = fresh_name()
    assert sessions.transition(conn, name, 1, "in_turn", actor="t") == NotFound()
    generation = spawn(conn, name)

    first = sessions.transition(conn, name, generation, "in_turn", actor="loop", reason="turn 1")
    assert isinstance(first, Ok) and first.ok
    assert (first.prev, first.version) == ("booting", 1)

    illegal = sessions.transition(conn, name, generation, "working", actor="loop")
    assert isinstance(illegal, IllegalTransition) and not illegal.ok
    assert illegal.prev == "in_turn"

    stale = sessions.transition(conn, name, generation + 7, "between_turns", actor="loop")
    assert isinstance(stale, StaleGeneration) and not stale.ok
    assert stale.current == generation

    assert not NotFound().ok
    row = sessions.get(conn, name)
    assert (row.state, row.state_reason, row.version) == ("in_turn", "turn 1", 1)  # type: ignore[union-attr]
    last = history_rows(conn, name)[-1]
    assert (last["from_state"], last["to_state"], last["actor"], last["reason"]) == ("booting", "in_turn", "loop", "turn 1")


def test_expect_narrows_the_predecessors(conn: sqlite3.Connection) -> None:
    name = fresh_name()
    generation = spawn(conn, name)
    # booting -> stalled is in the table, but this writer only stalls an agent it saw in_turn.
    assert sessions.transition(conn, name, generation, "stalled", actor="watchdog", expect={"in_turn"}) == \
        IllegalTransition(prev="booting")
    sessions.transition(conn, name, generation, "in_turn", actor="loop")
    assert sessions.transition(conn, name, generation, "stalled", actor="watchdog", expect={"in_turn"}).ok


def test_booting_and_unknown_states_are_never_written(conn: sqlite3.Connection) -> None:
    name = fresh_name()
    generation = spawn(conn, name)
    sessions.transition(conn, name, generation, "in_turn", actor="t")
    assert sessions.transition(conn, name, generation, "booting", actor="t") == IllegalTransition(prev="in_turn")
    with pytest.raises(ValueError, match="unknown state"):
        sessions.transition(conn, name, generation, "sleeping", actor="t")
    with pytest.raises(ValueError):
        sessions.transition(conn, name, generation, "between_turns", actor="t", fields={"state": "completed"})
    with pytest.raises(ValueError):
        sessions.update_fields(conn, name, generation, state="completed")
    assert sessions.get(conn, name).state == "in_turn"  # type: ignore[union-attr]


def test_fields_are_written_with_the_swap(conn: sqlite3.Connection) -> None:
    name = fresh_name()
    generation = spawn(conn, name)
    sessions.transition(conn, name, generation, "in_turn", actor="t", fields={"turn_pgid": 4242, "current_turn_id": "t1"})
    row = sessions.get(conn, name)
    assert (row.turn_pgid, row.current_turn_id) == (4242, "t1")  # type: ignore[union-attr]


# ---- create_session ---------------------------------------------------------


def test_create_session_refuses_an_active_name(conn: sqlite3.Connection) -> None:
    name = fresh_name()
    generation = spawn(conn, name)
    for to in ("in_turn", "stalled", "parked"):  # active states of several kinds
        sessions.transition(conn, name, generation, to, actor="t")
        with pytest.raises(AgentExists, match=name):
            spawn(conn, name)
        row = sessions.get(conn, name)
        assert (row.generation, row.state) == (generation, to)  # type: ignore[union-attr]
    assert conn.execute("SELECT generation FROM generations WHERE name = ?", (name,)).fetchone()[0] == generation


@pytest.mark.parametrize("terminal", sorted(TERMINAL_STATES))
def test_create_session_replaces_a_terminal_row(conn: sqlite3.Connection, terminal: str) -> None:
    name = fresh_name()
    generation = spawn(conn, name)
    sessions.transition(conn, name, generation, "in_turn", actor="t", fields={"turn_pgid": 99})
    sessions.transition(conn, name, generation, terminal, actor="t")
    new_generation = spawn(conn, name)
    assert new_generation == generation + 1
    row = sessions.get(conn, name)
    assert (row.generation, row.state, row.version, row.turn_pgid) == (new_generation, "booting", 0, None)  # type: ignore[union-attr]
    rows = history_rows(conn, name)
    assert [(r["generation"], r["from_state"], r["to_state"]) for r in rows] == [
        (generation, None, "booting"), (generation, "booting", "in_turn"), (generation, "in_turn", terminal),
        (new_generation, None, "booting"),
    ]


def test_generations_are_never_reused_after_discard(conn: sqlite3.Connection) -> None:
    name = fresh_name()
    seen = []
    for _ in range(4):
        generation = spawn(conn, name)
        seen.append(generation)
        sessions.discard_session(conn, name, generation)
        assert sessions.get(conn, name) is None
        assert history_rows(conn, name) == []
        assert sessions.transition(conn, name, generation, "in_turn", actor="t") == NotFound()
    assert seen == [1, 2, 3, 4]


def test_discard_only_touches_the_named_generation(conn: sqlite3.Connection) -> None:
    name = fresh_name()
    first = spawn(conn, name)
    sessions.transition(conn, name, first, "completed", actor="t")
    second = spawn(conn, name)
    sessions.discard_session(conn, name, first)  # a late undo of an old spawn
    assert sessions.get(conn, name).generation == second  # type: ignore[union-attr]


# ---- `then` runs inside the swap's transaction ------------------------------


def _mail_count(conn: sqlite3.Connection, subject: str) -> int:
    return conn.execute("SELECT count(*) FROM mail WHERE subject = ?", (subject,)).fetchone()[0]


def _send_note(conn: sqlite3.Connection, subject: str) -> None:
    conn.execute("INSERT INTO mail(sender, recipient, type, subject, created_at) VALUES ('ov','operator','worker_died',?,0)",
                 (subject,))


def test_then_commits_with_the_transition(conn: sqlite3.Connection) -> None:
    name = fresh_name()
    generation = spawn(conn, name)
    seen: list[tuple[str, Ok]] = []

    def notify(inner: sqlite3.Connection, ok: Ok) -> None:
        assert inner.in_transaction
        seen.append((inner.execute("SELECT state FROM sessions WHERE name = ?", (name,)).fetchone()[0], ok))
        _send_note(inner, f"died {name}")

    outcome = sessions.transition(conn, name, generation, "zombie", actor="watchdog", then=notify)
    assert seen == [("zombie", outcome)]
    assert _mail_count(conn, f"died {name}") == 1
    # A second writer loses the race and its side effect never happens.
    again = sessions.transition(conn, name, generation, "zombie", actor="watchdog", then=notify)
    assert again == IllegalTransition(prev="zombie")
    assert len(seen) == 1 and _mail_count(conn, f"died {name}") == 1


def test_an_exception_in_then_rolls_the_transition_back(conn: sqlite3.Connection) -> None:
    name = fresh_name()
    generation = spawn(conn, name)
    before = sessions.get(conn, name)
    rows_before = history_rows(conn, name)

    def explode(inner: sqlite3.Connection, ok: Ok) -> None:
        _send_note(inner, f"half {name}")
        raise RuntimeError("parent mailbox unavailable")

    with pytest.raises(RuntimeError, match="parent mailbox"):
        sessions.transition(conn, name, generation, "zombie", actor="watchdog", fields={"turn_pgid": 7}, then=explode)
    after = sessions.get(conn, name)
    assert (after.state, after.version, after.turn_pgid) == (before.state, before.version, before.turn_pgid)  # type: ignore[union-attr]
    assert history_rows(conn, name) == rows_before
    assert _mail_count(conn, f"half {name}") == 0
    assert not conn.in_transaction
    # The store is still usable and the same transition can be made afterwards.
    assert sessions.transition(conn, name, generation, "zombie", actor="watchdog").ok


def test_state_persists_across_connections(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    first = open_state(path)
    name = fresh_name()
    generation = spawn(first, name)
    sessions.transition(first, name, generation, "in_turn", actor="t")
    first.close()
    second = open_state(path)
    try:
        assert sessions.get(second, name).state == "in_turn"  # type: ignore[union-attr]
        assert_history_legal(history_rows(second, name))
    finally:
        second.close()


def test_every_edge_of_the_table_is_reachable(conn: sqlite3.Connection) -> None:
    """Each allowed edge can really be taken in the store (the table is not only on paper)."""
    for to, predecessors in EDGES.items():
        for prev in predecessors:
            name = fresh_name()
            generation = spawn(conn, name)
            route = _route_to(prev)
            for step in route:
                assert sessions.transition(conn, name, generation, step, actor="t").ok, (route, step)
            assert sessions.transition(conn, name, generation, to, actor="t") == Ok(prev=prev, version=len(route) + 1)


def _route_to(target: str) -> list[str]:
    """A shortest list of states leading from booting to ``target`` through allowed edges."""
    queue: list[tuple[str, list[str]]] = [("booting", [])]
    seen = {"booting"}
    index = 0
    while index < len(queue):
        state, route = queue[index]
        index += 1
        if state == target:
            return route
        for to, predecessors in EDGES.items():
            if state in predecessors and to not in seen:
                seen.add(to)
                queue.append((to, [*route, to]))
    raise AssertionError(f"{target} is unreachable from booting")
