from __future__ import annotations

import click

from overstory.cli._common import agent_channel, completer, echo_json, json_option, project_paths, state_conn


@click.command(name="merge")
@click.argument("agent", required=False, shell_complete=completer("complete_agents"))
@click.option("--branch", help="Merge this branch instead of an agent's.")
@click.option("--all", "merge_all_", is_flag=True, help="Process the merge queue (merge_ready mail) in arrival order.")
@click.option("--into", help="Target branch (default: the branch the agent was slung from).")
@click.option("--dry-run", is_flag=True, help="Predict with git merge-tree; touch nothing.")
@click.option("--tier-max", type=click.IntRange(1, 3), help="Highest resolution tier to try (default: config merge.tier_max).")
@json_option
def merge(agent: str | None, branch: str | None, merge_all_: bool, into: str | None, dry_run: bool,
          tier_max: int | None, as_json: bool) -> None:
    """Merge agents' branches back, never dropping content; the result is mailed to the parent.

    \b
    ov merge builder-task-42
    ov merge builder-task-42 --dry-run      # which tier it needs, which files conflict
    ov merge --all                          # everything announced with merge_ready
    ov merge --branch ov/builder-x --into main --tier-max 1
    """
    from overstory.config import load_config
    from overstory.errors import UsageError
    from overstory.merge.queue import MergeReport, merge_all, merge_one

    chosen = sum(bool(x) for x in (agent, branch, merge_all_))
    if chosen != 1:
        raise UsageError("name exactly one of: an AGENT, --branch B, or --all")
    remote = agent_channel()
    if remote is not None:  # a merger merges through its endpoint, outside its sandbox
        reports = [MergeReport(**remote.call("merge", {"agent": agent, "branch": branch, "all": merge_all_,
                                                       "into": into, "dry_run": dry_run, "tier_max": tier_max}))]
    else:
        project = project_paths()
        config = load_config(project.config_file, project.local_config_file)
        conn = state_conn(project)

        def waiting(pid: int | None) -> None:
            click.echo(f"waiting for the merge held by pid {pid}...", err=True)

        if merge_all_:
            reports = merge_all(project, config, conn, into=into, dry_run=dry_run, tier_max=tier_max,
                                on_lock_wait=waiting)
        else:
            reports = [merge_one(project, config, conn, agent_name=agent, branch=branch, into=into, dry_run=dry_run,
                                 tier_max=tier_max, on_lock_wait=waiting)]
    failed = [r for r in reports if not r.merged]
    if as_json:
        echo_json({"merges": [r.as_dict() for r in reports], "ok": not failed})
    else:
        if not reports:
            click.echo("nothing to merge: no pending merge_ready mail")
        for report in reports:
            label = report.agent or report.branch
            if report.dry_run:
                click.echo(f"{label}: {report.branch} -> {report.target}: {report.reason}")
            elif report.merged:
                click.echo(f"{label}: merged {report.branch} into {report.target} (tier {report.tier}, {report.commit})")
            else:
                click.echo(f"{label}: NOT merged into {report.target}: {report.reason}")
            for path in report.conflicts:
                click.echo(f"  conflict: {path}")
    if failed:
        raise click.exceptions.Exit(1)
