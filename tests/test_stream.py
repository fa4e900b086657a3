"""The stream-json parser against stdout captured from the real Claude Code CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from overstory.runtimes.claude.stream import TurnStream, describe_tool_input

FIXTURES = Path(__file__).parent / "fixtures" / "stream"


def feed(name: str) -> tuple[TurnStream, list]:
    stream = TurnStream()
    parsed = []
    for index, line in enumerate((FIXTURES / f"{name}.jsonl").read_text().splitlines()):
        parsed += stream.feed(line, now=float(index))
    return stream, parsed


def test_text_turn():
    stream, parsed = feed("text_turn")
    kinds = [p.kind for p in parsed]
    assert kinds[0] == "turn_start" and kinds[-1] == "turn_result" and "assistant_text" in kinds
    assert stream.succeeded and stream.session_id
    _, _, cost = stream.usage()
    assert cost > 0


def test_tool_turn_pairs_starts_and_ends():
    stream, parsed = feed("tool_turn")
    starts = [p for p in parsed if p.kind == "tool_start"]
    ends = [p for p in parsed if p.kind == "tool_end"]
    assert starts and len(starts) == len(ends) == stream.tool_calls
    assert {s.tool for s in starts} == {e.tool for e in ends}
    assert all(e.data["duration_ms"] >= 0 for e in ends)


def test_a_bash_result_carries_its_exit_code():
    _, parsed = feed("tool_turn")
    ends = {e.tool: e.data for e in parsed if e.kind == "tool_end"}
    assert ends["Bash"]["exit_code"] == 0 and "exit_code" not in ends["Write"]
    # How the CLI reports a failed and an interrupted Bash (CLAUDE_PROBE_NOTES.md, PostToolUseFailure).
    for content, summary, expected in (("Exit code 3\npartial\nbad", "Error: Exit code 3", 3),
                                        ("Exit code 137", "Error: Exit code 137", 137),
                                        ("Command was aborted", {"interrupted": True}, None)):
        stream = TurnStream()
        stream.feed(json.dumps({"type": "assistant", "message": {"id": "m1", "content": [
            {"type": "tool_use", "id": "u1", "name": "Bash", "input": {"command": "make"}}]}}))
        (end,) = stream.feed(json.dumps({"type": "user", "tool_use_result": summary, "message": {"content": [
            {"type": "tool_result", "tool_use_id": "u1", "content": content, "is_error": True}]}}))
        assert (end.kind, end.data["exit_code"]) == ("tool_end", expected)


def test_denied_tool_is_visible():
    stream, parsed = feed("denied_tool")
    result = [p for p in parsed if p.kind == "turn_result"][-1]
    assert result.data["permission_denials"]
    assert any(p.kind == "tool_end" and p.data["is_error"] for p in parsed)


@pytest.mark.parametrize(("fixture", "resumed", "kind"), [
    ("error_400", False, "permanent"),
    ("unknown_resume", True, "resume_failed"),
    ("killed_sigterm_request", False, "transient"),
    ("interrupted_sigint_request", False, "transient"),
])
def test_failure_classification(fixture, resumed, kind):
    stream, _ = feed(fixture)
    assert not stream.succeeded
    assert stream.failure_kind(resumed=resumed) == kind


def test_retried_529_then_success():
    stream, parsed = feed("api_retry_529")
    assert stream.succeeded and stream.api_retries
    assert any(p.kind == "api_retry" for p in parsed)


def test_bad_lines_are_events_not_errors():
    stream = TurnStream()
    assert stream.feed("not json")[0].kind == "malformed_line"
    assert stream.feed("[1, 2]")[0].kind == "malformed_line"
    assert stream.feed('{"type": "brand_new", "x": 1}')[0].kind == "runtime_event"
    assert stream.feed("") == []
    assert stream.malformed == 2 and stream.failure_kind(resumed=False) == "transient"


def test_tool_input_is_trimmed_and_readable():
    assert describe_tool_input("Bash", {"command": "ls -la"}) == "ls -la"
    assert describe_tool_input("Write", {"file_path": "/x/y.py", "content": "z" * 10_000}) == "/x/y.py"
    assert len(describe_tool_input("Other", {"blob": "q" * 10_000})) <= 300


def test_two_results_in_one_process_last_decides_and_cost_is_not_added_twice():
    """A background sub-agent's notification is a second turn in the same process (2.1.330)."""
    stream, parsed = feed("subagent_turn")
    results = [p for p in parsed if p.kind == "turn_result"]
    assert [r.data["result_index"] for r in results] == [0, 1]
    assert [p.kind for p in parsed].count("turn_start") == 2
    assert stream.succeeded and stream.result is stream.results[-1]
    first, second = stream.results
    input_tokens, output_tokens, cost = stream.usage()
    # usage is per result (add up); total_cost_usd is the process's running total (take the largest).
    assert input_tokens == sum(r["usage"]["input_tokens"] + r["usage"]["cache_creation_input_tokens"]
                               + r["usage"]["cache_read_input_tokens"] for r in (first, second))
    assert output_tokens == first["usage"]["output_tokens"] + second["usage"]["output_tokens"]
    assert cost == max(first["total_cost_usd"], second["total_cost_usd"]) > 0
    assert cost < first["total_cost_usd"] + second["total_cost_usd"]


def test_a_failed_last_result_fails_the_turn_after_a_successful_first():
    stream, parsed = feed("subagent_notification_error")
    first, second = stream.results
    assert not first["is_error"] and second["is_error"]
    assert not stream.succeeded and stream.finished
    assert stream.failure_kind(resumed=False) == "permanent"  # a 400
    assert stream.usage().cost_usd == first["total_cost_usd"] > 0
