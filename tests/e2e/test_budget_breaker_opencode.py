"""The budget circuit breaker with the REAL OpenCode CLI: each step's tokens are priced as the step ends.

Only the model is mocked (tests/mock_openai_chat.py on 127.0.0.1). opencode prints a step's tool
calls once they have run and then the step's ``step_finish`` with its tokens: the breaker must
price that bill at once and stop the turn before the next step's tool call runs.
"""

from __future__ import annotations

import dataclasses

from agent_helpers import mail_rows, wait_for
from e2e.test_opencode_agent import bash, setup
from mock_openai_chat import MockChatAPI, text_reply
from opencode_cli import requires_opencode
from overstory.paths import ProjectPaths
from runtime_agents import events, sling, turn_rows

# 100,000 output tokens at the mock's $8 per million (runtime_agents.MOCK_PRICE): $0.80, past a $0.50 limit.
BIG_OUTPUT = 100_000


@requires_opencode
def test_an_opencode_turn_is_stopped_at_the_first_step_whose_bill_crosses_the_limit(project: ProjectPaths) -> None:
    script = [
        dataclasses.replace(bash("touch call-1-ran"), completion_tokens=BIG_OUTPUT),
        bash("touch call-2-ran"),
        bash("ov mail send --type worker_done --subject 'all done' --body 'every call ran'"),
        text_reply("Done."),
    ]
    with MockChatAPI(script) as api:
        name = sling(project, "builder", "t1", "Do the task.", setup(project, api), "--max-usd", "0.50")
        agent = wait_for(lambda: (a := _agent(project, name)) and (a.is_terminal or a.state == "parked") and a, 120,
                         interval=0.2, message=f"{name} to settle")
    worktree = project.worktree(name)
    assert agent.state == "parked" and agent.park_kind == "budget", (agent.state, agent.state_reason)
    assert agent.state_reason.startswith("budget: max_usd 0.50 reached (0.8"), agent.state_reason
    assert (worktree / "call-1-ran").exists(), "the billed step's own call ran before its bill was printed"
    assert not (worktree / "call-2-ran").exists(), "the next step's tool call ran after the bill"
    assert mail_rows(project, type="worker_done") == []
    assert [t["status"] for t in turn_rows(project, name)] == ["budget"]
    assert len(events(project, name, "budget_crossed")) == 1


def _agent(project: ProjectPaths, name: str):
    from agent_helpers import agent_state

    return agent_state(project, name)
