from __future__ import annotations

import typing as t

import click

from overstory.cli._common import agent_channel, completer, echo_json, json_option, project_paths, state_conn


@click.command(name="merge")
@click.argument("agent", required=False, shell_complete=completer("complete_agents"))
@click.option("--branch", help="Merge this branch instead of an agent's.")
@click.option("--all", "merge_all_", is_flag=True,
              help="Merge every builder that finished with commits, and the merge_ready queue, in the order they "
                   "became ready; lists what it skipped and why.")
@click.option("--dismiss", is_flag=True,
              help="Take AGENT's (or --branch's) entry out of the merge queue: a failed merge stays listed, and is "
                   "tried again by --all, until it is merged or dismissed.")
@click.option("--into", help="Target branch (default: the branch the agent was slung from).")
@click.option("--dry-run", is_flag=True,
              help="Predict with git merge-tree (the tier, each conflicting file); touch nothing.")
@click.option("--tier-max", type=click.IntRange(1, 3), help="Highest resolution tier to try (default: config merge.tier_max).")
@click.option("--force", is_flag=True, help="Merge an agent that is still working (has not sent its terminal mail).")
@click.option("--allow-protected", is_flag=True,
              help="You have looked at the branch's changes to protected paths (config loop.protected_paths): "
                   "let the merge gates judge them.")
@click.option("--allow-out-of-scope", is_flag=True,
              help="You have looked at the branch's changes to files outside its builder's write scope "
                   "(`ov sling --files`): merge them.")
@json_option
def merge(agent: str | None, branch: str | None, merge_all_: bool, dismiss: bool, into: str | None, dry_run: bool,
          tier_max: int | None, force: bool, allow_protected: bool, allow_out_of_scope: bool, as_json: bool) -> None:
    """Merge agents' branches back, never dropping content; the result is mailed to the parent.

    The merge is made in a scratch worktree and the target moves to it in one step:
    an interrupted `ov merge` never leaves a half-done merge in your checkout. Its
    gates (config merge.gates) run there in the agents' sandbox; a branch that
    changes a protected path is not merged without --allow-protected, nor one that
    changes files outside its builder's --files scope without --allow-out-of-scope.

    \b
    ov merge builder-task-42
    ov merge builder-task-42 --dry-run      # which tier it needs, which files conflict
    ov merge --all                          # every finished builder, plus merge_ready mail
    ov merge --all --dry-run                # predicted in that order, each after the ones before it
    ov merge builder-task-42 --dismiss      # out of the queue: its failed merge is not tried again
    ov merge --branch ov/builder-x --into main --tier-max 1
    """
    from overstory.config.load import load as load_config
    from overstory.errors import UsageError
    from overstory.merge.queue import MergeReport, MergeRun, dismiss_entry, merge_all, merge_one
    from overstory.wire import MergeRequest

    chosen = sum(bool(x) for x in (agent, branch, merge_all_))
    if chosen != 1:
        raise UsageError("name exactly one of: an AGENT, --branch B, or --all")
    if allow_protected and merge_all_:
        raise UsageError("--allow-protected is for one merge you have looked at: ov merge AGENT --allow-protected")
    if allow_out_of_scope and merge_all_:
        raise UsageError("--allow-out-of-scope is for one merge you have looked at: "
                         "ov merge AGENT --allow-out-of-scope")
    if dismiss:
        if merge_all_ or dry_run or tier_max or force or into or allow_protected or allow_out_of_scope:
            raise UsageError("--dismiss takes an AGENT or --branch B and no other option")
        if agent_channel() is not None:
            raise UsageError("only the operator dismisses a merge-queue entry")
        project = project_paths()
        config = load_config(project.config_file, project.local_config_file)
        said = dismiss_entry(project, config, state_conn(project), agent_name=agent, branch=branch)
        if as_json:
            echo_json({"dismissed": agent or branch, "message": said})
        else:
            click.echo(said)
        return
    remote = agent_channel()
    if remote is not None and allow_protected:
        raise UsageError("only the operator can allow a change to protected paths (--allow-protected)")
    if remote is not None and allow_out_of_scope:
        raise UsageError("only the operator can allow a change outside a write scope (--allow-out-of-scope)")
    request = MergeRequest(agent=agent, branch=branch, all=merge_all_, into=into, dry_run=dry_run, tier_max=tier_max,
                           force=force, allow_protected=allow_protected, allow_out_of_scope=allow_out_of_scope)
    if remote is not None:  # an agent merges through its endpoint, outside its sandbox
        run = MergeRun([MergeReport(**remote.call("merge", request.to_wire()))])
    else:
        project = project_paths()
        config = load_config(project.config_file, project.local_config_file)
        conn = state_conn(project)

        def waiting(pid: int | None) -> None:
            click.echo(f"waiting for the merge held by pid {pid}...", err=True)

        if request.all:
            run = merge_all(project, config, conn, into=request.into, dry_run=request.dry_run,
                            tier_max=request.tier_max, on_lock_wait=waiting)
        else:
            run = MergeRun([merge_one(project, config, conn, agent_name=request.agent, branch=request.branch,
                                      into=request.into, dry_run=request.dry_run, tier_max=request.tier_max,
                                      force=request.force, on_lock_wait=waiting,
                                      allow_protected=request.allow_protected,
                                      allow_out_of_scope=request.allow_out_of_scope)])
    failed = [r for r in run.reports if r.failed]
    if as_json:
        echo_json({"merges": [r.as_dict() for r in run.reports], "skipped": [s.as_dict() for s in run.skipped],
                   "ok": not failed})
    else:
        _render(run, merge_all_)
    if failed:
        raise click.exceptions.Exit(1)


def _echo(text: str) -> None:
    """One line of the report: branch names, paths and git's reasons come from agents, so escaped."""
    from overstory.printable import line

    click.echo(line(text))


def _render(run: t.Any, merge_all_: bool) -> None:
    if merge_all_ and not run.reports:
        _echo("nothing to merge: no finished builder has unmerged commits and no merge_ready mail is pending")
    for report in run.reports:
        label = report.agent or report.branch
        if report.nothing_to_merge:
            _echo(f"{label}: {report.reason}")
        elif report.dry_run:
            _echo(f"{label}: {report.branch} -> {report.target}: {report.reason}")
            for path in report.conflicts:
                _echo(f"  conflict: {path}: {report.resolutions.get(path, 'conflicts')}")
        elif report.merged:
            short = (report.commit or "")[:12]
            count = len(report.commits)
            if report.already_merged:
                _echo(f"{label}: {report.reason} ({count} commit{'s' if count != 1 else ''})")
            else:
                _echo(f"{label}: merged {report.branch} into {report.target} (tier {report.tier}, {short}): "
                           f"{count} commit{'s' if count != 1 else ''}")
        else:
            _echo(f"{label}: NOT merged into {report.target}: {report.reason}")
            for path in report.conflicts:
                _echo(f"  conflict: {path}")
        if report.next_step:
            _echo(f"  next: {report.next_step}")
    for item in run.skipped:
        _echo(f"skipped {item.agent} ({item.branch}): {item.reason}")

