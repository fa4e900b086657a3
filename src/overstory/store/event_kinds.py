"""The vocabulary of events.db: every ``kind`` an event may have.

``events.record`` refuses any other (a typo in a new kind fails a test instead of vanishing from a
dashboard filter); ``tests/test_event_kinds.py`` checks that every kind the code records is here and
that every kind here is recorded somewhere. Adding a kind: add it below, in its group.
"""

from __future__ import annotations

KINDS = frozenset({
    # A runtime's stream, parsed (runtimes/*/stream.py's ParsedEvent kinds)
    "turn_start", "assistant_text", "thinking", "tool_start", "tool_end", "api_retry", "rate_limit",
    "turn_result", "user_message", "runtime_event", "malformed_line",
    # An agent's turns and its loop
    "spawn", "loop_start", "turn_end", "turn_stopped", "turn_retry", "turn_interrupted", "turn_parked",
    "turn_failed", "git_lock_removed", "branch_take_back", "workspace_returned", "branch_refused", "contract_violation",
    "resume_fallback", "idle_nudge", "no_report", "auth_failed",
    # Parking and unparking
    "budget_crossed", "budget_parked", "quota_parked", "auth_parked", "error_parked", "approval_parked",
    "agent_unparked", "agent_resumed", "agent_restart", "session_lost",
    # The tool-call ledger and approvals
    "tool_call_flagged", "approval_requested", "approval_used", "approval_approved", "approval_rejected",
    "approval_expired", "approval_escalated",
    # `ov loop` iterations
    "loop_iteration", "loop_iteration_interrupted", "loop_checked", "loop_checkpoint", "loop_critic",
    "loop_verdict", "loop_phase", "loop_recovered", "loop_completed", "loop_parked",
    # tmux agents
    "tmux_start", "tmux_dispatch", "tmux_dialog", "tmux_wake", "tmux_type_failed", "tmux_completed", "tmux_exit",
    # The watchdog
    "watchdog_readopt", "watchdog_settled", "watchdog_stalled", "watchdog_zombie",
    # Mail, notifications, an agent's endpoint, schedules
    "mail_sent", "mail_polling", "notify_failed", "endpoint_refused",
    "schedule_claimed", "schedule_fired", "schedule_failed", "schedule_skipped",
})
