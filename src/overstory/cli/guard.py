"""`ov guard`: the PreToolUse hook command. HOT: imports only the stdlib, click and guards."""

from __future__ import annotations

import os
import sys
import typing as t

import click

from overstory import guards


@click.command(name="guard")
def guard() -> None:
    """Decide one tool call for a runtime's pre-tool hook (Claude, Codex, Gemini CLI, OpenCode).

    Reads the hook JSON on stdin. When the call is blocked it prints the runtime's deny
    object (Claude and Codex: hookSpecificOutput; Gemini CLI: {"decision": "deny"}) or, for
    OpenCode's plugin and for input it cannot read, exits 2 with the reason on stderr.
    Allowed calls get no output and exit 0. Outside an agent (no OVERSTORY_AGENT_NAME)
    every call is allowed.
    An allowed call is counted against the agent's and its run's max_tool_calls; the
    call past either limit is denied.

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
    stdout, stderr, status = guards.guard_reply(text, os.environ, count_call=lambda: _count_tool_call(os.environ))
    if stdout:
        click.echo(stdout)
    if stderr:
        click.echo(stderr, err=True)
    if status:
        sys.exit(status)


def _count_tool_call(env: t.Mapping[str, str]) -> str | None:
    """Count the call against the agent's budget (one SQLite statement); the reason to deny it, or None."""
    agent, root, generation = (env.get("OVERSTORY_AGENT_NAME"), env.get("OVERSTORY_PROJECT_ROOT"),
                               env.get("OVERSTORY_GENERATION", ""))
    if not agent or not root or not generation.isdigit():
        return None
    from overstory.store.tool_count import count_tool_call

    return count_tool_call(os.path.join(root, ".overstory", "state.db"), agent, int(generation))
