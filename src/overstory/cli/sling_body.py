"""The body of `ov sling`, without click: the click command (cli/sling.py) and the fast entry point
(cli/fast.py) both call ``sling`` after parsing, so what it checks and prints has one source.

The agent's loop (``agents.warm_loop.WarmLoop``) is started as soon as the command line has named a
valid agent, before the spawn machinery is imported: the loop's own imports (tens of milliseconds)
then overlap everything `ov sling` still does, instead of following it. Starting it early never
changes what the command says: if the project or its configuration cannot be read yet, no loop is
started here and the same error is raised where it always was; a loop that turns out not to be
needed (a usage error, a failed spawn) is ended, having touched nothing.
"""

from __future__ import annotations

import os
import typing as t

from overstory.cli.hot import agent_channel, echo

if t.TYPE_CHECKING:
    from pathlib import Path

    from overstory.agents.warm_loop import WarmLoop
    from overstory.config.model import Config
    from overstory.paths import ProjectPaths


def sling(project_option: str | None, *, capability: str, task_id: str, name: str | None = None,
          prompt: str | None = None, spec_file: Path | None = None, files: tuple[str, ...] = (),
          parent: str | None = None, runtime: str | None = None, model: str | None = None,
          provider: str | None = None, base_branch: str | None = None, scenario: Path | None = None,
          tmux: bool | None = None, max_usd: float | None = None, max_turns: int | None = None,
          max_tool_calls: int | None = None, max_wallclock: float | None = None, approve: tuple[str, ...] = (),
          executor: str | None = None, group: str | None = None, as_json: bool = False) -> None:
    remote = agent_channel()
    early = None if remote is not None else _start_early(project_option, capability, task_id, name, runtime, tmux)
    warm = early[2] if early is not None else None
    try:
        document = _slung(project_option, remote, early, capability=capability, task_id=task_id, name=name,
                          prompt=prompt, spec_file=spec_file, files=files, parent=parent, runtime=runtime,
                          model=model, provider=provider, base_branch=base_branch, scenario=scenario, tmux=tmux,
                          budget={"max_usd": max_usd, "max_turns": max_turns, "max_tool_calls": max_tool_calls,
                                  "max_wallclock": max_wallclock}, approve=approve, executor=executor, group=group)
    finally:
        if warm is not None:
            warm.discard()  # unused after all (a usage error, a failed spawn); a no-op once the spawn told it to go
    _show(document, capability=capability, task_id=task_id, given_prompt=prompt is not None or spec_file is not None,
          group=group, as_json=as_json)


def _start_early(project_option: str | None, capability: str, task_id: str, name: str | None,
                 runtime: str | None, tmux: bool | None) -> tuple[ProjectPaths, Config, WarmLoop | None] | None:
    """The project, its configuration and, for a headless agent with a valid name, its loop already started;
    None when the project or configuration cannot be read (the spawn says why, in its turn)."""
    from overstory.capabilities import CAPABILITIES
    from overstory.config.load import load as load_config
    from overstory.errors import OrchestratorError
    from overstory.names import validate_name
    from overstory.paths import find_project

    try:
        project = find_project(project_option)
        config = load_config(project.config_file, project.local_config_file)
    except Exception:  # noqa: BLE001 - raised again, where it always was, by the same calls in _slung
        return None
    if capability not in CAPABILITIES or (config.runtime.tmux if tmux is None else tmux):
        return project, config, None  # spawn.sling refuses the capability; a tmux agent has no loop of ours
    try:
        validate_name(task_id)
        agent = validate_name(name if name is not None else f"{capability}-{task_id}")
    except OrchestratorError:
        return project, config, None  # spawn.sling says what is wrong with it
    from overstory.agents.warm_loop import WarmLoop

    environ = dict(os.environ)
    return project, config, WarmLoop(project, agent, launch_env(project, environ),
                                     runtime=runtime or config.runtime_for(capability))


def launch_env(project: ProjectPaths, environ: dict[str, str]) -> dict[str, str]:
    """``agents.spawn_steps.launch_env``, without importing the spawn's steps for the operator's own sling
    (no ``OVERSTORY_AGENT_NAME``: the environment as it is). Were the two ever to differ, the spawn would
    not use the early loop (``WarmLoop.go`` compares them) and start one the usual way."""
    if not environ.get("OVERSTORY_AGENT_NAME"):
        return environ
    from overstory.agents.spawn_steps import launch_env as spawn_launch_env

    return spawn_launch_env(project, environ)


def _slung(project_option: str | None, remote: t.Any,
           early: tuple[ProjectPaths, Config, WarmLoop | None] | None, *, capability: str, task_id: str,
           name: str | None, prompt: str | None, spec_file: Path | None, files: tuple[str, ...], parent: str | None,
           runtime: str | None, model: str | None, provider: str | None, base_branch: str | None,
           scenario: Path | None, tmux: bool | None, budget: dict[str, t.Any], approve: tuple[str, ...],
           executor: str | None, group: str | None) -> dict[str, t.Any]:
    """Check the command line, then spawn the agent here or through the calling agent's endpoint."""
    from overstory.errors import UsageError
    from overstory.wire import SlingRequest

    if prompt is not None and spec_file is not None:
        raise UsageError("give either --prompt or --spec, not both")
    if provider is not None:
        if not model or "/" in model:
            raise UsageError("--provider needs --model with the model's name on that provider (no PROVIDER/ prefix)")
        model = f"{provider}/{model}"
    for pattern in approve:
        from overstory.guards.patterns import parse_pattern

        try:
            parse_pattern(pattern)
        except ValueError as exc:
            raise UsageError(f"--approve: {exc}") from None
    from overstory.agents.scopes import checked_files

    files = tuple(checked_files(files))  # a bad pattern: one usage line, before anything is asked or made
    request = SlingRequest(capability=capability, task_id=task_id, name=name, prompt=prompt, spec_file=spec_file,
                           files=list(files), parent=parent, runtime=runtime, model=model, base_branch=base_branch,
                           scenario=scenario, tmux=tmux, budget=budget, approve=approve,
                           executor=executor, group=group)
    if remote is not None:  # an agent slings through its endpoint: files are read here, in its sandbox
        document: dict[str, t.Any] = remote.call("sling", request.read_files().to_wire())
        return document
    if early is not None:
        project, config, warm = early
    else:
        from overstory.config.load import load as load_config
        from overstory.paths import find_project

        project, warm = find_project(project_option), None
        config = load_config(project.config_file, project.local_config_file)
    _warn_if_unsandboxed(config)
    from overstory.agents.spawn import sling as spawn_sling
    from overstory.store.db import open_state

    conn = open_state(project.state_db)
    try:
        return spawn_sling(project, config, conn, request, warm_loop=warm).as_dict()
    finally:
        conn.close()


def _warn_if_unsandboxed(config: Config) -> None:
    from overstory.sandbox import OFF_WARNING, effective_mode

    mode = effective_mode(config)  # sandbox.mode: bwrap that does not work is an error here, before anything starts
    if mode.name == "off":
        echo(f"warning: {OFF_WARNING} ({mode.reason})", err=True)


def _show(document: dict[str, t.Any], *, capability: str, task_id: str, given_prompt: bool, group: str | None,
          as_json: bool) -> None:
    if not given_prompt:
        echo(f"ov: warning: no --prompt or --spec: {document['name']} has only its role ({capability}) and the "
             f"task id {task_id!r} to go on; send it the details with `ov mail send --to {document['name']}`",
             err=True)
    for overlap in document.get("scope_overlaps") or ():
        echo(f"ov: warning: {overlap}; their merges may conflict (agents.exclusive_scopes: true refuses this)",
             err=True)
    if as_json:
        import json

        from overstory.printable import json_text

        echo(json_text(json.dumps(document, indent=2, ensure_ascii=False, default=str)))  # as cli._common.echo_json
        return
    echo(f"slung {document['name']} ({document['capability']} on {document['task_id']}, "
         f"runtime {document['runtime']})")
    if document["branch"]:
        echo(f"  branch:   {document['branch']}")
        echo(f"  worktree: {document['worktree']}")
    echo(f"  parent:   {document['parent']}")
    if group is not None:
        echo(f"  group:    {group} (`ov group status {group}`)")
    limits = {k: v for k, v in (document.get("budget") or {}).items() if v is not None}
    if limits:
        from overstory.store.budgets import format_limit

        echo("  budget:   " + ", ".join(f"{k} {format_limit(k, v)}" for k, v in limits.items()))
    for note in document.get("budget_notes") or ():
        echo(f"  note:     {note}")
    if document["mode"] == "tmux":
        echo(f"  tmux:     session {document['tmux_session']}; watch it with `ov attach {document['name']}`")
