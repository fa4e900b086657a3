from __future__ import annotations

import click

from overstory.cli._common import agent_channel, completer, echo_json, json_option, project_paths, state_conn


@click.command(name="stop")
@click.argument("agent", shell_complete=completer("complete_agents"))
@click.option("--force", is_flag=True,
              help="SIGKILL its processes at once; with --clean, delete the branch even if unmerged.")
@click.option("--clean", is_flag=True, help="Also remove its worktree and branch (only if the branch is merged).")
@json_option
def stop(agent: str, force: bool, clean: bool, as_json: bool) -> None:
    """Stop an agent: settle it to completed and stop every process it runs.

    Its loop is stopped and its turn's process group gets SIGTERM, then SIGKILL
    after turns.kill_grace seconds (at once with --force). Unread mail stays in
    its inbox. Stopping an agent that already completed only cleans up.

    \b
    ov stop builder-task-42
    ov stop builder-task-42 --clean          # after `ov merge builder-task-42`
    ov stop builder-task-42 --clean --force  # throw its unmerged work away
    """
    from overstory.wire import StopRequest

    request = StopRequest(agent, force=force, clean=clean)
    remote = agent_channel()
    if remote is not None:  # an agent may stop its own descendants, through its endpoint
        result = remote.call("stop", request.to_wire())
    else:
        from overstory.agents.stop import stop_agent
        from overstory.config.load import load as load_config

        project = project_paths()
        config = load_config(project.config_file, project.local_config_file)
        result = stop_agent(project, state_conn(project), request.agent, force=request.force, clean=request.clean,
                            kill_grace=config.turns.kill_grace,
                            fallback_base=config.project.canonical_branch).as_dict()
    if as_json:
        echo_json(result)
        return
    if result.get("undone_spawn") is not None:
        click.echo(f"undid the unfinished spawn of {agent} (its `ov sling` was killed): "
                   + (", ".join(result["undone_spawn"]) or "nothing had been created"))
        if result["generation"] == 0:
            return
    if result["already_completed"]:
        click.echo(f"{agent} had already completed; nothing was running" if result["loop"] == "not running"
                   and not result["killed_groups"] else f"{agent} had already completed; stopped what was left")
    else:
        click.echo(f"stopped {agent} (was {result['previous_state']}; now completed)")
    if result["loop"] != "not running":
        click.echo(f"  loop: {result['loop']}")
    if result["killed_groups"]:
        click.echo(f"  killed process group(s): {', '.join(map(str, result['killed_groups']))}")
    if result["released_mail"]:
        click.echo(f"  {result['released_mail']} message(s) its turn had claimed are unread again")
    for item in result["cleaned"]:
        click.echo(f"  removed {item}")
