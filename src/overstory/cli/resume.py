"""`ov resume`: recover every agent after a crash (--all), or fork one from its checkpoint (--fork)."""

from __future__ import annotations

import click

from overstory.cli._common import echo_json, json_option, project_paths, state_conn


@click.command(name="resume")
@click.argument("agent", required=False)
@click.option("--all", "all_agents", is_flag=True,
              help="Re-adopt or restart every active agent (after ov's processes died, e.g. a reboot).")
@click.option("--fork", is_flag=True, help="Start a new agent from AGENT's checkpoint (same commit, new name).")
@click.option("--name", help="Name of the fork (default: AGENT-forkN).")
@click.option("--prompt", help="What the fork should try differently.")
@json_option
def resume(agent: str | None, all_agents: bool, fork: bool, name: str | None, prompt: str | None,
           as_json: bool) -> None:
    """Resume work after a crash, or fork an agent to try another direction.

    --all runs the watchdog's recovery once: every active agent whose loop died is
    re-adopted (its interrupted turn is retried, resuming its runtime session; side
    effects that already happened are not repeated), claimed mail is released, and
    agents that cannot go on are retired with one worker_died to their parent. `ov
    watch` and `ov watchdog` do the same when they start; while one runs, this only
    says so (the watchdog already does it).

    --fork slings a new agent with AGENT's capability and task, on a new branch that
    starts at the commit of AGENT's newest checkpoint.

    \b
    ov resume --all
    ov resume builder-task-42 --fork --prompt "try a streaming parser instead"
    """
    from overstory.config import load_config
    from overstory.errors import UsageError

    if all_agents == bool(agent):
        raise UsageError("give either --all or an AGENT (with --fork)")
    if all_agents and (fork or name or prompt):
        raise UsageError("--all takes no --fork, --name or --prompt")
    if agent and not fork:
        raise UsageError("ov resume AGENT needs --fork (resuming one parked agent comes with budgets)")
    project = project_paths()
    config = load_config(project.config_file, project.local_config_file)
    conn = state_conn(project)
    if all_agents:
        from overstory.errors import LockHeld
        from overstory.recovery import recover_all

        try:
            report = recover_all(project, config, state=conn)
        except LockHeld as running:  # the watchdog that holds the lock re-adopts every agent itself
            if as_json:
                echo_json({"recovered_by_watchdog": True, "detail": str(running)})
            else:
                click.echo(str(running))
            return
        if as_json:
            echo_json(report.as_dict())
            return
        for line in report.summary_lines():
            click.echo(line)
        return
    from overstory.recovery import fork as do_fork

    assert agent is not None
    result = do_fork(project, config, conn, agent, name=name, prompt=prompt)
    if as_json:
        echo_json(result.as_dict())
        return
    click.echo(f"forked {agent} as {result.name} (branch {result.branch}, worktree {result.worktree})")
