"""SIGTERM or SIGINT to an agent's loop mid-turn: the interrupt is checkpointed before the loop exits.

A real loop and a real turn (the scripted runtime, sleeping in a tool call), real SQLite.
"""

from __future__ import annotations

import os
import signal
import typing as t

import pytest

from overstory import procs
from overstory.paths import ProjectPaths
from overstory.store import checkpoints
from test_watchdog import row, start_agent, wait_for, write_local_config


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_to_the_loop_mid_turn_saves_the_interrupt_checkpoint(project: ProjectPaths, state_db: t.Any,
                                                                      signum: int) -> None:
    write_local_config(project, turns={"kill_grace": 1, "stall_timeout": 120})
    name = start_agent(project, state_db, "t1", {"turns": [{"actions": [{"bash": "sleep 60"}], "result": "done"}]})
    busy = wait_for(lambda: (r := row(state_db, name)).turn_pgid and r.current_turn_id and r,
                    what="the turn's process group")
    turn_id = busy.current_turn_id
    assert checkpoints.latest(state_db, name)["phase"] == "start"
    os.kill(busy.loop_pid, signum)  # type: ignore[arg-type]
    wait_for(lambda: not procs.is_alive(busy.loop_pid, busy.loop_start_ticks), timeout=60, what="the loop to exit")
    saved = checkpoints.latest(state_db, name)
    assert saved["turn_id"] == turn_id
    assert (saved["phase"], saved["turn_status"]) == ("end", "interrupted"), saved
    turn = state_db.execute("SELECT status, error FROM turns WHERE id = ?", (turn_id,)).fetchone()
    assert turn["status"] == "interrupted", dict(turn)
    assert not procs.is_alive(busy.turn_pgid), "the turn's process group went with it"
    dispatch = state_db.execute("SELECT claimed_by, read_at FROM mail WHERE recipient = ? AND type = 'dispatch'",
                                (name,)).fetchone()
    assert dispatch["claimed_by"] is None and dispatch["read_at"] is None, "its mail waits for the retry"
