"""A turn is plan -> named steps -> settle (``agents.turns.TURN_STEPS``); the loop killed right after a step.

``OV_TEST_KILL_AT=turn:<step>`` makes the agent's loop SIGKILL itself after that step of its first turn, as
`kill -9` or the OOM killer would. The loop the watchdog starts in its place (from the saved launch
environment, which does not carry the kill) takes the turn again, and the task is done once: one
``worker_done``, no ``worker_died``, no turn row left ``starting`` or ``running``. Real loop, scripted
runtime, real SQLite.
"""

from __future__ import annotations

import os
import typing as t

import pytest

from overstory import procs
from overstory.agents.turns import TURN_STEPS
from overstory.paths import ProjectPaths
from overstory.store import sessions
from test_watchdog import (
    REPORT_DONE,
    mail_rows,
    make_watchdog,
    repeat_turns,
    row,
    start_agent,
    wait_for,
    write_local_config,
)


@pytest.fixture
def quick(project: ProjectPaths) -> ProjectPaths:
    write_local_config(project, turns={"retry_backoff": 0.05, "kill_grace": 1, "stall_timeout": 120,
                                       "max_retries": 3, "max_concurrent": 8})
    return project


def test_the_turn_steps_are_named_in_order() -> None:
    assert [name for name, _ in TURN_STEPS] == ["logs", "sandbox", "record", "launch", "watch"]


# Before the runtime's process exists: after "launch" it runs on without its loop (the watchdog's other tests).
@pytest.mark.parametrize("step", ["logs", "sandbox", "record"])
def test_loop_killed_after_a_turn_step_is_restarted_and_the_task_done_once(quick: ProjectPaths, state_db: t.Any,
                                                                           step: str) -> None:
    from overstory.agents.loop import spawn_loop

    name = start_agent(quick, state_db, "t1", repeat_turns([REPORT_DONE], count=3), start=False)
    generation = row(state_db, name).generation
    pid, ticks = spawn_loop(quick, name, generation, {**os.environ, procs.KILL_AT_ENV: f"turn:{step}"})
    sessions.update_fields(state_db, name, generation, loop_pid=pid, loop_start_ticks=ticks)
    wait_for(lambda: not procs.is_alive(pid, ticks), timeout=60, what="the loop to kill itself")
    rows = [r["status"] for r in state_db.execute("SELECT status FROM turns WHERE agent = ?", (name,))]
    assert rows == ([] if step in ("logs", "sandbox") else ["starting"])
    assert row(state_db, name).loop_pid == pid and not row(state_db, name).is_terminal
    actions = make_watchdog(quick, state_db).tick()
    assert [a.agent for a in actions] == [name], actions
    agent = wait_for(lambda: (r := row(state_db, name)).is_terminal and r, timeout=90, what=f"{name} to finish")
    assert agent.state == "completed", agent.state_reason
    assert agent.loop_pid != pid
    assert len(mail_rows(state_db, sender=name, type="worker_done")) == 1
    assert mail_rows(state_db, type="worker_died") == []
    left = [r["status"] for r in state_db.execute("SELECT status FROM turns WHERE agent = ?", (name,))]
    assert "starting" not in left and "running" not in left, left
