"""`ov sling`: spawning an agent is a transaction.

Its first durable act is a record of intent (``agents.spawn_journal``); each step notes itself
there before acting. If a step fails, what was done is undone and the intent deleted, so no
branch, worktree, session row, mail or process is left behind and the same command can simply
be run again. If the spawner is killed instead, the intent remains with its dead pid, and a
retry, `ov stop NAME` or the watchdog undoes it. The events database is checked (readable,
its tables, writable) first: the agent's loop needs it.
"""

from __future__ import annotations

import json
import os
import shutil
import typing as t
from dataclasses import dataclass, field
from pathlib import Path

from overstory import procs
from overstory.agents import spawn_journal
from overstory.capabilities import SLINGERS as SLINGING_CAPABILITIES
from overstory.capabilities import WRITERS as WRITER_CAPABILITIES
from overstory.errors import (
    AgentExists,
    DiskFull,
    HierarchyError,
    OrchestratorError,
    SpawnError,
    StoreError,
    UsageError,
)
from overstory.gitutil import branch_exists, current_branch, git, keep_out_of_commits
from overstory.names import validate_name
from overstory.paths import ProjectPaths
from overstory.resources import ov_executable
from overstory.runtimes import get_runtime
from overstory.sandbox.layout import PINNED_FILES
from overstory.store import intents, sessions
from overstory.store.sessions import CAPABILITIES

if t.TYPE_CHECKING:
    import sqlite3

    from overstory.config import Config
    from overstory.runtimes.base import Runtime

FAULT_ENV = "OV_TEST_FAIL_AT"  # test hook: name of a spawn step that must fail
SPAWN_STEPS = ("branch", "worktree", "instructions", "session", "dispatch", "start")


@dataclass
class SlingRequest:
    capability: str
    task_id: str
    name: str | None = None
    prompt: str | None = None
    spec_file: Path | None = None
    files: t.Sequence[str] = ()
    parent: str | None = None
    runtime: str | None = None
    model: str | None = None
    base_branch: str | None = None
    scenario: Path | None = None
    scenario_text: str | None = None  # the scenario itself (an agent's sling through its endpoint sends the text)
    scenario_name: str | None = None  # the file scenario_text came from (its suffix says YAML or JSON)
    at_project_root: bool = False  # the coordinator works at the root, with no worktree
    start_point: str | None = None  # the commit the new branch starts at (default: the base branch's tip)
    tmux: bool | None = None  # run the interactive TUI in tmux (None: config runtime.tmux)
    budget: dict[str, t.Any] | None = None  # max_usd, max_turns, max_tool_calls, max_wallclock (None: config)
    approve: t.Sequence[str] = ()  # tool patterns whose calls need approval (ov sling --approve)
    loop: dict[str, t.Any] | None = None  # an `ov loop`'s definition (agents.loop_spec): it works in iterations
    continue_branch: bool = False  # `ov resume NAME --restart`: its existing ov/NAME branch (and worktree) go on


@dataclass
class SlingResult:
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

    def as_dict(self) -> dict[str, t.Any]:
        return dict(self.__dict__)


@dataclass
class _Undo:
    steps: list[tuple[str, t.Callable[[], None]]] = field(default_factory=list)

    def push(self, label: str, action: t.Callable[[], None]) -> None:
        self.steps.append((label, action))

    def run(self) -> list[str]:
        problems = []
        for label, action in reversed(self.steps):
            try:
                action()
            except Exception as exc:  # keep undoing the rest
                problems.append(f"undo {label}: {exc}")
        return problems


def _fault(step: str, environ: t.Mapping[str, str]) -> None:
    if environ.get(FAULT_ENV) == step:
        raise SpawnError(f"injected failure at step {step!r} ({FAULT_ENV})")


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
    children = conn.execute(
        "SELECT count(*) FROM sessions WHERE parent = ? AND state NOT IN ('completed', 'zombie')", (parent,)
    ).fetchone()[0]
    if children >= config.agents.max_children_per_lead:
        raise HierarchyError(f"{parent} already has {children} active children "
                             f"(agents.max_children_per_lead = {config.agents.max_children_per_lead})")
    return parent, depth


def sling(project: ProjectPaths, config: Config, conn: sqlite3.Connection, request: SlingRequest,
          environ: t.Mapping[str, str] | None = None, *, start: bool = True) -> SlingResult:
    environ = dict(os.environ if environ is None else environ)
    capability = request.capability
    if capability not in CAPABILITIES:
        raise UsageError(f"unknown capability {capability!r}; choose one of: {', '.join(CAPABILITIES)}")
    task_id = validate_name(request.task_id, "task id")
    name = validate_name(request.name if request.name is not None else f"{capability}-{task_id}", "agent name")
    spawn_journal.settle_abandoned(project, conn, name)  # a killed `ov sling NAME` is undone first
    runtime = request.runtime or config.runtime_for(capability)
    adapter = get_runtime(runtime)  # an unknown name is a usage error naming the known ones
    adapter.program(config)  # fails early and clearly if the runtime is not installed
    tmux = _tmux_mode(request, config, adapter) if request.loop is None else False  # iterations are headless
    from overstory.agents.turns import model_choice

    model, _ = model_choice(request.model, capability, config, _launch_env(project, environ),
                            runtime)  # unknown provider, missing key
    prompt = request.prompt
    if request.spec_file is not None:
        prompt = _read_text_file(request.spec_file, "--spec")
    from overstory.store.dispatch import agent_key

    key = agent_key(environ, "sling", capability, task_id, name, prompt, list(request.files), request.parent,
                    request.runtime, request.model, request.base_branch, request.at_project_root, request.start_point)
    existing = sessions.get(conn, name)
    if key is not None and existing is not None and existing.spec.get("idempotency_key") == key:
        return _result_of(conn, existing)  # a retried turn slinging again: the agent it already started
    if existing is not None and not existing.is_terminal:
        raise AgentExists(f"agent {name} is already active (state {existing.state}); stop it with `ov stop {name}` "
                          "or choose another --name")
    parent, depth = resolve_parent(request, conn, config, environ)
    active = conn.execute("SELECT count(*) FROM sessions WHERE state NOT IN ('completed','zombie')").fetchone()[0]
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
    if not at_root:
        if base_branch is None:
            raise SpawnError("the project is on a detached HEAD; check out a branch or pass --base-branch")
        if not branch_exists(project.root, base_branch):
            raise UsageError(f"base branch {base_branch!r} does not exist")
        if request.continue_branch:  # neither is ours to undo: the intent names neither the branch nor a reused tree
            reuse_worktree = spawn_journal.continuation(project, branch, worktree)  # type: ignore[arg-type]
        elif branch_exists(project.root, branch):  # type: ignore[arg-type]
            raise SpawnError(f"branch {branch} already exists (left by an earlier {name}); merge it, `ov resume {name} "
                             f"--restart` it, delete it with `ov stop {name} --clean`, or choose another --name")
        elif worktree.exists():  # type: ignore[union-attr]
            raise SpawnError(f"{worktree} already exists; remove it or choose another --name")

    _require_events_db(project, name)
    run_id = _open_run_id(conn)
    from overstory.agents.budgeting import agent_limits
    from overstory.agents.turns import provider_of

    limits, budget_notes = agent_limits(conn, config, run_id, request.budget, adapter, capability=request.capability)
    ov_command, ov_bin_dir = ov_executable()
    run_dir = project.run_dir / name
    # A fork (``start_point``) starts at another agent's checkpoint instead of the base branch's tip.
    base_commit = None if at_root else _commit_of(project, base_branch, request.start_point)  # type: ignore[arg-type]
    intent: dict[str, t.Any] = {
        "name": name, "pid": os.getpid(), "pid_ticks": procs.start_ticks(os.getpid()),
        "branch": None if request.continue_branch else branch, "base_commit": base_commit,
        "worktree": str(worktree) if worktree and not reuse_worktree else None, "run_dir": str(run_dir),
        "tmux_session": _tmux_session_name(name) if tmux else None, "step": "intent", "started_at": 0,
    }
    # Rendered before anything exists: a broken template leaves nothing to undo.
    instructions = _instructions_text(project, name=name, capability=capability, task_id=task_id,
                                      branch=branch or base_branch or "", base_branch=base_branch or "",
                                      worktree=worktree or project.root, parent=parent, prompt=prompt or "",
                                      files=request.files)
    spawn_journal.begin(conn, intent)
    intent["started_at"] = (intents.get_spawn(conn, name) or {}).get("started_at", 0)
    spawn_journal.kill_point("intent", environ)
    undo = _Undo()  # what the journal cannot undo by itself: processes only this call knows about
    started_pids: list[tuple[int, int | None]] = []
    try:
        if not at_root:
            assert worktree is not None and branch is not None
            _fault("branch", environ)
            spawn_journal.step(conn, intent, "branch")
            if not request.continue_branch:
                spawn_journal.run_git(project.root, "branch", branch, base_commit or base_branch)
            spawn_journal.kill_point("branch", environ)
            _fault("worktree", environ)
            if not reuse_worktree:
                spawn_journal.add_worktree(project, conn, intent, worktree, branch)  # notes the step first
            spawn_journal.kill_point("worktree", environ)
            home_files = _state_files(project, run_dir, adapter, name=name, capability=capability, task_id=task_id,
                                      worktree=worktree, branch=branch, base_branch=base_branch or "", parent=parent,
                                      prompt=prompt or "", files=request.files, ov_command=ov_command, tmux_mode=tmux,
                                      model=model)
            if home_files is None:  # ov's files go to the run dir (below); the worktree gets a copy for humans
                _fault("instructions", environ)
                spawn_journal.step(conn, intent, "instructions")
                _write_worktree_copy(worktree, adapter, instructions)
                spawn_journal.kill_point("instructions", environ)
        else:
            home_files = _state_files(project, run_dir, adapter, name=name, capability=capability, task_id=task_id,
                                      worktree=None, branch=base_branch or "", base_branch=base_branch or "",
                                      parent=parent, prompt=prompt or "", files=request.files, ov_command=ov_command,
                                      tmux_mode=tmux, model=model)
        spawn_journal.step(conn, intent, "rundir")
        if run_dir.exists():
            shutil.rmtree(run_dir)
        run_dir.mkdir(parents=True)
        if home_files is not None:  # the runtime's own home under the run dir: nothing goes into the worktree
            _fault("instructions", environ)
            for target, content in home_files.items():
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_text(content, encoding="utf-8")
            # Their names, so that each turn's sandbox shows them read-only (see sandbox.layout.PINNED_FILES).
            (run_dir / PINNED_FILES).write_text(json.dumps(sorted(str(p) for p in home_files)), encoding="utf-8")
        else:
            if at_root:
                _fault("instructions", environ)
            _write_run_files(run_dir, adapter, instructions, ov_command=ov_command, tmux_mode=tmux)
        scenario_path = None
        if scenario_text is not None:
            scenario_path = run_dir / scenario_file  # the player reads by suffix
            scenario_path.write_text(scenario_text, encoding="utf-8")
        from overstory.agents.process import save_launch_env

        launch_env = _launch_env(project, environ)
        save_launch_env(project, name, launch_env)
        if not tmux:  # the loop reads this instead of loading the configuration (and pydantic) itself
            from overstory.config import write_agent_snapshot

            write_agent_snapshot(project.config_file, project.local_config_file, launch_env, run_dir)
        _fault("session", environ)
        spawn_journal.step(conn, intent, "session")
        spec = {"prompt": prompt, "files": list(request.files), "ov_bin_dir": ov_bin_dir,
                "scenario": str(scenario_path) if scenario_path else None, "base_commit": base_commit,
                "idempotency_key": key, **({"loop": request.loop} if request.loop else {}),
                **({"approve": list(request.approve)} if request.approve else {})}
        generation = sessions.create_session(
            conn, name=name, capability=capability, task_id=task_id, runtime=runtime, actor=environ.get(
                "OVERSTORY_AGENT_NAME", "operator"), parent=parent, depth=depth, model=request.model,
            worktree=str(worktree) if worktree else None, branch=branch, base_branch=base_branch, spec=spec,
            run_id=run_id, mode="tmux" if tmux else "headless",
            tmux_session=_tmux_session_name(name) if tmux else None,
            provider=provider_of(request.model, capability, config, runtime))
        intent["generation"] = generation
        from overstory.store import budgets

        budgets.create_agent(conn, name, generation, run_id=run_id, limits=limits)  # the journal's undo removes it
        spawn_journal.kill_point("session", environ)
        _fault("dispatch", environ)
        from overstory.store import mail
        from overstory.store.db import write_transaction

        with write_transaction(conn):  # the mail and the note that it exists: one commit
            dispatch_id = mail.insert_message(
                conn, sender=parent, recipient=name, type="dispatch", priority="high",
                subject=f"task {task_id}",
                body=prompt or f"Work on task {task_id} as described in your instructions.",
                payload={"task_id": task_id, "capability": capability, "base_branch": base_branch,
                         "file_scope": list(request.files)},
            )
            spawn_journal.step(conn, intent, "dispatch", generation=generation, dispatch_id=dispatch_id)
        spawn_journal.kill_point("dispatch", environ)
        loop_pid = None
        if start:
            _fault("start", environ)
            spawn_journal.step(conn, intent, "start")
            if tmux:
                from overstory.agents.tmux import abort_start, start_agent

                started = start_agent(project, config, conn, name, generation, launch_env)
                undo.push("start", lambda: abort_start(project, started))
                loop_pid = started.driver_pid
            else:
                from overstory.agents.process import spawn_loop

                loop_pid, ticks = spawn_loop(project, name, generation, launch_env)
                started_pids.append((loop_pid, ticks))
                sessions.update_fields(conn, name, generation, loop_pid=loop_pid, loop_start_ticks=ticks)
            spawn_journal.kill_point("start", environ)
            _fault("after_start", environ)
        intents.end_spawn(conn, name)  # the commit point: from here on the agent exists
    except BaseException as exc:
        problems = undo.run()
        try:
            spawn_journal.undo(project, conn, intent, extra_pids=started_pids)
        except Exception as undo_exc:  # noqa: BLE001 - the intent stays for a retry, `ov stop` or the watchdog
            problems.append(f"undo: {undo_exc}")
            _give_up_intent(conn, name)
        if not isinstance(exc, Exception):
            raise
        raise _spawn_failure(name, exc, problems) from exc
    _record_spawn_event(project, name, generation, capability, task_id, parent)
    from overstory.store import mail

    mail.record_sent(conn, [dispatch_id])
    return SlingResult(name=name, capability=capability, task_id=task_id, generation=generation, branch=branch,
                       worktree=str(worktree) if worktree else None, parent=parent, depth=depth, runtime=runtime,
                       loop_pid=loop_pid, run_id=run_id, dispatch_mail_id=dispatch_id,
                       mode="tmux" if tmux else "headless", tmux_session=_tmux_session_name(name) if tmux else None,
                       budget=limits, budget_notes=budget_notes)


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
    from overstory.store.db import open_events
    from overstory.store.migrations import EVENTS_MIGRATIONS
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
        unwritable = None if missing else _write_refused(conn)
    finally:
        conn.close()
    if unwritable:
        raise SpawnError(f"cannot spawn {name}: {project.events_db} cannot be written ({unwritable}; the agent's "
                         "loop needs it); nothing was created")
    if missing:
        raise SpawnError(f"cannot spawn {name}: {project.events_db} has no table {', '.join(missing)} (the agent's "
                         "loop needs it; `ov doctor --repair` recreates it); nothing was created")


def _write_refused(conn) -> str | None:
    """Why a rolled-back write to the events database fails (root ignores permission bits), or None."""
    import sqlite3

    try:
        conn.execute("BEGIN IMMEDIATE")
        try:
            conn.execute("DELETE FROM events WHERE 0")
        finally:
            conn.execute("ROLLBACK")
    except sqlite3.Error as exc:
        return str(exc)
    return None


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

    row = conn.execute("SELECT id FROM mail WHERE recipient = ? AND type = 'dispatch' AND created_at >= ? "
                       "ORDER BY id LIMIT 1", (agent.name, agent.created_at)).fetchone()  # this generation's
    limits = budgets.get_agent(conn, agent.name, agent.generation)
    budget = {k: getattr(limits, k) for k in ("max_usd", "max_turns", "max_tool_calls", "max_wallclock")} \
        if limits is not None else {}
    return SlingResult(name=agent.name, capability=agent.capability, task_id=agent.task_id,
                       generation=agent.generation, branch=agent.branch, worktree=agent.worktree, parent=agent.parent,
                       depth=agent.depth, runtime=agent.runtime, loop_pid=agent.loop_pid, run_id=agent.run_id,
                       dispatch_mail_id=row[0] if row else None, mode=agent.mode, tmux_session=agent.tmux_session,
                       budget=budget)


def _tmux_mode(request: SlingRequest, config: Config, runtime: Runtime) -> bool:
    """--tmux (or runtime.tmux in config) runs the runtime's TUI in tmux; a runtime without one stays headless."""
    wanted = config.runtime.tmux if request.tmux is None else request.tmux
    if not wanted:
        return False
    if runtime.tui is None:
        if request.tmux:
            raise UsageError(f"--tmux runs the runtime's interactive TUI; the {runtime.name} runtime is headless only")
        return False
    from overstory.tmux_server import tmux_available

    if not tmux_available():
        from overstory.errors import RuntimeNotAvailable

        raise RuntimeNotAvailable("tmux mode needs tmux on PATH (apt install tmux / brew install tmux)")
    return True


def _tmux_session_name(name: str) -> str:
    from overstory.tmux_server import session_name

    return session_name(name)


def _launch_env(project: ProjectPaths, environ: dict[str, str]) -> dict[str, str]:
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


def _open_run_id(conn: sqlite3.Connection) -> str | None:
    row = conn.execute("SELECT id FROM runs WHERE status = 'open' ORDER BY started_at DESC LIMIT 1").fetchone()
    return row[0] if row else None


def _instructions_text(project: ProjectPaths, *, name: str, capability: str, task_id: str, branch: str,
                       base_branch: str, worktree: Path, parent: str, prompt: str, files: t.Sequence[str]) -> str:
    from overstory.agents.overlay import render_instructions
    from overstory.resources import shipped_agents_dir, shipped_templates_dir

    agents_dir = project.agents_dir if project.agents_dir.is_dir() and any(project.agents_dir.iterdir()) else shipped_agents_dir()
    templates_dir = project.templates_dir if project.templates_dir.is_dir() and any(project.templates_dir.iterdir()) else shipped_templates_dir()
    context = {
        "agent_name": name, "capability": capability, "task_id": task_id, "branch": branch,
        "base_branch": base_branch, "worktree": str(worktree), "parent": parent, "prompt": prompt,
        "file_scope": "\n".join(f"- {f}" for f in files) if files else "no file scope given",
        "access": "read-write inside your worktree" if capability in WRITER_CAPABILITIES else "read-only",
    }
    return render_instructions(capability, context, agents_dir=agents_dir, templates_dir=templates_dir)


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


def _write_run_files(run_dir: Path, runtime: Runtime, instructions: str, *, ov_command: list[str],
                     tmux_mode: bool) -> None:
    """The instructions and hook settings in the agent's run dir (ov's, read-only in its sandbox): the
    runtime gets both on every command line, so nothing the agent writes in its worktree can replace them."""
    (run_dir / runtime.run_instructions_file).write_text(instructions, encoding="utf-8")
    settings = runtime.hook_settings(ov_command, tmux_mode=tmux_mode)
    if settings is not None:
        (run_dir / runtime.run_settings_file).write_text(json.dumps(settings, indent=2), encoding="utf-8")


def _write_worktree_copy(worktree: Path, runtime: Runtime, instructions: str) -> None:
    """A copy of the instructions in the worktree, for humans (the runtime never reads it), kept out of commits."""
    copy = worktree / runtime.instructions_file
    copy.parent.mkdir(parents=True, exist_ok=True)
    copy.write_text(instructions, encoding="utf-8")
    keep_out_of_commits(worktree, [runtime.instructions_file])


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
