"""Whole-machine recovery (`ov resume --all`) and forks (`ov resume AGENT --fork`), ARCHITECTURE §13.

After every ov process died at once (SIGKILL, power loss, a reboot), the database still
says who was doing what. Recovery is the watchdog's start-up pass, run once under the
watchdog's lock: ``Watchdog.reconcile`` (leftovers of finished agents go, live turns of
ended agents are closed) and one ``Watchdog.tick``, which re-adopts every headless agent
whose loop is gone:

- a turn in flight is killed (its recorded group, checked by start time, and every
  process tagged with its turn id), its claimed mail released, and it counts as a failed
  attempt, retried by the new loop under the ledger's replay policy; the runtime session
  is resumed, since its id was stored the moment it was known;
- a turn that finished but was not settled is settled (completed, if it sent its
  terminal mail in any attempt of its dispatch);
- an agent between turns, waiting on a child or parked just gets its loop back; parked
  stays parked;
- a tmux agent whose pane died is declared zombie: its parent gets one ``worker_died``
  (deduplicated per generation), as does an agent out of retries.

Recorded pids are only believed with their start time, so none of them means anything
after a reboot. `ov watch` and `ov watchdog` do the same on start; ``recover_all`` just
does it once and reports. Nothing is sent twice: worker_died and run summaries carry
dedup keys, and replayed ``ov mail send``/``ov sling`` calls are idempotent per dispatch.
"""

from __future__ import annotations

import sqlite3
import typing as t
from dataclasses import dataclass, field

from overstory.errors import LockHeld, UsageError
from overstory.paths import ProjectPaths
from overstory.store import checkpoints, sessions
from overstory.watchdog import Action, ReconcileReport, Watchdog, WatchdogLock, WatchdogSettings, lock_holder

if t.TYPE_CHECKING:
    from overstory.agents.spawn import SlingResult
    from overstory.config import Config


@dataclass
class RecoveryReport:
    reconcile: ReconcileReport
    actions: list[Action] = field(default_factory=list)
    uncertain_calls: list[dict[str, t.Any]] = field(default_factory=list)

    def as_dict(self) -> dict[str, t.Any]:
        return {"reconcile": self.reconcile.as_dict(), "actions": [a.as_dict() for a in self.actions],
                "uncertain_calls": self.uncertain_calls}

    def summary_lines(self) -> list[str]:
        lines = self.reconcile.summary_lines()
        lines += [f"{a.agent}: {a.kind}: {a.detail}" for a in self.actions]
        if not self.actions:
            lines.append("every active agent's loop is alive: nothing to re-adopt")
        for call in self.uncertain_calls:
            lines.append(f"{call['agent']}: tool call #{call['id']} ({call['tool']}, {call['class']}) started without "
                         "a result: its retry will be held back once and flagged (`ov trace "
                         f"{call['agent']}`)")
        return lines


def recover_all(project: ProjectPaths, config: Config, *, state: sqlite3.Connection | None = None) -> RecoveryReport:
    """Re-adopt or restart every active agent once; LockHeld when a watchdog already runs (it does this itself)."""
    lock = WatchdogLock(project)
    try:
        lock.acquire()
    except LockHeld:
        holder = lock_holder(project)
        raise LockHeld(f"a watchdog is running for this project (pid {holder or '?'}); it re-adopts every agent "
                       "itself: watch it with `ov status`") from None
    dog = Watchdog(project, WatchdogSettings.from_config(config), state)
    try:
        report = RecoveryReport(dog.reconcile())
        report.actions = dog.tick()
        report.uncertain_calls = _uncertain_calls(dog.state)
        return report
    finally:
        dog.close()
        lock.release()


def _uncertain_calls(state: sqlite3.Connection) -> list[dict[str, t.Any]]:
    """Side effects that started in turns nobody is running any more, with no result recorded."""
    from overstory.store.ledger import uncertain_side_effects

    return [dict(r) for r in uncertain_side_effects(state)]


# --------------------------------------------------------------------------- forks


@dataclass
class ForkResult:
    """A fork: the agent it slung, and what it kept of its source and what it could not carry over."""

    sling: SlingResult
    source: str
    kept: dict[str, t.Any]
    not_carried: list[str]

    @property
    def name(self) -> str:
        return self.sling.name

    def as_dict(self) -> dict[str, t.Any]:
        return {**self.sling.as_dict(), "source": self.source, "kept": self.kept, "not_carried": self.not_carried}

    def summary_lines(self) -> list[str]:
        from overstory.store.budgets import format_limit

        limits = {k: v for k, v in self.sling.budget.items() if v is not None}
        kept = [f"budget {', '.join(f'{k} {format_limit(k, v)}' for k, v in limits.items()) or 'none'}"]
        if self.kept["approve"]:
            kept.append(f"approval gates {', '.join(self.kept['approve'])}")
        loop = self.kept["loop"]
        if loop is not None:
            kept.append(f"loop (until {loop['until']}, max_iterations {loop['max_iterations']}, "
                        f"{len(loop['phases'])} phase(s))")
        lines = [(f"forked {self.source} as {self.sling.name} (branch {self.sling.branch}, worktree "
                  f"{self.sling.worktree})"), "  kept: " + "; ".join(kept)]
        lines += [f"  budget: {note}" for note in self.sling.budget_notes]
        lines.append("  not carried over: " + "; ".join(self.not_carried))
        return lines


def fork(project: ProjectPaths, config: Config, state: sqlite3.Connection, source_name: str, *,
         name: str | None = None, prompt: str | None = None, environ: t.Mapping[str, str] | None = None
         ) -> ForkResult:
    """Start a new agent from ``source_name``'s checkpoint: its commit, task and scope, a new name and branch.

    The new branch starts at the HEAD of the source's newest checkpoint (its branch tip
    when it has none); uncommitted changes are not carried over. The fork gets the
    source's task text plus a note saying where it starts, and ``prompt`` (a different
    direction to try). It starts a fresh runtime session.

    It keeps everything that limits or gates its source: the budget limits as they stand
    now (raises by `ov resume --add-*` included; spend counts from zero, and no limit goes
    beyond what is left of the open run's budget), its ``ov sling --approve`` gates (config
    ``approvals.rules`` apply to every agent anyway) and, for an `ov loop` agent, the loop
    (objective, promise, check, phases, critic, max_iterations) with the note added to its
    constraints: a loop fork starts at iteration 1 of the first phase.
    """
    from overstory.agents.spawn import SlingRequest, sling
    from overstory.gitutil import git

    source = sessions.get(state, source_name)
    if source is None:
        raise sessions.agent_not_found(state, source_name)
    if not source.worktree or not source.branch:
        raise UsageError(f"{source_name} works at the project root, not on a branch of its own: nothing to fork")
    mark = checkpoints.latest(state, source_name)
    start = (mark or {}).get("head")
    if not start or git(project.root, "cat-file", "-e", f"{start}^{{commit}}", check=False).returncode != 0:
        start = source.branch
    name = name or _fork_name(state, source_name)
    parent_row = sessions.get(state, source.parent) if source.parent != "operator" else None
    parent = source.parent if parent_row is not None and not parent_row.is_terminal else "operator"
    note = (f"[ov] You are {name}, a fork of {source_name}: your branch starts from its checkpoint (commit "
            f"{start[:12]} of {source.branch}"
            + (f", after its turn {mark['turn_id']}" if mark else "") + "). "
            + (prompt or "Try a different direction from the one it took."))
    budget, approve, loop = _inherited(state, source, note)
    scenario = source.spec.get("scenario")
    request = SlingRequest(capability=source.capability, task_id=source.task_id, name=name,
                           prompt=f"{source.spec.get('prompt') or ''}\n\n{note}".strip(),
                           files=list(source.spec.get("files") or ()), parent=parent, runtime=source.runtime,
                           model=source.model, base_branch=source.base_branch, start_point=start,
                           scenario=_path(scenario), tmux=source.mode == "tmux",
                           budget=budget, approve=approve, loop=loop)
    result = sling(project, config, state, request, environ)
    not_carried = ["uncommitted changes", "its runtime session (the fork starts a fresh one)",
                   "its spend (the fork's counts from zero)"]
    if loop is not None:
        not_carried.append("its loop's progress file and count (the fork starts at iteration 1 of the first phase)")
    if parent != source.parent:
        not_carried.append(f"its parent {source.parent} (no longer active: the fork reports to the operator)")
    return ForkResult(result, source_name, {"budget": budget, "approve": approve, "loop": loop}, not_carried)


def _inherited(state: sqlite3.Connection, source: sessions.Session, note: str
               ) -> tuple[dict[str, t.Any] | None, list[str], dict[str, t.Any] | None]:
    """What a fork keeps of its source: budget limits (as they stand now), approval gates, the loop."""
    from overstory.store import budgets, loops

    row = budgets.get_agent(state, source.name, source.generation)
    budget = {limit: getattr(row, limit) for limit in budgets.LIMITS} if row is not None else None
    approve = [str(p) for p in source.spec.get("approve") or ()]
    loop = source.spec.get("loop")
    if loop is not None:
        loop = dict(loop)
        current = loops.get(state, source.name, source.generation)
        if current is not None:  # `ov resume --add-iterations` raised it
            loop["max_iterations"] = current.max_iterations
        loop["constraints"] = [*(loop.get("constraints") or []), note]
    return budget, approve, loop


def _fork_name(state: sqlite3.Connection, source: str) -> str:
    taken = sessions.fork_names_taken(state, source)
    number = 1
    while f"{source}-fork{number}" in taken:
        number += 1
    return f"{source}-fork{number}"


def _path(text: str | None) -> t.Any:
    from pathlib import Path

    return Path(text) if text and Path(text).is_file() else None
