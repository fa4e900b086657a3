from __future__ import annotations

import os
import shlex
import sys

import click

from overstory.cli._common import completer, echo_json, json_option, project_paths, state_conn


@click.command(name="attach")
@click.argument("agent", shell_complete=completer("complete_agents"))
@click.option("--read-only", "-r", is_flag=True, help="Watch without being able to type (tmux attach -r).")
@click.option("--print", "print_only", is_flag=True, help="Only print the tmux command that attaches.")
@json_option
def attach(agent: str, read_only: bool, print_only: bool, as_json: bool) -> None:
    """Attach this terminal to a tmux-mode agent's session (detach with C-b d).

    When stdout is not a terminal (or with --print / --json) it prints the exact
    tmux command instead, for scripts and for another terminal.

    \b
    ov attach builder-task-42
    ov attach builder-task-42 --read-only
    ov attach builder-task-42 --print      # tmux -L ov-… attach-session -t =builder-task-42
    """
    from overstory.agents.tmux.server import attach_command, tmux_available
    from overstory.errors import TmuxError
    from overstory.store import sessions

    project = project_paths()
    row = sessions.get(state_conn(project), agent)
    if row is None:
        raise sessions.agent_not_found(state_conn(project), agent)
    if row.mode != "tmux" or not row.tmux_session:
        raise TmuxError(f"{agent} runs headless (no TUI to attach to); follow it with `ov logs {agent} --follow`, "
                        f"or sling with --tmux")
    if row.is_terminal:
        raise TmuxError(f"{agent} is {row.state}; its tmux session is closed (its last screen is under "
                        f"{project.logs_dir / agent / 'tmux'})")
    command = attach_command(project, row.tmux_session, read_only=read_only)
    if as_json:
        echo_json({"agent": agent, "tmux_session": row.tmux_session, "command": command})
        return
    if print_only or not (sys.stdout.isatty() and sys.stdin.isatty()):
        click.echo(shlex.join(command))
        return
    if not tmux_available():
        raise TmuxError("tmux is not on PATH")
    env = dict(os.environ)
    if env.pop("TMUX", None):
        click.echo("(attaching inside your own tmux: press the prefix key twice to reach the agent's session)",
                   err=True)
    os.execvpe(command[0], command, env)
