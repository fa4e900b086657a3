"""Fault injection: kill -9 turn process groups, agent loops and the watchdog at random moments.

Each round runs a small team on the scripted runtime with a real `ov watchdog`
subprocess, injects SIGKILLs for a few seconds, lets the system settle, and then
checks the invariants: every agent is terminal and owns no live process, every
agent that could recover completed, every zombie's parent got exactly one
``worker_died``, no message is lost or left claimed, and look-alike processes
that ov did not start are untouched.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import time
import typing as t
from collections import Counter
from pathlib import Path

import pytest

from conftest import make_repo, ov_command
from overstory import procs
from overstory.paths import ProjectPaths
from overstory.store import mail, sessions
from test_watchdog import (
    REPORT_DONE,
    agent_processes,
    mail_rows,
    repeat_turns,
    start_agent,
    start_decoy,
    write_local_config,
)

pytestmark = pytest.mark.slow

CHAOS_SECONDS = 8.0
SETTLE_TIMEOUT = 60.0
KILLS_PER_AGENT = 3  # below turns.max_retries, so a healthy agent always has retries left
HEALTHY = repeat_turns([{"expect_in_prompt": "Type: dispatch"}, {"bash": "sleep 0.7"}, {"text": "halfway"},
                        {"bash": "sleep 0.7"}, REPORT_DONE], count=12)
CRASHER = repeat_turns([{"text": "about to crash"}, {"crash": 3}], count=12)
HANGER = repeat_turns([{"text": "thinking very hard"}, {"bash": "sleep 300"}], count=12)


class Chaos:
    def __init__(self, project: ProjectPaths, conn: t.Any, rng: random.Random) -> None:
        self.project = project
        self.conn = conn
        self.rng = rng
        self.watchdog: subprocess.Popen[str] | None = None
        self.kills: Counter[str] = Counter()
        self.per_agent: Counter[str] = Counter()
        self.extra_mail: list[int] = []

    def start_watchdog(self) -> None:
        self.watchdog = subprocess.Popen([*ov_command(), "watchdog", "--interval", "0.3"], cwd=self.project.root,
                                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)

    def _candidates(self) -> list[sessions.Session]:
        return [a for a in sessions.list_sessions(self.conn, include_terminal=False)
                if self.per_agent[a.name] < KILLS_PER_AGENT]

    def kill_turn_group(self) -> bool:
        for agent in self.rng.sample(self._candidates(), k=len(self._candidates())):
            if agent.turn_pgid and procs.group_is_ours(agent.turn_pgid, agent.turn_start_ticks) \
                    and procs.group_alive(agent.turn_pgid, agent.turn_start_ticks):
                assert agent.turn_pgid != os.getpgrp()
                try:
                    os.killpg(agent.turn_pgid, signal.SIGKILL)
                except ProcessLookupError:
                    continue
                self.kills["turn_group"] += 1
                self.per_agent[agent.name] += 1
                return True
        return False

    def kill_loop(self) -> bool:
        for agent in self.rng.sample(self._candidates(), k=len(self._candidates())):
            if procs.is_alive(agent.loop_pid, agent.loop_start_ticks):
                os.kill(agent.loop_pid, signal.SIGKILL)  # type: ignore[arg-type]
                self.kills["loop"] += 1
                self.per_agent[agent.name] += 1
                return True
        return False

    def kill_watchdog(self) -> bool:
        assert self.watchdog is not None
        self.watchdog.kill()
        self.watchdog.wait()
        self.kills["watchdog"] += 1
        time.sleep(self.rng.uniform(0, 0.8))
        self.start_watchdog()
        return True

    def mail_someone(self) -> bool:
        active = sessions.list_sessions(self.conn, include_terminal=False)
        if not active:
            return False
        try:
            self.extra_mail += mail.send(self.conn, sender="operator", to=self.rng.choice(active).name,
                                         subject="extra", body="one more thing")
        except Exception:  # noqa: BLE001 - the agent turned terminal in between: refused, as designed
            return False
        return True

    def run(self, seconds: float) -> None:
        actions = {"turn_group": self.kill_turn_group, "loop": self.kill_loop, "watchdog": self.kill_watchdog,
                   "mail": self.mail_someone}
        pending = ["turn_group", "loop", "watchdog"]  # at least one of each kind per round
        self.rng.shuffle(pending)
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            time.sleep(self.rng.uniform(0.15, 0.6))
            kind = pending[0] if pending else self.rng.choices(list(actions), weights=[4, 3, 1, 1])[0]
            if actions[kind]() and pending and kind == pending[0]:
                pending.pop(0)
        assert not pending, f"chaos never managed to inject {pending}"


def _run_round(root: Path, seed: int) -> Counter[str]:
    from overstory.project.init import init_project
    from overstory.store.db import open_state

    init_project(make_repo(root))
    project = ProjectPaths(root)
    write_local_config(project, turns={"retry_backoff": 0.05, "kill_grace": 0.5, "stall_timeout": 60,
                                       "max_retries": 5, "max_concurrent": 8},
                       watchdog={"interval": 0.3, "stale_after": 3, "zombie_after": 6})
    conn = open_state(project.state_db)
    rng = random.Random(seed)
    chaos = Chaos(project, conn, rng)
    decoys: list[subprocess.Popen[bytes]] = []
    try:
        healthy = [start_agent(project, conn, f"h{index}", HEALTHY) for index in range(5)]
        crasher = start_agent(project, conn, "crash", CRASHER)
        hanger = start_agent(project, conn, "hang", HANGER)
        names = [*healthy, crasher, hanger]
        worktree = project.worktrees_dir / healthy[0]
        decoys.append(start_decoy(worktree, ["-m", "overstory.runtimes.scripted", "-p", "--output-format",
                                             "stream-json", "--input-format", "stream-json", "--verbose"]))
        decoys.append(start_decoy(project.root, ["-m", "overstory.agents.loop", "--project", str(project.root),
                                                 "--agent", healthy[0], "--generation", "1"]))
        chaos.start_watchdog()
        chaos.run(CHAOS_SECONDS)
        assert chaos.watchdog is not None and chaos.watchdog.poll() is None

        deadline = time.monotonic() + SETTLE_TIMEOUT
        while sessions.list_sessions(conn, include_terminal=False) and time.monotonic() < deadline:
            time.sleep(0.2)
        states = {a.name: (a.state, a.state_reason) for a in sessions.list_sessions(conn)}
        chaos.watchdog.send_signal(signal.SIGTERM)
        assert chaos.watchdog.wait(timeout=20) == 0, chaos.watchdog.stderr.read() if chaos.watchdog.stderr else ""

        # Every agent that could recover did; the others are zombies.
        assert {n: s for n, (s, _) in states.items()} == {**{n: "completed" for n in healthy},
                                                         crasher: "zombie", hanger: "zombie"}, (states, chaos.kills)
        assert "retries" in (states[crasher][1] or ""), states[crasher]
        assert "no activity" in (states[hanger][1] or ""), states[hanger]

        # State matches reality: a terminal agent owns no live process (loops need a moment to notice).
        decoy_pids = {d.pid for d in decoys}
        leftovers: dict[str, list[int]] = {}
        end = time.monotonic() + 10
        while time.monotonic() < end:
            leftovers = {n: [p for p in agent_processes(project, n) if p not in decoy_pids] for n in names}
            if not any(leftovers.values()):
                break
            time.sleep(0.1)
        assert not any(leftovers.values()), leftovers
        for agent in sessions.list_sessions(conn):
            assert agent.turn_pgid is None or not procs.group_alive(agent.turn_pgid, agent.turn_start_ticks)

        # Each zombie's parent got exactly one worker_died; nobody else got one.
        died = Counter(json.loads(m["payload"])["agent"] for m in mail_rows(conn, type="worker_died"))
        assert died == Counter({crasher: 1, hanger: 1})
        assert all(m["recipient"] == "operator" for m in mail_rows(conn, type="worker_died"))
        for name in names:
            into_zombie = [h for h in sessions.history(conn, name) if h["to_state"] == "zombie"]
            assert len(into_zombie) == (1 if name in (crasher, hanger) else 0)

        # No mail lost: everything sent is still there, nothing is stuck claimed by a dead turn,
        # and every completed agent's dispatch was delivered to a turn that succeeded.
        everything = mail_rows(conn)
        assert {m["id"] for m in everything} >= set(chaos.extra_mail)
        assert [m for m in everything if m["claimed_by"] is not None and m["read_at"] is None] == []
        for name in healthy:
            dispatch = mail_rows(conn, recipient=name, type="dispatch")
            assert len(dispatch) == 1 and dispatch[0]["read_at"] is not None
            assert mail_rows(conn, sender=name, type="worker_done"), f"{name} never reported"
        for name in (crasher, hanger):
            assert mail_rows(conn, recipient=name, type="dispatch")[0]["read_at"] is None, "unread mail stays"

        # Nothing ov did not start was touched.
        assert all(d.poll() is None for d in decoys), "a decoy process was killed"
        return chaos.kills
    finally:
        if chaos.watchdog is not None and chaos.watchdog.poll() is None:
            chaos.watchdog.kill()
            chaos.watchdog.wait()
        from overstory.agents.stop import stop_agent

        for agent in sessions.list_sessions(conn):
            try:
                stop_agent(project, conn, agent.name, force=True, kill_grace=0.2)
            except Exception:  # noqa: BLE001 - teardown is best effort
                pass
        for decoy in decoys:
            decoy.kill()
            decoy.wait()
        conn.close()


@pytest.mark.parametrize("seed", [11, 23, 47])
def test_random_sigkills_leave_a_consistent_project(tmp_path: Path, seed: int) -> None:
    kills = _run_round(tmp_path / f"round-{seed}", seed)
    assert kills["turn_group"] >= 1 and kills["loop"] >= 1 and kills["watchdog"] >= 1
