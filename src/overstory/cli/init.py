from __future__ import annotations

from pathlib import Path

import click

from overstory.cli._common import echo_json, json_option


@click.command(name="init")
@click.option("--force", is_flag=True, help="Restore missing files and overwrite edited ones.")
@click.option("--no-limits", is_flag=True, help="Write every budget limit as null (no limit) instead of the defaults.")
@json_option
def init(force: bool, no_limits: bool, as_json: bool) -> None:
    """Create .overstory/ (config, role definitions, databases) in this git repository.

    The config it writes has budgets: each agent may spend $5, 50 turns and 4h of wall
    clock, each run $25, 300 turns and 8h (`budgets` in .overstory/config.yaml); an agent
    that reaches one is parked, not killed. --no-limits writes them as null instead.

    \b
    git init && git commit --allow-empty -m start
    ov init
    ov init --no-limits
    """
    from overstory.project.init import budget_summary, init_project, written_budgets

    report = init_project(Path.cwd(), force=force, no_limits=no_limits)
    budgets = written_budgets(report.root)
    if as_json:
        echo_json({"root": str(report.root), "canonical_branch": report.canonical_branch,
                   "branch_detected": report.branch_detected, "created": report.created,
                   "overwritten": report.overwritten, "kept": report.kept, "budgets": budgets})
        return
    click.echo(f"initialized ov in {report.root / '.overstory'}")
    for path in report.kept:
        click.echo(f"  kept your edited {path} (use --force to overwrite)")
    for path in report.overwritten:
        click.echo(f"  overwrote {path}")
    if report.branch_detected:
        click.echo(f"  canonical branch: {report.canonical_branch} (the branch you are on; merges go there)")
    else:
        click.echo(f"  canonical branch: {report.canonical_branch} (HEAD is detached; set project.canonical_branch "
                   "in .overstory/config.yaml)")
    if budgets is not None:
        click.echo(f"  budgets: each agent {budget_summary(budgets['agent'])}; "
                   f"each run {budget_summary(budgets['run'])}")
        click.echo("    (an agent that reaches a limit is parked, not killed; `budgets` in .overstory/config.yaml, "
                   "null: no limit)")
    click.echo("  models: builders use sonnet, scouts haiku (`models` in .overstory/config.yaml; the CLI's own "
               "default is its most capable, most expensive model)")
    click.echo("  .overstory/.gitignore keeps databases, logs, worktrees and config.local.yaml out of git;")
    click.echo("  commit the rest so your team shares the config and roles:")
    click.echo("    git add .overstory && git commit -m 'ov: project config'")
