"""The real Claude Code CLI, headless, against the scripted mock Messages API.

These tests pin down the behaviour `ov`'s turn runner relies on (event shapes, tools
really running, resume, hook denials, retries, errors, signals). Set
OV_CAPTURE_STREAM_FIXTURES=1 to refresh tests/fixtures/stream/*.jsonl from these runs.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import typing as t
from pathlib import Path

import pytest

from claude_cli import (
    CLAUDE_BIN,
    HEADLESS_ARGS,
    claude_env,
    parse_stream,
    requires_claude,
    run_headless_turn,
    seed_interactive_config,
    user_message_line,
)
from conftest import hermetic_environ
from mockapi import (
    MockMessagesAPI,
    Reply,
    ScriptedConversation,
    conversation_text,
    delayed,
    error_reply,
    is_side_request,
    stalled_reply,
    text_reply,
    tool_reply,
    tools_reply,
)
from requires import need_program

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "stream"
TURN_TIMEOUT = 60.0
# Read at import: the shared autouse fixture removes OV_* variables before each test.
CAPTURE_FIXTURES = os.environ.get("OV_CAPTURE_STREAM_FIXTURES") == "1"


# --------------------------------------------------------------------------- helpers


def capture(name: str, stdout: str) -> None:
    """Keep a real stdout as a parser fixture when OV_CAPTURE_STREAM_FIXTURES=1."""
    if CAPTURE_FIXTURES:
        FIXTURES.mkdir(parents=True, exist_ok=True)
        (FIXTURES / f"{name}.jsonl").write_text(stdout)


def of_type(events: list[dict[str, t.Any]], kind: str, subtype: str | None = None) -> list[dict[str, t.Any]]:
    return [e for e in events if e.get("type") == kind and (subtype is None or e.get("subtype") == subtype)]


def the_result(events: list[dict[str, t.Any]]) -> dict[str, t.Any]:
    results = of_type(events, "result")
    assert len(results) == 1, f"expected exactly one result event, got {len(results)}: {events!r}"
    assert events[-1] is results[0], "the result must be the last event"
    return results[0]


def blocks(events: list[dict[str, t.Any]], kind: str, block_type: str) -> list[dict[str, t.Any]]:
    return [
        block
        for e in of_type(events, kind)
        for block in e["message"]["content"]
        if isinstance(block, dict) and block.get("type") == block_type
    ]


def wait_until(predicate: t.Callable[[], bool], timeout: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill(0); it has finished for our purposes.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0] != "Z"
    except (FileNotFoundError, IndexError):
        return False


def make_git_repo(path: Path) -> Path:
    """A git repository with one commit (README.md)."""
    path.mkdir(parents=True)
    for args in (
        ["init", "-q", "-b", "main"],
        ["config", "user.email", "e2e@example.invalid"],
        ["config", "user.name", "e2e"],
    ):
        subprocess.run(["git", *args], cwd=path, check=True)
    (path / "README.md").write_text("# scratch\n")
    subprocess.run(["git", "add", "-A"], cwd=path, check=True)
    subprocess.run(["git", "commit", "-q", "-m", "initial"], cwd=path, check=True)
    return path


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A throw-away git repository with one commit, as an agent's worktree would be."""
    return make_git_repo(tmp_path / "repo")


@pytest.fixture
def claude() -> str:
    assert CLAUDE_BIN, "requires_claude should have skipped this test"
    return CLAUDE_BIN


class Turn(t.NamedTuple):
    proc: subprocess.CompletedProcess[str]
    events: list[dict[str, t.Any]]


def turn(claude: str, prompt: str, repo: Path, env: dict[str, str], **kwargs: t.Any) -> Turn:
    proc = run_headless_turn(claude, prompt, cwd=repo, env=env, timeout=TURN_TIMEOUT, **kwargs)
    return Turn(proc, parse_stream(proc.stdout))


def start_turn(claude: str, prompt: str, repo: Path, env: dict[str, str]) -> subprocess.Popen[str]:
    """A turn in its own process group (as ov runs it), stdin closed after the prompt."""
    proc = subprocess.Popen(
        [claude, *HEADLESS_ARGS],
        cwd=repo,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    assert proc.stdin is not None
    proc.stdin.write(user_message_line(prompt))
    proc.stdin.close()
    return proc


def finish(proc: subprocess.Popen[str]) -> tuple[str, str]:
    try:
        # Popen.communicate would try to flush the already closed stdin.
        proc.stdin = None
        return proc.communicate(timeout=TURN_TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise


# --------------------------------------------------------------------------- the mock alone


def test_mock_serves_the_anthropic_sdk_without_streaming() -> None:
    anthropic = pytest.importorskip("anthropic")
    with MockMessagesAPI([text_reply("merged text")]) as api:
        client = anthropic.Anthropic(base_url=api.base_url, api_key="x", max_retries=0)
        message = client.messages.create(
            model="claude-test", max_tokens=50, messages=[{"role": "user", "content": "resolve this"}]
        )
    assert message.content[0].text == "merged text"
    assert message.stop_reason == "end_turn"
    assert message.usage.input_tokens > 0
    assert api.requests[0]["_side"] is False
    assert "resolve this" in conversation_text(api.requests[0])


def test_mock_streams_tool_calls_and_errors_to_the_sdk() -> None:
    anthropic = pytest.importorskip("anthropic")
    script: list[Reply | list[Reply]] = [
        tools_reply([("Bash", {"command": "ls"}), ("Read", {"file_path": "/x"})], text="two calls"),
        error_reply(529, "overloaded_error", "Overloaded"),
    ]
    with MockMessagesAPI(script) as api:
        client = anthropic.Anthropic(base_url=api.base_url, api_key="x", max_retries=0)
        with client.messages.stream(model="m", max_tokens=50, messages=[{"role": "user", "content": "go"}]) as stream:
            final = stream.get_final_message()
        with pytest.raises(anthropic.APIStatusError) as caught:
            client.messages.create(
                model="m",
                max_tokens=50,
                messages=[
                    {"role": "user", "content": "go"},
                    {"role": "assistant", "content": "two calls"},
                    {"role": "user", "content": "again"},
                ],
            )
    assert final.stop_reason == "tool_use"
    assert [b.type for b in final.content] == ["text", "tool_use", "tool_use"]
    assert final.content[2].input == {"file_path": "/x"}
    assert caught.value.status_code == 529
    assert caught.value.body["error"]["type"] == "overloaded_error"


def test_script_follows_conversation_position_not_request_count() -> None:
    script = ScriptedConversation(
        [[error_reply(529, "overloaded_error", "busy"), text_reply("first")], text_reply("second")]
    )
    opening = {"messages": [{"role": "user", "content": "a"}]}
    later = {
        "messages": [
            {"role": "user", "content": "a"},
            {"role": "assistant", "content": "x"},
            {"role": "user", "content": "b"},
        ]
    }
    assert script(opening).status == 529
    assert script(opening).blocks[0]["text"] == "first"
    assert script(later).blocks[0]["text"] == "second"
    assert script(opening).blocks[0]["text"] == "first"  # a resend of the history replays position 0
    beyond = {"messages": later["messages"] + [{"role": "assistant", "content": "y"}, {"role": "user", "content": "c"}]}
    assert script(beyond).blocks[0]["text"] == ScriptedConversation.FINISHED


def test_side_requests_are_told_apart_by_the_cli_marks() -> None:
    cli_headers = {"User-Agent": "claude-cli/2.1.330 (external, sdk-cli)", "x-app": "cli"}
    title = {
        "system": [{"type": "text", "text": "Generate a concise title"}],
        "messages": [{"role": "user", "content": "x"}],
    }
    conversation = dict(title, tools=[{"name": "Bash"}])
    assert is_side_request(title, cli_headers)
    assert not is_side_request(conversation, cli_headers)
    assert not is_side_request(title, {"User-Agent": "Anthropic/Python 2.12.0"})


def test_unknown_paths_get_a_json_404() -> None:
    import urllib.error
    import urllib.request

    with MockMessagesAPI([]) as api:
        head = urllib.request.urlopen(urllib.request.Request(api.base_url + "/", method="HEAD"), timeout=5)
        with pytest.raises(urllib.error.HTTPError) as caught:
            urllib.request.urlopen(api.base_url + "/v1/complete", data=b"{}", timeout=5)
    assert head.status == 200
    assert caught.value.code == 404
    assert json.loads(caught.value.read())["type"] == "error"
    assert api.requests == []


def test_stalled_reply_is_released_when_the_mock_closes() -> None:
    import urllib.error
    import urllib.request

    outcome: list[str] = []
    api = MockMessagesAPI([stalled_reply(None)]).start()

    def call() -> None:
        request = urllib.request.Request(api.base_url + "/v1/messages", data=b'{"messages": []}', method="POST")
        try:
            urllib.request.urlopen(request, timeout=30)
            outcome.append("answered")
        except (urllib.error.URLError, ConnectionError, OSError) as exc:
            outcome.append(type(exc).__name__)

    caller = threading.Thread(target=call)
    caller.start()
    assert api.wait_for_requests(1)
    assert outcome == []  # still held
    api.close()
    caller.join(timeout=10)
    assert outcome and outcome != ["answered"]


# --------------------------------------------------------------------------- the real CLI


class TextThenResume(t.NamedTuple):
    """A text turn, then a second process resuming its session."""

    root: Path
    repo: Path
    first: Turn
    first_requests: list[dict[str, t.Any]]
    second: Turn
    second_requests: list[dict[str, t.Any]]


@pytest.fixture(scope="module")
def text_then_resume(tmp_path_factory: pytest.TempPathFactory, _test_home: Path) -> TextThenResume:
    """The text-turn probe's run is the resume probe's first turn (one CLI start fewer)."""
    assert CLAUDE_BIN, "requires_claude should have skipped this test"
    root = tmp_path_factory.mktemp("claude-text")
    repo = make_git_repo(root / "repo")
    with hermetic_environ(_test_home):
        with MockMessagesAPI([text_reply("Hello from the mock"), text_reply("second answer BANANA")]) as api:
            env = claude_env(api.base_url, root)
            first = turn(CLAUDE_BIN, "say hello", repo, env)
            capture("text_turn", first.proc.stdout)
            first_requests = list(api.main_requests)
            session_id = first.events[0].get("session_id", "") if first.events else ""
            second = turn(CLAUDE_BIN, "turn two", repo, env, resume=session_id)
            capture("resume_turn", second.proc.stdout)
            return TextThenResume(root, repo, first, first_requests, second, api.main_requests[len(first_requests) :])


@requires_claude
def test_text_turn_reports_session_and_cost(text_then_resume: TextThenResume) -> None:
    result, repo = text_then_resume.first, text_then_resume.repo
    assert result.proc.returncode == 0, result.proc.stderr
    init = result.events[0]
    assert (init["type"], init["subtype"]) == ("system", "init")
    session_id = init["session_id"]
    assert session_id and init["cwd"] == str(repo)
    final = the_result(result.events)
    assert final["subtype"] == "success" and final["is_error"] is False
    assert final["result"] == "Hello from the mock"
    assert final["session_id"] == session_id
    assert final["total_cost_usd"] > 0
    assert final["usage"]["input_tokens"] > 0
    (request,) = text_then_resume.first_requests
    assert "say hello" in conversation_text(request)
    assert request["_headers"]["x-claude-code-session-id"] == session_id
    # Every character of the cwd that is not a letter or digit becomes "-" (not only "/").
    project_dir = re.sub(r"[^A-Za-z0-9]", "-", str(repo))
    session_file = text_then_resume.root / "claude-config" / "projects" / project_dir / f"{session_id}.jsonl"
    assert session_file.exists()


class ToolTurn(t.NamedTuple):
    """A Write and a Bash call, run with nonessential traffic allowed behind a refusing proxy."""

    repo: Path
    result: Turn
    main_requests: list[dict[str, t.Any]]
    side_requests: list[dict[str, t.Any]]
    refused: list[bytes]


@pytest.fixture(scope="module")
def tool_turn(tmp_path_factory: pytest.TempPathFactory, _test_home: Path) -> ToolTurn:
    """One run for two probes: tool calls really run, and a headless turn asks for no
    session title even when nonessential traffic is allowed (CLAUDE_CODE_DISABLE_
    NONESSENTIAL_TRAFFIC unset; the vendor's hosts go to a local proxy that refuses
    everything, so this stays offline even where the internet is reachable)."""
    assert CLAUDE_BIN, "requires_claude should have skipped this test"
    root = tmp_path_factory.mktemp("claude-tools")
    repo = make_git_repo(root / "repo")
    refused: list[bytes] = []
    proxy = socket.socket()
    proxy.bind(("127.0.0.1", 0))
    proxy.listen(16)

    def refuse() -> None:
        while True:
            try:
                conn, _ = proxy.accept()
            except OSError:
                return
            with conn:
                conn.settimeout(2)
                try:
                    refused.append(conn.recv(1024).split(b"\r\n", 1)[0])
                    conn.sendall(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n")
                except OSError:
                    pass

    threading.Thread(target=refuse, daemon=True).start()
    proxy_url = f"http://127.0.0.1:{proxy.getsockname()[1]}"
    target = repo / "hello.txt"
    script = [
        tool_reply("Write", {"file_path": str(target), "content": "written by the agent\n"}, text="Writing it."),
        tool_reply(
            "Bash",
            {"command": "git add -A && git commit -q -m agent-commit && git log --oneline", "description": "commit"},
        ),
        text_reply("Committed."),
    ]
    try:
        with hermetic_environ(_test_home), MockMessagesAPI(script) as api:
            env = claude_env(
                api.base_url,
                root,
                extra={"HTTPS_PROXY": proxy_url, "HTTP_PROXY": proxy_url, "NO_PROXY": "127.0.0.1,localhost"},
            )
            del env["CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC"]
            result = turn(CLAUDE_BIN, "create hello.txt and commit", repo, env)
            capture("tool_turn", result.proc.stdout)
            return ToolTurn(repo, result, api.main_requests, api.side_requests, list(refused))
    finally:
        proxy.close()


@requires_claude
def test_write_and_bash_tool_calls_really_run(tool_turn: ToolTurn) -> None:
    """(Run with nonessential traffic allowed: see the title probe.)"""
    result, repo = tool_turn.result, tool_turn.repo
    assert result.proc.returncode == 0, result.proc.stderr
    assert (repo / "hello.txt").read_text() == "written by the agent\n"
    log = subprocess.run(["git", "log", "--format=%s"], cwd=repo, capture_output=True, text=True, check=True).stdout
    assert log.splitlines()[0] == "agent-commit"

    uses = blocks(result.events, "assistant", "tool_use")
    assert [u["name"] for u in uses] == ["Write", "Bash"]
    outcomes = blocks(result.events, "user", "tool_result")
    assert [o["tool_use_id"] for o in outcomes] == [u["id"] for u in uses]
    assert "agent-commit" in outcomes[1]["content"]
    # The Bash output went back to the model in the next request.
    assert len(tool_turn.main_requests) == 3
    assert "agent-commit" in conversation_text(tool_turn.main_requests[2])
    final = the_result(result.events)
    assert final["num_turns"] == 3 and final["result"] == "Committed."


@requires_claude
def test_resume_in_a_second_process_resends_the_history(text_then_resume: TextThenResume) -> None:
    """(The first turn is the text-turn probe's.)"""
    first, second = text_then_resume.first, text_then_resume.second
    session_id = first.events[0]["session_id"]
    assert first.proc.returncode == 0 and second.proc.returncode == 0, second.proc.stderr
    assert second.events[0]["session_id"] == session_id
    assert the_result(second.events)["result"] == "second answer BANANA"
    resent = conversation_text(text_then_resume.second_requests[-1])
    assert "say hello" in resent and "Hello from the mock" in resent and "turn two" in resent
    assert text_then_resume.second_requests[-1]["_headers"]["x-claude-code-session-id"] == session_id


@requires_claude
def test_resume_of_an_unknown_session_is_an_error_result(claude: str, repo: Path, tmp_path: Path) -> None:
    with MockMessagesAPI([text_reply("never")]) as api:
        result = turn(
            claude, "hi", repo, claude_env(api.base_url, tmp_path), resume="00000000-0000-4000-8000-000000000000"
        )
    capture("unknown_resume", result.proc.stdout)

    assert result.proc.returncode == 1
    final = the_result(result.events)
    assert final["subtype"] == "error_during_execution" and final["is_error"] is True
    assert any("No conversation found" in e for e in final["errors"])
    assert api.requests == []


DENY_HOOK = """\
import json, os, sys
seen = json.load(sys.stdin)
seen["_env"] = {k: v for k, v in os.environ.items() if k.startswith(("CLAUDE", "OVERSTORY"))}
with open(sys.argv[1], "a") as log:
    log.write(json.dumps(seen) + "\\n")
print(json.dumps({"hookSpecificOutput": {
    "hookEventName": "PreToolUse",
    "permissionDecision": "deny",
    "permissionDecisionReason": "scouts may not write files",
}}))
"""


@requires_claude
def test_pretooluse_hook_deny_blocks_the_write(claude: str, repo: Path, tmp_path: Path) -> None:
    hook_script = tmp_path / "deny_hook.py"
    hook_script.write_text(DENY_HOOK)
    hook_log = tmp_path / "hook.log"
    settings = {
        "hooks": {
            "PreToolUse": [
                {
                    "matcher": "Write",
                    "hooks": [{"type": "command", "command": f"{sys.executable} {hook_script} {hook_log}"}],
                }
            ]
        }
    }
    (repo / ".claude").mkdir()
    (repo / ".claude" / "settings.local.json").write_text(json.dumps(settings))
    forbidden = repo / "forbidden.txt"
    script = [
        tool_reply("Write", {"file_path": str(forbidden), "content": "x"}),
        text_reply("Understood, not writing."),
    ]
    with MockMessagesAPI(script) as api:
        env = claude_env(api.base_url, tmp_path, extra={"OVERSTORY_AGENT_NAME": "scout-1"})
        result = turn(claude, "write forbidden.txt", repo, env)
    capture("denied_tool", result.proc.stdout)

    assert result.proc.returncode == 0, result.proc.stderr
    assert not forbidden.exists()
    denial = blocks(result.events, "user", "tool_result")[0]
    assert denial["is_error"] is True and "scouts may not write files" in denial["content"]
    assert "scouts may not write files" in conversation_text(api.main_requests[-1])
    final = the_result(result.events)
    assert final["is_error"] is False
    write_use = blocks(result.events, "assistant", "tool_use")[0]
    assert final["permission_denials"] == [
        {
            "tool_name": "Write",
            "tool_use_id": write_use["id"],
            "tool_input": {"file_path": str(forbidden), "content": "x"},
        }
    ]
    hook_input = json.loads(hook_log.read_text().splitlines()[0])
    assert hook_input["hook_event_name"] == "PreToolUse" and hook_input["tool_name"] == "Write"
    assert hook_input["tool_use_id"] == write_use["id"]
    assert hook_input["session_id"] == final["session_id"]
    assert hook_input["_env"]["OVERSTORY_AGENT_NAME"] == "scout-1"
    assert hook_input["_env"]["CLAUDE_PROJECT_DIR"] == str(repo)
    assert hook_input["_env"]["CLAUDE_CODE_SESSION_ID"] == final["session_id"]


TRACE_HOOK = """\
import json, sys
seen = json.load(sys.stdin)
with open(sys.argv[1], "a") as log:
    log.write(json.dumps(seen) + "\\n")
if seen["hook_event_name"] == "Stop" and not seen["stop_hook_active"]:
    print(json.dumps({"decision": "block", "reason": "send worker_done before stopping"}))
"""


@requires_claude
def test_hook_events_and_a_blocking_stop_hook(claude: str, repo: Path, tmp_path: Path) -> None:
    """With --include-hook-events hook traces precede system/init; a Stop hook that
    blocks once feeds its reason back and buys exactly one more model turn."""
    hook_script = tmp_path / "trace_hook.py"
    hook_script.write_text(TRACE_HOOK)
    hook_log = tmp_path / "hooks.log"
    command = {"type": "command", "command": f"{sys.executable} {hook_script} {hook_log}"}
    settings = {
        "hooks": {
            event: [{"matcher": "Bash", "hooks": [command]}] if event.endswith("ToolUse") else [{"hooks": [command]}]
            for event in ("SessionStart", "UserPromptSubmit", "PreToolUse", "PostToolUse", "Stop")
        }
    }
    (repo / ".claude").mkdir()
    (repo / ".claude" / "settings.local.json").write_text(json.dumps(settings))
    script = [
        tool_reply("Bash", {"command": "echo traced", "description": "echo"}),
        text_reply("stopping now"),
        text_reply("worker_done sent"),
    ]
    with MockMessagesAPI(script) as api:
        result = turn(claude, "work", repo, claude_env(api.base_url, tmp_path), extra_args=["--include-hook-events"])
    capture("hook_events", result.proc.stdout)

    assert result.proc.returncode == 0, result.proc.stderr
    kinds = [(e["type"], e.get("subtype")) for e in result.events]
    init_at = kinds.index(("system", "init"))
    assert init_at > 0 and all(k[1] in ("hook_started", "hook_response") for k in kinds[:init_at])
    responses = of_type(result.events, "system", "hook_response")
    assert {r["hook_event"] for r in responses} == {
        "SessionStart",
        "UserPromptSubmit",
        "PreToolUse",
        "PostToolUse",
        "Stop",
    }
    assert all(r["exit_code"] == 0 and r["outcome"] == "success" for r in responses)
    assert "send worker_done before stopping" in conversation_text(api.main_requests[-1])
    assert the_result(result.events)["result"] == "worker_done sent"
    assert len(api.main_requests) == 3

    seen = [json.loads(line) for line in hook_log.read_text().splitlines()]
    by_event = {}
    for entry in seen:
        by_event.setdefault(entry["hook_event_name"], []).append(entry)
    assert by_event["SessionStart"][0]["source"] == "startup"
    assert by_event["UserPromptSubmit"][0]["prompt"] == "work"
    assert by_event["PostToolUse"][0]["tool_response"]["stdout"] == "traced"
    assert [s["stop_hook_active"] for s in by_event["Stop"]] == [False, True]
    assert by_event["Stop"][0]["last_assistant_message"] == "stopping now"


@requires_claude
def test_overloaded_529_is_retried_with_an_api_retry_event(claude: str, repo: Path, tmp_path: Path) -> None:
    script = [[error_reply(529, "overloaded_error", "Overloaded"), text_reply("answered after retry")]]
    with MockMessagesAPI(script) as api:
        result = turn(claude, "hi", repo, claude_env(api.base_url, tmp_path))
    capture("api_retry_529", result.proc.stdout)

    assert result.proc.returncode == 0, result.proc.stderr
    retries = of_type(result.events, "system", "api_retry")
    assert len(retries) == 1
    assert retries[0]["error_status"] == 529 and retries[0]["attempt"] == 1
    assert retries[0]["max_retries"] >= 1 and retries[0]["retry_delay_ms"] > 0
    assert the_result(result.events)["result"] == "answered after retry"
    assert len(api.main_requests) == 2


def _betas(request: dict[str, t.Any]) -> set[str]:
    return set(filter(None, request["_headers"].get("anthropic-beta", "").split(",")))


@requires_claude
def test_bad_request_400_ends_the_turn_with_an_error_result(claude: str, repo: Path, tmp_path: Path) -> None:
    """A 400 is sent again 5 times, each time with fewer beta features (and from the
    4th on without tool search, so with every tool inline), silently: no api_retry."""
    with MockMessagesAPI([error_reply(400, "invalid_request_error", "mock: messages.0 is malformed")]) as api:
        result = turn(claude, "hi", repo, claude_env(api.base_url, tmp_path))
    capture("error_400", result.proc.stdout)

    assert result.proc.returncode == 1
    final = the_result(result.events)
    assert final["is_error"] is True and final["subtype"] == "success"
    assert final["api_error_status"] == 400 and final["api_error_type"] == "invalid_request_error"
    assert final["terminal_reason"] == "api_error"
    assert "mock: messages.0 is malformed" in final["result"]
    assert of_type(result.events, "system", "api_retry") == []
    requests = api.main_requests
    assert len(requests) == 6
    assert _betas(requests[-1]) < _betas(requests[0])
    assert len(requests[-1]["tools"]) > len(requests[0]["tools"])


@requires_claude
def test_prompt_too_long_400_is_not_sent_again(claude: str, repo: Path, tmp_path: Path) -> None:
    too_long = error_reply(400, "invalid_request_error", "prompt is too long: 300000 tokens > 200000 maximum")
    with MockMessagesAPI([too_long]) as api:
        result = turn(claude, "hi", repo, claude_env(api.base_url, tmp_path))

    assert result.proc.returncode == 1
    final = the_result(result.events)
    assert final["is_error"] is True and final["api_error_status"] == 400
    assert final["terminal_reason"] == "prompt_too_long" and final["result"].startswith("Prompt is too long")
    assert len(api.main_requests) == 1


@requires_claude
def test_headless_turn_sends_no_title_request_even_with_nonessential_traffic(tool_turn: ToolTurn) -> None:
    """2.1.197 asked the same endpoint for a session title when nonessential traffic
    was allowed; 2.1.330 does not, in -p mode. It still tries the vendor's own hosts,
    which are sent to a local proxy that refuses everything, so this stays offline
    even where the internet is reachable. (The tool-call probe's run.)"""
    result = tool_turn.result
    assert result.proc.returncode == 0, result.proc.stderr
    assert the_result(result.events)["result"] == "Committed."
    assert tool_turn.side_requests == []
    assert len(tool_turn.main_requests) == 3
    assert all(b.startswith(b"CONNECT ") for b in tool_turn.refused)


TASK = {
    "description": "compute",
    "prompt": "SUBAGENT-PROMPT: compute the answer",
    "subagent_type": "general-purpose",
}


@requires_claude
def test_subagent_runs_in_the_background_and_its_notification_is_a_second_result(
    claude: str, repo: Path, tmp_path: Path
) -> None:
    """The Task (now `Agent`) tool starts a background sub-agent that talks to the same
    endpoint with an agent-id header; it must not replay the main script from position
    0. The main turn ends at once; when the sub-agent finishes, the same process starts
    another turn (a second init) for its notification and prints a second result. With
    stdin closed both results come at the end, the cumulative cost in each."""
    sub_prompts: list[str] = []

    def side(body: dict[str, t.Any]) -> Reply:
        sub_prompts.append(conversation_text(body))
        return delayed(text_reply("SUBAGENT-ANSWER 42"), 0.5)

    script = [tool_reply("Task", TASK), text_reply("main done"), text_reply("read the notification")]
    with MockMessagesAPI(script, side_responder=side) as api:
        result = turn(claude, "please delegate", repo, claude_env(api.base_url, tmp_path))
    capture("subagent_turn", result.proc.stdout)

    assert result.proc.returncode == 0, result.proc.stderr
    assert len(sub_prompts) == 1 and "SUBAGENT-PROMPT: compute the answer" in sub_prompts[0]
    (sub_request,) = api.side_requests
    assert sub_request["_agent_id"] and sub_request.get("tools")
    assert "Agent" in [tool["name"] for tool in api.main_requests[0]["tools"]]
    started = of_type(result.events, "system", "task_started")[0]
    assert started["prompt"] == TASK["prompt"] and started["is_backgrounded"] is True
    # The tool_result only says the agent was launched; its answer comes with the notification.
    launched = blocks(result.events, "user", "tool_result")[0]
    assert "Async agent launched" in launched["content"][0]["text"]
    assert "SUBAGENT-ANSWER 42" not in conversation_text(api.main_requests[1])
    assert len(api.main_requests) == 3
    assert "<task-notification>" in conversation_text(api.main_requests[2])
    assert "SUBAGENT-ANSWER 42" in conversation_text(api.main_requests[2])

    assert len(of_type(result.events, "system", "init")) == 2
    first, second = of_type(result.events, "result")
    assert result.events[-1] is second
    assert (first["result_index"], first["result"], first["is_error"]) == (0, "main done", False)
    assert (second["result_index"], second["result"], second["is_error"]) == (1, "read the notification", False)
    assert "origin" not in first and second["origin"]["kind"] == "task-notification"
    # total_cost_usd is the process's running total: the same in both, sub-agent included.
    assert first["total_cost_usd"] == second["total_cost_usd"] > 0
    # usage is per result, main thread only.
    assert second["usage"]["input_tokens"] < first["usage"]["input_tokens"]


@requires_claude
def test_a_failing_notification_turn_fails_the_process(claude: str, repo: Path, tmp_path: Path) -> None:
    script = [
        tool_reply("Task", TASK),
        text_reply("main done"),
        error_reply(400, "invalid_request_error", "mock: the notification turn is malformed"),
    ]
    with MockMessagesAPI(script, side_responder=lambda body: text_reply("SUBAGENT-ANSWER 42")) as api:
        result = turn(claude, "please delegate", repo, claude_env(api.base_url, tmp_path))
    capture("subagent_notification_error", result.proc.stdout)

    assert result.proc.returncode == 1
    first, second = of_type(result.events, "result")
    assert first["is_error"] is False and second["is_error"] is True
    assert second["api_error_status"] == 400 and second["origin"]["kind"] == "task-notification"
    assert len(api.main_requests) == 2 + 6  # the 400 is sent 6 times (see the 400 test above)


@requires_claude
def test_sigint_mid_tool_stops_the_tool_and_ends_with_an_error_result(claude: str, repo: Path, tmp_path: Path) -> None:
    command = "echo $$ > started.pid; sleep 30; echo late > finished.txt"
    with MockMessagesAPI([tool_reply("Bash", {"command": command, "description": "wait"}), text_reply("x")]) as api:
        proc = start_turn(claude, "wait a bit", repo, claude_env(api.base_url, tmp_path))
        try:
            assert wait_until(
                lambda: (repo / "started.pid").exists() and (repo / "started.pid").read_text().strip() != ""
            )
            tool_shell = int((repo / "started.pid").read_text())
            proc.send_signal(signal.SIGINT)
            stdout, _ = finish(proc)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
    capture("interrupted_sigint_tool", stdout)

    events = parse_stream(stdout)
    assert proc.returncode in (0, 1)  # measured: 1 mostly, 0 sometimes (a race in the CLI's exit)
    # Mostly an error result follows; once, on a loaded machine, the CLI exited before printing it
    # (2026-11-28). Either way nothing says the turn succeeded, which is all ov relies on.
    results = [e for e in events if e.get("type") == "result"]
    assert len(results) <= 1 and all(r["subtype"] == "error_during_execution" and r["is_error"] for r in results)
    outcome = blocks(events, "user", "tool_result")[0]
    assert outcome["is_error"] is True
    assert "[Request interrupted by user for tool use]" in stdout
    assert wait_until(lambda: not pid_alive(tool_shell), timeout=10)
    assert not (repo / "finished.txt").exists()


@requires_claude
def test_sigterm_kills_the_tool_shell_but_sigkill_leaves_it_running(claude: str, repo: Path, tmp_path: Path) -> None:
    """The CLI starts each Bash tool call in a session of its own, outside the turn's
    process group. On SIGTERM it kills the tool's group itself (the tool_result says
    "Exit code 137") and exits 143 with no result; on SIGKILL it cannot, and the tool
    shell lives on, re-parented. A runner must still reap those itself."""
    command = "echo $$ > started.pid; exec sleep 30"
    outcomes: dict[str, tuple[int, str, bool, int, list[bytes]]] = {}
    for sig in (signal.SIGTERM, signal.SIGKILL):
        pid_file = repo / "started.pid"
        pid_file.unlink(missing_ok=True)
        script = [tool_reply("Bash", {"command": command, "description": "wait"}), text_reply("x")]
        with MockMessagesAPI(script) as api:
            proc = start_turn(claude, "wait a bit", repo, claude_env(api.base_url, tmp_path / sig.name))
            tool_pid = None
            try:
                assert wait_until(lambda: pid_file.exists() and pid_file.read_text().strip() != "")
                tool_pid = int(pid_file.read_text())
                tool_sid = os.getsid(tool_pid)
                # The pid file is written before the shell execs sleep: /proc/PID/environ reads empty while
                # the exec is under way, so read it once it has something.
                assert wait_until(lambda: Path(f"/proc/{tool_pid}/environ").read_bytes().strip(b"\0") != b"")
                environ = Path(f"/proc/{tool_pid}/environ").read_bytes().split(b"\0")
                os.killpg(proc.pid, sig)
                stdout, _ = finish(proc)
                wait_until(lambda: not pid_alive(tool_pid), timeout=5 if sig == signal.SIGTERM else 1)
                outcomes[sig.name] = (proc.returncode, stdout, pid_alive(tool_pid), tool_sid, environ)
            finally:
                if proc.poll() is None:
                    os.killpg(proc.pid, signal.SIGKILL)
                if tool_pid is not None and pid_alive(tool_pid):
                    os.kill(tool_pid, signal.SIGKILL)
        assert outcomes[sig.name][3] not in (proc.pid, os.getsid(0))  # its own session

    term_code, term_out, term_alive, _, _ = outcomes["SIGTERM"]
    assert term_code == 143 and not term_alive
    term_events = parse_stream(term_out)
    assert of_type(term_events, "result") == []
    killed = blocks(term_events, "user", "tool_result")
    assert killed and killed[0]["is_error"] is True and killed[0]["content"] == "Exit code 137"
    kill_code, kill_out, kill_alive, _, environ = outcomes["SIGKILL"]
    assert kill_code == -signal.SIGKILL and kill_alive
    session_id = parse_stream(kill_out)[0]["session_id"]
    assert f"CLAUDE_CODE_SESSION_ID={session_id}".encode() in environ


@requires_claude
def test_signals_during_a_hung_request_never_look_like_success(claude: str, repo: Path, tmp_path: Path) -> None:
    """A hung API call: SIGTERM exits 143 with no result; SIGINT exits 0, usually with no
    result at all (sometimes an error_during_execution result, depending on timing).
    So an exit status of 0 alone never means the turn finished: only a result does."""
    outcomes: dict[str, tuple[int, str]] = {}
    for sig in (signal.SIGTERM, signal.SIGINT):
        with MockMessagesAPI([stalled_reply(None)]) as api:
            proc = start_turn(claude, "hello?", repo, claude_env(api.base_url, tmp_path / sig.name))
            try:
                assert api.wait_for_requests(1, timeout=30)
                proc.send_signal(sig)
                stdout, _ = finish(proc)
            finally:
                if proc.poll() is None:
                    os.killpg(proc.pid, signal.SIGKILL)
        outcomes[sig.name] = (proc.returncode, stdout)
    capture("killed_sigterm_request", outcomes["SIGTERM"][1])
    capture("interrupted_sigint_request", outcomes["SIGINT"][1])

    term_code, term_out = outcomes["SIGTERM"]
    assert term_code == 143
    assert [(e["type"], e.get("subtype")) for e in parse_stream(term_out)] == [("system", "init")]
    int_code, int_out = outcomes["SIGINT"]
    assert int_code == 0
    int_events = parse_stream(int_out)
    assert (int_events[0]["type"], int_events[0]["subtype"]) == ("system", "init")
    assert all(e["is_error"] for e in of_type(int_events, "result"))


# Footer of the TUI: present once it is ready; "esc to interrupt" joins it while busy.
TUI_READY_MARK = "bypass permissions on"
TUI_BUSY_MARK = "esc to interrupt"


@requires_claude
def test_interactive_tui_in_tmux_answers_a_typed_prompt(claude: str, repo: Path, tmp_path: Path) -> None:
    need_program("tmux")
    socket_name = f"ov-e2e-{os.getpid()}-{tmp_path.name}"[:80]

    def tmux(*args: str) -> str:
        return subprocess.run(["tmux", "-L", socket_name, *args], capture_output=True, text=True, timeout=10).stdout

    def screen() -> str:
        return tmux("capture-pane", "-p", "-t", "agent")

    script = [
        delayed(tool_reply("Bash", {"command": "echo from-tui", "description": "echo"}), 1.0),
        text_reply("TUI answer ORANGE"),
    ]
    with MockMessagesAPI(script) as api:
        env = claude_env(api.base_url, tmp_path)
        seed_interactive_config(env, repo)
        passed = [
            arg
            for name in (
                "ANTHROPIC_BASE_URL",
                "ANTHROPIC_API_KEY",
                "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC",
                "CLAUDE_CODE_DISABLE_OFFICIAL_MARKETPLACE_AUTOINSTALL",
                "CLAUDE_CONFIG_DIR",
                "CLAUDE_CODE_TMPDIR",
                "IS_SANDBOX",
                "DISABLE_AUTOUPDATER",
            )
            if name in env
            for arg in ("-e", f"{name}={env[name]}")
        ]
        try:
            subprocess.run(
                [
                    "tmux",
                    "-L",
                    socket_name,
                    "-f",
                    "/dev/null",
                    "new-session",
                    "-d",
                    "-s",
                    "agent",
                    "-x",
                    "120",
                    "-y",
                    "40",
                    "-c",
                    str(repo),
                    *passed,
                    f"{claude} --permission-mode bypassPermissions",
                ],
                check=True,
                timeout=10,
                env={k: v for k, v in os.environ.items() if k != "TMUX"},
            )
            assert wait_until(lambda: TUI_READY_MARK in screen(), timeout=30), screen()
            assert TUI_BUSY_MARK not in screen()
            tmux("send-keys", "-t", "agent", "-l", "run the echo")
            tmux("send-keys", "-t", "agent", "Enter")
            assert wait_until(lambda: TUI_BUSY_MARK in screen(), timeout=30), screen()
            assert wait_until(
                lambda: "TUI answer ORANGE" in screen() and TUI_BUSY_MARK not in screen(), timeout=30
            ), screen()
        finally:
            tmux("kill-server")

    assert "from-tui" in conversation_text(api.main_requests[-1])
    assert "run the echo" in conversation_text(api.main_requests[0])
    # 2.1.197's TUI asked for a session title even with nonessential traffic off; 2.1.330's does not.
    assert api.side_requests == []
