"""The budget circuit breaker in a turn made of nothing but tool calls, with the REAL Claude Code CLI.

Only the model is mocked (tests/mockapi.py on 127.0.0.1). Most real turns are tool calls from
start to end, and their bills arrive in the same stream events (and often in the same read of
the pipe) as the calls themselves: the breaker must price each one as it arrives, refuse the
next tool call and stop the turn's process group, not wait for a text block at the turn's end.
"""

from __future__ import annotations

from agent_helpers import agent_state, mail_rows
from claude_cli import requires_claude
from e2e.test_cost_control_claude import GroupWatch, agent_env, events_of, ov, settled, turns_of
from mockapi import MockMessagesAPI, text_reply, tool_reply, with_usage

# 400,000 input tokens on sonnet (a builder's model): $0.80, past a $0.50 limit with the first reply.
BIG_INPUT = 400_000
REPORT = "ov mail send --type worker_done --subject all-done --body 'every call ran'"


def call(number: int) -> str:
    return f"echo {number} >> calls.log && touch call-{number}-ran"


@requires_claude
def test_a_turn_of_tool_calls_is_stopped_at_its_first_bill(project, tmp_path):
    script = [
        with_usage(tool_reply("Bash", {"command": call(1), "description": "first"}), input_tokens=BIG_INPUT),
        tool_reply("Bash", {"command": call(2), "description": "second"}),
        tool_reply("Bash", {"command": call(3), "description": "third"}),
        tool_reply("Bash", {"command": REPORT, "description": "report"}),
        text_reply("All done."),
    ]
    with MockMessagesAPI(script) as api:
        env = agent_env(api, tmp_path)
        slung = ov(project, "sling", "builder", "t1", "--prompt", "Do the task.", "--max-usd", "0.50", env=env)
        assert slung.returncode == 0, slung.stderr
        watch = GroupWatch(project, "builder-t1")
        watch.start()
        agent = settled(project, "builder-t1")
        watch.join(timeout=10)
        requests = len(api.main_requests)
    worktree = project.root / ".overstory" / "worktrees" / "builder-t1"
    assert agent.state == "parked" and agent.park_kind == "budget", (agent.state, agent.state_reason)
    assert agent.state_reason.startswith("budget: max_usd 0.50 reached (0.8"), agent.state_reason
    assert not (worktree / "call-2-ran").exists(), "the tool call after the bill ran"
    assert not (worktree / "call-3-ran").exists()
    assert requests <= 2, f"{requests} model requests: the turn went on after its first bill"
    # The refused call ends the turn in claude itself (the hook's "continue": false): no model request follows
    # the refusal, so the model never bills a message past the limit (a deny alone costs one more request).
    ran = len(list(worktree.glob("call-*-ran")))
    assert requests == ran + 1, f"{requests} model requests after {ran} calls ran: one followed the refusal"
    assert mail_rows(project, type="worker_done") == [], "worker_done went out after the limit"
    (turn,) = turns_of(project, "builder-t1")
    assert turn["status"] == "budget"
    crossed = events_of(project, "builder-t1", "budget_crossed")
    assert len(crossed) == 1 and crossed[0]["data"]["estimate_usd"] >= 0.8
    assert watch.gone_at is not None, "the turn's process group outlived the crossing"
    escalation = mail_rows(project, type="escalation")
    assert len(escalation) == 1 and escalation[0]["recipient"] == "operator"
    assert agent_state(project, "builder-t1").state == "parked"
