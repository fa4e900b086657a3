"""`ov budget` (limits, spent, left) and `ov resume` (raise limits, un-park)."""

from __future__ import annotations

import typing as t

import click

from overstory.cli._common import echo_json, json_option, project_paths, state_conn


class Duration(click.ParamType):
    """Seconds, or a number with a unit: 90, 90s, 30m, 4h."""

    name = "duration"

    def convert(self, value: t.Any, param: click.Parameter | None, ctx: click.Context | None) -> float:
        if isinstance(value, (int, float)):
            return float(value)
        from overstory.clock import parse_duration

        try:
            return parse_duration(str(value))
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


DURATION = Duration()


def _config(project: t.Any) -> t.Any:
    from overstory.config.load import load as load_config

    return load_config(project.config_file, project.local_config_file)


def budget_lines(label: str, document: dict[str, t.Any] | None) -> list[str]:
    from overstory.store.budgets import format_limit

    if document is None:
        return [f"{label}: no budget recorded"]
    lines = [label]
    for key, entry in document["limits"].items():
        limit = f"max_{key}"
        used = format_limit(limit, entry["used"]) if key != "usd" else f"{entry['used']:.4f}"
        extra = ""
        if key == "usd" and entry.get("live_estimate"):
            extra = f" (${entry['live_estimate']:.4f} of it estimated, turn in progress)"
        if key == "tool_calls" and entry.get("refused"):
            extra = f" ({entry['refused']} refused past the limit)"
        left = "-" if entry["limit"] is None else format_limit(limit, entry["left"])
        lines.append(f"  {key:<11} limit {format_limit(limit, entry['limit']):>8}  used {used:>8}  left {left:>8}{extra}")
    return lines


@click.command(name="budget")
@click.argument("agent", required=False)
@click.option("--run", "run_ref", help="A run (id or unique prefix) instead of an agent.")
@json_option
def budget(agent: str | None, run_ref: str | None, as_json: bool) -> None:
    """Show limit, used and left of max_usd, max_turns, max_tool_calls and max_wallclock.

    With no argument: every active agent and the open run.

    \b
    ov budget
    ov budget builder-task-42
    ov budget --run run-20260101 --json
    """
    from overstory.errors import UsageError
    from overstory.store import budgets, runs, sessions

    if agent and run_ref:
        raise UsageError("give an agent or --run, not both")
    conn = state_conn(project_paths())
    documents: list[tuple[str, dict[str, t.Any] | None]] = []
    if run_ref:
        run = runs.resolve(conn, run_ref)
        found = budgets.get_run(conn, run.id)
        documents.append((f"run {run.id}", found.as_dict() if found else None))
        names = sessions.names_in_run(conn, run.id)
    elif agent:
        if sessions.get(conn, agent) is None:
            raise sessions.agent_not_found(conn, agent)
        names = [agent]
    else:
        open_run = runs.open_run(conn)
        if open_run is not None:
            found = budgets.get_run(conn, open_run.id)
            documents.append((f"run {open_run.id}", found.as_dict() if found else None))
        names = [a.name for a in sessions.list_sessions(conn, include_terminal=False)]
    current = budgets.current_agents(conn, names)
    for name in names:
        entry = current.get(name)
        documents.append((name, entry.as_dict() if entry else None))
    if as_json:
        echo_json({"budgets": [doc if doc is not None else {"name": label, "limits": None}
                               for label, doc in documents]})
        return
    if not documents:
        click.echo("no active agents and no open run")
    for label, document in documents:
        click.echo("\n".join(budget_lines(label, document)))


def add_options(command: t.Callable[..., t.Any]) -> t.Callable[..., t.Any]:
    for option in reversed((
        click.option("--add-usd", type=click.FloatRange(min=0), default=0.0, help="Raise max_usd by this many dollars."),
        click.option("--add-turns", type=click.IntRange(min=0), default=0, help="Raise max_turns."),
        click.option("--add-tool-calls", type=click.IntRange(min=0), default=0, help="Raise max_tool_calls."),
        click.option("--add-time", "add_seconds", type=DURATION, default=0.0,
                     help="More wall-clock time from now: seconds or 30m, 2h."),
    )):
        command = option(command)
    return command


@click.command(name="resume")
@click.argument("agent", required=False)
@click.argument("new_name", metavar="[NEWNAME]", required=False)
@add_options
@click.option("--add-iterations", type=click.IntRange(min=0), default=0,
              help="An `ov loop`: raise its max_iterations (and its current phase's).")
@click.option("--all", "all_agents", is_flag=True,
              help="Re-adopt or restart every active agent (after ov's processes died, e.g. a reboot).")
@click.option("--fork", is_flag=True, help="Start a new agent from AGENT's checkpoint (same commit, new name).")
@click.option("--restart", is_flag=True, help="Sling a stopped or zombie AGENT again under its name: its branch goes "
                                              "on, in a fresh session told what was done.")
@click.option("--name", help="With --fork: the new agent's name (default: AGENT-forkN).")
@click.option("--prompt", help="With --fork or --restart: what the agent should try (differently).")
@click.option("--dry-run", is_flag=True, help="Only say what a retry would do (session, ledger rows, cost); "
                                              "change nothing.")
@json_option
def resume(agent: str | None, new_name: str | None, add_usd: float, add_turns: int, add_tool_calls: int, add_seconds: float,
           add_iterations: int, all_agents: bool, fork: bool, restart: bool, name: str | None, prompt: str | None,
           dry_run: bool, as_json: bool) -> None:
    """Un-park an agent, raising its limits first; it continues the same runtime session.

    A budget park needs the limit it reached raised; an auth park needs the key or
    login fixed first (the runtime's key variables are taken from your environment);
    a quota park can be ended early.

    --all recovers after a crash or reboot: every active agent whose loop died is
    re-adopted (its interrupted turn is retried, resuming its runtime session; side
    effects that already happened are not repeated), claimed mail is released, and
    agents that cannot go on are retired with one worker_died to their parent. `ov
    watch` and `ov watchdog` do the same when they start; while one runs, this only
    says so. --fork slings a new agent (NEWNAME, default AGENT-forkN) with AGENT's
    capability and task, on a new branch that starts at the commit of AGENT's newest
    checkpoint; where the runtime can fork a session (claude: --resume SESSION
    --fork-session) its first turn continues AGENT's conversation in a session of its
    own, else it starts a fresh one (docs/runtimes.md); it keeps AGENT's budget limits
    (within what is left of the run's), its --approve gates and its loop, and says
    what it carried over and what it could not. --restart slings a stopped or zombie
    AGENT again under its own name: its branch (and worktree, uncommitted changes
    included) goes on, with a fresh runtime session, its limits and gates, and a
    dispatch listing its commits so far; the earlier run dir is kept as
    .overstory/run/AGENT@genN. --dry-run only says what a retry would do: the session
    it resumes, the turn it retries, which of that turn's tool calls the ledger would
    replay (answer with their receipt), hold back or re-run, and its likely cost (the
    newest turn's); it changes nothing.

    \b
    ov resume builder-task-42 --add-usd 5
    ov resume builder-task-42 --add-turns 10 --add-time 30m
    ov resume builder-task-42          # after fixing ANTHROPIC_API_KEY
    ov resume builder-task-42 --add-iterations 3   # a parked `ov loop`
    ov resume --all                    # after a reboot
    ov resume builder-task-42 --fork --prompt "try a streaming parser instead"
    ov resume builder-task-42 --fork builder-stream   # the fork's name
    ov resume builder-task-42 --restart   # a zombie or stopped agent, on its own branch
    ov resume builder-task-42 --dry-run   # what a retry would do; nothing changes
    """
    raised = add_usd or add_turns or add_tool_calls or add_seconds or add_iterations
    if new_name is not None:
        if not fork or name:
            raise click.UsageError("NEWNAME goes with --fork (`ov resume AGENT --fork NEWNAME`), instead of --name")
        name = new_name
    if all_agents:
        if agent or fork or restart or name or prompt or raised or dry_run:
            raise click.UsageError("--all takes no AGENT, --fork, --restart, --name, --prompt, --dry-run or --add-* "
                                   "option")
        from overstory.cli.resume import recover_all

        recover_all(as_json)
        return
    if agent is None:
        raise click.UsageError("give an AGENT (or --all)")
    if dry_run:
        if fork or restart or name or prompt or raised:
            raise click.UsageError("--dry-run previews a plain retry: it takes no --fork, --restart, --name, --prompt "
                                   "or --add-*")
        from overstory.agents.retry_preview import preview, summary_lines

        project = project_paths()
        document = preview(state_conn(project), _config(project), agent)
        if as_json:
            echo_json(document)
        else:
            from overstory.printable import line

            for text in summary_lines(document):  # they quote tool inputs and errors
                click.echo(line(text))
        return
    if restart:
        if fork or name or raised:
            raise click.UsageError("--restart keeps AGENT's name and limits: no --fork, --name or --add-*")
        from overstory.cli.resume import restart as do_restart

        do_restart(agent, prompt, as_json)
        return
    if fork:
        if raised:
            raise click.UsageError("--fork keeps AGENT's limits; raise the fork's afterwards with "
                                   "`ov resume FORK --add-usd ...`")
        from overstory.cli.resume import fork as do_fork

        do_fork(agent, name, prompt, as_json)
        return
    if name or prompt:
        raise click.UsageError("--name goes with --fork, --prompt with --fork or --restart")
    from overstory.agents.budgeting import resume_agent

    project = project_paths()
    result = resume_agent(project, _config(project), state_conn(project), agent, add_usd=add_usd,
                          add_turns=add_turns, add_tool_calls=add_tool_calls, add_seconds=add_seconds,
                          add_iterations=add_iterations)
    if as_json:
        echo_json(result.as_dict())
        return
    if result.unparked:
        goes_on = "its next iteration starts" if result.park_kind == "loop" else "its next turn continues the same session"
        click.echo(f"resumed {agent} (was parked: {result.park_kind}); {goes_on}")
    elif result.previous_state == "parked":
        click.echo(f"{agent} was un-parked by someone else a moment ago")
    else:
        click.echo(f"{agent} is {result.previous_state}, not parked; its limits are raised")
    if result.refreshed_credentials:
        click.echo(f"  took {', '.join(result.refreshed_credentials)} from your environment")
    if result.budget and not as_json:
        click.echo("\n".join(budget_lines("  budget:", result.budget)[1:]))
