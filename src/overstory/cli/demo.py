from __future__ import annotations

from pathlib import Path

import click

from overstory.cli._common import echo_json, json_option
from overstory.runtimes import RUNTIME_NAMES


@click.command(name="demo")
@click.option("--runtime", type=click.Choice(RUNTIME_NAMES), default="scripted", show_default=True,
              help="scripted needs nothing; claude needs the Claude Code CLI and an API key (or a mock server).")
@click.option("--dir", "directory", type=click.Path(file_okay=False, path_type=Path),
              help="Where to create the demo repository (default: a new temporary folder).")
@click.option("--timeout", default=180.0, show_default=True, help="Seconds to wait for the team to settle.")
@json_option
def demo(runtime: str, directory: Path | None, timeout: float, as_json: bool) -> None:
    """Run a small team (a scout and two builders) in a throw-away repository.

    Exit codes are `ov wait`'s: 0 every agent completed, 3 one died, 4/5/6 one was
    parked (budget, quota, auth), 124 not settled within --timeout.

    \b
    ov demo                     # scripted runtime: no API key, no claude needed
    ov demo --runtime claude    # the real Claude Code CLI
    """
    from overstory.config import Config
    from overstory.demo import run_demo
    from overstory.runtimes import get_runtime

    get_runtime(runtime).program(Config())  # a runtime that is not installed fails here, before any repository

    def show(agent) -> None:  # type: ignore[no-untyped-def]
        if not as_json:
            click.echo(f"  {agent.name:<16} {agent.state}")

    if not as_json:
        click.echo(f"ov demo: slinging a scout and two builders (runtime {runtime})")
    outcome = run_demo(runtime=runtime, directory=directory, timeout=timeout, on_change=show)
    rows = [{"name": a.name, "capability": a.capability, "state": a.state, "turns": a.turns,
             "cost_usd": round(a.cost_usd, 6), "branch": a.branch} for a in outcome.agents]
    if as_json:
        echo_json({"project": str(outcome.project), "all_completed": outcome.all_completed,
                   "exit_code": outcome.exit_code, "seconds": round(outcome.seconds, 2), "agents": rows})
    else:
        click.echo("")
        for row in rows:
            click.echo(f"{row['name']:<16} {row['state']:<10} turns {row['turns']}  ${row['cost_usd']:.4f}  {row['branch']}")
        verdict = "every agent completed" if outcome.all_completed else "NOT every agent completed"
        click.echo(f"\n{verdict} in {outcome.seconds:.1f}s. Look around:")
        project = outcome.project
        click.echo(f"  cd {project}")
        click.echo("  ov status            # agents, turns, cost")
        click.echo("  ov mail list         # the team's mail, including their worker_done reports")
        click.echo("  ov feed              # every tool call and turn")
        click.echo("  git log --all --oneline --graph")
    if outcome.exit_code:
        raise click.exceptions.Exit(outcome.exit_code)
