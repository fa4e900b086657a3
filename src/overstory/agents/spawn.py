"""`ov sling`: spawning an agent is a transaction, in three phases.

Plan (``plan_sling``): check everything and decide everything, touching nothing. Steps
(``agents.spawn_steps``): the spawn's first durable act is a record of intent
(``agents.spawn_journal``); each named step notes itself there before acting. If a step fails, what was done is undone and the intent deleted, so no
branch, worktree, session row, mail or process is left behind and the same command can simply
be run again. If the spawner is killed instead, the intent remains with its dead pid, and a
retry, `ov stop NAME` or the watchdog undoes it. Settle: once the intent is deleted (the commit
point) the spawn event and the dispatch mail's sent record are written; losing them undoes nothing.
The events database is checked (readable, its tables, writable) in the plan: the agent's loop needs it.
Before the plan, an earlier `ov sling` of the same name that was killed half-way is undone.
"""

from __future__ import annotations

import os
import typing as t
from dataclasses import dataclass, field
from pathlib import Path

from overstory.agents import scopes, spawn_journal, spawn_steps
from overstory.agents.spawn_steps import FAULT_ENV as FAULT_ENV  # the tests' names for the hooks
from overstory.agents.spawn_steps import SPAWN_STEPS as SPAWN_STEPS
from overstory.capabilities import SLINGERS as SLINGING_CAPABILITIES
from overstory.capabilities import WRITERS as WRITER_CAPABILITIES
from overstory.errors import (
    AgentExists,
    DiskFull,
    HierarchyError,
    OrchestratorError,
    SpawnError,
    UsageError,
)
from overstory.gitutil import branch_refs, current_branch, git
from overstory.names import validate_name
from overstory.paths import ProjectPaths
from overstory.resources import ov_executable
from overstory.runtimes import get_runtime
from overstory.store import sessions
from overstory.store.sessions import CAPABILITIES
from overstory.wire import SlingRequest  # the request's one shape (also its wire shape)

if t.TYPE_CHECKING:
    import sqlite3

    from overstory.agents.warm_loop import WarmLoop
    from overstory.config.model import Config
    from overstory.runtimes.base import Runtime



@dataclass
class SlingResult:
    """What `ov sling` made: the agent, where it works and how its turns run (its JSON output).

    (A docstring of its own: without one, dataclasses imports inspect to write one, 4 ms of every sling.)"""

    name: str
    capability: str
    task_id: str
    generation: int
    branch: str | None
    worktree: str | None
    parent: str
    depth: int
    runtime: str
    loop_pid: int | None
    run_id: str | None = None
    dispatch_mail_id: int | None = None
    mode: str = "headless"
    tmux_session: str | None = None
    budget: dict[str, t.Any] = field(default_factory=dict)
    budget_notes: list[str] = field(default_factory=list)
    scope_overlaps: list[str] = field(default_factory=list)  # other active builders' write scopes it overlaps

    def as_dict(self) -> dict[str, t.Any]:
        return dict(self.__dict__)


def resolve_parent(request: SlingRequest, conn: sqlite3.Connection, config: Config,
                   environ: t.Mapping[str, str]) -> tuple[str, int]:
    """Who the new agent reports to and its depth; enforces who may spawn and how deep."""
    caller = environ.get("OVERSTORY_AGENT_NAME")
    parent = request.parent or caller or "operator"
    if caller:
        me = sessions.get(conn, caller)
        capability = me.capability if me else environ.get("OVERSTORY_CAPABILITY", "")
        if capability not in SLINGING_CAPABILITIES:
            raise HierarchyError(f"{caller} is a {capability or 'unknown agent'}: only coordinator and lead agents may "
                                 "sling; ask your parent with `ov mail send --type question` instead")
        if parent != caller:
            from overstory.agents.hierarchy import is_descendant

            if not is_descendant(conn, parent, caller):
                raise HierarchyError(f"{caller} may only sling its own children (or children of its descendants); "
                                     f"--parent {parent} is outside its part of the hierarchy")
    if parent == "operator":
        return parent, 0
    parent_row = sessions.get(conn, parent)
    if parent_row is None:
        raise HierarchyError(f"parent {parent!r} is not an active agent: {sessions.no_agent_named(conn, parent)}")
    if parent_row.is_terminal:
        raise HierarchyError(f"parent {parent!r} is not an active agent")
    depth = parent_row.depth + 1
    if depth > config.agents.max_depth:
        raise HierarchyError(f"{parent} is at depth {parent_row.depth}; a child would be at depth {depth}, beyond "
                             f"agents.max_depth = {config.agents.max_depth}")
    children = sessions.count_active_children(conn, parent)
    if children >= config.agents.max_children_per_lead:
        raise HierarchyError(f"{parent} already has {children} active children "
                             f"(agents.max_children_per_lead = {config.agents.max_children_per_lead})")
    return parent, depth


def sling(project: ProjectPaths, config: Config, conn: sqlite3.Connection, request: SlingRequest,
          environ: t.Mapping[str, str] | None = None, *, start: bool = True,
          warm_loop: WarmLoop | None = None) -> SlingResult:
    """Spawn an agent: plan it (touching nothing), take the named steps (``agents.spawn_steps``), settle.

    ``warm_loop``: the agent's loop, already started by the caller (``agents.warm_loop``) as early as it could,
    with the launch environment ``spawn_steps.launch_env`` gives; else one is started here for a headless
    agent. Either way it is ended, having touched nothing, when the spawn fails or does not need it."""
    warm = warm_loop
    try:
        environ = dict(os.environ if environ is None else environ)
        capability = request.capability
        if capability not in CAPABILITIES:
            raise UsageError(f"unknown capability {capability!r}; choose one of: {', '.join(CAPABILITIES)}")
        task_id = validate_name(request.task_id, "task id")
        files = scopes.checked_files(request.files)  # a bad pattern is a usage error before anything else
        name = validate_name(request.name if request.name is not None else f"{capability}-{task_id}", "agent name")
        if request.group is not None:  # an unknown group: refused before anything is made
            from overstory.store import groups

            groups.get(conn, validate_name(request.group, "group name"))
        spawn_journal.settle_abandoned(project, conn, name)  # a killed `ov sling NAME` is undone first
        if warm is None and start and not (config.runtime.tmux if request.tmux is None else request.tmux):
            from overstory.agents.warm_loop import WarmLoop

            warm = WarmLoop(project, name, spawn_steps.launch_env(project, environ),  # starts while we plan and build
                            runtime=request.runtime or config.runtime_for(capability))
        plan = plan_sling(project, config, conn, request, environ, name=name, task_id=task_id, files=files)
        if isinstance(plan, SlingResult):
            return plan  # a retried turn slinging again: the agent it already started
        spawning = spawn_steps.Spawning(project, config, conn, plan, warm_loop=warm if start else None)
        spawn_steps.run(spawning, spawn_steps.steps_for(plan, start=start))
    finally:
        if warm is not None:
            warm.discard()  # unused (a failed spawn, a tmux one): it exits, having touched nothing
    # Settle: after the commit point, so nothing here may undo (or fail) the spawn.
    _record_spawn_event(project, name, spawning.generation, capability, task_id, plan.parent)
    from overstory.store import mail

    mail.record_sent(conn, [spawning.dispatch_id] if spawning.dispatch_id is not None else [])
    if request.group is not None:  # killed before this: the agent runs outside its group (`ov group add` puts it in)
        from overstory.store import groups

        groups.add(conn, request.group, [name])
    return SlingResult(name=name, capability=capability, task_id=task_id, generation=spawning.generation,
                       branch=plan.branch, worktree=str(plan.worktree) if plan.worktree else None, parent=plan.parent,
                       depth=plan.depth, runtime=plan.runtime, loop_pid=spawning.loop_pid, run_id=plan.run_id,
                       dispatch_mail_id=spawning.dispatch_id, mode="tmux" if plan.tmux else "headless",
                       tmux_session=plan.tmux_session, budget=plan.limits, budget_notes=plan.budget_notes,
                       scope_overlaps=plan.scope_overlaps)


def plan_sling(project: ProjectPaths, config: Config, conn: sqlite3.Connection, request: SlingRequest,
               environ: dict[str, str], *, name: str, task_id: str,
               files: list[str]) -> spawn_steps.SpawnPlan | SlingResult:
    """Check everything a spawn of ``name`` needs and decide all it will do; creates nothing, writes no row.

    Returns the agent an earlier identical sling from the same turn started instead, when there is one.
    """
    capability = request.capability
    runtime = request.runtime or config.runtime_for(capability)
    adapter = get_runtime(runtime)  # an unknown name is a usage error naming the known ones
    adapter.program(config)  # fails early and clearly if the runtime is not installed
    tmux = _tmux_mode(request, config, adapter) if request.loop is None else False  # iterations are headless
    _check_executor(request.executor, tmux, config)
    from overstory.agents.models import model_choice, provider_of

    model, _ = model_choice(request.model, capability, config, spawn_steps.launch_env(project, environ),
                            runtime)  # unknown provider, missing key
    prompt = request.prompt
    if request.spec_file is not None:
        prompt = _read_text_file(request.spec_file, "--spec")
    from overstory.store.dispatch import agent_key

    key = agent_key(environ, "sling", capability, task_id, name, prompt, list(request.files), request.parent,
                    request.runtime, request.model, request.base_branch, request.at_project_root, request.start_point)
    existing = sessions.get(conn, name)
    if key is not None and existing is not None and existing.spec.get("idempotency_key") == key:
        return _result_of(conn, existing)
    if existing is not None and not existing.is_terminal:
        raise AgentExists(f"agent {name} is already active (state {existing.state}); stop it with `ov stop {name}` "
                          "or choose another --name")
    parent, depth = resolve_parent(request, conn, config, environ)
    active = sessions.count_active(conn)
    if active >= config.agents.max_concurrent_agents:
        raise HierarchyError(f"{active} agents are active (agents.max_concurrent_agents = "
                             f"{config.agents.max_concurrent_agents}); wait for some to finish or stop them")
    scenario_text = request.scenario_text
    if scenario_text is None and request.scenario is not None:
        scenario_text = _read_text_file(request.scenario, "--scenario")
    from overstory.agents.scenario import checked_scenario

    scenario_text, scenario_file = checked_scenario(adapter, scenario_text, request.scenario or request.scenario_name,
                                                    capability=capability, task_id=task_id)
    at_root, reuse_worktree = request.at_project_root, False
    branch = None if at_root else f"ov/{name}"
    worktree = None if at_root else project.worktree(name)
    base_branch = request.base_branch or current_branch(project.root)
    tips: dict[str, str] = {}
    if not at_root:
        if base_branch is None:
            raise SpawnError("the project is on a detached HEAD; check out a branch or pass --base-branch")
        refs = branch_refs(project.root, base_branch, branch)  # type: ignore[arg-type]
        tips = {name: commit for name, (kind, commit) in refs.items() if kind == "commit"}
        if base_branch not in refs:
            raise UsageError(f"base branch {base_branch!r} does not exist")
        if request.continue_branch:  # neither is ours to undo: the intent names neither the branch nor a reused tree
            reuse_worktree = spawn_journal.continuation(project, branch, worktree)  # type: ignore[arg-type]
        elif branch in refs:
            raise SpawnError(f"branch {branch} already exists (left by an earlier {name}); merge it, `ov resume {name} "
                             f"--restart` it, delete it with `ov stop {name} --clean`, or choose another --name")
        elif worktree.exists():  # type: ignore[union-attr]
            raise SpawnError(f"{worktree} already exists; remove it or choose another --name")
    _require_events_db(project, name)
    run_id = _open_run_id(conn)
    write_scope = scopes.write_scope_of(capability, files)
    scope_overlaps = scopes.overlaps_with(sessions.list_sessions(conn, include_terminal=False), run_id, name,
                                          write_scope)
    if scope_overlaps and config.agents.exclusive_scopes:
        raise SpawnError(f"{'; '.join(scope_overlaps)}, and agents.exclusive_scopes is on: give {name} other "
                         "--files, or wait for the other builder to finish; nothing was created")
    from overstory.agents.budgeting import agent_limits

    limits, budget_notes = agent_limits(conn, config, run_id, request.budget, adapter, capability=request.capability)
    ov_command, ov_bin_dir = ov_executable()
    run_dir = project.run_dir / name
    # A fork (``start_point``) starts at another agent's checkpoint instead of the base branch's tip.
    base_commit = None if at_root else (  # the base branch's tip as read above, unless a start point is named
        tips.get(base_branch) if request.start_point is None and base_branch in tips  # type: ignore[arg-type]
        else _commit_of(project, base_branch, request.start_point))  # type: ignore[arg-type]
    # Rendered before anything exists: a broken template leaves nothing to undo.
    instructions = _instructions_text(project, name=name, capability=capability, task_id=task_id,
                                      branch=branch or base_branch or "", base_branch=base_branch or "",
                                      worktree=worktree or project.root, parent=parent, prompt=prompt or "",
                                      files=files, own_agent_tools=adapter.own_agent_tools)
    home_files = _state_files(project, run_dir, adapter, name=name, capability=capability, task_id=task_id,
                              worktree=worktree, branch=branch or base_branch or "", base_branch=base_branch or "",
                              parent=parent, prompt=prompt or "", files=files, ov_command=ov_command,
                              tmux_mode=tmux, model=model)
    return spawn_steps.SpawnPlan(
        name=name, capability=capability, task_id=task_id, runtime=runtime, adapter=adapter, tmux=tmux, prompt=prompt,
        key=key, parent=parent, depth=depth, scenario_text=scenario_text, scenario_file=scenario_file, branch=branch,
        worktree=worktree, base_branch=base_branch, base_commit=base_commit, run_id=run_id, limits=limits,
        budget_notes=budget_notes, ov_command=ov_command, ov_bin_dir=ov_bin_dir, run_dir=run_dir,
        instructions=instructions, home_files=home_files, files=files, write_scope=write_scope,
        scope_overlaps=scope_overlaps, continue_branch=request.continue_branch,
        reuse_worktree=reuse_worktree, model=request.model,
        provider=provider_of(request.model, capability, config, runtime), loop=request.loop,
        approve=list(request.approve), environ=environ, executor=request.executor,
        fork_of=dict(request.fork_of) if request.fork_of else None)


def _read_text_file(path: Path, option: str) -> str:
    from overstory.limits import read_at_most
    from overstory.store.mail import MAX_BODY_BYTES

    data = read_at_most(str(path), MAX_BODY_BYTES, f"{option} {path}")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UsageError(f"{option} {path} is not UTF-8 text (byte {exc.start})") from None


def _require_events_db(project: ProjectPaths, name: str) -> None:
    """The agent's loop records its events there: refuse before creating anything if it is unusable."""
    from overstory.store.db import events_write_refused, open_events
    from overstory.store.events_migrations import EVENTS_MIGRATIONS
    from overstory.store.schema import missing_objects

    try:
        conn = open_events(project.events_db)
    except DiskFull as exc:
        raise DiskFull(f"cannot spawn {name}: {exc}") from None
    except OrchestratorError as exc:
        raise SpawnError(f"cannot spawn {name}: {exc} (the agent's loop needs it; run `ov doctor`); "
                         "nothing was created") from None
    try:
        missing = [obj for kind, obj in missing_objects(conn, EVENTS_MIGRATIONS) if kind == "table"]
        unwritable = None if missing else events_write_refused(conn)
    finally:
        conn.close()
    if unwritable:
        raise SpawnError(f"cannot spawn {name}: {project.events_db} cannot be written ({unwritable}; the agent's "
                         "loop needs it); nothing was created")
    if missing:
        raise SpawnError(f"cannot spawn {name}: {project.events_db} has no table {', '.join(missing)} (the agent's "
                         "loop needs it; `ov doctor --repair` recreates it); nothing was created")


def _commit_of(project: ProjectPaths, branch: str, start_point: str | None = None) -> str:
    ref = start_point or f"refs/heads/{branch}"
    done = git(project.root, "rev-parse", "--verify", "-q", f"{ref}^{{commit}}", check=False)
    if done.returncode != 0 or not done.stdout.strip():
        raise UsageError(f"start point {start_point!r} is not a commit" if start_point else
                         f"base branch {branch!r} does not exist")
    return done.stdout.strip()


def _result_of(conn: sqlite3.Connection, agent: sessions.Session) -> SlingResult:
    """What the first `ov sling` of this agent printed (a retried turn slings it again)."""
    from overstory.store import budgets
    from overstory.store.mail_queries import first_dispatch_since

    dispatch_id = first_dispatch_since(conn, agent.name, agent.created_at)  # this generation's
    limits = budgets.get_agent(conn, agent.name, agent.generation)
    budget = {k: getattr(limits, k) for k in ("max_usd", "max_turns", "max_tool_calls", "max_wallclock")} \
        if limits is not None else {}
    return SlingResult(name=agent.name, capability=agent.capability, task_id=agent.task_id,
                       generation=agent.generation, branch=agent.branch, worktree=agent.worktree, parent=agent.parent,
                       depth=agent.depth, runtime=agent.runtime, loop_pid=agent.loop_pid, run_id=agent.run_id,
                       dispatch_mail_id=dispatch_id, mode=agent.mode, tmux_session=agent.tmux_session,
                       budget=budget)


def _check_executor(executor: str | None, tmux: bool, config: Config) -> None:
    """``--executor``: a known kind, configured; a tmux agent's TUI runs here, so only with ``local``. The kind
    its turns will use (``--executor``, else config ``executor.kind``) must be loadable: ray needs its extra."""
    from overstory.executors import EXECUTOR_KINDS, check_available

    if not tmux:
        check_available(executor or config.executor.kind)
    if executor is None:
        return

    if executor not in EXECUTOR_KINDS:
        raise UsageError(f"unknown executor {executor!r}; choose one of: {', '.join(EXECUTOR_KINDS)}")
    if tmux and executor != "local":
        raise UsageError(f"--executor {executor} runs headless turns; a --tmux agent runs on this machine")
    if executor == "ray" and not config.executor.ray.address:
        raise UsageError("--executor ray needs executor.ray.address (HOST:PORT of a running cluster) in the config")


def _tmux_mode(request: SlingRequest, config: Config, runtime: Runtime) -> bool:
    """--tmux (or runtime.tmux in config) runs the runtime's TUI in tmux; a runtime without one stays headless."""
    wanted = config.runtime.tmux if request.tmux is None else request.tmux
    if not wanted:
        return False
    if runtime.tui is None:
        if request.tmux:
            raise UsageError(f"--tmux runs the runtime's interactive TUI; the {runtime.name} runtime is headless only")
        return False
    from overstory.agents.tmux.server import tmux_available

    if not tmux_available():
        from overstory.errors import RuntimeNotAvailable

        raise RuntimeNotAvailable("tmux mode needs tmux on PATH (apt install tmux / brew install tmux)")
    return True


def _open_run_id(conn: sqlite3.Connection) -> str | None:
    from overstory.store.runs import open_run

    run = open_run(conn)
    return run.id if run is not None else None


def _instructions_text(project: ProjectPaths, *, name: str, capability: str, task_id: str, branch: str,
                       base_branch: str, worktree: Path, parent: str, prompt: str, files: t.Sequence[str],
                       own_agent_tools: str | None = None) -> str:
    from overstory.agents.overlay import render_file_scope, render_instructions
    from overstory.resources import shipped_agents_dir, shipped_templates_dir

    agents_dir = project.agents_dir if project.agents_dir.is_dir() and any(project.agents_dir.iterdir()) else shipped_agents_dir()
    templates_dir = project.templates_dir if project.templates_dir.is_dir() and any(project.templates_dir.iterdir()) else shipped_templates_dir()
    context = {
        "agent_name": name, "capability": capability, "task_id": task_id, "branch": branch,
        "base_branch": base_branch, "worktree": str(worktree), "parent": parent, "prompt": prompt,
        "file_scope": render_file_scope(files, enforced=capability in WRITER_CAPABILITIES),
        "access": "read-write inside your worktree" if capability in WRITER_CAPABILITIES else "read-only",
    }
    return render_instructions(capability, context, agents_dir=agents_dir, templates_dir=templates_dir,
                               own_agent_tools=own_agent_tools)


def _state_files(project: ProjectPaths, run_dir: Path, runtime: Runtime, *, name: str, capability: str,
                 task_id: str, worktree: Path | None, branch: str, base_branch: str, parent: str, prompt: str,
                 files: t.Sequence[str], ov_command: list[str], tmux_mode: bool,
                 model: str | None) -> dict[Path, str] | None:
    """The files of a runtime that reads the agent's instructions and hook config from an ov-owned home of its
    own (CODEX_HOME, ...), by absolute path; None when it reads them from the worktree (or the run dir)."""
    from overstory.runtimes.base import AgentSetup

    state_dir = runtime.state_dir(run_dir)
    if state_dir is None:
        return None
    text = _instructions_text(project, name=name, capability=capability, task_id=task_id, branch=branch,
                              base_branch=base_branch, worktree=worktree or project.root, parent=parent, prompt=prompt,
                              files=files)
    written = runtime.state_files(AgentSetup(
        name=name, capability=capability, writable=capability in WRITER_CAPABILITIES, project_root=project.root,
        worktree=worktree, run_dir=run_dir, instructions=text, ov_command=ov_command, tmux_mode=tmux_mode,
        model=model))
    return None if written is None else {state_dir / relative: content for relative, content in written.items()}


def _record_spawn_event(project: ProjectPaths, name: str, generation: int, capability: str, task_id: str,
                        parent: str) -> None:
    """After the commit point: losing this event must not undo (or fail) a spawn that happened."""
    import sqlite3 as sqlite

    from overstory.store import events as event_store
    from overstory.store.db import open_events

    try:
        conn = open_events(project.events_db)
    except OrchestratorError:
        return
    try:
        event_store.record(conn, "spawn", agent=name, generation=generation,
                           summary=f"{capability} on {task_id}, parent {parent}")
    except (sqlite.Error, OrchestratorError, OSError):
        pass
    finally:
        conn.close()
