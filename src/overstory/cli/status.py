"""`ov status`. Hot (agents call `ov status --json`): the body is ``cli.hot.status``, shared with ``cli.fast``."""

from __future__ import annotations

import click

from overstory.cli import hot
from overstory.cli._common import json_option, project_option


@click.command(name="status")
@click.option("--all", "include_completed", is_flag=True, help="Include completed agents.")
@json_option
def status(include_completed: bool, as_json: bool) -> None:
    """Show agents, pending mail and runs. Never changes anything.

    Completed agents are hidden unless --all; zombies are always shown. A state
    marked `!` has no running agent loop (`ov watchdog` re-adopts it). COST shows
    dollars spent against the agent's max_usd; WHY says why an agent is parked,
    stalled, dead or completed (terminal mail sent, or stopped by the operator).

    \b
    ov status
    ov status --all
    ov status --json | jq '.agents[] | select(.state == "zombie") | .name'

    \b
    The --json document is stable:
    {"generated_at": ISO,
     "agents": [{"name", "capability", "state", "state_reason", "task_id", "parent",
                 "depth", "turns", "last_activity" (ISO-8601 UTC with Z), "idle_seconds",
                 "input_tokens", "output_tokens", "cost_usd", "current_tool", "runtime",
                 "mode", "branch", "generation", "retries", "pending_mail",
                 "loop_alive" (true/false; null for tmux or terminal agents), "run_id",
                 "park_kind" (budget/quota/auth/approval/loop/error when parked), "park_until" (ISO or null),
                 "budget": {"usd"|"turns"|"tool_calls"|"wallclock": {"limit", "used"}} or null}],
     "mail": {"pending": N, "by_agent": {NAME: N}},
     "runs": [{"id", "coordinator", "status", "started_at", "completed_at", "agents",
               "budget" (as for agents, for the whole run)}],
     "waiting": [{"id", "agent", "call", "reason", "decider", "seconds_left"}] (approval gates),
     "totals": {"agents", "active", "by_state": {STATE: N}, "turns", "input_tokens",
                "output_tokens", "cost_usd"}}
    """
    hot.status(project_option(), include_completed=include_completed, as_json=as_json)
