"""`ov loop`: an agent that works in fresh-session iterations until ov's own check agrees; `ov loop status`."""

from __future__ import annotations

from pathlib import Path

import click

from overstory import printable
from overstory.cli._common import completer, echo_json, json_option, project_paths, state_conn
from overstory.cli.budget import DURATION
from overstory.runtimes import RUNTIME_NAMES


@click.command(name="loop")
@click.argument("capability", shell_complete=completer("complete_capabilities"))
@click.argument("task_id")
@click.option("--prompt", help="The objective (or give --spec).")
@click.option("--spec", "spec_file", type=click.Path(dir_okay=False, path_type=Path),
              help="YAML: objective, constraints, check, phases with gates, critic (or a text: the objective).")
@click.option("--until", help="The completion promise the model's last message must hold (default LOOP_DONE).")
@click.option("--check",
              help="Shell command ov runs after each iteration (in the sandbox, over the agent's branch); must exit 0 "
                   "to finish.")
@click.option("--max-iterations", type=click.IntRange(min=1), help="Park after this many (default: config loop).")
@click.option("--max-usd", type=click.FloatRange(min=0), help="The loop's budget in dollars (parks when reached).")
@click.option("--max-wallclock", type=DURATION,
              help="The loop's budget of wall-clock time since it started (90m, 4h; parks when reached).")
@click.option("--name", help="Loop (and agent) name (default: CAPABILITY-TASK_ID).")
@click.option("--runtime", type=click.Choice(RUNTIME_NAMES), help="Runtime (default: config runtimes, runtime.default).")
@click.option("--model", help="Model for the loop's agent.")
@click.option("--parent", shell_complete=completer("complete_agents"), help="Agent to report to.")
@click.option("--base-branch", help="Branch to start from (default: the project's current branch).")
@click.option("--scenario", type=click.Path(dir_okay=False, path_type=Path),
              help="Scenario file for the scripted runtime (`iterations:` plays one per iteration).")
@click.option("--allow-protected", "allow_protected", multiple=True, metavar="PATH",
              help="Let the loop change this protected path (config loop.protected_paths); repeatable.")
@json_option
def loop(capability: str, task_id: str, prompt: str | None, spec_file: Path | None, until: str | None,
         check: str | None, max_iterations: int | None, max_usd: float | None, max_wallclock: float | None,
         name: str | None, runtime: str | None,
         model: str | None, parent: str | None, base_branch: str | None, scenario: Path | None,
         allow_protected: tuple[str, ...], as_json: bool) -> None:
    """Run an agent in iterations until the work is provably done; `ov loop status NAME [--json]` shows them.

    Each iteration is a fresh session of the same agent in the same worktree and branch;
    its first message repeats the objective and constraints, the iteration number and
    limit, the agent's progress file (.overstory-progress.md) and the end of the last
    check's output. The loop completes only when the model's last message holds the
    promise AND the check exits 0. The check runs in the agents' sandbox over the
    agent's last commit, with config loop.protected_paths as on the base branch (a
    change there fails it unless --allow-protected). It parks (one escalation) at
    --max-iterations, at --max-usd or --max-wallclock (its budget: default config
    budgets.agent), or when the same check failure repeats (config
    loop.same_failure_limit); `ov resume NAME --add-iterations N` goes on. The check runs
    in the project's Python environment (its .venv, or config loop.check_env), never ov's.
    The agent's own worker_done is held while the loop runs: the loop reports once.

    \b
    ov loop builder green --prompt "make the test suite pass" --check "python -m pytest -q"
    ov loop builder migrate --spec migrate.yaml --max-iterations 30 --max-usd 20 --max-wallclock 4h
    ov loop status builder-green
    """
    from overstory.errors import UsageError

    if capability == "status":
        _status(task_id, as_json, given=[prompt, spec_file, until, check, max_iterations, max_usd, max_wallclock,
                                         name, runtime,
                                         model, parent, base_branch, scenario, allow_protected or None])
        return
    from overstory.agents.iterations.start import LoopRequest, check_environment, start_loop
    from overstory.config.load import load as load_config

    if prompt is not None and spec_file is not None:
        raise UsageError("give either --prompt or --spec, not both")
    project = project_paths()
    config = load_config(project.config_file, project.local_config_file)
    request = LoopRequest(capability=capability, task_id=task_id, prompt=prompt, spec_file=spec_file, until=until,
                          check=check, max_iterations=max_iterations, max_usd=max_usd, name=name, runtime=runtime,
                          model=model, parent=parent, base_branch=base_branch, scenario=scenario,
                          allow_protected=tuple(allow_protected),
                          budget={"max_wallclock": max_wallclock} if max_wallclock is not None else {})
    result, definition = start_loop(project, config, state_conn(project), request)
    environment = check_environment(project, config, definition)
    if as_json:
        echo_json({**result.as_dict(), "loop": definition,
                   "check_env": environment.as_dict() if environment is not None else None})
        return
    phases = definition["phases"]
    click.echo(f"looping {result.name} ({result.capability} on {result.task_id}, runtime {result.runtime})")
    click.echo(f"  branch:   {result.branch}")
    click.echo(f"  until:    the last message says {definition['until']}"
               + (f" and `{phases[0]['gate']['command']}` exits 0" if not definition["phased"] and phases[0]["gate"]
                  and phases[0]["gate"]["kind"] == "command" else ""))
    if definition["phased"]:
        click.echo(f"  phases:   {', '.join(p['name'] for p in phases)}")
    if environment is not None:
        click.echo(f"  checks:   {environment.describe()}")
    from overstory.store.budgets import format_limit

    click.echo(f"  limit:    {definition['max_iterations']} iterations"
               + (f", ${result.budget['max_usd']:.2f}" if result.budget.get("max_usd") is not None else "")
               + (f", {format_limit('max_wallclock', result.budget['max_wallclock'])} of wall clock"
                  if result.budget.get("max_wallclock") is not None else ""))
    if not definition["phased"] and phases[0]["gate"] is None:
        click.echo("ov: warning: no --check: the promise alone ends this loop", err=True)
    click.echo(f"  status:   ov loop status {result.name}")


def _status(name: str, as_json: bool, given: list[object]) -> None:
    from overstory.agents.iterations.start import status_document, status_lines
    from overstory.errors import UsageError

    if any(value is not None for value in given):
        raise UsageError("`ov loop status NAME` takes only --json")
    project = project_paths()
    document = status_document(state_conn(project), name, project.root)
    if as_json:
        echo_json(document)
        return
    click.echo(printable.lines(status_lines(document)))  # progress, reasons and outcomes are agents' text
