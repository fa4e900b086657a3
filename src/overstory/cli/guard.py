"""`ov guard`: the PreToolUse hook command. HOT: imports only the stdlib, click and guards."""

from __future__ import annotations

import os
import sys
import typing as t

import click

from overstory import guards

GUARD_TIMEOUT_SECONDS = 30.0  # the endpoint's count is one UPDATE; a hung loop must not hold the tool call for long


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
    """Count the call against the agent's budget; the reason to deny it, or None.

    Inside an agent's turn the count goes through its endpoint (state.db is read-only in
    its sandbox, and the endpoint knows who is calling); elsewhere it is one SQLite statement.
    Either way a count that cannot be made allows the call (``store.tool_count``).
    """
    agent, root, generation = (env.get("OVERSTORY_AGENT_NAME"), env.get("OVERSTORY_PROJECT_ROOT"),
                               env.get("OVERSTORY_GENERATION", ""))
    if not agent or not root or not generation.isdigit():
        return None
    from overstory.endpoint.client import channel

    remote = channel(env)
    if remote is not None:
        from overstory.errors import EndpointError

        try:
            answer = remote.call("tool_call", {}, timeout=GUARD_TIMEOUT_SECONDS)
        except EndpointError:
            return None
        deny = answer.get("deny") if isinstance(answer, dict) else None
        return str(deny) if deny else None
    from overstory.store.tool_count import count_tool_call

    return count_tool_call(os.path.join(root, ".overstory", "state.db"), agent, int(generation))
