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
from overstory.watchdog.daemon import Action, ReconcileReport, Watchdog, WatchdogLock, WatchdogSettings, lock_holder

if t.TYPE_CHECKING:
    from overstory.agents.spawn import SlingResult
    from overstory.config.model import Config


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
        fork_of = self.kept.get("fork_of") or {}
        if fork_of.get("session"):
            kept.append(f"its conversation (session {fork_of['session']}, continued in a new session: "
                        f"{fork_of['how']})")
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
    direction to try). Where the runtime can fork a session (``Runtime.session_fork``) and
    the source is a headless agent with one, the fork's first turn continues the source's
    conversation in a new session of its own (the source's files are copied at the fork; its
    session is not touched); otherwise it starts a fresh session. Its spec records where it
    came from (``fork_of``: the source, its generation, ``parent_run_id``: the checkpoint's
    turn, and the session).

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
    fork_of, conversation = _fork_of(project, source, mark)
    note = (f"[ov] You are {name}, a fork of {source_name}: "
            + ("the conversation so far is its own; from here on you work " if fork_of.get("session") else "you work ")
            + f"on a branch of your own, which starts from its checkpoint (commit {start[:12]} of {source.branch}"
            + (f", after its turn {mark['turn_id']}" if mark else "") + "). "
            + (prompt or "Try a different direction from the one it took."))
    budget, approve, loop = _inherited(state, source, note)
    scenario = source.spec.get("scenario")
    request = SlingRequest(capability=source.capability, task_id=source.task_id, name=name,
                           prompt=f"{source.spec.get('prompt') or ''}\n\n{note}".strip(),
                           files=list(source.spec.get("files") or ()), parent=parent, runtime=source.runtime,
                           model=source.model, base_branch=source.base_branch, start_point=start,
                           scenario=_path(scenario), tmux=source.mode == "tmux",
                           budget=budget, approve=approve, loop=loop, fork_of=fork_of)
    result = sling(project, config, state, request, environ)
    kept: dict[str, t.Any] = {"budget": budget, "approve": approve, "loop": loop, "fork_of": fork_of}
    not_carried = ["uncommitted changes", "its spend (the fork's counts from zero)"]
    if conversation is not None:
        not_carried.insert(1, f"its conversation ({conversation}: the fork starts a fresh session, told where it "
                              "starts)")
    if loop is not None:
        not_carried.append("its loop's progress file and count (the fork starts at iteration 1 of the first phase)")
    if parent != source.parent:
        not_carried.append(f"its parent {source.parent} (no longer active: the fork reports to the operator)")
    return ForkResult(result, source_name, kept, not_carried)


def _fork_of(project: ProjectPaths, source: sessions.Session, mark: dict[str, t.Any] | None
             ) -> tuple[dict[str, t.Any], str | None]:
    """Where a fork comes from, and (when its conversation cannot come along) why not."""
    from overstory.runtimes import get_runtime

    fork_of: dict[str, t.Any] = {"agent": source.name, "generation": source.generation,
                                 "parent_run_id": (mark or {}).get("turn_id"), "runtime": source.runtime}
    runtime = get_runtime(source.runtime)
    session = (mark or {}).get("session_id") or source.runtime_session_id
    state_dir = runtime.state_dir(project.run_dir / source.name)
    if runtime.session_fork is None:
        return fork_of, f"{source.runtime} has no way to fork a session"
    if source.mode != "headless" or source.spec.get("loop"):
        return fork_of, ("a tmux agent's TUI session is not forked" if source.mode != "headless" else
                         "an `ov loop` starts each iteration in a fresh session")
    if not session or state_dir is None or not source.worktree:
        return fork_of, "it has no session yet"
    fork_of.update(session=session, state_dir=str(state_dir), cwd=source.worktree, how=runtime.session_fork)
    return fork_of, None


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


# --------------------------------------------------------------------------- restarts

RESTART_EVENT = "agent_restart"  # written before the re-spawn: what it needs, should the old row be gone


@dataclass
class RestartResult:
    """A stopped or zombie agent slung again under its own name, on its own branch, in a fresh session."""

    sling: SlingResult
    previous_state: str
    commits: list[str]
    uncommitted: list[str]
    archived_run_dir: str | None

    def as_dict(self) -> dict[str, t.Any]:
        return {**self.sling.as_dict(), "previous_state": self.previous_state, "commits": self.commits,
                "uncommitted": self.uncommitted, "archived_run_dir": self.archived_run_dir}

    def summary_lines(self) -> list[str]:
        lines = [f"restarted {self.sling.name} (was {self.previous_state}) on {self.sling.branch}, a fresh session "
                 f"(generation {self.sling.generation})",
                 f"  its dispatch lists {len(self.commits)} commit(s) so far and {len(self.uncommitted)} uncommitted "
                 "change(s) in its worktree"]
        if self.archived_run_dir:
            lines.append(f"  the earlier run dir: {self.archived_run_dir} (turn logs: .overstory/logs/{self.sling.name}/)")
        return lines


def restart(project: ProjectPaths, config: Config, state: sqlite3.Connection, name: str, *,
            prompt: str | None = None, environ: t.Mapping[str, str] | None = None) -> RestartResult:
    """Sling a stopped or zombie ``name`` again under its own name: its branch goes on (the worktree too, when it
    is still there), with a fresh runtime session and a dispatch that lists what was done so far.

    Goes through `ov sling`'s journal (``continue_branch``: the intent names neither the branch nor a reused
    worktree, so an undo never removes the work) and ``sessions.create_session`` (the one state path). What
    the re-spawn needs is recorded (an ``agent_restart`` event) before anything changes: killed after the new
    session row replaced the old one, the undo removes the new row, and running this again finds the record."""
    from overstory.agents import spawn_journal
    from overstory.agents.spawn import SlingRequest, sling

    spawn_journal.settle_abandoned(project, state, name)  # a restart killed half-way is undone first
    source = sessions.get(state, name)
    spec = _restart_spec(project, name) if source is None else None
    if source is None and spec is None:
        raise sessions.agent_not_found(state, name)
    if source is not None:
        if not source.is_terminal:
            raise UsageError(f"{name} is {source.state}: `ov resume {name}` continues it; to restart it, `ov stop "
                             f"{name}` first")
        if source.state == "completed" and not (source.state_reason or "").startswith("stopped by"):
            raise UsageError(f"{name} completed its task ({source.state_reason or 'done'}); merge it, or `ov resume "
                             f"{name} --fork` to try again from its checkpoint")
        if not source.worktree or not source.branch:
            raise UsageError(f"{name} works at the project root, not on a branch of its own: sling it again instead")
        budget, approve, loop = _inherited(state, source, "[ov] restarted: continue the work on your branch")
        spec = {"capability": source.capability, "task_id": source.task_id, "prompt": source.spec.get("prompt"),
                "files": list(source.spec.get("files") or ()), "parent": source.parent, "runtime": source.runtime,
                "model": source.model, "base_branch": source.base_branch, "base_commit": source.spec.get("base_commit"),
                "scenario": source.spec.get("scenario"), "tmux": source.mode == "tmux", "budget": budget,
                "approve": approve, "loop": loop, "state": source.state, "generation": source.generation,
                "branch": source.branch, "worktree": source.worktree}
        _record_restart(project, name, source.generation, spec)
    assert spec is not None
    commits, uncommitted = _done_so_far(project, spec)
    archived = _archive_run_dir(project, name, int(spec["generation"]))
    scenario = spec.get("scenario")
    old_run_dir = str(project.run_dir / name) + "/"
    if archived and scenario and scenario.startswith(old_run_dir):  # its scenario file moved with the logs
        scenario = f"{archived}/{scenario[len(old_run_dir):]}"
    parent_row = sessions.get(state, spec["parent"]) if spec["parent"] != "operator" else None
    parent = spec["parent"] if parent_row is not None and not parent_row.is_terminal else "operator"
    note = (f"[ov] You were restarted with a fresh session (the earlier one was {spec['state']}); your branch "
            f"{spec['branch']} keeps what was done: " + (f"{len(commits)} commit(s):\n" + "\n".join(
                f"  {c}" for c in commits[:30]) if commits else "no commits yet.")
            + ("\nUncommitted changes in your worktree:\n" + "\n".join(f"  {c}" for c in uncommitted[:30])
               if uncommitted else "") + "\nContinue from there; do not start over." + (f"\n{prompt}" if prompt else ""))
    request = SlingRequest(capability=spec["capability"], task_id=spec["task_id"], name=name,
                           prompt=f"{spec.get('prompt') or ''}\n\n{note}".strip(), files=spec["files"], parent=parent,
                           runtime=spec["runtime"], model=spec["model"], base_branch=spec["base_branch"],
                           start_point=spec.get("base_commit"), scenario=_path(scenario),
                           tmux=spec["tmux"], budget=spec["budget"], approve=spec["approve"], loop=spec["loop"],
                           continue_branch=True)
    result = sling(project, config, state, request, environ)
    return RestartResult(result, str(spec["state"]), commits, uncommitted, archived)


def _record_restart(project: ProjectPaths, name: str, generation: int, spec: dict[str, t.Any]) -> None:
    from overstory.store import events
    from overstory.store.db import open_events

    conn = open_events(project.events_db)
    try:
        events.record(conn, RESTART_EVENT, agent=name, generation=generation,
                      summary=f"restart of {name} (was {spec['state']}) on {spec['branch']}", data=spec)
    finally:
        conn.close()


def _restart_spec(project: ProjectPaths, name: str) -> dict[str, t.Any] | None:
    """The recorded restart of ``name`` whose re-spawn was undone after its session row was replaced."""
    from overstory.store import events
    from overstory.store.db import open_events

    conn = open_events(project.events_db)
    try:
        found = events.query(conn, agent=name, kinds=[RESTART_EVENT], newest=True, limit=1)
    finally:
        conn.close()
    return dict(found[0].data) if found and found[0].data else None


def _done_so_far(project: ProjectPaths, spec: t.Mapping[str, t.Any]) -> tuple[list[str], list[str]]:
    from pathlib import Path

    from overstory.gitutil import git

    since = spec.get("base_commit") or spec.get("base_branch")
    log = git(project.root, "log", "--oneline", "--no-decorate", f"{since}..{spec['branch']}", check=False)
    worktree = Path(spec["worktree"])
    dirty = git(worktree, "status", "--short", check=False).stdout if worktree.is_dir() else ""
    return log.stdout.splitlines() if log.returncode == 0 else [], dirty.splitlines()


def _archive_run_dir(project: ProjectPaths, name: str, generation: int) -> str | None:
    """Keep the earlier run's logs: the re-spawn starts a fresh run dir (``NAME@genN`` is no agent's name)."""
    old, target = project.run_dir / name, project.run_dir / f"{name}@gen{generation}"
    if old.is_dir() and not target.exists():
        old.rename(target)
    return str(target) if target.is_dir() else None
