"""`ov sling`: spawning an agent is a transaction.

Each step has an undo. If any step fails, the steps already done are undone in
reverse order, so no branch, worktree, session row, mail or process is left
behind and the same command can simply be run again.
"""

from __future__ import annotations

import json
import os
import shutil
import typing as t
from dataclasses import dataclass, field
from pathlib import Path

from overstory import procs
from overstory.errors import AgentExists, HierarchyError, OrchestratorError, SpawnError, UsageError
from overstory.gitutil import branch_exists, current_branch, git, worktree_admin_lock
from overstory.names import validate_name
from overstory.paths import ProjectPaths
from overstory.resources import ov_executable
from overstory.runtimes import get_runtime
from overstory.store import sessions
from overstory.store.sessions import CAPABILITIES, WRITER_CAPABILITIES

if t.TYPE_CHECKING:
    import sqlite3

    from overstory.config import Config
    from overstory.runtimes.base import Runtime

SLINGING_CAPABILITIES = frozenset({"coordinator", "lead"})
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
    at_project_root: bool = False  # the coordinator works at the root, with no worktree
    tmux: bool | None = None  # run the interactive TUI in tmux (None: config runtime.tmux)


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
    if parent_row is None or parent_row.is_terminal:
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


def _keep_out_of_commits(worktree: Path, relative_paths: t.Sequence[str]) -> None:
    """Untracked files go into the repository's exclude list; tracked ones get skip-worktree."""
    common = git(worktree, "rev-parse", "--git-common-dir").stdout.strip()
    exclude = (worktree / common / "info" / "exclude").resolve() if not Path(common).is_absolute() else Path(common) / "info" / "exclude"
    exclude.parent.mkdir(parents=True, exist_ok=True)
    existing = exclude.read_text() if exclude.exists() else ""
    missing = [p for p in relative_paths if f"/{p}" not in existing.splitlines()]
    if missing:
        with open(exclude, "a", encoding="utf-8") as handle:
            if existing and not existing.endswith("\n"):
                handle.write("\n")
            handle.write("# added by ov: per-agent instructions and hook settings\n")
            handle.writelines(f"/{p}\n" for p in missing)
    for path in relative_paths:
        if git(worktree, "ls-files", "--error-unmatch", path, check=False).returncode == 0:
            git(worktree, "update-index", "--skip-worktree", path)


def sling(project: ProjectPaths, config: Config, conn: sqlite3.Connection, request: SlingRequest,
          environ: t.Mapping[str, str] | None = None, *, start: bool = True) -> SlingResult:
    environ = dict(os.environ if environ is None else environ)
    capability = request.capability
    if capability not in CAPABILITIES:
        raise UsageError(f"unknown capability {capability!r}; choose one of: {', '.join(CAPABILITIES)}")
    task_id = validate_name(request.task_id, "task id")
    name = validate_name(request.name if request.name is not None else f"{capability}-{task_id}", "agent name")
    runtime = request.runtime or config.runtime.default
    adapter = get_runtime(runtime)  # an unknown name is a usage error naming the known ones
    adapter.program(config)  # fails early and clearly if the runtime is not installed
    tmux = _tmux_mode(request, config, adapter)
    from overstory.agents.turns import model_choice

    model_choice(request.model, capability, config, _launch_env(project, environ), runtime)  # unknown provider, missing key
    prompt = request.prompt
    if request.spec_file is not None:
        try:
            prompt = Path(request.spec_file).read_text(encoding="utf-8")
        except OSError as exc:
            raise UsageError(f"cannot read --spec {request.spec_file}: {exc.strerror}") from None
    existing = sessions.get(conn, name)
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
        try:
            scenario_text = Path(request.scenario).read_text(encoding="utf-8")
        except OSError as exc:
            raise UsageError(f"cannot read --scenario {request.scenario}: {exc.strerror}") from None
    elif scenario_text is None:
        built_in = adapter.default_scenario(capability, task_id)
        scenario_text = json.dumps(built_in, indent=2) if built_in is not None else None

    at_root = request.at_project_root
    branch = None if at_root else f"ov/{name}"
    worktree = None if at_root else project.worktree(name)
    base_branch = request.base_branch or current_branch(project.root)
    if not at_root:
        if base_branch is None:
            raise SpawnError("the project is on a detached HEAD; check out a branch or pass --base-branch")
        if not branch_exists(project.root, base_branch):
            raise UsageError(f"base branch {base_branch!r} does not exist")
        if branch_exists(project.root, branch):  # type: ignore[arg-type]
            raise SpawnError(f"branch {branch} already exists (left by an earlier {name}); merge it, or delete it with "
                             f"`ov stop {name} --clean`, or choose another --name")
        if worktree.exists():  # type: ignore[union-attr]
            raise SpawnError(f"{worktree} already exists; remove it or choose another --name")

    run_id = _open_run_id(conn)
    ov_command, ov_bin_dir = ov_executable()
    undo = _Undo()
    try:
        if not at_root:
            assert worktree is not None and branch is not None
            _fault("branch", environ)
            git(project.root, "branch", branch, base_branch)
            undo.push("branch", lambda: git(project.root, "branch", "-D", branch, check=False))
            _fault("worktree", environ)
            _add_worktree(project, worktree, branch)
            undo.push("worktree", lambda: _remove_worktree(project, worktree))
        run_dir = project.run_dir / name
        if run_dir.exists():
            shutil.rmtree(run_dir)
        run_dir.mkdir(parents=True)
        undo.push("run dir", lambda: shutil.rmtree(run_dir, ignore_errors=True))
        _fault("instructions", environ)
        _write_agent_files(project, run_dir, worktree, adapter, name=name, capability=capability, task_id=task_id,
                           branch=branch or base_branch or "", base_branch=base_branch or "", parent=parent,
                           prompt=prompt or "", files=request.files, ov_command=ov_command, tmux_mode=tmux)
        scenario_path = None
        if scenario_text is not None:
            yaml_file = request.scenario is not None and request.scenario.suffix in (".yaml", ".yml")
            scenario_path = run_dir / ("scenario.yaml" if yaml_file else "scenario.json")  # the player reads by suffix
            scenario_path.write_text(scenario_text, encoding="utf-8")
        from overstory.agents.process import save_launch_env

        launch_env = _launch_env(project, environ)
        save_launch_env(project, name, launch_env)
        _fault("session", environ)
        spec = {"prompt": prompt, "files": list(request.files), "ov_bin_dir": ov_bin_dir,
                "scenario": str(scenario_path) if scenario_path else None}
        generation = sessions.create_session(
            conn, name=name, capability=capability, task_id=task_id, runtime=runtime, actor=environ.get(
                "OVERSTORY_AGENT_NAME", "operator"), parent=parent, depth=depth, model=request.model,
            worktree=str(worktree) if worktree else None, branch=branch, base_branch=base_branch, spec=spec,
            run_id=run_id, mode="tmux" if tmux else "headless",
            tmux_session=_tmux_session_name(name) if tmux else None)
        undo.push("session", lambda: sessions.discard_session(conn, name, generation))
        _fault("dispatch", environ)
        from overstory.store import mail

        dispatch_id = mail.insert_message(
            conn, sender=parent, recipient=name, type="dispatch", priority="high",
            subject=f"task {task_id}",
            body=prompt or f"Work on task {task_id} as described in your instructions.",
            payload={"task_id": task_id, "capability": capability, "base_branch": base_branch,
                     "file_scope": list(request.files)},
        )
        undo.push("dispatch", lambda: mail.discard(conn, dispatch_id))
        loop_pid = None
        if start:
            _fault("start", environ)
            if tmux:
                from overstory.agents.tmux import abort_start, start_agent

                started = start_agent(project, config, conn, name, generation, launch_env)
                undo.push("start", lambda: abort_start(project, started))
                loop_pid = started.driver_pid
            else:
                from overstory.agents.process import spawn_loop

                loop_pid, ticks = spawn_loop(project, name, generation, launch_env)
                undo.push("start", lambda: procs.kill_group(loop_pid, ticks, force=True))
                sessions.update_fields(conn, name, generation, loop_pid=loop_pid, loop_start_ticks=ticks)
            _fault("after_start", environ)
    except OrchestratorError:
        undo.run()
        raise
    except Exception as exc:
        problems = undo.run()
        raise SpawnError(f"could not spawn {name}: {exc}" + (f" (and {'; '.join(problems)})" if problems else "")) from exc
    _record_spawn_event(project, name, generation, capability, task_id, parent)
    from overstory.store import mail

    mail.record_sent(conn, [dispatch_id])
    return SlingResult(name=name, capability=capability, task_id=task_id, generation=generation, branch=branch,
                       worktree=str(worktree) if worktree else None, parent=parent, depth=depth, runtime=runtime,
                       loop_pid=loop_pid, run_id=run_id, dispatch_mail_id=dispatch_id,
                       mode="tmux" if tmux else "headless", tmux_session=_tmux_session_name(name) if tmux else None)


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


def _add_worktree(project: ProjectPaths, worktree: Path, branch: str) -> None:
    import git as gitpython

    worktree.parent.mkdir(parents=True, exist_ok=True)
    with worktree_admin_lock(project.root), gitpython.Repo(project.root) as repo:
        repo.git.worktree("add", str(worktree), branch)


def _remove_worktree(project: ProjectPaths, worktree: Path) -> None:
    with worktree_admin_lock(project.root):
        git(project.root, "worktree", "remove", "--force", str(worktree), check=False)
        if worktree.exists():
            shutil.rmtree(worktree, ignore_errors=True)
        git(project.root, "worktree", "prune", check=False)


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


def _write_agent_files(project: ProjectPaths, run_dir: Path, worktree: Path | None, runtime: Runtime, *, name: str,
                       capability: str, task_id: str, branch: str, base_branch: str, parent: str, prompt: str,
                       files: t.Sequence[str], ov_command: list[str], tmux_mode: bool) -> None:
    """The instructions and hook settings, in the agent's run dir (ov's, read-only in its sandbox).

    The runtime gets both on every command line, so nothing the agent writes in its worktree can
    replace them. A worktree gets a copy of the instructions for humans (the runtime never reads
    it), kept out of commits; an agent at the project root gets none (the user's own files stay
    untouched).
    """
    text = _instructions_text(project, name=name, capability=capability, task_id=task_id, branch=branch,
                              base_branch=base_branch, worktree=worktree or project.root, parent=parent,
                              prompt=prompt, files=files)
    (run_dir / runtime.run_instructions_file).write_text(text, encoding="utf-8")
    settings = runtime.hook_settings(ov_command, tmux_mode=tmux_mode)
    if settings is not None:
        (run_dir / runtime.run_settings_file).write_text(json.dumps(settings, indent=2), encoding="utf-8")
    if worktree is not None:
        copy = worktree / runtime.instructions_file
        copy.parent.mkdir(parents=True, exist_ok=True)
        copy.write_text(text, encoding="utf-8")
        _keep_out_of_commits(worktree, [runtime.instructions_file])


def _record_spawn_event(project: ProjectPaths, name: str, generation: int, capability: str, task_id: str,
                        parent: str) -> None:
    from overstory.store import events as event_store
    from overstory.store.db import open_events

    conn = open_events(project.events_db)
    try:
        event_store.record(conn, "spawn", agent=name, generation=generation,
                           summary=f"{capability} on {task_id}, parent {parent}")
    finally:
        conn.close()
