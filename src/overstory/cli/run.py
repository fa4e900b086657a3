from __future__ import annotations

import click

from overstory import printable
from overstory.cli._common import completer, echo_json, json_option, project_paths, state_conn
from overstory.cli.budget import add_options, budget_lines
from overstory.cli.main import SuggestingGroup


@click.group(name="run", cls=SuggestingGroup)
def run() -> None:
    """List, inspect and complete runs (the agents started under one coordinator).

    \b
    ov run list
    ov run show                 # the open run, else the newest
    ov run show run-20260101 --json
    ov run complete
    ov run resume --add-usd 10     # after its budget parked its agents
    """


@run.command(name="list")
@click.option("--limit", type=click.IntRange(1, 2**63 - 1), default=50, show_default=True)
@json_option
def run_list(limit: int, as_json: bool) -> None:
    """List runs, newest first.

    \b
    ov run list
    ov run list --json
    """
    from overstory.store import runs

    project = project_paths()
    rows = runs.list_runs(state_conn(project), limit=limit)
    if as_json:
        echo_json({"runs": rows})
        return
    if not rows:
        click.echo("no runs yet; `ov coordinator start` opens one")
        return
    for row in rows:
        click.echo(f"{row['id']}  {row['status']:<9}  {row['agents']} agent(s), {row['active']} active, "
                   f"{row['turns']} turn(s), ${row['cost_usd']:.4f}  started {row['started_at']}")


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 60:
        return f"{seconds:.0f}s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


@run.command(name="show")
@click.argument("run_ref", metavar="[RUN]", required=False, shell_complete=completer("complete_runs"))
@click.option("--turns", "show_turns", is_flag=True, help="Also list every turn.")
@json_option
def run_show(run_ref: str | None, show_turns: bool, as_json: bool) -> None:
    """Show a run: its agents, states, turns, tokens, cost, durations and mail counts.

    RUN is an id or a unique prefix; without it, the open run (else the newest).

    \b
    ov run show
    ov run show run-20260101-120000-ab12 --turns
    ov run show --json
    """
    from overstory.store import runs

    project = project_paths()
    conn = state_conn(project)
    document = runs.report(conn, runs.resolve(conn, run_ref))
    if as_json:
        echo_json(document)
        return
    info, totals = document["run"], document["totals"]
    click.echo(f"run {info['id']}: {info['status']}, coordinator {info['coordinator'] or '-'}, "
               f"started {info['started_at']}" + (f", completed {info['completed_at']}" if info["completed_at"] else "")
               + f", {_duration(info['duration_seconds'])}")
    header = f"  {'agent':<28} {'capability':<11} {'state':<13} {'turns':>5} {'tokens in/out':>15} {'cost':>9} " \
             f"{'time':>7} {'mail out/in':>11}"
    click.echo(header)
    for a in document["agents"]:
        tokens = f"{a['input_tokens']}/{a['output_tokens']}"
        click.echo(f"  {a['name']:<28} {a['capability']:<11} {a['state']:<13} {a['turns']:>5} {tokens:>15} "
                   f"{'$' + format(a['cost_usd'], '.4f'):>9} {_duration(a['duration_seconds']):>7} "
                   f"{str(a['mail_sent']) + '/' + str(a['mail_received']):>11}")
    click.echo(f"  total: {totals['agents']} agent(s) ({totals['active']} active), {totals['turns']} turn(s) "
               f"({totals['turns_ok']} ok), {totals['input_tokens']}/{totals['output_tokens']} tokens, "
               f"${totals['cost_usd']:.4f}, {totals['mail']} mail")
    if show_turns:
        for turn in document["turns"]:
            ledger = turn["ledger"]
            calls = ", ".join(f"{n} {status}" for status, n in sorted(ledger["by_status"].items())) or "no tool calls"
            flagged = f", {ledger['flagged']} FLAGGED (ov trace {turn['agent']})" if ledger["flagged"] else ""
            click.echo(printable.line(f"  turn {turn['id']} {turn['agent']} #{turn['number']} attempt "
                                      f"{turn['attempt']} {turn['status']} ${turn['cost_usd']:.4f} "
                                      f"{_duration(turn['duration_seconds'])} [{turn['dispatch'] or 'no dispatch'}; "
                                      f"{calls}{flagged}]" + (f" ({turn['error']})" if turn["error"] else "")))


@run.command(name="complete")
@click.argument("run_ref", metavar="[RUN]", required=False, shell_complete=completer("complete_runs"))
@click.option("--force", is_flag=True, help="Close it even though agents in it are still active.")
@json_option
def run_complete(run_ref: str | None, force: bool, as_json: bool) -> None:
    """Mark a run completed (default: the open run); agents slung later start a new one.

    Refused while agents of the run are still active, unless --force.

    \b
    ov run complete
    ov run complete run-20260101-120000-ab12 --force
    """
    from overstory.errors import OrchestratorError
    from overstory.store import runs

    project = project_paths()
    conn = state_conn(project)
    if run_ref is None:
        target = runs.open_run(conn)
        if target is None:
            raise OrchestratorError("no run is open; `ov run list` shows the finished ones")
    else:
        target = runs.resolve(conn, run_ref)
    done, changed = runs.complete(conn, target.id, force=force)
    if changed:
        from overstory.agents.run_files import run_ended
        from overstory.config.load import load as load_config

        config = load_config(project.config_file, project.local_config_file)
        run_ended(project, conn, done.id, config)  # a crash before it: the watchdog does it
    if as_json:
        echo_json({**done.as_dict(), "changed": changed})
        return
    click.echo(f"run {done.id} completed" if changed else f"run {done.id} was already {done.status}")


@run.command(name="resume")
@click.argument("run_ref", metavar="[RUN]", required=False)
@add_options
@json_option
def run_resume(run_ref: str | None, add_usd: float, add_turns: int, add_tool_calls: int, add_seconds: float,
               as_json: bool) -> None:
    """Raise a run's budget and un-park its agents that its budget (or theirs) had parked.

    RUN is an id or a unique prefix; without it, the open run (else the newest).
    Each agent checks its own limits again before its next turn.

    \b
    ov run resume --add-usd 10
    ov run resume run-20260101-120000-ab12 --add-turns 20 --add-time 1h
    """
    from overstory.agents.budgeting import resume_run
    from overstory.store import runs

    project = project_paths()
    conn = state_conn(project)
    target = runs.resolve(conn, run_ref)
    result = resume_run(project, conn, target.id, add_usd=add_usd, add_turns=add_turns,
                        add_tool_calls=add_tool_calls, add_seconds=add_seconds)
    if as_json:
        echo_json(result.as_dict())
        return
    click.echo(f"run {result.run_id}: resumed {len(result.unparked)} agent(s)"
               + (f": {', '.join(result.unparked)}" if result.unparked else ""))
    click.echo("\n".join(budget_lines("  budget:", result.budget)[1:]))
