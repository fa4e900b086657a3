"""A turn that dies right after its terminal mail is committed settles the agent `completed`.

The committed ``worker_done`` is the agent's promise that the task is done: retrying the
turn would redo the task and send the parent a second ``worker_done``. Real loops, real
turn processes (the scripted runtime), real SQLite; the turn is killed with SIGKILL
exactly after the mail row exists (the scenario then sleeps, so the kill always lands
in that window), or crashes by itself, or goes silent past the stall timeout.
"""

from __future__ import annotations

import os
import signal
import typing as t

import pytest

from overstory import procs
from overstory.paths import ProjectPaths
from overstory.store import sessions
from test_watchdog import (
    REPORT_DONE,
    agent_processes,
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
    """Retries and kills fast; the project fixture stops whatever the test leaves running."""
    write_local_config(project, turns={"retry_backoff": 0.05, "kill_grace": 1, "stall_timeout": 120,
                                       "max_retries": 3, "max_concurrent": 8})
    return project


AFTER_PROMISE = [{"expect_in_prompt": "Type: dispatch"}, REPORT_DONE]


def _promised_and_busy(conn: t.Any, name: str) -> sessions.Session:
    """Wait until the worker_done row is committed and the turn is still running."""
    wait_for(lambda: mail_rows(conn, sender=name, type="worker_done"), timeout=60, what="the worker_done mail")
    return wait_for(lambda: (r := row(conn, name)).turn_pgid and r, what="the turn's process group")


def _settled_once(conn: t.Any, name: str) -> sessions.Session:
    agent = wait_for(lambda: (r := row(conn, name)).is_terminal and r, timeout=60, what=f"{name} to settle")
    assert agent.state == "completed", agent.state_reason
    assert "terminal mail sent" in (agent.state_reason or "")
    assert len(mail_rows(conn, sender=name, type="worker_done")) == 1, "the task was not redone"
    assert mail_rows(conn, type="worker_died") == []
    dispatch = mail_rows(conn, recipient=name, type="dispatch")
    assert dispatch[0]["read_at"] is not None and dispatch[0]["claimed_by"] is not None
    turns = conn.execute("SELECT status FROM turns WHERE agent = ?", (name,)).fetchall()
    assert len(turns) == 1 and turns[0]["status"] not in ("starting", "running"), [dict(r) for r in turns]
    wait_for(lambda: not agent_processes(conn_project(conn), name), timeout=20, what="its processes to end")
    return agent


def conn_project(conn: t.Any) -> ProjectPaths:
    path = next(r[2] for r in conn.execute("PRAGMA database_list") if r[1] == "main")
    return ProjectPaths(os.path.dirname(os.path.dirname(path)))  # type: ignore[arg-type]


def test_turn_group_killed_after_worker_done_completes_the_agent(quick: ProjectPaths, state_db: t.Any) -> None:
    name = start_agent(quick, state_db, "t1",
                       repeat_turns([*AFTER_PROMISE, {"bash": "sleep 30"}], count=3))
    busy = _promised_and_busy(state_db, name)
    os.killpg(busy.turn_pgid, signal.SIGKILL)  # type: ignore[arg-type]
    _settled_once(state_db, name)


def test_turn_crashing_after_worker_done_is_not_retried(quick: ProjectPaths, state_db: t.Any) -> None:
    name = start_agent(quick, state_db, "t1", repeat_turns([*AFTER_PROMISE, {"crash": 3}], count=3))
    _settled_once(state_db, name)


def test_turn_stalling_after_worker_done_completes_instead_of_zombie(quick: ProjectPaths, state_db: t.Any) -> None:
    write_local_config(quick, turns={"retry_backoff": 0.05, "kill_grace": 0.5, "stall_timeout": 2,
                                            "max_retries": 3})
    name = start_agent(quick, state_db, "t1",
                       repeat_turns([*AFTER_PROMISE, {"bash": "sleep 60"}], count=3))
    _settled_once(state_db, name)


def test_loop_and_turn_killed_after_worker_done_the_watchdog_completes_it(quick: ProjectPaths, state_db: t.Any) -> None:
    name = start_agent(quick, state_db, "t1",
                       repeat_turns([*AFTER_PROMISE, {"bash": "sleep 30"}], count=3))
    busy = _promised_and_busy(state_db, name)
    os.kill(busy.loop_pid, signal.SIGKILL)  # type: ignore[arg-type]
    os.killpg(busy.turn_pgid, signal.SIGKILL)  # type: ignore[arg-type]
    wait_for(lambda: not procs.is_alive(busy.loop_pid, busy.loop_start_ticks), what="the loop to die")
    actions = make_watchdog(quick, state_db).tick()
    assert [(a.agent, a.kind) for a in actions] == [(name, "completed")], actions
    agent = _settled_once(state_db, name)
    assert agent.loop_pid == busy.loop_pid, "no new loop was started for a finished agent"
    assert make_watchdog(quick, state_db).tick() == []
