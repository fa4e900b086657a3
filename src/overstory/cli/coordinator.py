from __future__ import annotations

import typing as t
from pathlib import Path

import click

from overstory.cli._common import echo_json, json_option, project_paths, state_conn
from overstory.cli.budget import DURATION
from overstory.cli.main import SuggestingGroup
from overstory.runtimes import RUNTIME_NAMES


@click.group(name="coordinator", cls=SuggestingGroup)
def coordinator() -> None:
    """Start, mail, ask and stop the project's persistent coordinator.

    The coordinator works at the project root (no worktree), breaks objectives
    into tasks, slings leads and builders, merges their work and reports to you.
    Agents slung while it runs join its run (`ov run show`).

    \b
    ov coordinator start
    ov coordinator send "add a greet() function and its test"
    ov coordinator ask "what is still open?" --timeout 120
    ov coordinator status
    ov coordinator check-complete   # exit 0 when the run's work is all done and merged
    ov coordinator output           # the run's report
    ov coordinator stop
    """


def _config(project: t.Any) -> t.Any:
    from overstory.config.load import load as load_config

    return load_config(project.config_file, project.local_config_file)


@coordinator.command(name="start")
@click.option("--runtime", type=click.Choice(RUNTIME_NAMES), help="Runtime (default: config runtimes.<capability>, else runtime.default).")
@click.option("--model", help="Model (default: config models.coordinator, then runtime.model).")
@click.option("--scenario", type=click.Path(dir_okay=False, path_type=Path),
              help="Scenario file for the scripted runtime.")
@click.option("--budget-usd", type=click.FloatRange(min=0), help="Run budget: dollars (default: config budgets.run).")
@click.option("--budget-turns", type=click.IntRange(min=0), help="Run budget: turns of all its agents.")
@click.option("--budget-tool-calls", type=click.IntRange(min=0), help="Run budget: tool calls of all its agents.")
@click.option("--budget-wallclock", type=DURATION, help="Run budget: wall-clock time since the run started (4h).")
@click.option("--watchdog", "with_watchdog", is_flag=True,
              help="Also start the project's watchdog as a daemon, unless one runs already (`ov watchdog --background`).")
@click.option("--attach", is_flag=True,
              help="Then follow the coordinator's events on this terminal until Ctrl-C (which leaves it running); "
                   "refused when stdout is not a terminal.")
@json_option
def coordinator_start(runtime: str | None, model: str | None, scenario: Path | None, budget_usd: float | None,
                      budget_turns: int | None, budget_tool_calls: int | None, budget_wallclock: float | None,
                      with_watchdog: bool, attach: bool, as_json: bool) -> None:
    """Start the coordinator and open a run (or rejoin the open one).

    Only one coordinator runs at a time. Its instructions and hook settings are
    written to .overstory/run/coordinator/, never into your .claude/. The run's
    budget covers every agent of the run: crossing it parks them all (`ov run resume`).

    \b
    ov coordinator start
    ov coordinator start --model sonnet --budget-usd 20 --budget-wallclock 4h
    ov coordinator start --runtime scripted --scenario demo.json
    ov coordinator start --watchdog --attach   # and the watchdog; then follow it (Ctrl-C leaves it running)

    The coordinator always runs headless (a turn per mail), so --attach follows its
    events as `ov logs coordinator --follow` does; there is no TUI to attach to. A
    script should not use it (it never ends): it is refused, before anything starts,
    when stdout is not a terminal or with --json.
    """
    import sys

    from overstory.agents.coordinator import start
    from overstory.errors import UsageError

    if attach and as_json:
        raise UsageError("--attach follows the coordinator on a terminal; it does not go with --json")
    if attach and not sys.stdout.isatty():
        raise UsageError("--attach needs a terminal (stdout is not one); follow it with `ov logs coordinator "
                         "--follow`")
    project = project_paths()
    budget = {"max_usd": budget_usd, "max_turns": budget_turns, "max_tool_calls": budget_tool_calls,
              "max_wallclock": budget_wallclock}
    result = start(project, _config(project), state_conn(project), runtime=runtime, model=model, scenario=scenario,
                   budget=budget)
    # Started after the coordinator, so a refused start leaves no daemon behind; if ov dies in between, the
    # coordinator runs without one until `ov watchdog --background` (or `ov watch`) starts it.
    watchdog = None
    if with_watchdog:
        from overstory.watchdog.background import ensure_watchdog

        watchdog = ensure_watchdog(project)
    if as_json:
        echo_json({**result.as_dict(), **({"watchdog": watchdog.as_dict()} if watchdog else {})})
        return
    click.echo(f"started {result.name} (runtime {result.runtime}, loop pid {result.loop_pid})")
    click.echo(f"  run: {result.run_id}" + ("" if result.run_created else " (rejoined the open run)"))
    limits = {k: v for k, v in result.run_budget.items() if v is not None}
    if limits:
        from overstory.store.budgets import format_limit

        click.echo("  run budget: " + ", ".join(f"{k} {format_limit(k, v)}" for k, v in limits.items()))
    click.echo(f"  instructions: {result.instructions}")
    if watchdog is not None:
        from overstory.cli.watchdog import describe_start

        click.echo(f"  {describe_start(watchdog)}")
    click.echo('  give it an objective: ov coordinator send "..."')
    if attach:
        from overstory.cli.logs import follow_agent

        click.echo(f"following {result.name}'s events (Ctrl-C stops following; the coordinator keeps running)",
                   err=True)
        follow_agent(project, result.name)


@coordinator.command(name="send")
@click.argument("objective")
@click.option("--subject", help="Subject line (default: the objective's first line).")
@click.option("--priority", type=click.Choice(["low", "normal", "high", "urgent"]), default="normal", show_default=True)
@json_option
def coordinator_send(objective: str, subject: str | None, priority: str, as_json: bool) -> None:
    """Mail the coordinator an objective; it starts working on its next turn.

    \b
    ov coordinator send "add a greet() function and its test"
    ov coordinator send "$(cat objective.md)" --subject "billing export"
    """
    from overstory.agents.coordinator import send

    project = project_paths()
    message_id = send(state_conn(project), objective, subject=subject, priority=priority)
    if as_json:
        echo_json({"id": message_id, "to": "coordinator"})
        return
    click.echo(f"sent #{message_id} to coordinator")


@coordinator.command(name="ask")
@click.argument("question")
@click.option("--timeout", type=click.FloatRange(min=0), default=120, show_default=True,
              help="Seconds to wait for the answer.")
@click.option("--subject", help="Subject line (default: the question's first line).")
@json_option
def coordinator_ask(question: str, timeout: float, subject: str | None, as_json: bool) -> None:
    """Ask the coordinator a question and print its answer.

    The answer is the coordinator's reply in the question's thread. Exit codes are
    `ov wait`'s: 124 when no answer came in time, 3 when the coordinator died, 4/5/6
    when it was parked (budget, quota, auth), 1 when it was stopped.

    \b
    ov coordinator ask "what is still open?"
    ov coordinator ask "ping" --timeout 5
    """
    from overstory.agents.coordinator import ask

    project = project_paths()
    answer = ask(state_conn(project), question, timeout=timeout, subject=subject)
    if as_json:
        echo_json(answer.as_dict())
        return
    from overstory.printable import block, line

    click.echo(block(answer.reply.body) if answer.reply.body else line(answer.reply.subject))


@coordinator.command(name="status")
@json_option
def coordinator_status(as_json: bool) -> None:
    """Show the coordinator's state, run, children and last report.

    \b
    ov coordinator status
    ov coordinator status --json
    """
    from overstory.agents.coordinator import status

    project = project_paths()
    document = status(state_conn(project))
    if as_json:
        echo_json(document)
        return
    agent = document["coordinator"]
    if agent is None:
        click.echo("no coordinator has been started; `ov coordinator start`")
        return
    from overstory.printable import line

    label = "running" if document["running"] else "not running"
    click.echo(line(f"coordinator: {label} ({agent['state']}" + (f": {agent['state_reason']}" if agent["state_reason"]
                                                                    and not document["running"] else "") + ")"))
    click.echo(f"  turns: {agent['turns']}, cost ${agent['cost_usd']:.4f}, idle {agent['idle_seconds']}s, "
               f"pending mail {agent['pending_mail']}")
    if document["run"]:
        click.echo(f"  run: {document['run']['id']} ({document['run']['status']})")
    for child in document["children"]:
        click.echo(f"  child: {child['name']} ({child['capability']}, {child['state']})")
    if document["last_report"]:
        report = document["last_report"]
        click.echo(line(f"  last report to operator: #{report['id']} [{report['type']}] {report['subject']}"))


@coordinator.command(name="stop")
@click.option("--all", "stop_children", is_flag=True, help="Stop every other active agent of its run first.")
@click.option("--force", is_flag=True, help="SIGKILL processes at once.")
@json_option
def coordinator_stop(stop_children: bool, force: bool, as_json: bool) -> None:
    """Stop the coordinator; the run completes when nothing in it is still active.

    Without --all, agents it slung keep working; the run stays open and the next
    `ov coordinator start` rejoins it.

    \b
    ov coordinator stop
    ov coordinator stop --all
    """
    from overstory.agents.coordinator import stop

    project = project_paths()
    result = stop(project, _config(project), state_conn(project), stop_children=stop_children, force=force)
    if as_json:
        echo_json(result.as_dict())
        return
    for agent in result.stopped_agents:
        click.echo(f"stopped {agent['agent']} (was {agent['previous_state']})")
    click.echo(f"stopped coordinator (was {result.coordinator['previous_state']})")
    if result.run_id:
        if result.still_active:
            click.echo(f"run {result.run_id} stays open: {', '.join(result.still_active)} still active; "
                       "`ov coordinator start` rejoins it, `ov coordinator stop --all` would have stopped them")
        else:
            click.echo(f"run {result.run_id} {result.run_status}")


@coordinator.command(name="check-complete")
@click.option("--run", "run_ref", metavar="RUN", help="A run id or unique prefix (default: the open run, else the newest).")
@json_option
def coordinator_check_complete(run_ref: str | None, as_json: bool) -> None:
    """Exit 0 when the run's objective is done: every agent of it (but the coordinator) has ended and its
    work is merged; else exit 1 and list what is still open.

    \b
    ov coordinator check-complete && echo done
    ov coordinator check-complete --run run-2026 --json
    """
    from overstory.agents.run_outcome import check_complete
    from overstory.printable import line

    project = project_paths()
    document = check_complete(project, state_conn(project), run_ref, _config(project).project.canonical_branch)
    if as_json:
        echo_json(document)
    elif document["complete"]:
        click.echo(f"run {document['run']}: complete ({document['agents']} agent(s) ended, their work merged)")
    else:
        why = document.get("reason") or f"{len(document['open'])} of {document['agents']} agent(s) still open"
        click.echo(f"run {document['run']}: not complete: {why}")
        for item in document["open"]:
            click.echo(line(f"  {item['name']} ({item['capability']}, {item['state']}): {item['open']}"))
    if not document["complete"]:
        raise click.exceptions.Exit(1)


@coordinator.command(name="output")
@click.option("--run", "run_ref", metavar="RUN", help="A run id or unique prefix (default: the open run, else the newest).")
@json_option
def coordinator_output(run_ref: str | None, as_json: bool) -> None:
    """The run's report: what the coordinator reported to you during it, the run's summary, its totals.

    \b
    ov coordinator output
    ov coordinator output --run run-2026 --json
    """
    from overstory.agents.run_outcome import output
    from overstory.printable import block, line

    document = output(state_conn(project_paths()), run_ref)
    if as_json:
        echo_json(document)
        return
    info, totals = document["run"], document["totals"]
    click.echo(f"run {info['id']} ({info['status']}), coordinator {info['coordinator'] or '-'}: "
               f"{totals['agents']} agent(s), {totals['turns']} turn(s), ${totals['cost_usd']:.4f}")
    if not document["reports"]:
        click.echo("  the coordinator has reported nothing to you in this run yet")
    for report in document["reports"]:
        click.echo(line(f"\n#{report['id']} [{report['type']}] {report['subject']}"))
        if report["body"]:
            click.echo(block(report["body"]))
    for summary in document["summaries"]:
        click.echo("\nrun summary:")
        click.echo(block(summary))
    for agent in document["agents"]:
        click.echo(line(f"  {agent['name']} ({agent['capability']}): {agent['state']}"
                        + (f": {agent['state_reason']}" if agent["state_reason"] else "")))
