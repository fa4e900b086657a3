"""Waiting for agents to settle, and the exit codes of the commands that wait.

`ov wait`, `ov demo` and `ov coordinator ask` share one contract:

====  =================================================
0     every agent completed (by its own report)
1     an ov error (bad state, database trouble...)
2     a usage error (bad arguments)
3     an agent died (zombie)
4     an agent is parked by a budget (or an `ov loop` by its limits, its check or its critic)
5     an agent is parked by a quota or rate limit
6     an agent is parked by an authentication failure
7     an agent waits for an approval (`ov approvals`)
8     an agent was stopped before it finished (`ov stop`: completed without its report)
124   timeout (like coreutils' ``timeout``)
====  =================================================

When several agents end differently, the most urgent wins: an approval, then auth, quota,
budget, a death, a stop (``URGENCY``): it names the thing a person must look at first.
A stopped persistent agent (the coordinator) is not "stopped before finishing": stopping
is how it ends.

An agent has *settled* when it is terminal (completed, zombie) or parked; a run has
settled when every agent of it has, except persistent ones (the coordinator) that
are merely idle.
"""

from __future__ import annotations

import sqlite3
import time
import typing as t
from dataclasses import dataclass

from overstory.store import runs, sessions
from overstory.store.lifecycle import PERSISTENT_CAPABILITIES
from overstory.store.sessions import Session

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_ZOMBIE = 3
EXIT_BUDGET = 4
EXIT_QUOTA = 5
EXIT_AUTH = 6
EXIT_APPROVAL = 7
EXIT_STOPPED = 8
EXIT_ERROR_PARKED = 9  # parked by a runtime error ov could not classify
EXIT_TIMEOUT = 124
# Most urgent first; a code not listed (1, a park of an unknown kind) comes after these, before 0.
URGENCY = (EXIT_APPROVAL, EXIT_AUTH, EXIT_ERROR_PARKED, EXIT_QUOTA, EXIT_BUDGET, EXIT_ZOMBIE, EXIT_STOPPED)
# `ov stop` (agents.stop) settles an agent to completed with this reason: "stopped by the operator" or by an ancestor.
STOPPED_PREFIX = "stopped by "
# A parked `ov loop` (its iteration limit, the same failure again, its critic) asks a person whether to spend
# more, as a budget does.
PARK_EXIT = {"budget": EXIT_BUDGET, "loop": EXIT_BUDGET, "quota": EXIT_QUOTA, "auth": EXIT_AUTH,
             "approval": EXIT_APPROVAL, "error": EXIT_ERROR_PARKED}
POLL_SECONDS = 0.25


def is_settled(agent: Session) -> bool:
    return agent.is_terminal or agent.state == "parked"


def code_of(agent: Session) -> int | None:
    """The exit code one settled agent stands for; None while it has not settled."""
    if agent.state == "completed":
        stopped = (agent.state_reason or "").startswith(STOPPED_PREFIX)
        return EXIT_STOPPED if stopped and agent.capability not in PERSISTENT_CAPABILITIES else EXIT_OK
    if agent.state == "zombie":
        return EXIT_ZOMBIE
    if agent.state == "parked":
        return PARK_EXIT.get(agent.park_kind or "", EXIT_ERROR)
    return None


def outcome_code(agents: t.Iterable[Session]) -> int:
    """The most urgent code of the settled agents (``URGENCY``; 0 when all completed, or there are none)."""
    codes = [code for code in (code_of(agent) for agent in agents) if code is not None]
    return min(codes, key=lambda code: (URGENCY.index(code) if code in URGENCY else len(URGENCY), code == EXIT_OK),
               default=EXIT_OK)


@dataclass
class WaitResult:
    code: int
    agents: list[Session]
    waited_seconds: float
    timed_out: bool

    def as_dict(self) -> dict[str, t.Any]:
        return {"exit_code": self.code, "timed_out": self.timed_out, "waited_seconds": round(self.waited_seconds, 3),
                "agents": [{"name": a.name, "state": a.state, "reason": a.state_reason, "park_kind": a.park_kind,
                            "exit_code": code_of(a)} for a in self.agents]}


def run_members(conn: sqlite3.Connection, run_id: str) -> list[Session]:
    """The run's agents that a wait is about: all but idle persistent ones."""
    names = sessions.names_in_run(conn, run_id, by_depth=True)
    found = [agent for agent in (sessions.get(conn, name) for name in names) if agent is not None]
    return [a for a in found if a.capability not in PERSISTENT_CAPABILITIES or is_settled(a)]


def wait(conn: sqlite3.Connection, *, agent: str | None = None, run_id: str | None = None,
         timeout: float | None = None, poll: float = POLL_SECONDS,
         on_change: t.Callable[[Session], None] | None = None) -> WaitResult:
    """Block until the agent (or every agent of the run) has settled, or ``timeout`` seconds pass."""
    started = time.monotonic()
    seen: dict[str, str] = {}
    while True:
        if agent is not None:
            found = sessions.get(conn, agent)
            if found is None:
                raise sessions.agent_not_found(conn, agent)
            members = [found]
        else:
            assert run_id is not None
            members = run_members(conn, run_id)
        for member in members:
            if on_change is not None and seen.get(member.name) != member.state:
                on_change(member)
            seen[member.name] = member.state
        run_done = run_id is not None and (found_run := runs.get_run(conn, run_id)) is not None \
            and not found_run.is_open
        if run_done or all(is_settled(m) for m in members):
            return WaitResult(outcome_code(members), members, time.monotonic() - started, False)
        if timeout is not None and time.monotonic() - started >= timeout:
            return WaitResult(EXIT_TIMEOUT, members, time.monotonic() - started, True)
        time.sleep(poll if timeout is None else max(0.01, min(poll, timeout - (time.monotonic() - started))))
