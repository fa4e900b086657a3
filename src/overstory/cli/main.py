"""The `ov` root group. Subcommands are imported only when invoked.

`ov` itself starts in ``cli.fast``, which runs the hot commands without click and hands
everything else to ``main`` here.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import typing as t

import click

from overstory import __version__

# name -> (module, attribute, one-line help). The help lives here so `ov --help`
# can list every command without importing any of them.
COMMANDS: dict[str, tuple[str, str, str]] = {
    "init": ("overstory.cli.init", "init", "Create .overstory/ in a git repository."),
    "doctor": ("overstory.cli.doctor", "doctor", "Check the environment, databases and config."),
    "config": ("overstory.cli.config", "config", "Show the effective configuration."),
    "mail": ("overstory.cli.mail", "mail", "Send, check, list and reply to mail."),
    "nudge": ("overstory.cli.mail", "nudge", "Send an agent a high-priority nudge."),
    "guard": ("overstory.cli.guard", "guard", "PreToolUse hook: allow or deny one tool call."),
    "sling": ("overstory.cli.sling", "sling", "Spawn an agent on a task."),
    "loop": ("overstory.cli.loop", "loop", "Run an agent in iterations until its check agrees it is done."),
    "schedule": ("overstory.cli.schedule", "schedule", "Start work by itself: cron schedules and mail triggers."),
    "status": ("overstory.cli.status", "status", "Show agents, mail and runs."),
    "stop": ("overstory.cli.stop", "stop", "Stop an agent."),
    "resume": ("overstory.cli.budget", "resume", "Un-park an agent; --all after a crash; --fork."),
    "approvals": ("overstory.cli.approvals", "approvals", "List tool calls waiting for approval."),
    "approve": ("overstory.cli.approvals", "approve", "Approve a waiting tool call (runs once)."),
    "reject": ("overstory.cli.approvals", "reject", "Reject a waiting tool call, with a reason."),
    "notify": ("overstory.cli.notify", "notify", "Notifications: `ov notify test` sends to every target."),
    "budget": ("overstory.cli.budget", "budget", "Show budgets: limit, used and left."),
    "costs": ("overstory.cli.costs", "costs", "Show tokens, dollars, turns and tool calls."),
    "policy": ("overstory.cli.policy", "policy", "Audit agents' tool calls against the ledger's rules."),
    "wait": ("overstory.cli.wait", "wait", "Wait until an agent or run settles (exit code says how)."),
    "logs": ("overstory.cli.logs", "logs", "Show one agent's events."),
    "feed": ("overstory.cli.logs", "feed", "Show the project's event feed."),
    "watch": ("overstory.cli.watch", "watch", "Live dashboard (runs the watchdog too)."),
    "watchdog": ("overstory.cli.watchdog", "watchdog", "Run the mechanical watchdog."),
    "attach": ("overstory.cli.attach", "attach", "Attach to a tmux-mode agent."),
    "merge": ("overstory.cli.merge", "merge", "Merge agents' branches back."),
    "coordinator": ("overstory.cli.coordinator", "coordinator", "Start, mail and stop the coordinator."),
    "tree": ("overstory.cli.tree", "tree", "Show the agent hierarchy."),
    "group": ("overstory.cli.group", "group", "Task groups: agents that work on one piece of work."),
    "run": ("overstory.cli.run", "run", "List and inspect runs."),
    "trace": ("overstory.cli.trace", "trace", "Show one agent's turns, tool calls and mail."),
    "demo": ("overstory.cli.demo", "demo", "Run a demo swarm in a throw-away repository."),
    "diff": ("overstory.cli.diff", "diff", "Show an agent's changes against its base."),
    "clean": ("overstory.cli.clean", "clean", "Remove what finished agents left behind."),
    "serve": ("overstory.cli.serve", "serve", "HTTP API, live events and the web dashboard."),
}
# Left out of `ov --help` (still documented in the README and by `ov NAME --help`):
# `ov guard` is the hook agents' tool calls go through, not a command for people.
HIDDEN: set[str] = {"guard"}


class SuggestingGroup(click.Group):
    """A command group whose "No such command" names the closest commands (`ov mail sedn` -> `send`)."""

    unsuggested: frozenset[str] = frozenset()  # commands never offered (hidden ones)

    def resolve_command(self, ctx: click.Context, args: list[str]) -> tuple[str | None, click.Command | None,
                                                                             list[str]]:
        try:
            return super().resolve_command(ctx, args)
        except click.UsageError:
            word = args[0] if args else ""
            if ctx.resilient_parsing or word.startswith("-") or self.get_command(ctx, word) is not None:
                raise
            from overstory.names import closest, either

            found = closest(word, [name for name in self.list_commands(ctx) if name not in self.unsuggested])
            if not found:
                raise
            raise click.UsageError(f"No such command {word!r}. Did you mean {either(found)}?", ctx=ctx) from None


class LazyGroup(SuggestingGroup):
    unsuggested = frozenset(HIDDEN)

    def list_commands(self, ctx: click.Context) -> list[str]:
        available = {name for name, spec in COMMANDS.items() if importlib.util.find_spec(spec[0]) is not None}
        return sorted(available | set(self.commands))

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in self.commands:
            return self.commands[cmd_name]
        spec = COMMANDS.get(cmd_name)
        if spec is None or importlib.util.find_spec(spec[0]) is None:
            return None
        module = importlib.import_module(spec[0])
        command: click.Command = getattr(module, spec[1])
        return command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(name, COMMANDS[name][2]) for name in self.list_commands(ctx) if name in COMMANDS and name not in HIDDEN]
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


class AppContext:
    def __init__(self, project: str | None, verbose: bool) -> None:
        self.project_option = project
        self.verbose = verbose


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "-V", "--version", prog_name="ov", message="%(prog)s %(version)s")
@click.option("--project", type=click.Path(file_okay=False), envvar="OVERSTORY_PROJECT_ROOT",
              help="Project root (default: found from the current directory).")
@click.option("-v", "--verbose", is_flag=True, help="Show tracebacks for errors.")
@click.pass_context
def cli(ctx: click.Context, project: str | None, verbose: bool) -> None:
    """ov: run a team of AI coding agents in git worktrees.

    \b
    ov init                         # set up .overstory/ in a git repository
    ov sling builder task-42 --prompt "add a --json flag to status"
    ov mail check                   # read your mail
    ov status                       # what every agent is doing
    ov merge builder-task-42        # bring the work back
    """
    ctx.obj = AppContext(project, verbose)


def main(argv: t.Sequence[str] | None = None) -> t.NoReturn:
    from overstory.cli.hot import report

    args = list(sys.argv[1:] if argv is None else argv)
    try:
        # Without standalone mode click *returns* ctx.exit()'s code instead of exiting.
        result = cli.main(args=args, prog_name="ov", standalone_mode=False)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except (Exception, KeyboardInterrupt) as exc:  # click's errors and ov's: shown as cli.fast.run shows them
        sys.exit(report(exc, args))
    sys.exit(result if isinstance(result, int) else 0)
