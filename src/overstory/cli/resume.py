"""`ov resume --all` (recover every agent after a crash), `ov resume AGENT --fork` and `--restart`.

The `ov resume` command itself lives in ``cli.budget`` (un-parking an agent, raising its
limits); these are its other forms, each one call into ``overstory.watchdog.recovery``.
"""

from __future__ import annotations

import click

from overstory import printable
from overstory.cli._common import echo_json, project_paths, state_conn


def recover_all(as_json: bool) -> None:
    """Re-adopt or restart every active agent once, as the watchdog does when it starts."""
    from overstory.config.load import load as load_config
    from overstory.errors import LockHeld
    from overstory.watchdog.recovery import recover_all as do_recover

    project = project_paths()
    config = load_config(project.config_file, project.local_config_file)
    try:
        report = do_recover(project, config, state=state_conn(project))
    except LockHeld as running:  # the watchdog that holds the lock re-adopts every agent itself
        if as_json:
            echo_json({"recovered_by_watchdog": True, "detail": str(running)})
        else:
            click.echo(printable.line(running))
        return
    if as_json:
        echo_json(report.as_dict())
        return
    for line in report.summary_lines():  # they quote agents' reasons
        click.echo(printable.line(line))


def fork(agent: str, name: str | None, prompt: str | None, as_json: bool) -> None:
    """Sling a new agent from AGENT's newest checkpoint: its task, a new name, a branch at its commit."""
    from overstory.config.load import load as load_config
    from overstory.watchdog.recovery import fork as do_fork

    project = project_paths()
    config = load_config(project.config_file, project.local_config_file)
    result = do_fork(project, config, state_conn(project), agent, name=name, prompt=prompt)
    if as_json:
        echo_json(result.as_dict())
        return
    for line in result.summary_lines():
        click.echo(line)


def restart(agent: str, prompt: str | None, as_json: bool) -> None:
    """Sling a stopped or zombie AGENT again under its own name, continuing its branch in a fresh session."""
    from overstory.config.load import load as load_config
    from overstory.watchdog.recovery import restart as do_restart

    project = project_paths()
    config = load_config(project.config_file, project.local_config_file)
    result = do_restart(project, config, state_conn(project), agent, prompt=prompt)
    if as_json:
        echo_json(result.as_dict())
        return
    for line in result.summary_lines():
        click.echo(printable.line(line))
