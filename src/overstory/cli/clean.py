"""`ov clean`: remove what finished agents left behind."""

from __future__ import annotations

import typing as t

import click

from overstory.cli._common import echo_json, json_option, project_paths, state_conn


@click.command(name="clean")
@click.option("--completed", "completed", is_flag=True,
              help="Every finished agent (the default): merged work goes, unmerged work is kept unless --force.")
@click.option("--merged", "merged_only", is_flag=True,
              help="Only finished agents whose branch is merged (unmerged ones are not even listed).")
@click.option("--dry-run", is_flag=True, help="List exactly what would go, and remove nothing.")
@click.option("--force", is_flag=True, help="Also delete finished agents' unmerged commits and uncommitted changes.")
@json_option
def clean(completed: bool, merged_only: bool, dry_run: bool, force: bool, as_json: bool) -> None:
    """Remove what finished agents left behind, in one go.

    For every completed or zombie agent whose work is merged into its base: its
    worktree and branch (a zombie is settled to completed and any process it
    left is stopped). Also turn logs older than `logs.keep_days` and the
    project's tmux socket when no server is behind it. Unmerged commits and
    uncommitted changes are never deleted without --force. Active agents are
    never touched: stop them with `ov stop`.

    \b
    ov clean --dry-run        # what would go, and what is kept and why
    ov clean
    ov clean --merged         # only agents whose branch is merged
    ov clean --completed --force   # also throw away unmerged work of finished agents
    """
    from overstory.config.load import load as load_config
    from overstory.errors import UsageError
    from overstory.project import cleanup

    if completed and merged_only:
        raise UsageError("give --completed or --merged, not both")
    if force and merged_only:
        raise UsageError("--force deletes unmerged work, which --merged never selects; use --completed --force")
    project = project_paths()
    config = load_config(project.config_file, project.local_config_file)
    conn = state_conn(project)
    chosen = cleanup.plan(project, conn, merged_only=merged_only, force=force, keep_days=config.logs.keep_days,
                          fallback_base=config.project.canonical_branch)
    if dry_run:
        done = chosen.remove
    else:
        done = cleanup.apply(project, conn, chosen, force=force, kill_grace=config.turns.kill_grace,
                             fallback_base=config.project.canonical_branch)
    if as_json:
        echo_json({"dry_run": dry_run, "removed": [i.as_dict() for i in done],
                   "kept": [i.as_dict() for i in chosen.kept]})
        return
    from overstory.printable import line

    verb = "would remove" if dry_run else "removed"
    for item in done:
        click.echo(line(f"{verb} {_describe(item)}"))
    for item in chosen.kept:  # the detail may quote git (an agent's file names)
        click.echo(line(f"kept {item.target}: {item.detail}"))
    if not done and not chosen.kept:
        click.echo("nothing to clean")


def _describe(item: t.Any) -> str:
    if item.kind == "agent":
        return f"{item.target}: {item.detail}"
    if item.kind == "logs":
        return f"logs {item.detail}"
    return f"{item.detail}: {item.target}"
