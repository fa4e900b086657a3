from __future__ import annotations

from pathlib import Path

import click

from overstory.cli._common import echo_json, json_option


@click.command(name="init")
@click.option("--force", is_flag=True, help="Restore missing files and overwrite edited ones.")
@json_option
def init(force: bool, as_json: bool) -> None:
    """Create .overstory/ (config, role definitions, databases) in this git repository.

    \b
    git init && git commit --allow-empty -m start
    ov init
    """
    from overstory.project_init import init_project

    report = init_project(Path.cwd(), force=force)
    if as_json:
        echo_json({"root": str(report.root), "canonical_branch": report.canonical_branch,
                   "branch_detected": report.branch_detected, "created": report.created,
                   "overwritten": report.overwritten, "kept": report.kept})
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
    click.echo("  models: builders use sonnet, scouts haiku (`models` in .overstory/config.yaml; the CLI's own "
               "default is its most capable, most expensive model)")
    click.echo("  .overstory/.gitignore keeps databases, logs, worktrees and config.local.yaml out of git;")
    click.echo("  commit the rest so your team shares the config and roles:")
    click.echo("    git add .overstory && git commit -m 'ov: project config'")
