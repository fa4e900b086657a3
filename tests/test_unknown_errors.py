"""A runtime error ov cannot classify is not retried at full price: the agent parks with the runtime's message.

Parsers first (what each one calls transient, and what it cannot place), then a real agent on the
scripted runtime (real loop, process group, store and `ov` commands): one turn, no retry, parked
with the message, one escalation to its parent, `ov wait` exit 9, and `ov resume` retries the turn.
"""

from __future__ import annotations

import json

import pytest

from agent_helpers import agent_state, mail_rows, wait_for
from conftest import run_ov
from overstory.runtimes.base import TRANSIENT, UNKNOWN
from overstory.runtimes.claude.stream import TurnStream
from overstory.runtimes.codex.stream import CodexTurnStream
from overstory.runtimes.gemini.stream import GeminiTurnStream
from overstory.runtimes.opencode.stream import OpenCodeTurnStream
from test_cost_control import REPORT, events, settled, start, turns_of

MYSTERY = "The tool runner lost its state (code 0x2a); the turn cannot go on"


def claude_result(**fields) -> TurnStream:
    stream = TurnStream()
    stream.feed(json.dumps({"type": "system", "subtype": "init", "session_id": "s", "model": "claude-opus-5-5"}))
    stream.feed(json.dumps({"type": "result", "is_error": True, "session_id": "s", "total_cost_usd": 0.2,
                            **fields}))
    stream.finish(1, "")
    return stream


def test_claude_an_error_result_nobody_recognises_is_unknown_not_transient():
    failure = claude_result(subtype="error_during_execution", result=MYSTERY).failure(resumed=False)
    assert failure.kind == UNKNOWN and failure.reason == MYSTERY
    assert claude_result(subtype="error_max_turns").failure(resumed=False).kind == UNKNOWN
    assert claude_result(subtype="success", result="API Error: 529 Overloaded", api_error_status=529) \
        .failure(resumed=False).kind == TRANSIENT
    assert claude_result(subtype="success", result="weird", api_error_status="n/a").failure(resumed=False).kind \
        == UNKNOWN
    interrupted = claude_result(subtype="error_during_execution", terminal_reason="aborted_tools",
                                errors=["[ede_diagnostic] result_type=user last_content_type=n/a stop_reason=tool_use"])
    assert interrupted.failure(resumed=False).kind == TRANSIENT, "an interrupt (SIGINT) is known: retried"
    killed = TurnStream()
    killed.finish(143, "")
    assert killed.failure(resumed=False).kind == TRANSIENT, "a crash or kill with no result is still retried"


@pytest.mark.parametrize(("message", "kind"), [
    ("stream disconnected before completion: idle timeout waiting for SSE", "transient"),
    ("exec session crashed: sandbox denied seccomp filter", "unknown"),
    ("Unauthorized: invalid api key", "auth"),
])
def test_codex_failure_kinds(message, kind):
    stream = CodexTurnStream()
    stream.feed(json.dumps({"type": "thread.started", "thread_id": "t"}))
    stream.feed(json.dumps({"type": "turn.failed", "error": {"message": message}}))
    stream.finish(1, "")
    assert stream.failure(resumed=False).kind == kind


@pytest.mark.parametrize(("message", "kind"), [
    ("The model returned an empty response.", "transient"),
    ("Model stream ended with an invalid chunk or missing finish reason.", "transient"),
    ("The response was blocked (SAFETY).", "unknown"),
])
def test_gemini_failure_kinds(message, kind):
    stream = GeminiTurnStream()
    stream.feed(json.dumps({"type": "result", "status": "error", "error": {"type": "unknown", "message": message},
                            "stats": {}}))
    stream.finish(0, "")
    assert stream.failure(resumed=False).kind == kind


def test_opencode_an_error_it_does_not_name_or_an_odd_ending_is_unknown():
    stream = OpenCodeTurnStream()
    stream.feed(json.dumps({"type": "error", "sessionID": "ses_1",
                            "error": {"name": "UnknownError", "data": {"message": MYSTERY}}}))
    stream.finish(1, "")
    assert stream.failure(resumed=False).kind == UNKNOWN
    retryable = OpenCodeTurnStream()
    retryable.feed(json.dumps({"type": "error", "sessionID": "ses_1",
                               "error": {"name": "UnknownError", "data": {"message": "x", "isRetryable": True}}}))
    retryable.finish(1, "")
    assert retryable.failure(resumed=False).kind == TRANSIENT
    filtered = OpenCodeTurnStream()
    filtered.feed(json.dumps({"type": "step_finish", "sessionID": "ses_1", "part": {"reason": "content-filter"}}))
    filtered.finish(0, "")
    assert filtered.failure(resumed=False).kind == UNKNOWN


def test_an_unknown_runtime_error_parks_the_agent_once_with_its_message_and_resume_retries(project, tmp_path):
    # The error is played once (its marker is in the agent's state dir): the resumed turn goes on to report.
    start(project, tmp_path, [{"actions": [{"bash": "true"}, {"api_error": "unclassified", "once": "failed-once"},
                                           REPORT]}], parent=None)
    agent = settled(project, "builder-t1")
    assert agent.state == "parked" and agent.park_kind == "error", (agent.state, agent.state_reason)
    assert agent.state_reason == f"error: {MYSTERY}"
    assert [r["status"] for r in turns_of(project, "builder-t1")] == ["unknown"], "not retried"
    assert agent.retries == 0
    parked = wait_for(lambda: events(project, "builder-t1", "error_parked"), 10)  # written after the park commits
    assert len(parked) == 1 and parked[0]["data"]["message"] == MYSTERY
    assert events(project, "builder-t1", "turn_retry") == []
    escalation = mail_rows(project, type="escalation")
    assert len(escalation) == 1 and escalation[0]["recipient"] == "operator"
    assert MYSTERY in escalation[0]["subject"] and json.loads(escalation[0]["payload"])["kind"] == "error"
    assert mail_rows(project, type="dispatch")[0]["read_at"] is None, "its mail waits for the retried turn"
    waited = run_ov("wait", "builder-t1", "--timeout", "5", cwd=project.root)
    assert waited.returncode == 9, waited.stdout + waited.stderr
    status = run_ov("status", "--json", cwd=project.root)
    assert '"park_kind": "error"' in status.stdout

    resumed = run_ov("resume", "builder-t1", cwd=project.root)
    assert resumed.returncode == 0, resumed.stderr
    waited = run_ov("wait", "builder-t1", "--timeout", "90", cwd=project.root, timeout=120)
    assert waited.returncode == 0, waited.stdout + waited.stderr
    assert [r["status"] for r in turns_of(project, "builder-t1")] == ["unknown", "ok"]
    assert len(mail_rows(project, type="worker_done")) == 1 and len(mail_rows(project, type="escalation")) == 1
    assert agent_state(project, "builder-t1").state == "completed"
