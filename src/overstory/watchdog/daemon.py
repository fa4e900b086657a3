"""The mechanical watchdog: keeps every agent's state honest, one tick at a time.

Exactly one watchdog runs per project (an flock on ``.overstory/locks/watchdog.lock``). Each tick
reads the non-terminal session rows and a few ``/proc`` entries; only when a rule fires does it
write, always by compare-and-swap with the generation it observed:

- a headless agent whose loop is gone is re-adopted: a turn it left in flight is killed (its
  recorded process group, verified by start ticks) and counts as failed (claimed mail released,
  ``retries`` bumped, zombie past ``turns.max_retries``), then a new loop is started;
- ``in_turn``/``working`` (or ``booting`` with a turn running) with no activity for
  ``watchdog.stale_after`` becomes ``stalled`` and gets one ``nudge`` mail;
- ``stalled`` with no activity for ``watchdog.zombie_after`` is declared zombie (the parent gets
  exactly one ``worker_died``) and its turn's process group is killed; an agent stalled for
  ``no report`` (its parent was told) runs nothing and is left alone;
- ``parked`` with a ``park_until`` that has passed (a quota window) is un-parked; the parks of
  one provider end a few seconds apart (``quota.stagger``).

``between_turns`` agents waiting for mail are never stale. Nothing is ever killed unless ov recorded it.

Also, each tick: due schedules are fired (``scheduler``); a spawn or merge killed half-way (its intent
names a dead pid) is undone or finished; an agent whose terminal mail is committed is settled
``completed``; a loop that crashes on start-up twice makes its agent zombie.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import time
import typing as t
from dataclasses import asdict, dataclass, field

from overstory import procs
from overstory.agents.idle import NO_REPORT
from overstory.agents.iterations.starts import ATTEMPTS, StartupCrashes
from overstory.clock import iso, now_ms
from overstory.errors import ConfigError, OrchestratorError
from overstory.paths import ProjectPaths
from overstory.store import intents, mail_queries, sessions, turns
from overstory.store.db import write_transaction
from overstory.store.lifecycle import (
    complete_promised,
    declare_zombie,
    ends_by_terminal_mail,
    promised,
    terminal_mail_sent,
)
from overstory.store.sessions import Session
from overstory.watchdog import remote_turns
from overstory.watchdog.lock import WatchdogLock as WatchdogLock  # where callers have always imported them
from overstory.watchdog.lock import lock_holder as lock_holder
from overstory.watchdog.people import SideTicks

if t.TYPE_CHECKING:
    from overstory.config.model import Config

ACTOR = "watchdog"
# `ov sling` records the loop's pid right after starting it; give it this long.
LOOP_START_GRACE_MS = 15_000
# States whose silence means something is wrong (a turn or a tmux TUI should be talking).
SPEAKING_STATES = frozenset({"in_turn", "working"})


@dataclass(frozen=True)
class WatchdogSettings:
    interval: float = 5.0
    stale_after: float = 300.0
    zombie_after: float = 900.0
    max_retries: int = 2
    kill_grace: float = 5.0

    @classmethod
    def from_config(cls, config: Config, *, interval: float | None = None) -> WatchdogSettings:
        return cls(interval=interval if interval is not None else config.watchdog.interval,
                   stale_after=config.watchdog.stale_after, zombie_after=config.watchdog.zombie_after,
                   max_retries=config.turns.max_retries, kill_grace=config.turns.kill_grace)


@dataclass(frozen=True)
class Action:
    """One thing a tick did (or tried and lost a race on)."""

    agent: str
    kind: str  # readopted | stalled | zombie | recovered | unparked | lost_race | error
    detail: str
    at: int = field(default_factory=now_ms)

    def as_dict(self) -> dict[str, t.Any]:
        return {"agent": self.agent, "kind": self.kind, "detail": self.detail, "at": iso(self.at)}


@dataclass
class ReconcileReport:
    """What the watchdog found on start: reality compared with the rows."""

    agents: list[dict[str, t.Any]] = field(default_factory=list)
    killed: list[dict[str, t.Any]] = field(default_factory=list)
    released_mail: dict[str, int] = field(default_factory=dict)
    closed_turns: int = 0
    orphan_worktrees: list[str] = field(default_factory=list)
    finished_worktrees: list[dict[str, t.Any]] = field(default_factory=list)
    missing_worktrees: list[dict[str, t.Any]] = field(default_factory=list)

    def as_dict(self) -> dict[str, t.Any]:
        return asdict(self)

    def summary_lines(self) -> list[str]:
        dead = [a for a in self.agents if a["loop"] == "dead"]
        lines = [f"reconciled {len(self.agents)} active agent(s); {len(dead)} without a live loop"]
        for item in self.killed:
            lines.append(f"killed leftover {item['what']} of {item['agent']} (pgid {item['pgid']})")
        for agent, count in self.released_mail.items():
            lines.append(f"released {count} claimed message(s) of {agent}")
        if self.closed_turns:
            lines.append(f"closed {self.closed_turns} turn row(s) left running by dead agents")
        for path in self.orphan_worktrees:
            lines.append(f"orphan worktree (no agent row; left in place): {path}")
        for item in self.missing_worktrees:
            lines.append(f"agent {item['agent']} ({item['state']}) has no worktree at {item['path']}")
        return lines


# ---- the watchdog ---------------------------------------------------------------


class _RowChanged(Exception):
    """Raised inside a transaction to roll it back: the row moved on since we read it."""


class Watchdog:
    """Rules over the session rows of one project. The caller holds the WatchdogLock."""

    def __init__(self, project: ProjectPaths, settings: WatchdogSettings, state: sqlite3.Connection | None = None,
                 *, spawn: t.Callable[[ProjectPaths, str, int], tuple[int, int | None]] | None = None) -> None:
        from overstory.store.db import open_state

        self.project = project
        self.settings = settings
        self._own_state = state is None
        self.state = state if state is not None else open_state(project.state_db)
        self._events: sqlite3.Connection | None = None
        self._spawn = spawn or _spawn_loop
        # Loops this watchdog started, by agent: (generation, pid, ticks); alive = the agent's loop.
        self._started: dict[str, tuple[int, int, int | None]] = {}
        self._crashes = StartupCrashes(project.run_dir)  # loops of ours that crashed on start-up
        self._scanned = False
        self._side = SideTicks(project)  # `ov schedule`'s fires, approval timeouts, notifications

    # -- plumbing

    def close(self) -> None:
        self._side.close()
        for conn, own in ((self._events, True), (self.state, self._own_state)):
            if conn is not None and own:
                try:
                    conn.close()
                except sqlite3.Error:
                    pass
        self._events = None

    def _event(self, kind: str, agent: Session, summary: str, data: dict[str, t.Any] | None = None) -> None:
        from overstory.store import events as event_store

        try:
            if self._events is None:
                from overstory.store.db import open_events

                self._events = open_events(self.project.events_db)
            event_store.record(self._events, kind, agent=agent.name, generation=agent.generation,
                               summary=summary[:300], data=data)
        except (sqlite3.Error, OSError, OrchestratorError):
            pass  # the state change is what matters; the event is a courtesy (events.db may be broken)

    # -- one tick

    def tick(self) -> list[Action]:
        """Apply the rules once to every non-terminal agent; returns what was done."""
        now = now_ms()
        actions: list[Action] = []
        try:
            actions.extend(self._settle_intents())
        except (sqlite3.Error, OSError, OrchestratorError) as exc:  # never in the way of the rules below
            actions.append(Action("-", "error", f"settling interrupted commands: {exc}"))
        actions.extend(Action(*fired) for fired in self._side.schedules(self.state, self.settings.interval))
        try:
            spawning = {row["name"] for row in intents.list_spawns(self.state)}
            agents = sessions.list_sessions(self.state, include_terminal=False)
        except (sqlite3.Error, OrchestratorError) as exc:  # e.g. locked past the busy timeout: try next tick
            return [*actions, Action("-", "error", f"database: {exc}")]
        for agent in agents:
            if agent.name in spawning:
                continue  # its `ov sling` is still running: the agent does not exist yet
            try:
                actions.extend(self._check(agent, now))
            except (sqlite3.Error, OSError, OrchestratorError) as exc:
                actions.append(Action(agent.name, "error", f"{type(exc).__name__}: {exc}"))
        actions.extend(Action(*done) for done in self._side.people(self.state))  # approval timeouts, notifications
        return actions

    def _settle_intents(self) -> list[Action]:
        """Undo spawns and finish or roll back merges whose command was killed half-way."""
        from overstory.agents.spawn_journal import settle_all
        from overstory.merge.intents import settle_all as settle_merges

        actions = [Action(name, "spawn_undone",
                          "its `ov sling` died half-way; removed: " + (", ".join(what) or "nothing"))
                   for name, what in settle_all(self.project, self.state).items()]
        scan, self._scanned = not self._scanned, True  # merge journals without an intent: looked for once
        for label, what in settle_merges(self.project, self.state, scan_journals=scan).items():
            actions.append(Action(label, "merge_settled", what))
        return actions

    def _check(self, agent: Session, now: int) -> list[Action]:
        if agent.mode == "headless" and not self._loop_alive(agent, now):
            return self._readopt(agent)
        if agent.mode == "tmux":
            actions = self._check_tmux(agent, now)
            if actions:
                return actions
        if agent.state == "parked":
            return self._unpark_if_due(agent, now)
        idle_ms = now - agent.last_activity
        speaking = agent.state in SPEAKING_STATES or (agent.state == "booting" and agent.turn_pgid is not None)
        if speaking and idle_ms >= self.settings.stale_after * 1000:
            return self._stall(agent, idle_ms)
        if agent.state == "stalled" and agent.state_reason != NO_REPORT and idle_ms >= self.settings.zombie_after * 1000:
            return self._zombify(agent)
        return []

    def _unpark_if_due(self, agent: Session, now: int) -> list[Action]:
        from overstory.store.lifecycle import unpark

        if agent.park_until is None or agent.park_until > now:
            return []
        outcome = unpark(self.state, agent, actor=ACTOR, reason=f"{agent.park_kind} park ended", due_at=now)
        if outcome is None or not outcome.ok:
            return []
        self._event("agent_unparked", agent, f"{agent.park_kind} park ended; back to work")
        return [Action(agent.name, "unparked", f"{agent.park_kind} park ended")]

    def _loop_alive(self, agent: Session, now: int) -> bool:
        if procs.is_alive(agent.loop_pid, agent.loop_start_ticks):
            return True
        started = self._started.get(agent.name)
        if started and started[0] == agent.generation and procs.is_alive(started[1], started[2]):
            return True  # ours, still starting up (or waiting for the agent lock)
        if agent.loop_pid is None and started is None:
            return now - agent.created_at < LOOP_START_GRACE_MS  # `ov sling` is still starting it
        return False

    # -- rule: a tmux agent's pane or driver is gone

    def _check_tmux(self, agent: Session, now: int) -> list[Action]:
        from overstory.agents.tmux import panes as tmux_panes

        status = tmux_panes.pane_status(agent)  # reads /proc only
        if status == "gone":
            reason = tmux_panes.pane_exit_reason(self.project, agent)
            outcome = declare_zombie(self.state, agent, reason, actor=ACTOR)
            tmux_panes.kill_session(self.project, agent, grace=self.settings.kill_grace)
            if not outcome.ok:
                return [Action(agent.name, "lost_race", f"not declared zombie: {type(outcome).__name__}")]
            return [Action(agent.name, "zombie", reason)]
        if status == "alive" and not self._loop_alive(agent, now):
            from overstory.agents.process import load_launch_env
            from overstory.agents.tmux.session import spawn_driver

            pid, ticks = spawn_driver(self.project, agent.name, agent.generation,
                                      load_launch_env(self.project, agent.name))
            self._started[agent.name] = (agent.generation, pid, ticks)
            return [Action(agent.name, "readopted", f"restarted the tmux driver (pid {pid})")]
        return []

    # -- rule: the loop is gone

    def _readopt(self, agent: Session) -> list[Action]:
        actions: list[Action] = []
        latest = turns.last_inserted(self.state, agent.name, agent.generation)
        live = latest["id"] if latest is not None and latest["status"] in turns.LIVE_TURN_STATUSES else None
        remote = remote_turns.settle(self.project, agent, agent.current_turn_id or live, self.settings.kill_grace)
        killed = f"; {remote.detail}" if remote is not None else ""  # a turn on a cluster: its executor's word
        if (agent.turn_pgid is not None and procs.group_alive(agent.turn_pgid, agent.turn_start_ticks)) or \
                procs.tagged_processes(agent.current_turn_id or ""):
            procs.kill_turn(agent.turn_pgid, agent.turn_start_ticks, agent.current_turn_id,
                            grace=self.settings.kill_grace)
            killed += f"; killed its orphaned turn group {agent.turn_pgid}"
        from overstory.sandbox.checks import kill_leftover, loop_record

        if kill_leftover(loop_record(self.project.run_dir, agent.name)):  # a loop's check (or gate) it left running
            killed += "; killed the check its loop left running"
        claimed = mail_queries.claimed_unread(self.state, agent.name)
        try:
            if latest is not None and latest["status"] == "ok" and agent.state in ("in_turn", "stalled", "booting"):
                action = self._settle_finished_turn(agent, latest["id"], latest["started_at"])
            elif promised(self.state, agent):
                action = self._complete_promised(agent, "its loop died" + killed)
            elif ((agent.state == "in_turn" or (agent.state == "stalled" and agent.state_reason != NO_REPORT))
                  or agent.current_turn_id or agent.turn_pgid or claimed
                  or (latest is not None and latest["status"] in turns.LIVE_TURN_STATUSES)):
                action = self._fail_interrupted_turn(agent, killed, remote.lost if remote is not None else None)
            elif agent.retries > self.settings.max_retries:
                action = self._give_up(agent, "its loop died after the last retry")
            elif (crash := self._crashes.gave_up(agent.name, agent.generation, booting=agent.state == "booting",
                                                 turns=agent.turns)) is not None:
                action = self._give_up(agent, f"its agent loop could not start ({ATTEMPTS} attempts): {crash}")
            else:
                action = Action(agent.name, "readopted", "loop was gone; restarting it" + killed)
        except _RowChanged as changed:
            return [Action(agent.name, "lost_race", str(changed))]
        actions.append(action)
        if action.kind in ("readopted", "recovered"):
            fresh = sessions.get(self.state, agent.name)
            if fresh is not None and fresh.generation == agent.generation and not fresh.is_terminal:
                self._crashes.starting(agent.name, agent.generation)
                pid, ticks = self._spawn(self.project, agent.name, agent.generation)
                self._started[agent.name] = (agent.generation, pid, ticks)
                # Recorded at once (the loop records itself too, a moment later): a one-shot recovery that
                # runs right after this one (`ov resume --all`, `ov watchdog --once`) must see it alive.
                sessions.update_fields(self.state, agent.name, agent.generation, loop_pid=pid, loop_start_ticks=ticks)
                self._event("watchdog_readopt", agent, f"{action.detail}; new loop pid {pid}")
        return actions

    def _complete_promised(self, agent: Session, what_happened: str) -> Action:
        outcome = complete_promised(self.state, agent, what_happened, actor=ACTOR, expect=frozenset({agent.state}))
        if not outcome.ok:
            return Action(agent.name, "lost_race", f"could not settle as completed: {type(outcome).__name__}")
        self._event("watchdog_settled", agent, f"terminal mail already sent; {what_happened}: completed")
        return Action(agent.name, "completed", f"its terminal mail was sent; {what_happened}: settled as completed")

    def _fence(self, tx: sqlite3.Connection, agent: Session) -> None:
        """Inside a transaction: stop if a newer generation or a new loop appeared."""
        row = sessions.fence_row(tx, agent.name)
        if row is None or row["generation"] != agent.generation:
            raise _RowChanged("the agent was replaced while the watchdog looked at it")
        if row["loop_pid"] != agent.loop_pid:
            raise _RowChanged("a new loop recorded itself while the watchdog looked at it")

    def _fail_interrupted_turn(self, agent: Session, killed: str, lost: str | None = None) -> Action:
        """The loop died mid-turn (or its turn was ``lost`` with its node): that turn failed. Same retry policy
        as the loop's own."""
        from overstory.store import mail

        retries = agent.retries + 1
        what = "its turn was lost with its node or worker" if lost else "agent loop died mid-turn"
        reason = f"{what} (retry {retries}/{self.settings.max_retries})"
        turn_fields = {"retries": retries, "failed_turns": agent.failed_turns + 1, "turn_pgid": None,
                       "turn_start_ticks": None, "current_turn_id": None, "current_tool": None}

        def bookkeeping(tx: sqlite3.Connection, _ok: sessions.Ok | None = None) -> None:
            from overstory.store import budgets

            self._fence(tx, agent)
            mail.release_agent(tx, agent.name)
            estimate = budgets.settle_interrupted(tx, agent.name, agent.generation)
            if agent.current_turn_id:
                turns.add_cost(tx, agent.current_turn_id, estimate)
            turns.end_live_turns(tx, agent.name, agent.generation, status="transient" if lost else "failed",
                                 error=lost or "the agent loop died during the turn")

        if agent.state in ("in_turn", "stalled", "booting"):
            outcome = sessions.transition(self.state, agent.name, agent.generation, "between_turns", actor=ACTOR,
                                          reason=reason, fields=turn_fields, expect={agent.state}, then=bookkeeping)
            if not outcome.ok:
                return Action(agent.name, "lost_race", f"could not settle the failed turn: {type(outcome).__name__}")
        else:
            with write_transaction(self.state):
                if sessions.state_of(self.state, agent.name, agent.generation) != agent.state:
                    raise _RowChanged("the agent changed state while the watchdog looked at it")
                bookkeeping(self.state)
                sessions.update_fields(self.state, agent.name, agent.generation, **turn_fields)
        self._event("turn_failed", agent, reason + killed, {"retries": retries})
        if retries > self.settings.max_retries:
            fresh = sessions.get(self.state, agent.name)
            if fresh is not None and fresh.generation == agent.generation:
                return self._give_up(fresh, f"{what}; gave up after {retries - 1} retries")
        return Action(agent.name, "readopted", reason + killed)

    def _settle_finished_turn(self, agent: Session, turn_id: str, started_ms: int) -> Action:
        """The turn ended cleanly but the loop died before settling it: settle it as the loop would."""
        from overstory.store import checkpoints, mail

        since = min(started_ms, checkpoints.dispatch_started(self.state, turn_id) or started_ms)
        done = ends_by_terminal_mail(agent) and terminal_mail_sent(self.state, agent, since)

        def deliver(tx: sqlite3.Connection, _ok: sessions.Ok) -> None:
            self._fence(tx, agent)
            mail.mark_read(tx, turn_id)

        outcome = sessions.transition(
            self.state, agent.name, agent.generation, "completed" if done else "between_turns", actor=ACTOR,
            reason="turn finished (settled by the watchdog)" if not done else "terminal mail sent (settled by the watchdog)",
            fields={"turns": agent.turns + 1, "retries": 0, "turn_pgid": None, "turn_start_ticks": None,
                    "current_turn_id": None, "current_tool": None},
            expect={agent.state}, then=deliver)
        if not outcome.ok:
            return Action(agent.name, "lost_race", f"could not settle the finished turn: {type(outcome).__name__}")
        if done:
            self._event("watchdog_settled", agent, "finished turn settled: completed")
            return Action(agent.name, "completed", "its loop died after the final turn; settled as completed")
        return Action(agent.name, "recovered", "its loop died after a clean turn; settled and restarting the loop")

    def _give_up(self, agent: Session, reason: str) -> Action:
        if promised(self.state, agent):
            return self._complete_promised(agent, reason)
        outcome = declare_zombie(self.state, agent, reason, actor=ACTOR)
        if not outcome.ok:
            return Action(agent.name, "lost_race", f"could not declare zombie: {type(outcome).__name__}")
        self._event("watchdog_zombie", agent, reason)
        return Action(agent.name, "zombie", reason)

    # -- rule: silence

    def _stall(self, agent: Session, idle_ms: int) -> list[Action]:
        from overstory.store import mail

        idle = idle_ms / 1000
        reason = f"no activity for {idle:.0f}s (watchdog.stale_after = {self.settings.stale_after:g}s)"

        def nudge(tx: sqlite3.Connection, ok: sessions.Ok) -> None:
            mail.insert_message(
                tx, sender=ACTOR, recipient=agent.name, type="nudge", priority="high",
                subject="no activity from you: are you stuck?",
                body=(f"The watchdog has seen no activity from {agent.name} for {idle:.0f}s. If you are blocked, "
                      "say so to your parent with `ov mail send --type question`; otherwise carry on."),
                dedup_key=f"nudge:{agent.name}:{agent.generation}:{ok.version}")

        outcome = sessions.transition(self.state, agent.name, agent.generation, "stalled", actor=ACTOR, reason=reason,
                                      expect={agent.state}, then=nudge)
        if not outcome.ok:
            return [Action(agent.name, "lost_race", f"not stalled: {type(outcome).__name__}")]
        self._event("watchdog_stalled", agent, reason, {"idle_seconds": round(idle, 1)})
        return [Action(agent.name, "stalled", reason)]

    def _zombify(self, agent: Session) -> list[Action]:
        from overstory.store import mail

        fresh = sessions.get(self.state, agent.name)  # activity may have resumed since the tick's read
        if fresh is None or fresh.generation != agent.generation or fresh.state != "stalled":
            return []
        idle = (now_ms() - fresh.last_activity) / 1000
        if idle < self.settings.zombie_after:
            return []
        reason = f"no activity for {idle:.0f}s (watchdog.zombie_after = {self.settings.zombie_after:g}s)"
        if promised(self.state, fresh):
            procs.kill_turn(fresh.turn_pgid, fresh.turn_start_ticks, fresh.current_turn_id,
                            grace=self.settings.kill_grace)
            return [self._complete_promised(fresh, f"its turn hung ({reason})")]
        outcome = declare_zombie(self.state, fresh, reason, actor=ACTOR, expect=frozenset({"stalled"}))
        if not outcome.ok:
            return [Action(agent.name, "lost_race", f"not declared zombie: {type(outcome).__name__}")]
        detail = reason
        if fresh.turn_pgid is not None or fresh.current_turn_id:
            procs.kill_turn(fresh.turn_pgid, fresh.turn_start_ticks, fresh.current_turn_id,
                            grace=self.settings.kill_grace)
            detail += f"; killed turn group {fresh.turn_pgid}"
        if not procs.is_alive(fresh.loop_pid, fresh.loop_start_ticks):
            mail.release_agent(self.state, agent.name)  # nobody else will give the claimed mail back
        self._event("watchdog_zombie", fresh, detail)
        return [Action(agent.name, "zombie", detail)]

    # -- start-up reconciliation

    def reconcile(self) -> ReconcileReport:
        """Compare rows with live processes and worktrees; settle leftovers ov owns, report the rest."""
        from overstory.store import mail

        report = ReconcileReport()
        rows = sessions.list_sessions(self.state)
        by_name = {row.name: row for row in rows}
        for row in rows:
            loop_alive = procs.is_alive(row.loop_pid, row.loop_start_ticks)
            turn_alive = row.turn_pgid is not None and procs.group_alive(row.turn_pgid, row.turn_start_ticks)
            if not row.is_terminal:
                report.agents.append({
                    "agent": row.name, "state": row.state, "generation": row.generation, "mode": row.mode,
                    "loop": "alive" if loop_alive else ("none" if row.loop_pid is None else "dead"),
                    "turn_group": "alive" if turn_alive else ("none" if row.turn_pgid is None else "dead"),
                })
                if row.worktree and not os.path.isdir(row.worktree):
                    report.missing_worktrees.append({"agent": row.name, "state": row.state, "path": row.worktree})
                continue
            # A terminal agent owns no processes: whatever it left behind (and ov recorded) goes.
            if turn_alive:
                procs.kill_turn(row.turn_pgid, row.turn_start_ticks, row.current_turn_id,
                                grace=self.settings.kill_grace)
                report.killed.append({"agent": row.name, "what": "turn group", "pgid": row.turn_pgid})
            if loop_alive and row.loop_pid is not None:
                try:
                    os.kill(row.loop_pid, signal.SIGTERM)
                    report.killed.append({"agent": row.name, "what": "loop", "pgid": row.loop_pid})
                except ProcessLookupError:
                    pass
            if row.turn_pgid is not None:
                sessions.update_fields(self.state, row.name, row.generation, turn_pgid=None, turn_start_ticks=None,
                                       current_turn_id=None, current_tool=None)
            if not loop_alive:
                released = mail.release_agent(self.state, row.name)
                if released:
                    report.released_mail[row.name] = released
        with write_transaction(self.state):
            report.closed_turns = turns.abort_turns_of_ended_agents(self.state)
        worktrees = self.project.worktrees_dir
        if worktrees.is_dir():
            for entry in sorted(worktrees.iterdir()):
                if not entry.is_dir():
                    continue
                owner = by_name.get(entry.name)
                if owner is None:
                    report.orphan_worktrees.append(str(entry))
                elif owner.is_terminal:
                    report.finished_worktrees.append({"agent": owner.name, "state": owner.state, "path": str(entry)})
        return report

    # -- the loop

    def run(self, *, once: bool = False, should_stop: t.Callable[[], bool] = lambda: False,
            on_reconcile: t.Callable[[ReconcileReport], None] | None = None,
            on_tick: t.Callable[[list[Action]], None] | None = None) -> None:
        """Reconcile, then tick every ``settings.interval`` seconds until ``should_stop``."""
        report = self.reconcile()
        if on_reconcile is not None:
            on_reconcile(report)
        while True:
            actions = self.tick()
            if on_tick is not None:
                on_tick(actions)
            if once:
                return
            deadline = time.monotonic() + self.settings.interval
            while time.monotonic() < deadline:
                if should_stop():
                    return
                time.sleep(min(0.1, self.settings.interval))


def _spawn_loop(project: ProjectPaths, agent: str, generation: int) -> tuple[int, int | None]:
    from overstory.agents.loop import spawn_loop  # (re-exported there from agents.process)
    from overstory.agents.process import load_launch_env
    from overstory.config.load import write_agent_snapshot

    launch_env = load_launch_env(project, agent)
    try:  # the re-adopted loop sees the configuration as it is now, as one that loaded it itself would
        write_agent_snapshot(project.config_file, project.local_config_file, launch_env, project.run_dir / agent)
    except (ConfigError, OSError):
        pass  # now invalid or unreadable: the loop keeps the one the agent was slung with
    return spawn_loop(project, agent, generation, launch_env)
