"""The steps of `ov sling` after its plan: what a spawn does, one named step at a time.

``agents.spawn`` plans a spawn (checks everything, touches nothing) and hands the plan
here. ``run`` opens the spawn journal (``agents.spawn_journal``: the intent, its first
durable act), then takes the steps in order. For each step the loop checks the test hook
that makes it fail (``OV_TEST_FAIL_AT=<name>``), notes the step in the journal before it
acts (a step that must note itself inside its own lock or transaction does so), acts, and
offers the kill point (``OV_TEST_KILL_AT=spawn:<name>``). After the last step the intent
is deleted: that is the commit point. Whatever fails before it is undone, journal first.
"""

from __future__ import annotations

import json
import os
import typing as t
from dataclasses import dataclass, field
from pathlib import Path

from overstory import procs
from overstory.agents import spawn_journal
from overstory.errors import DiskFull, OrchestratorError, SpawnError, StoreError
from overstory.gitutil import common_dir, keep_out_of_commits
from overstory.paths import ProjectPaths
from overstory.store import intents, sessions

if t.TYPE_CHECKING:
    import sqlite3

    from overstory.agents.warm_loop import WarmLoop
    from overstory.config.model import Config
    from overstory.runtimes.base import Runtime

FAULT_ENV = "OV_TEST_FAIL_AT"  # test hook: name of a spawn step that must fail
SPAWN_STEPS = ("branch", "worktree", "instructions", "session", "dispatch", "start")


@dataclass
class SpawnPlan:
    """Everything `ov sling` decided before it touched anything."""

    name: str
    capability: str
    task_id: str
    runtime: str
    adapter: Runtime
    tmux: bool
    prompt: str | None
    key: str | None  # the idempotency key of a sling from inside a turn
    parent: str
    depth: int
    scenario_text: str | None
    scenario_file: str
    branch: str | None  # None: at the project root (the coordinator), no branch and no worktree
    worktree: Path | None
    base_branch: str | None
    base_commit: str | None
    run_id: str | None
    limits: dict[str, t.Any]
    budget_notes: list[str]
    ov_command: list[str]
    ov_bin_dir: str | None
    run_dir: Path
    instructions: str
    home_files: dict[Path, str] | None  # the runtime's own home under the run dir (None: it has none)
    files: list[str]
    write_scope: list[str]  # a writer's --files, enforced by the guard and at merge (empty: none)
    scope_overlaps: list[str]  # other active builders' write scopes it overlaps (a warning)
    continue_branch: bool  # `ov resume --restart`: ov/NAME exists and goes on (not ours to undo)
    reuse_worktree: bool  # ... and so does its worktree (the journal must never remove it)
    model: str | None  # as asked (None: the configuration decides at each turn)
    provider: str
    loop: dict[str, t.Any] | None
    approve: list[str]
    environ: dict[str, str]
    executor: str | None = None  # ov sling --executor (None: config executor.kind at each turn)
    fork_of: dict[str, t.Any] | None = None  # `ov resume --fork`: its source (SlingRequest.fork_of)

    @property
    def tmux_session(self) -> str | None:
        if not self.tmux:
            return None
        from overstory.agents.tmux.server import session_name  # (it imports hashlib: not for a headless spawn)

        return session_name(self.name)


@dataclass
class Spawning:
    """One spawn under way: its plan and what its steps made so far."""

    project: ProjectPaths
    config: Config
    conn: sqlite3.Connection
    plan: SpawnPlan
    intent: dict[str, t.Any] = field(default_factory=dict)
    undo: list[tuple[str, t.Callable[[], None]]] = field(default_factory=list)  # what the journal cannot undo
    started_pids: list[tuple[int, int | None]] = field(default_factory=list)
    launch_env: dict[str, str] = field(default_factory=dict)
    scenario_path: Path | None = None
    generation: int = 0
    dispatch_id: int | None = None
    loop_pid: int | None = None
    warm_loop: WarmLoop | None = None  # a headless loop started early, waiting to be told its generation


@dataclass(frozen=True)
class Step:
    """One step: its journal name (``spawn_journal.STEPS``, also its kill point) and what it does."""

    name: str
    act: t.Callable[[Spawning], None]
    fault: str | None = None  # the OV_TEST_FAIL_AT name checked before the journal note (default: ``name``)
    fault_in: str | None = None  # one checked after the note, before the act
    fault_after: str | None = None  # one checked after the kill point
    notes_itself: bool = False  # the act notes the step in the journal (inside its own lock or transaction)
    kill_point: bool = True


def fault(name: str | None, environ: t.Mapping[str, str]) -> None:
    if name is not None and environ.get(FAULT_ENV) == name:
        raise SpawnError(f"injected failure at step {name!r} ({FAULT_ENV})")


def launch_env(project: ProjectPaths, environ: dict[str, str]) -> dict[str, str]:
    """The environment the new agent's loop (and so its turns) starts from.

    Slung from inside an agent, that is the caller's own launch environment rather than
    its turn's: a turn carries per-agent variables (its provider's ANTHROPIC_BASE_URL and
    key, its identity) that must not leak into a child with another provider.
    """
    caller = environ.get("OVERSTORY_AGENT_NAME")
    if caller:
        from overstory.agents.process import env_file, load_launch_env

        if env_file(project, caller).is_file():
            return load_launch_env(project, caller)
    return environ


# ---- the steps ---------------------------------------------------------------------


def _branch(sp: Spawning) -> None:
    plan = sp.plan
    assert plan.branch is not None
    if not plan.continue_branch:
        spawn_journal.run_git(sp.project.root, "branch", plan.branch, plan.base_commit or plan.base_branch or "")


def _worktree(sp: Spawning) -> None:
    assert sp.plan.worktree is not None and sp.plan.branch is not None
    if sp.plan.reuse_worktree:
        spawn_journal.step(sp.conn, sp.intent, "worktree")  # the step noted like add_worktree does; nothing added
        return
    spawn_journal.add_worktree(sp.project, sp.conn, sp.intent, sp.plan.worktree, sp.plan.branch)  # notes the step


def _instructions(sp: Spawning) -> None:
    """A copy of the instructions in the worktree, for humans (the runtime never reads it), kept out of commits."""
    worktree, runtime = sp.plan.worktree, sp.plan.adapter
    assert worktree is not None
    copy = worktree / runtime.instructions_file
    copy.parent.mkdir(parents=True, exist_ok=True)
    copy.write_text(sp.plan.instructions, encoding="utf-8")
    keep_out_of_commits(worktree, [runtime.instructions_file], common=common_dir(sp.project.root))


def _rundir(sp: Spawning) -> None:
    plan, run_dir = sp.plan, sp.plan.run_dir
    if run_dir.exists():
        import shutil

        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True)
    if plan.home_files is not None:  # the runtime's own home under the run dir: nothing goes into the worktree
        for target, content in plan.home_files.items():
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(content, encoding="utf-8")
        # Their names, so that each turn's sandbox shows them read-only (see sandbox.layout.PINNED_FILES).
        from overstory.sandbox.layout import PINNED_FILES  # (the sandbox package: not for every spawn)

        (run_dir / PINNED_FILES).write_text(json.dumps(sorted(str(p) for p in plan.home_files)), encoding="utf-8")
    else:
        _write_run_files(run_dir, plan.adapter, plan.instructions, ov_command=plan.ov_command, tmux_mode=plan.tmux)
    if plan.scenario_text is not None:
        sp.scenario_path = run_dir / plan.scenario_file  # the player reads by suffix
        sp.scenario_path.write_text(plan.scenario_text, encoding="utf-8")
    from overstory.agents.process import save_launch_env

    sp.launch_env = launch_env(sp.project, plan.environ)
    save_launch_env(sp.project, plan.name, sp.launch_env)
    if not plan.tmux:  # the loop reads this instead of loading the configuration (and pydantic) itself
        from overstory.config.load import write_agent_snapshot

        write_agent_snapshot(sp.project.config_file, sp.project.local_config_file, sp.launch_env, run_dir)
    if plan.fork_of and plan.fork_of.get("session"):
        _import_forked_session(plan)


def _import_forked_session(plan: SpawnPlan) -> None:
    """A fork's first turn continues its source's session: its files are copied now, as they are at the fork,
    into the fork's own state dir (in the run dir: undone with it). Nothing to copy (the source's run dir was
    removed), the first turn's resume fails and it starts a fresh session told what it is, as without a fork."""
    fork = plan.fork_of or {}
    state_dir = plan.adapter.state_dir(plan.run_dir)
    source_dir = Path(fork["state_dir"]) if fork.get("state_dir") else None
    if state_dir is None or source_dir is None or plan.worktree is None:
        return
    try:
        fork["session_copied"] = plan.adapter.import_session(source_dir, Path(fork["cwd"]), state_dir, plan.worktree,
                                                             fork["session"])
    except OSError:
        fork["session_copied"] = False


def _session(sp: Spawning) -> None:
    plan = sp.plan
    spec = {"prompt": plan.prompt, "files": plan.files, "ov_bin_dir": plan.ov_bin_dir,
            **({"write_scope": plan.write_scope} if plan.write_scope else {}),
            "scenario": str(sp.scenario_path) if sp.scenario_path else None, "base_commit": plan.base_commit,
            "idempotency_key": plan.key, **({"loop": plan.loop} if plan.loop else {}),
            **({"approve": plan.approve} if plan.approve else {}),
            **({"executor": plan.executor} if plan.executor else {}),
            **({"fork_of": plan.fork_of} if plan.fork_of else {}),
            # checked out by this spawn (not reused): its first turn starts from exactly that checkout
            **({"new_worktree": True} if plan.worktree is not None and not plan.reuse_worktree else {})}
    sp.generation = sessions.create_session(
        sp.conn, name=plan.name, capability=plan.capability, task_id=plan.task_id, runtime=plan.runtime,
        actor=plan.environ.get("OVERSTORY_AGENT_NAME", "operator"), parent=plan.parent, depth=plan.depth,
        model=plan.model, worktree=str(plan.worktree) if plan.worktree else None, branch=plan.branch,
        base_branch=plan.base_branch, spec=spec, run_id=plan.run_id, mode="tmux" if plan.tmux else "headless",
        tmux_session=plan.tmux_session, provider=plan.provider)
    sp.intent["generation"] = sp.generation
    from overstory.store import budgets

    budgets.create_agent(sp.conn, plan.name, sp.generation, run_id=plan.run_id,
                         limits=plan.limits)  # the journal's undo removes it


def _dispatch(sp: Spawning) -> None:
    from overstory.store import mail
    from overstory.store.db import write_transaction

    plan = sp.plan
    with write_transaction(sp.conn):  # the mail and the note that it exists: one commit
        sp.dispatch_id = mail.insert_message(
            sp.conn, sender=plan.parent, recipient=plan.name, type="dispatch", priority="high",
            subject=f"task {plan.task_id}",
            body=plan.prompt or f"Work on task {plan.task_id} as described in your instructions.",
            payload={"task_id": plan.task_id, "capability": plan.capability, "base_branch": plan.base_branch,
                     "file_scope": plan.files},
        )
        spawn_journal.step(sp.conn, sp.intent, "dispatch", generation=sp.generation, dispatch_id=sp.dispatch_id)


def _start(sp: Spawning) -> None:
    plan = sp.plan
    if plan.tmux:
        from overstory.agents.tmux.session import abort_start, start_agent

        started = start_agent(sp.project, sp.config, sp.conn, plan.name, sp.generation, sp.launch_env)
        sp.undo.append(("start", lambda: abort_start(sp.project, started)))
        sp.loop_pid = started.driver_pid
    else:
        from overstory.agents.process import spawn_loop

        told = sp.warm_loop.go(sp.generation, sp.launch_env) if sp.warm_loop is not None else None
        sp.loop_pid, ticks = told or spawn_loop(sp.project, plan.name, sp.generation, sp.launch_env)
        sp.started_pids.append((sp.loop_pid, ticks))
        sessions.update_fields(sp.conn, plan.name, sp.generation, loop_pid=sp.loop_pid, loop_start_ticks=ticks)


def steps_for(plan: SpawnPlan, *, start: bool) -> list[Step]:
    """The steps of this spawn, in order (at the project root there is no branch, worktree or copy)."""
    steps = []
    if plan.branch is not None:
        steps += [Step("branch", _branch, fault="branch"),
                  Step("worktree", _worktree, fault="worktree", notes_itself=True)]
        if plan.home_files is None:  # ov's files go to the run dir; the worktree gets a copy for humans
            steps.append(Step("instructions", _instructions, fault="instructions"))
    # Where the copy step is absent, a failure injected at "instructions" hits the run dir's files instead.
    writes_instructions = plan.branch is None or plan.home_files is not None
    steps += [Step("rundir", _rundir, fault_in="instructions" if writes_instructions else None, kill_point=False),
              Step("session", _session, fault="session"),
              Step("dispatch", _dispatch, fault="dispatch", notes_itself=True)]
    if start:
        steps.append(Step("start", _start, fault="start", fault_after="after_start"))
    return steps


def run(sp: Spawning, steps: t.Sequence[Step]) -> None:
    """Open the journal, take ``steps``, and commit (delete the intent); on any failure undo and raise."""
    plan, environ = sp.plan, sp.plan.environ
    sp.intent = {"name": plan.name, "pid": os.getpid(), "pid_ticks": procs.start_ticks(os.getpid()),
                 # A continued branch or a reused worktree is not named: the undo must never remove them.
                 "branch": None if plan.continue_branch else plan.branch, "base_commit": plan.base_commit,
                 "worktree": str(plan.worktree) if plan.worktree and not plan.reuse_worktree else None,
                 "run_dir": str(plan.run_dir),
                 "tmux_session": plan.tmux_session, "step": "intent", "started_at": 0}
    spawn_journal.begin(sp.conn, sp.intent)
    sp.intent["started_at"] = (intents.get_spawn(sp.conn, plan.name) or {}).get("started_at", 0)
    spawn_journal.kill_point("intent", environ)
    try:
        for step in steps:
            fault(step.fault, environ)
            if not step.notes_itself:
                spawn_journal.step(sp.conn, sp.intent, step.name)
            fault(step.fault_in, environ)
            step.act(sp)
            if step.kill_point:
                spawn_journal.kill_point(step.name, environ)
            fault(step.fault_after, environ)
        intents.end_spawn(sp.conn, plan.name)  # the commit point: from here on the agent exists
    except BaseException as exc:
        problems = _undo(sp)
        if not isinstance(exc, Exception):
            raise
        raise _spawn_failure(plan.name, exc, problems) from exc


def _undo(sp: Spawning) -> list[str]:
    problems = []
    for label, action in reversed(sp.undo):  # what only this call knows about (a tmux start), last first
        try:
            action()
        except Exception as exc:  # keep undoing the rest
            problems.append(f"undo {label}: {exc}")
    try:
        spawn_journal.undo(sp.project, sp.conn, sp.intent, extra_pids=sp.started_pids)
    except Exception as undo_exc:  # noqa: BLE001 - the intent stays for a retry, `ov stop` or the watchdog
        problems.append(f"undo: {undo_exc}")
        _give_up_intent(sp.conn, sp.plan.name)
    return problems


def _spawn_failure(name: str, exc: Exception, problems: list[str]) -> OrchestratorError:
    """The error a failed spawn reports, after its undo: one line, and a full disk said plainly."""
    text = f"{exc} {getattr(exc, 'stderr', '') or ''}"
    left = f" (but: {'; '.join(problems)}; `ov stop {name}` finishes the cleanup)" if problems else ""
    if isinstance(exc, DiskFull) or "No space left on device" in text or "disk is full" in text:
        return DiskFull(f"no space left on device: the spawn of {name} was undone, nothing was written{left}")
    if str(exc).startswith("no such table:"):
        return StoreError(f"could not spawn {name}: ov's state database has no table {str(exc)[15:]!r}: it is "
                          f"damaged; run `ov doctor` (the spawn was undone){left}")
    if isinstance(exc, OrchestratorError):
        if problems:
            exc.args = (f"{exc}{left}",)
        return exc
    stderr = getattr(exc, "stderr", None)
    detail = f"{exc}: {stderr.strip()}" if isinstance(stderr, str) and stderr.strip() else str(exc)
    return SpawnError(f"could not spawn {name}: {detail}{left}")


def _give_up_intent(conn: sqlite3.Connection, name: str) -> None:
    """Our undo failed half-way: leave the intent to whoever comes next (a dead pid)."""
    try:
        intents.abandon_spawn(conn, name)
    except Exception:  # noqa: BLE001 - after we exit our pid is dead anyway
        pass


def _write_run_files(run_dir: Path, runtime: Runtime, instructions: str, *, ov_command: list[str],
                     tmux_mode: bool) -> None:
    """The instructions and hook settings in the agent's run dir (ov's, read-only in its sandbox): the
    runtime gets both on every command line, so nothing the agent writes in its worktree can replace them."""
    (run_dir / runtime.run_instructions_file).write_text(instructions, encoding="utf-8")
    settings = runtime.hook_settings(ov_command, tmux_mode=tmux_mode)
    if settings is not None:
        (run_dir / runtime.run_settings_file).write_text(json.dumps(settings, indent=2), encoding="utf-8")
