from __future__ import annotations

from pathlib import Path

import click

from overstory.cli._common import echo_json, json_option, project_paths
from overstory.runtimes import RUNTIME_NAMES


@click.command(name="demo")
@click.option("--runtime", type=click.Choice(RUNTIME_NAMES), default="scripted", show_default=True,
              help="scripted needs nothing; claude needs the Claude Code CLI and a login or an API key.")
@click.option("--dir", "directory", type=click.Path(file_okay=False, path_type=Path),
              help="Where to create the demo repository (default: a new temporary folder).")
@click.option("--timeout", default=180.0, show_default=True, help="Seconds to wait for the team to settle.")
@json_option
def demo(runtime: str, directory: Path | None, timeout: float, as_json: bool) -> None:
    """Run a small team (a scout and two builders) in a throw-away repository.

    The claude runtime uses `runtime.claude_bin` from the project you run this in
    (or OV_RUNTIME_CLAUDE_BIN). The scripted runtime plays a scenario instead of
    asking a model; docs/scripted-runtime.md describes the
    format (for your own: `ov sling --runtime scripted --scenario FILE`).

    Exit codes are `ov wait`'s: 0 every agent completed, 3 one died, 4/5/6 one was
    parked (budget, quota, auth), 124 not settled within --timeout.

    \b
    ov demo                     # scripted runtime: no API key, no claude needed
    ov demo --runtime claude    # the real Claude Code CLI (a few cents)
    """
    import os

    from overstory.project.demo import run_demo
    from overstory.runtimes import get_runtime

    config = _operator_config()
    program = get_runtime(runtime).program(config)  # a runtime that is not installed fails here, before any repository
    claude_bin = os.path.abspath(program[0]) if runtime == "claude" else None

    def show(agent) -> None:  # type: ignore[no-untyped-def]
        if not as_json:
            click.echo(f"  {agent.name:<16} {agent.state}")

    if not as_json:
        click.echo(f"ov demo: slinging a scout and two builders (runtime {runtime})")
    outcome = run_demo(runtime=runtime, directory=directory, timeout=timeout, on_change=show, claude_bin=claude_bin)
    rows = [{"name": a.name, "capability": a.capability, "state": a.state, "turns": a.turns,
             "cost_usd": round(a.cost_usd, 6), "branch": a.branch, "reason": outcome.reasons.get(a.name)}
            for a in outcome.agents]
    if as_json:
        echo_json({"project": str(outcome.project), "all_completed": outcome.all_completed,
                   "exit_code": outcome.exit_code, "seconds": round(outcome.seconds, 2), "agents": rows})
    else:
        click.echo("")
        for row in rows:
            click.echo(f"{row['name']:<16} {row['state']:<10} turns {row['turns']}  ${row['cost_usd']:.4f}  {row['branch']}")
        if outcome.all_completed:
            click.echo(f"\nevery agent completed in {outcome.seconds:.1f}s. Look around:")
        else:
            click.echo(f"\nNOT every agent completed ({outcome.seconds:.1f}s):")
            for row in rows:
                if row["reason"]:
                    click.echo(f"  {row['name']}: {row['reason']}")
            click.echo("Look around:")
        click.echo(f"  cd {outcome.project}")
        click.echo("  ov status --all      # the demo's agents (finished ones too), turns, cost")
        click.echo("  ov mail list         # the team's mail, including their worker_done reports")
        click.echo("  ov feed              # every tool call and turn")
        click.echo("  ov diff builder-api  # what a builder changed")
        click.echo("  git log --all --oneline --graph")
    if outcome.exit_code:
        raise click.exceptions.Exit(outcome.exit_code)


def _operator_config():  # type: ignore[no-untyped-def]
    """The configuration of the project `ov demo` is run in, else the defaults; OV_* variables apply either way."""
    from overstory.config.load import load as load_config
    from overstory.errors import ProjectNotFound

    try:
        project = project_paths()
    except ProjectNotFound:
        return load_config(Path("/nonexistent/config.yaml"))
    return load_config(project.config_file, project.local_config_file)
