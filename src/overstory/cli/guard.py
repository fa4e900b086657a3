"""`ov guard`: the PreToolUse (and, with --post, PostToolUse) hook command.

HOT: the body is cli.hot.guard, which cli.fast also calls without click.
"""

from __future__ import annotations

import click

from overstory.cli import hot


@click.command(name="guard")
@click.option("--post", is_flag=True, help="PostToolUse/PostToolUseFailure (or Gemini's AfterTool) hook: record the call's result.")
def guard(post: bool) -> None:
    """Decide one tool call for a runtime's pre-tool hook (Claude, Codex, Gemini CLI, OpenCode).

    Reads the hook JSON on stdin. When the call is blocked it prints the runtime's deny
    object (Claude and Codex: hookSpecificOutput; Gemini CLI: {"decision": "deny"}) or, for
    OpenCode's plugin and for input it cannot read, exits 2 with the reason on stderr.
    Allowed calls get no output and exit 0. Outside an agent (no OVERSTORY_AGENT_NAME)
    every call is allowed.
    An allowed call is counted against the agent's and its run's max_tool_calls; the
    call past either limit is denied. Every call is recorded in the tool-call ledger, and
    one that repeats a side effect an earlier, crashed attempt of the same task already
    had is denied with that attempt's result. With --post it reads Claude's PostToolUse
    or PostToolUseFailure payload, stores the call's result, and prints nothing.

    \b
    Example hook in <worktree>/.claude/settings.local.json:
      {"hooks": {"PreToolUse": [{"matcher": ".*",
        "hooks": [{"type": "command", "command": "ov guard"}]}],
        "PostToolUse": [{"hooks": [{"type": "command", "command": "ov guard --post"}]}]}}
    """
    hot.guard(None, post=post)
