"""`ov status`. Hot (agents call `ov status --json`): the body is ``cli.hot.status``, shared with ``cli.fast``."""

from __future__ import annotations

import click

from overstory.cli import hot
from overstory.cli._common import completer, json_option, project_option


@click.command(name="status")
@click.option("--all", "include_completed", is_flag=True, help="Include completed agents.")
@click.option("--capability", shell_complete=completer("complete_capabilities"),
              help="Only agents of this capability (several: builder,scout).")
@click.option("--state", help="Only agents in this state (several: parked,zombie; completed shows completed ones).")
@click.option("--parent", shell_complete=completer("complete_agents"), help="Only this agent's children (or operator).")
@click.option("--run", "run_ref", shell_complete=completer("complete_runs"),
              help="Only agents of this run (id or prefix).")
@json_option
def status(include_completed: bool, capability: str | None, state: str | None, parent: str | None,
           run_ref: str | None, as_json: bool) -> None:
    """Show agents, pending mail and runs. Never changes anything.

    Completed agents are hidden unless --all; zombies are always shown. A state
    marked `!` has no running agent loop (`ov watchdog` re-adopts it). COST shows
    dollars spent against the agent's max_usd; WHY says why an agent is parked,
    stalled, dead or completed (terminal mail sent, or stopped by the operator).
    Pending mail is unread mail someone will read: not mail its recipient sent
    itself (your own `ov merge` reports), not mail to an agent that has ended.
    Each task group (`ov group`) gets one line: done/total, active, dead, cost.

    --capability, --state, --parent and --run select agents; the agents, totals,
    pending mail and approvals shown are then the selected agents' (and the runs:
    --run's only). An unknown state or capability is a usage error (exit 2).

    \b
    ov status
    ov status --all
    ov status --state parked,zombie
    ov status --capability builder --run run-2026 --json
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
     "scope_overlaps": [{"run", "agents": [A, B], "patterns": [[PA, PB]], "message"}]
                       (active builders of one run whose --files may name one file),
     "groups": [{"name", "description", "created_at", "agents", "done", "zombie", "active", "cost_usd"}]
               (task groups, `ov group`; with a selection, those with a selected agent),
     "totals": {"agents", "active", "by_state": {STATE: N}, "turns", "input_tokens",
                "output_tokens", "cost_usd"}}
    """
    hot.status(project_option(), include_completed=include_completed, as_json=as_json, capability=capability,
               state=state, parent=parent, run_ref=run_ref)
