"""`ov diff AGENT`: what an agent changed, paged like git."""

from __future__ import annotations

import os
import sys

import click

from overstory.cli._common import completer, project_paths, state_conn


@click.command(name="diff")
@click.argument("agent", shell_complete=completer("complete_agents"))
@click.option("--stat", is_flag=True, help="Only the files changed and their line counts.")
@click.option("--no-pager", is_flag=True, help="Print straight to stdout, even on a terminal.")
def diff(agent: str, stat: bool, no_pager: bool) -> None:
    """Show an agent's changes against its base branch: commits and uncommitted work.

    Compares the agent's worktree (untracked files included) with the point where
    its branch left its base branch; once the worktree is removed, its branch. On
    a terminal the output goes through a pager ($PAGER, else `less -FRX`) like git.

    \b
    ov diff builder-task-42
    ov diff builder-task-42 --stat
    ov diff builder-task-42 --no-pager | grep TODO
    """
    from overstory.config.load import load as load_config
    from overstory.views.diffs import agent_diff

    project = project_paths()
    config = load_config(project.config_file, project.local_config_file)
    on_terminal = sys.stdout.isatty() and not no_pager
    color = on_terminal and not os.environ.get("NO_COLOR")
    text = agent_diff(project, state_conn(project), agent, stat=stat, color=color,
                      fallback_base=config.project.canonical_branch)
    if not text:
        click.echo(f"{agent} has no changes against its base")
        return
    from overstory.printable import block, colored_block

    text = colored_block(text) if color else block(text)  # the files are the agent's: no control reaches you
    if on_terminal:
        os.environ.setdefault("LESS", "FRX")
        click.echo_via_pager(text)
    else:
        click.echo(text, nl=False)
