"""`ov guard`: the PreToolUse (and, with --post, PostToolUse) hook command.

HOT: imports only the stdlib, click, guards and the stdlib-only ledger layer.
"""

from __future__ import annotations

import os
import sys

import click


@click.command(name="guard")
@click.option("--post", is_flag=True, help="PostToolUse/PostToolUseFailure hook: record the call's receipt.")
def guard(post: bool) -> None:
    """Decide one tool call for Claude's PreToolUse hook, and record it in the tool-call ledger.

    Reads the hook JSON on stdin. Prints Claude's deny object when the call is blocked and
    nothing when it is allowed; exits 0 either way. Outside an agent (no
    OVERSTORY_AGENT_NAME) every call is allowed. A call that repeats a side effect an
    earlier, crashed attempt of the same task already had is denied with that attempt's
    result. With --post it reads a PostToolUse or PostToolUseFailure payload, stores the
    result, and prints nothing.

    \b
    Example hook in <worktree>/.claude/settings.local.json:
      {"hooks": {"PreToolUse": [{"matcher": ".*",
        "hooks": [{"type": "command", "command": "ov guard"}]}],
        "PostToolUse": [{"hooks": [{"type": "command", "command": "ov guard --post"}]}]}}
    """
    try:
        stdin = getattr(sys.stdin, "buffer", None)
        raw = stdin.read() if stdin is not None else sys.stdin.read().encode("utf-8", errors="replace")
        text: str | None = raw.decode("utf-8", errors="replace")
    except OSError:
        text = None
    from overstory.agents import ledger

    if post:
        ledger.hook_post(text, os.environ)
        return
    from overstory import guards

    response = guards.hook_response(ledger.hook_pre(text, guards.decide_hook_text(text, os.environ), os.environ))
    if response:
        click.echo(response)
