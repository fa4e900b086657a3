"""The codex, gemini and opencode parsers against stdout captured from the real CLIs.

Fixtures are in tests/fixtures/stream/{codex,gemini,opencode}-*.jsonl (refreshed by the
CLIs' probe tests with OV_CAPTURE_STREAM_FIXTURES=1, or copied from e2e turn logs). Where a
failure prints nothing on stdout, the parser learns it from the exit status and stderr
(``finish``), quoted here as the probes measured them.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from overstory.runtimes.base import TurnParser
from overstory.runtimes.codex.stream import CodexTurnStream, shell_command
from overstory.runtimes.gemini.stream import GeminiTurnStream
from overstory.runtimes.opencode.stream import OpenCodeTurnStream

FIXTURES = Path(__file__).parent / "fixtures" / "stream"


def feed(parser: TurnParser, name: str, *, exit_code: int | None = 0, stderr: str = "") -> list:
    parsed = []
    for index, line in enumerate((FIXTURES / f"{name}.jsonl").read_text().splitlines()):
        parsed += parser.feed(line, now=float(index))
    parser.finish(exit_code, stderr)
    return parsed


def kinds(parsed: list) -> list[str]:
    return [p.kind for p in parsed]


# ---- codex ---------------------------------------------------------------------------------------


def test_codex_tool_turn() -> None:
    stream = CodexTurnStream()
    parsed = feed(stream, "codex-tool_turn")
    assert kinds(parsed)[0] == "turn_start" and kinds(parsed)[-1] == "turn_result"
    assert stream.succeeded and stream.session_id == "01a208bf-0287-7e83-abf5-fb845742ea1d"
    starts = [p for p in parsed if p.kind == "tool_start"]
    ends = [p for p in parsed if p.kind == "tool_end"]
    assert [s.summary for s in starts] == ["echo written > out.txt && cat out.txt", "echo failing; exit 3"]
    assert [e.data["is_error"] for e in ends] == [False, True] and stream.tool_calls == 2
    assert [p.data["text"] for p in parsed if p.kind == "assistant_text"] == ["Writing the file.", "done"]
    assert stream.usage() == (17072, 188, 0.0)  # tokens, no dollars: the price table supplies them


def test_codex_cached_input_is_priced_at_the_cache_read_rate() -> None:
    """codex counts cached input inside input_tokens; a turn that mostly re-read its cached context costs a
    fraction of the same tokens fresh (gpt-5: $1.25 fresh, $0.125 cached per million)."""
    import types

    from overstory.agents.turns import priced_usage

    stream = CodexTurnStream()
    stream.feed(json.dumps({"type": "thread.started", "thread_id": "t-1"}))
    assert stream.live_usage() == {} and stream.live_reports == 0
    stream.feed(json.dumps({"type": "turn.completed", "usage": {
        "input_tokens": 1_000_000, "cached_input_tokens": 800_000, "output_tokens": 10_000}}))
    stream.finish(0, "")
    assert stream.live_reports == 1
    assert stream.live_usage() == {"": (200_000, 10_000, 800_000, 0)}
    config = types.SimpleNamespace(prices={})
    tokens_in, tokens_out, cost = priced_usage(stream, "gpt-5", config)
    assert (tokens_in, tokens_out) == (1_000_000, 10_000), "the token counts stay the CLI's"
    assert cost == pytest.approx(0.2 * 1.25 + 0.8 * 0.125 + 0.01 * 10.0), cost  # $0.45, not $1.35


def test_codex_notices_are_not_failures_and_patches_are_tools() -> None:
    stream = CodexTurnStream()
    parsed = feed(stream, "codex-file_change")
    assert stream.succeeded and not stream.errors
    assert [(p.kind, p.tool) for p in parsed if p.tool] == [("tool_start", "apply_patch"), ("tool_end", "apply_patch")]
    assert "update /tmp" in parsed[[p.kind for p in parsed].index("tool_start")].summary


def test_codex_resume_keeps_the_thread() -> None:
    stream = CodexTurnStream()
    feed(stream, "codex-resume_turn")
    assert stream.succeeded and stream.session_id == "01a208bf-08ec-7b81-9e9b-afa843cb124d"


@pytest.mark.parametrize(("fixture", "kind", "needle"), [
    ("codex-error_503", "transient", "503"),
    ("codex-error_401", "auth", "401"),
    ("codex-error_429", "rate_limit", "429"),
])
def test_codex_failures(fixture: str, kind: str, needle: str) -> None:
    stream = CodexTurnStream()
    parsed = feed(stream, fixture, exit_code=1)
    assert stream.finished and not stream.succeeded
    failure = stream.failure(resumed=False)
    assert failure.kind == kind and needle in failure.reason
    assert parsed[-1].kind == "turn_result" and parsed[-1].data["is_error"]


def test_codex_reconnects_are_api_retries() -> None:
    stream = CodexTurnStream()
    parsed = feed(stream, "codex-error_401", exit_code=1)
    retries = [p for p in parsed if p.kind == "api_retry"]
    assert len(retries) == 5 and all(r.data["error_status"] == 401 for r in retries)


@pytest.mark.parametrize(("message", "kind"), [
    ("We’re currently experiencing high demand, which may cause temporary errors.", "transient"),
    ("stream disconnected before completion: idle timeout waiting for SSE", "transient"),
    ("Quota exceeded. Check your plan and billing details.", "permanent"),
    ("Codex ran out of room in the model's context window. Start a new thread or clear earlier history.", "permanent"),
    ('{"error": {"message": "bad request", "type": "invalid_request_error"}}', "permanent"),
    ("unexpected status 403 Forbidden: no access, url: http://x/v1/responses, request id: r", "auth"),
    ("unexpected status 404 Not Found: no such model, url: http://x/v1/responses", "permanent"),
])
def test_codex_failure_messages(message: str, kind: str) -> None:
    stream = CodexTurnStream()
    stream.feed(json.dumps({"type": "thread.started", "thread_id": "t"}))
    stream.feed(json.dumps({"type": "turn.failed", "error": {"message": message}}))
    stream.finish(1, "")
    assert stream.failure(resumed=False).kind == kind


def test_codex_unknown_resume_is_known_from_stderr_only() -> None:
    stderr = ("Error: thread/resume: thread/resume failed: no rollout found for thread id "
              "0199a0a0-0000-7000-8000-000000000000 (code -32600)\n   0: backtrace...\n")
    stream = CodexTurnStream()
    stream.finish(1, stderr)
    assert not stream.finished and stream.failure(resumed=True).kind == "resume_failed"


def test_codex_config_error_is_permanent_and_a_kill_transient() -> None:
    broken = CodexTurnStream()
    broken.finish(1, "Error loading config.toml: wire_api = \"chat\" is no longer supported.\n")
    assert broken.failure(resumed=False).kind == "permanent"
    assert "config.toml" in broken.failure(resumed=False).reason
    killed = CodexTurnStream()
    killed.feed(json.dumps({"type": "thread.started", "thread_id": "t"}))
    killed.feed(json.dumps({"type": "turn.started"}))
    killed.finish(-15, "")
    assert killed.failure(resumed=False).kind == "transient"


def test_codex_rate_limit_reset_when_the_message_says_when() -> None:
    stream = CodexTurnStream()
    stream.feed(json.dumps({"type": "turn.failed", "error": {
        "message": "exceeded retry limit, last status: 429 Too Many Requests; try again in 20s"}}))
    failure = stream.failure(resumed=False)
    assert failure.kind == "rate_limit" and failure.reset_at_ms is not None
    assert abs(failure.reset_at_ms - (time.time() + 20) * 1000) < 5000


def test_codex_shell_command_unwrapping() -> None:
    assert shell_command("/bin/bash -c 'echo ok > allowed.txt'") == "echo ok > allowed.txt"
    assert shell_command("/bin/bash -lc \"git add x && git commit -m 'y'\"") == "git add x && git commit -m 'y'"
    assert shell_command("/usr/bin/env python3 x.py") == "/usr/bin/env python3 x.py"
    assert shell_command("bash -c 'unclosed") == "bash -c 'unclosed"


def test_a_malformed_line_is_an_event_for_every_parser() -> None:
    for parser in (CodexTurnStream(), GeminiTurnStream(), OpenCodeTurnStream()):
        assert [p.kind for p in parser.feed("not json {")] == ["malformed_line"]
        assert [p.kind for p in parser.feed("[1, 2]")] == ["malformed_line"]
        assert parser.feed("   ") == []


# ---- gemini --------------------------------------------------------------------------------------


def test_gemini_text_deltas_become_one_text() -> None:
    stream = GeminiTurnStream()
    parsed = feed(stream, "gemini-text_turn")
    texts = [p.data["text"] for p in parsed if p.kind == "assistant_text"]
    assert texts == ["Hello from the mock, long enough to arrive in two chunks."]
    assert kinds(parsed)[0] == "turn_start" and kinds(parsed)[-1] == "turn_result"
    assert stream.succeeded and stream.model == "gemini-2.5-flash"
    assert stream.usage() == (6502, 17, 0.0)


def test_gemini_tool_turn() -> None:
    stream = GeminiTurnStream()
    parsed = feed(stream, "gemini-tool_turn")
    starts = [p for p in parsed if p.kind == "tool_start"]
    ends = [p for p in parsed if p.kind == "tool_end"]
    assert [s.tool for s in starts] == [e.tool for e in ends] == ["run_shell_command"]
    assert starts[0].summary == "echo made-by-gemini > out.txt && cat out.txt"
    assert ends[0].data["output"] == "made-by-gemini" and not ends[0].data["is_error"]


def test_gemini_hook_denial_is_a_failed_tool_not_a_failed_turn() -> None:
    stream = GeminiTurnStream()
    parsed = feed(stream, "gemini-hook_deny")
    ends = [p for p in parsed if p.kind == "tool_end"]
    assert [e.data["error_type"] for e in ends] == ["policy_violation", None]
    assert stream.succeeded


def test_gemini_resume_turn() -> None:
    stream = GeminiTurnStream()
    feed(stream, "gemini-resume_turn")
    assert stream.succeeded and stream.session_id == "844d5747-3bf6-44a0-b902-73dd0bfe0440"


@pytest.mark.parametrize(("fixture", "exit_code", "kind"), [
    ("gemini-error_500", 244, "transient"),
    ("gemini-error_401", 145, "auth"),
])
def test_gemini_api_failures(fixture: str, exit_code: int, kind: str) -> None:
    stream = GeminiTurnStream()
    feed(stream, fixture, exit_code=exit_code)
    assert stream.finished and not stream.succeeded
    assert stream.failure(resumed=False).kind == kind


@pytest.mark.parametrize(("message", "error_type", "kind"), [
    (('[API Error: {"error":{"code":400,"message":"API key not valid.","status":"INVALID_ARGUMENT",'
      '"details":[{"reason":"API_KEY_INVALID"}]}}]'), "unknown", "auth"),
    ('[API Error: {"error":{"code":400,"message":"bad field","status":"INVALID_ARGUMENT"}}]', "unknown", "permanent"),
    (('[API Error: {"error":{"code":429,"message":"Resource exhausted","details":[{"retryDelay":"400s"}]}}]\n'
      "Please wait and try again later."), "unknown", "rate_limit"),
    ("You have exhausted your daily quota on this model.", "unknown", "rate_limit"),
    ("Reached max session turns for this session.", "FatalTurnLimitedError", "permanent"),
    ("The model returned an empty response.", "unknown", "transient"),
])
def test_gemini_failure_messages(message: str, error_type: str, kind: str) -> None:
    stream = GeminiTurnStream()
    stream.feed(json.dumps({"type": "result", "status": "error", "error": {"type": error_type, "message": message},
                            "stats": {}}))
    stream.finish(1, "")
    failure = stream.failure(resumed=False)
    assert failure.kind == kind
    if "400s" in message:
        assert abs(failure.reset_at_ms - (time.time() + 400) * 1000) < 5000


@pytest.mark.parametrize(("exit_code", "stderr", "resumed", "kind"), [
    (41, "Invalid auth method selected.", False, "auth"),
    (42, "Invalid session identifier \"x\". Searched for sessions in /h/.gemini/tmp/repo/chats", True,
     "resume_failed"),
    (42, "Session ID x already exists. Use --resume to resume it.", False, "permanent"),
    (55, "Gemini CLI is not running in a trusted directory.", False, "permanent"),
    (0, "", False, "transient"),  # killed: exit 0 and no result line
])
def test_gemini_failures_known_only_from_the_exit_status(exit_code: int, stderr: str, resumed: bool,
                                                         kind: str) -> None:
    stream = GeminiTurnStream()
    stream.finish(exit_code, stderr)
    assert not stream.succeeded and stream.failure(resumed=resumed).kind == kind


def test_gemini_exit_0_with_an_error_result_is_not_success() -> None:
    stream = GeminiTurnStream()
    stream.feed(json.dumps({"type": "error", "severity": "error", "message": "The model returned an empty response."}))
    stream.feed(json.dumps({"type": "result", "status": "error", "stats": {}}))
    stream.finish(0, "")
    assert stream.finished and not stream.succeeded
    assert "empty response" in stream.failure(resumed=False).reason


# ---- opencode ------------------------------------------------------------------------------------


def test_opencode_text_turn() -> None:
    stream = OpenCodeTurnStream()
    parsed = feed(stream, "opencode-text_turn")
    assert kinds(parsed) == ["turn_start", "runtime_event", "assistant_text", "turn_result"]
    assert stream.succeeded and stream.session_id == "ses_df740dd7bffeIVGySj5e4I14bj"
    assert stream.usage() == (7818, 4, 0.03919)  # opencode priced it: its config had a cost


def test_opencode_tool_turn_adds_up_steps() -> None:
    stream = OpenCodeTurnStream()
    parsed = feed(stream, "opencode-tool_turn")
    assert [(p.kind, p.tool) for p in parsed if p.tool] == [
        ("tool_start", "write"), ("tool_end", "write"), ("tool_start", "bash"), ("tool_end", "bash")]
    assert [p.kind for p in parsed].count("turn_result") == 1 and stream.steps == 3
    assert stream.usage() == (7753 + 7846 + 7924, 32 + 22 + 2, 0.0)
    bash_end = [p for p in parsed if p.kind == "tool_end"][1]
    assert bash_end.data["exit_code"] == 0 and bash_end.data["duration_ms"] == 96


def test_opencode_plugin_denial_is_a_failed_tool() -> None:
    stream = OpenCodeTurnStream()
    parsed = feed(stream, "opencode-plugin_deny")
    ends = [p for p in parsed if p.kind == "tool_end"]
    assert ends[0].data["is_error"] and ends[0].data["output"] == "ov guard: no forbidden files"
    assert stream.succeeded


@pytest.mark.parametrize(("fixture", "kind"), [("opencode-error_503", "transient"), ("opencode-error_401", "auth")])
def test_opencode_api_failures(fixture: str, kind: str) -> None:
    stream = OpenCodeTurnStream()
    parsed = feed(stream, fixture, exit_code=1)
    assert kinds(parsed) == ["turn_start", "turn_result"]
    assert stream.finished and not stream.succeeded and stream.failure(resumed=False).kind == kind


def test_opencode_rate_limit_reset_from_the_response_headers() -> None:
    stream = OpenCodeTurnStream()
    stream.feed(json.dumps({"type": "error", "sessionID": "ses_1", "error": {"name": "APIError", "data": {
        "message": "Rate limit reached", "statusCode": 429, "isRetryable": True,
        "responseHeaders": {"retry-after": "30"}}}}))
    stream.finish(1, "")
    failure = stream.failure(resumed=False)
    assert failure.kind == "rate_limit" and abs(failure.reset_at_ms - (time.time() + 30) * 1000) < 5000


def test_opencode_unknown_session_and_silent_exits() -> None:
    gone = OpenCodeTurnStream()
    gone.finish(1, "\x1b[91m\x1b[1mError: \x1b[0mSession not found\n")
    assert gone.failure(resumed=True).kind == "resume_failed"
    broken = OpenCodeTurnStream()
    broken.finish(1, "Error: You must provide a message or a command\n")
    assert broken.failure(resumed=False).kind == "permanent"
    killed = OpenCodeTurnStream()
    killed.feed(json.dumps({"type": "step_start", "sessionID": "ses_1", "part": {}}))
    killed.finish(-15, "")
    assert not killed.succeeded and killed.failure(resumed=False).kind == "transient"


def test_opencode_exit_status_must_be_clean_for_success() -> None:
    stream = OpenCodeTurnStream()
    feed(stream, "opencode-text_turn", exit_code=1)
    assert stream.finished and not stream.succeeded


# ---- qwen (Qwen Code 0.24.4: Claude's stream-json, its own error texts and shell results) ----------


def test_qwen_tool_turn_receipts_come_from_exit_codes() -> None:
    from overstory.runtimes.qwen.stream import QwenTurnStream

    stream = QwenTurnStream()
    parsed = feed(stream, "qwen-tool_turn")
    ends = [p.data for p in parsed if p.kind == "tool_end"]
    # `echo hi > a.txt && exit 3` ran: the receipt says failed, with its exit code; the write succeeded.
    assert [(e["is_error"], e.get("exit_code")) for e in ends] == [(True, 3), (False, None)]
    assert stream.succeeded and stream.session_id and stream.tool_calls == 2
    usage = stream.usage()
    assert usage.input_tokens > 0 and usage.output_tokens > 0 and usage.cost_usd == 0.0  # qwen reports no dollars
    assert sum(t.total for t in stream.live_usage().values()) > 0  # each message's usage, for budgets mid-turn


def test_qwen_401_is_auth_and_a_silent_exit_is_transient() -> None:
    from overstory.runtimes.qwen.stream import QwenTurnStream

    stream = QwenTurnStream()
    feed(stream, "qwen-error_401", exit_code=1)
    failure = stream.failure(resumed=False)
    assert not stream.succeeded and failure.kind == "auth" and "401" in failure.reason
    killed = QwenTurnStream()
    killed.finish(-9, "")
    assert killed.failure(resumed=False).kind == "transient"
