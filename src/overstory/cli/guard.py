"""`ov guard`: the PreToolUse hook command. HOT: imports only the stdlib, click and guards."""

from __future__ import annotations

import os
import sys

import click

from overstory import guards


@click.command(name="guard")
def guard() -> None:
    """Decide one tool call for Claude's PreToolUse hook.

    Reads the hook JSON on stdin. Prints Claude's deny object when the call is blocked and
    nothing when it is allowed; exits 0 either way. Outside an agent (no
    OVERSTORY_AGENT_NAME) every call is allowed.

    \b
    Example hook in <worktree>/.claude/settings.local.json:
      {"hooks": {"PreToolUse": [{"matcher": ".*",
        "hooks": [{"type": "command", "command": "ov guard"}]}]}}
    """
    try:
        stdin = getattr(sys.stdin, "buffer", None)
        raw = stdin.read() if stdin is not None else sys.stdin.read().encode("utf-8", errors="replace")
        text: str | None = raw.decode("utf-8", errors="replace")
    except OSError:
        text = None
    response = guards.hook_response(guards.decide_hook_text(text, os.environ))
    if response:
        click.echo(response)
