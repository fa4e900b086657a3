"""`ov wait`: block until an agent or a run has settled; the exit code says how it ended."""

from __future__ import annotations

import click

from overstory.cli._common import echo_json, json_option, project_paths, state_conn


@click.command(name="wait")
@click.argument("agent", required=False)
@click.option("--run", "run_ref", help="Wait for every agent of a run (id or unique prefix) instead.")
@click.option("--timeout", type=click.FloatRange(min=0), help="Give up after this many seconds (exit 124).")
@click.option("--quiet", "-q", is_flag=True, help="Print nothing; only the exit code.")
@json_option
def wait(agent: str | None, run_ref: str | None, timeout: float | None, quiet: bool, as_json: bool) -> None:
    """Wait until the agent (or every agent of the run) is completed, zombie or parked.

    \b
    Exit codes (also of `ov demo` and `ov coordinator ask`):
      0 all completed      3 an agent died (zombie)   5 parked by a quota
      1 ov error           4 parked by a budget       6 parked by an auth failure
      2 usage error        7 waits for an approval (ov approvals)
      8 stopped before it finished (ov stop)          124 timeout
      9 parked by an error ov could not classify (its message)
    When agents end differently the most urgent wins: 7, 6, 9, 5, 4, 3, 8.

    \b
    ov wait builder-task-42
    ov wait --run run-20260101 --timeout 3600 && ov merge --all
    ov wait builder-task-42 --json
    """
    from overstory.errors import UsageError
    from overstory.printable import line
    from overstory.store import runs
    from overstory.views.waiting import EXIT_OK, code_of
    from overstory.views.waiting import wait as wait_for

    if bool(agent) == bool(run_ref):
        raise UsageError("give an agent name or --run RUN (one of them)")
    conn = state_conn(project_paths())
    run_id = runs.resolve(conn, run_ref).id if run_ref else None
    result = wait_for(conn, agent=agent, run_id=run_id, timeout=timeout)
    if as_json:
        echo_json(result.as_dict())
    elif not quiet:
        for member in result.agents:
            reason = f": {member.state_reason}" if member.state_reason and code_of(member) != EXIT_OK else ""
            click.echo(line(f"{member.name}: {member.state}{reason}"))
        if result.timed_out:
            click.echo(f"timed out after {timeout:g}s", err=True)
    raise click.exceptions.Exit(result.code)
