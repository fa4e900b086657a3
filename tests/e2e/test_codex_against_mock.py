"""The real Codex CLI (`codex exec --json`), headless, against the scripted mock Responses API.

Only the model is mocked (there is no model to call offline); the tools, the sandbox,
hooks, session files and resume are codex's own. These tests pin the facts an `ov`
runtime adapter for codex relies on (tests/fixtures/CODEX_PROBE_NOTES.md): the JSONL
event shapes, a shell command really running, apply_patch edits, resume re-sending the
history, the retry behaviour on 5xx / 401 / 429 / a silent stream, PreToolUse hooks,
and what a signal leaves behind. Set OV_CAPTURE_STREAM_FIXTURES=1 to refresh
tests/fixtures/stream/codex-*.jsonl from these runs.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import typing as t
from pathlib import Path

import pytest

from codex_cli import (
    CODEX_BIN,
    RefusingProxy,
    cmdline,
    codex_config,
    codex_env,
    exec_args,
    items,
    parse_jsonl,
    pid_alive,
    processes_of_thread,
    proxied,
    requires_codex,
    run_exec,
    wait_until,
)
from conftest import hermetic_environ
from mock_openai_responses import (
    MockResponsesAPI,
    Reply,
    error_reply,
    function_outputs,
    input_messages,
    shell_reply,
    silent_stream_reply,
    stalled_reply,
    text_reply,
    with_headers,
)

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "stream"
# /tmp and $TMPDIR are writable roots of workspace-write by default; pytest's tmp_path
# is under /tmp, so tests that need "outside the worktree" to be read-only drop them.
NO_TMP_WRITES = "[sandbox_workspace_write]\nexclude_slash_tmp = true\nexclude_tmpdir_env_var = true\n"
TURN_TIMEOUT = 45.0
# Read at import: the shared autouse fixture removes OV_* variables before each test.
CAPTURE_FIXTURES = os.environ.get("OV_CAPTURE_STREAM_FIXTURES") == "1"


# --------------------------------------------------------------------------- helpers


def sh(cmd: str, **kwargs: t.Any) -> Reply:
    """An exec_command call that waits up to 30 s for the command (codex's default is
    10 s, after which the item stays in_progress and the model gets a session id)."""
    return shell_reply(cmd, yield_time_ms=30000, **kwargs)


def capture(name: str, stdout: str) -> None:
    """Keep a real stdout as a parser fixture when OV_CAPTURE_STREAM_FIXTURES=1."""
    if CAPTURE_FIXTURES:
        FIXTURES.mkdir(parents=True, exist_ok=True)
        (FIXTURES / f"codex-{name}.jsonl").write_text(stdout)


class Turn(t.NamedTuple):
    proc: subprocess.CompletedProcess[str]
    events: list[dict[str, t.Any]]


def turn(codex: str, prompt: str, repo: Path, env: dict[str, str], **kwargs: t.Any) -> Turn:
    proc = run_exec(codex, prompt, cwd=repo, env=env, timeout=TURN_TIMEOUT, **kwargs)
    return Turn(proc, parse_jsonl(proc.stdout))


def of_type(events: list[dict[str, t.Any]], kind: str) -> list[dict[str, t.Any]]:
    return [e for e in events if e.get("type") == kind]


def thread_id(events: list[dict[str, t.Any]]) -> str:
    started = of_type(events, "thread.started")
    assert len(started) == 1 and events[0] is started[0], f"thread.started must come first: {events!r}"
    return str(started[0]["thread_id"])


def assert_completed(result: Turn) -> dict[str, t.Any]:
    """A successful turn: exit 0 and ``turn.completed`` as the last event."""
    assert result.proc.returncode == 0, result.proc.stderr
    assert result.events and result.events[-1]["type"] == "turn.completed", result.events
    return result.events[-1]


def assert_failed(result: Turn) -> str:
    """A failed turn: exit 1, an ``error`` event, then ``turn.failed`` last; its message."""
    assert result.proc.returncode == 1, (result.proc.returncode, result.proc.stderr)
    assert result.events[-1]["type"] == "turn.failed", result.events
    assert result.events[-2]["type"] == "error", result.events
    message = str(result.events[-1]["error"]["message"])
    assert result.events[-2]["message"] == message
    assert not of_type(result.events, "turn.completed")
    return message


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
def codex() -> str:
    assert CODEX_BIN, "requires_codex should have skipped this test"
    return CODEX_BIN


# --------------------------------------------------------------------------- happy paths


class QuietTextTurn(t.NamedTuple):
    repo: Path
    result: Turn
    requests: list[dict[str, t.Any]]
    probes: list[t.Any]
    proxy_lines: list[str]


@pytest.fixture(scope="module")
def quiet_text_turn(tmp_path_factory: pytest.TempPathFactory, _test_home: Path) -> QuietTextTurn:
    """One text turn for two probes: its event shapes and request, and (behind a refusing
    proxy) that the offline config contacts nothing but the mock."""
    assert CODEX_BIN, "requires_codex should have skipped this test"
    root = tmp_path_factory.mktemp("codex-text")
    repo = make_git_repo(root / "repo")
    (repo / "AGENTS.md").write_text("Always answer in lower case. MARKER-AGENTS-MD\n")
    reply = text_reply("hello from the mock")
    with hermetic_environ(_test_home), RefusingProxy() as proxy, MockResponsesAPI([reply]) as api:
        env = proxied(codex_env(api.base_url, root / "quiet"), proxy.url)
        result = turn(CODEX_BIN, "say hello", repo, env)
        return QuietTextTurn(repo, result, list(api.requests), list(api.probes), list(proxy.lines))


@requires_codex
def test_text_turn_event_shapes_and_request(quiet_text_turn: QuietTextTurn) -> None:
    """(Run behind the refusing proxy of the offline probe.)"""
    result, repo = quiet_text_turn.result, quiet_text_turn.repo
    usage = assert_completed(result)["usage"]
    sid = thread_id(result.events)
    assert result.events[-2] == {
        "type": "item.completed",
        "item": {"id": result.events[-2]["item"]["id"], "type": "agent_message", "text": "hello from the mock"},
    }
    assert of_type(result.events, "turn.started"), result.events
    # Token counts come straight from response.completed's usage (the mock's estimate).
    assert set(usage) >= {"input_tokens", "cached_input_tokens", "output_tokens", "reasoning_output_tokens"}
    assert usage["input_tokens"] > 0 and usage["output_tokens"] > 0
    # A model outside codex's catalog is announced by a non-fatal `error` *item*.
    warnings = items(result.events, "error")
    assert all("Model metadata for `mock-model` not found" in w["message"] for w in warnings), warnings

    assert len(quiet_text_turn.requests) == 1 and not quiet_text_turn.probes
    body = quiet_text_turn.requests[0]
    assert body["_path"] == "/v1/responses"
    assert body["stream"] is True and body["model"] == "mock-model" and body["store"] is False
    assert body["_headers"]["authorization"] == "Bearer sk-mock-0123456789"
    assert body["_headers"]["session-id"] == sid == body["prompt_cache_key"]
    assert input_messages(body, "user")[-1] == "say hello"
    # AGENTS.md from the repository reaches the model as a user message.
    agents = [m for m in input_messages(body, "user") if "MARKER-AGENTS-MD" in m]
    assert agents and agents[0].startswith(f"# AGENTS.md instructions for {repo}")
    tools = {tool.get("name"): tool for tool in body["tools"]}
    assert tools["exec_command"]["parameters"]["required"] == ["cmd"]


class ShellThenResume(t.NamedTuple):
    repo: Path
    env: dict[str, str]
    first: Turn
    first_requests: list[dict[str, t.Any]]
    second: Turn
    second_requests: list[dict[str, t.Any]]


@pytest.fixture(scope="module")
def shell_then_resume(tmp_path_factory: pytest.TempPathFactory, _test_home: Path) -> ShellThenResume:
    """The shell-command probe's turn is the resume probe's first turn (one run fewer)."""
    assert CODEX_BIN, "requires_codex should have skipped this test"
    root = tmp_path_factory.mktemp("codex-shell")
    repo = make_git_repo(root / "repo")
    script = [
        sh("echo written > out.txt && cat out.txt", text="Writing the file."),
        sh("echo failing; exit 3"),
        text_reply("done"),
        text_reply("second turn done"),
    ]
    with hermetic_environ(_test_home), MockResponsesAPI(script) as api:
        env = codex_env(api.base_url, root)
        first = turn(CODEX_BIN, "write out.txt", repo, env)
        capture("tool_turn", first.proc.stdout)
        first_requests = list(api.requests)
        sid = next((e.get("thread_id") for e in first.events if e.get("type") == "thread.started"), None)
        second = turn(CODEX_BIN, "SECOND PROMPT", repo, env, resume=str(sid))
        capture("resume_turn", second.proc.stdout)
        return ShellThenResume(repo, env, first, first_requests, second, api.requests[len(first_requests) :])


@requires_codex
def test_shell_command_really_runs_and_its_output_reaches_the_model(shell_then_resume: ShellThenResume) -> None:
    result, repo = shell_then_resume.first, shell_then_resume.repo
    assert_completed(result)
    assert (repo / "out.txt").read_text() == "written\n"
    started = items(result.events, "command_execution", "item.started")
    done = items(result.events, "command_execution")
    assert [s["id"] for s in started] == [d["id"] for d in done] and len(done) == 2
    assert started[0]["status"] == "in_progress" and started[0]["exit_code"] is None
    ok, failed = done
    # allow_login_shell = false: `bash -c` (the default is `bash -lc`), shell-quoted.
    assert ok["command"] == "/bin/bash -c 'echo written > out.txt && cat out.txt'"
    assert failed["command"] == "/bin/bash -c 'echo failing; exit 3'"
    assert (ok["status"], ok["exit_code"], ok["aggregated_output"]) == ("completed", 0, "written\n")
    assert (failed["status"], failed["exit_code"], failed["aggregated_output"]) == ("failed", 3, "failing\n")
    messages = items(result.events, "agent_message")
    assert [m["text"] for m in messages] == ["Writing the file.", "done"]

    requests = shell_then_resume.first_requests
    assert len(requests) == 3
    outputs = function_outputs(requests[-1])
    assert len(outputs) == 2
    first, second = outputs.values()
    assert "Process exited with code 0" in first and first.endswith("Output:\nwritten\n")
    assert "Process exited with code 3" in second


@requires_codex
def test_workspace_write_sandbox_blocks_writes_outside_the_worktree(codex: str, repo: Path, tmp_path: Path) -> None:
    """The sandbox works as root here: writes outside the workspace and socket() are refused.

    A sandboxed command that exits non-zero with a denial-looking output ("Operation not
    permitted") is sometimes taken for a sandbox denial and then has no command_execution
    item at all; measured with 0.169.0, about half the runs do emit one. Both are accepted."""
    outside = tmp_path / "outside.txt"
    write = f"touch inside.txt; touch {outside}; echo outside=$?"
    connect = f"{sys.executable} -c 'import socket; socket.socket()'"
    script = [sh(write), sh(connect), sh("echo denied >&2; exit 1"), text_reply("done")]
    with MockResponsesAPI(script) as api:
        result = turn(codex, "probe the sandbox", repo, codex_env(api.base_url, tmp_path, extra_toml=NO_TMP_WRITES))
    assert_completed(result)
    assert (repo / "inside.txt").exists()
    assert not outside.exists()
    finished = items(result.events, "command_execution")
    refused_socket = [i for i in finished if "socket.socket()" in i["command"]]
    assert all(i["exit_code"] == 1 and "Operation not permitted" in i["aggregated_output"] for i in refused_socket)
    finished = [i for i in finished if i not in refused_socket]
    assert [(i["command"].split()[-1], i["exit_code"]) for i in finished] == [("outside=$?'", 0), ("1'", 1)]
    assert "Read-only file system" in finished[0]["aggregated_output"]
    assert "outside=1" in finished[0]["aggregated_output"]
    # The network is cut too (seccomp refuses socket(), loopback included); that call
    # exited 1 with "Operation not permitted", so only the model saw it.
    outputs = list(function_outputs(api.requests[-1]).values())
    assert len(outputs) == 3
    assert "Process exited with code 1" in outputs[1]
    assert "PermissionError: [Errno 1] Operation not permitted" in outputs[1]


@requires_codex
def test_apply_patch_through_exec_command_is_a_file_change(codex: str, repo: Path, tmp_path: Path) -> None:
    patch = (
        "apply_patch <<'EOF'\n*** Begin Patch\n*** Add File: hello.txt\n+hello\n"
        "*** Update File: README.md\n@@\n-# scratch\n+# patched\n*** End Patch\nEOF\n"
    )
    outside = tmp_path / "outside.txt"
    escape = f"apply_patch <<'EOF'\n*** Begin Patch\n*** Add File: {outside}\n+no\n*** End Patch\nEOF\n"
    with MockResponsesAPI([sh(patch), sh(escape), text_reply("patched")]) as api:
        result = turn(codex, "patch it", repo, codex_env(api.base_url, tmp_path, extra_toml=NO_TMP_WRITES))
    capture("file_change", result.proc.stdout)

    assert_completed(result)
    assert (repo / "hello.txt").read_text() == "hello\n"
    assert (repo / "README.md").read_text() == "# patched\n"
    assert not outside.exists()
    (change,) = items(result.events, "file_change")
    assert change["status"] == "completed"
    assert sorted((c["path"], c["kind"]) for c in change["changes"]) == [
        (str(repo / "README.md"), "update"),
        (str(repo / "hello.txt"), "add"),
    ]
    # No command_execution item for an intercepted apply_patch, and none for the
    # rejected one: the rejection only reaches the model (and codex's stderr log).
    assert not items(result.events, "command_execution")
    outputs = list(function_outputs(api.requests[-1]).values())
    assert "Success. Updated the following files:" in outputs[0]
    assert outputs[1].startswith("patch rejected: writing outside of the project")


@requires_codex
def test_resume_sends_the_earlier_conversation(shell_then_resume: ShellThenResume) -> None:
    """(The first turn is the shell-command probe's.)"""
    first, second, env = shell_then_resume.first, shell_then_resume.second, shell_then_resume.env
    assert_completed(first)
    sid = thread_id(first.events)
    assert_completed(second)
    assert thread_id(second.events) == sid
    assert [m["text"] for m in items(second.events, "agent_message")] == ["second turn done"]
    (body,) = shell_then_resume.second_requests
    assert body["_headers"]["session-id"] == sid
    history = body["input"]
    users = input_messages(body, "user")
    assert users[-1] == "SECOND PROMPT" and "write out.txt" in users
    assert input_messages(body, "assistant") == ["Writing the file.", "done"]
    calls = [i for i in history if i.get("type") == "function_call"]
    assert [json.loads(c["arguments"])["cmd"] for c in calls] == [
        "echo written > out.txt && cat out.txt",
        "echo failing; exit 3",
    ]
    assert {c["call_id"] for c in calls} <= set(function_outputs(body))
    # The session lives under $CODEX_HOME/sessions/YYYY/MM/DD/rollout-<time>-<id>.jsonl.
    rollouts = list((Path(env["CODEX_HOME"]) / "sessions").glob(f"*/*/*/rollout-*-{sid}.jsonl"))
    assert len(rollouts) == 1


@requires_codex
def test_resume_of_an_unknown_id_fails_without_events(codex: str, repo: Path, tmp_path: Path) -> None:
    with MockResponsesAPI([text_reply("never")]) as api:
        env = codex_env(api.base_url, tmp_path)
        result = turn(codex, "hello", repo, env, resume="01a20000-0000-7000-8000-000000000000")
    assert result.proc.returncode == 1
    assert result.events == []
    assert "no rollout found for thread id 01a20000-0000-7000-8000-000000000000" in result.proc.stderr
    assert api.requests == []


# --------------------------------------------------------------------------- errors


@requires_codex
def test_persistent_5xx_is_retried_then_the_turn_fails(codex: str, repo: Path, tmp_path: Path) -> None:
    with MockResponsesAPI([error_reply(503, "mock unavailable")]) as api:
        env = codex_env(api.base_url, tmp_path, request_max_retries=1, stream_max_retries=1)
        result = turn(codex, "hi", repo, env)
    capture("error_503", result.proc.stdout)

    message = assert_failed(result)
    assert message.startswith("unexpected status 503 Service Unavailable: mock unavailable")
    reconnecting = [e["message"] for e in of_type(result.events, "error")][:-1]
    assert len(reconnecting) == 1 and reconnecting[0].startswith("Reconnecting... 1/1 (unexpected status 503")
    # Two layers of retry: (request_max_retries + 1) * (stream_max_retries + 1) attempts.
    assert len(api.requests) == 4


@requires_codex
def test_5xx_then_success_recovers_silently(codex: str, repo: Path, tmp_path: Path) -> None:
    with MockResponsesAPI([[error_reply(500, "boom"), text_reply("recovered")]]) as api:
        result = turn(codex, "hi", repo, codex_env(api.base_url, tmp_path, request_max_retries=2))
    assert_completed(result)
    assert [m["text"] for m in items(result.events, "agent_message")] == ["recovered"]
    assert not of_type(result.events, "error")  # request-level retries are invisible
    assert len(api.requests) == 2


@requires_codex
def test_401_is_retried_only_by_the_stream_loop(codex: str, repo: Path, tmp_path: Path) -> None:
    """Default retry settings: a 401 is not retried per request but the turn still
    reconnects 5 times (6 requests, about 7 s) before it fails."""
    with MockResponsesAPI([error_reply(401, "Incorrect API key provided", code="invalid_api_key")]) as api:
        base_url = api.base_url
        result = turn(codex, "hi", repo, codex_env(base_url, tmp_path))

    message = assert_failed(result)
    assert message.startswith("unexpected status 401 Unauthorized: Incorrect API key provided")
    assert f"url: {base_url}/responses" in message
    reconnecting = [e["message"] for e in of_type(result.events, "error")][:-1]
    assert [m.split(" (")[0] for m in reconnecting] == [f"Reconnecting... {n}/5" for n in range(1, 6)]
    assert len(api.requests) == 6


@requires_codex
def test_429_without_retry_after_fails_at_once_with_it_retries(codex: str, repo: Path, tmp_path: Path) -> None:
    with MockResponsesAPI([error_reply(429, "slow down", code="rate_limit_exceeded")]) as api:
        result = turn(codex, "hi", repo, codex_env(api.base_url, tmp_path))
    message = assert_failed(result)
    assert message.startswith("exceeded retry limit, last status: 429 Too Many Requests")
    assert len(api.requests) == 1

    limited = with_headers(error_reply(429, "slow down", code="rate_limit_exceeded"), retry_after="1")
    with MockResponsesAPI([[limited, text_reply("after the wait")]]) as api:
        result = turn(codex, "hi", repo, codex_env(api.base_url, tmp_path / "second"))
    assert_completed(result)
    assert len(api.requests) == 2
    assert api.requests[1]["_received_at"] - api.requests[0]["_received_at"] >= 0.9  # retry-after honoured
    assert of_type(result.events, "error")[0]["message"].startswith("Reconnecting... 1/5")


@requires_codex
def test_silent_stream_hits_the_idle_timeout(codex: str, repo: Path, tmp_path: Path) -> None:
    """Headers and response.created, then nothing: stream_idle_timeout_ms ends it.
    (A server that sends no bytes at all is not timed out: see the probe notes.)"""
    with MockResponsesAPI([silent_stream_reply(None)]) as api:
        env = codex_env(
            api.base_url, tmp_path, stream_idle_timeout_ms=1000, stream_max_retries=0, request_max_retries=0
        )
        result = turn(codex, "hi", repo, env)
    message = assert_failed(result)
    assert message == "stream disconnected before completion: idle timeout waiting for SSE"
    assert len(api.requests) == 1


@requires_codex
def test_a_server_that_sends_nothing_hangs_the_turn(codex: str, repo: Path, tmp_path: Path) -> None:
    """No headers, no bytes: codex has no request timeout (a probe waited 650 s), so the
    turn runner must enforce its own limit. Observed here for 3 s, then interrupted."""
    with MockResponsesAPI([stalled_reply(None)]) as api:
        env = codex_env(api.base_url, tmp_path, stream_idle_timeout_ms=500, request_max_retries=0)
        proc = subprocess.Popen(
            exec_args(codex, "hi", cwd=repo),
            cwd=repo,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            start_new_session=True,
        )
        try:
            assert api.wait_for_requests(1, timeout=20)
            time.sleep(3)
            still_running = proc.poll() is None
            proc.send_signal(signal.SIGINT)
            out, _ = proc.communicate(timeout=10)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        assert still_running
        assert len(api.requests) == 1
    assert [e["type"] for e in parse_jsonl(out) if e["type"] != "item.completed"] == ["thread.started", "turn.started"]


# --------------------------------------------------------------------------- hooks, network, signals


HOOK_SCRIPT = """
import json, os, sys
data = json.load(sys.stdin)
with open(os.environ["HOOK_LOG"], "a") as log:
    log.write(json.dumps(data) + "\\n")
if data.get("hook_event_name") == "PreToolUse" and "FORBIDDEN" in json.dumps(data.get("tool_input")):
    print("ov guard: FORBIDDEN is not allowed", file=sys.stderr)
    sys.exit(2)
"""


@requires_codex
def test_pre_tool_use_hook_blocks_a_command_only_with_hook_trust(codex: str, repo: Path, tmp_path: Path) -> None:
    hook = tmp_path / "hook.py"
    hook.write_text(HOOK_SCRIPT)
    hooks = (
        "[[hooks.PreToolUse]]\n"
        'matcher = "Bash"\n'
        "[[hooks.PreToolUse.hooks]]\n"
        'type = "command"\n'
        f'command = "{sys.executable} {hook}"\n'
        "timeout = 10\n"
    )
    script = [sh("echo FORBIDDEN > forbidden.txt"), sh("echo ok > allowed.txt"), text_reply("done")]
    log = tmp_path / "hooks.jsonl"

    # Untrusted (never reviewed) hooks are skipped silently in exec.
    with MockResponsesAPI(script) as api:
        env = codex_env(api.base_url, tmp_path / "untrusted", extra={"HOOK_LOG": str(log)}, extra_toml=hooks)
        result = turn(codex, "go", repo, env)
    assert_completed(result)
    assert (repo / "forbidden.txt").exists() and not log.exists()
    (repo / "forbidden.txt").unlink()
    (repo / "allowed.txt").unlink()

    with MockResponsesAPI(script) as api:
        env = codex_env(api.base_url, tmp_path / "trusted", extra={"HOOK_LOG": str(log)}, extra_toml=hooks)
        result = turn(codex, "go", repo, env, extra_args=["--dangerously-bypass-hook-trust"])
    capture("hook_denied", result.proc.stdout)

    assert_completed(result)
    assert not (repo / "forbidden.txt").exists() and (repo / "allowed.txt").exists()
    # The blocked call leaves no command_execution item; only the model is told.
    assert [c["command"] for c in items(result.events, "command_execution")] == ["/bin/bash -c 'echo ok > allowed.txt'"]
    blocked = next(iter(function_outputs(api.requests[-1]).values()))
    assert blocked == (
        "Command blocked by PreToolUse hook: ov guard: FORBIDDEN is not allowed. Command: echo FORBIDDEN > forbidden.txt"
    )
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    assert [c["tool_input"] for c in calls] == [
        {"command": "echo FORBIDDEN > forbidden.txt"},
        {"command": "echo ok > allowed.txt"},
    ]
    first = calls[0]
    assert first["tool_name"] == "Bash" and first["hook_event_name"] == "PreToolUse"
    assert first["session_id"] == thread_id(result.events) and first["cwd"] == str(repo)
    assert first["tool_use_id"] == api.requests[1]["input"][-2]["call_id"]


@requires_codex
def test_offline_config_makes_no_outside_connection(
    codex: str, repo: Path, tmp_path: Path, quiet_text_turn: QuietTextTurn
) -> None:
    """With codex_config's switches nothing but the mock is contacted (the text-turn
    probe's run, behind a refusing proxy); without them codex tries github.com (plugin
    sync) and chatgpt.com (plugin export, OTLP metrics)."""
    assert_completed(quiet_text_turn.result)
    assert quiet_text_turn.proxy_lines == []
    with RefusingProxy() as proxy, MockResponsesAPI([text_reply("quiet")]) as api:
        # The same without the three network switches (the shell snapshot stays off: it
        # is not network, and a login shell killed mid-way can leave stale lock files).
        bare = "\n".join(
            line
            for line in codex_config(api.base_url).splitlines()
            if not line.startswith(("check_for_update_on_startup", "plugins =", "enabled = false"))
        )
        env = proxied(codex_env(api.base_url, tmp_path / "bare", config=bare), proxy.url)
        assert_completed(turn(codex, "hi", repo, env))
        assert wait_until(lambda: len(proxy.lines) >= 2, timeout=5)
    hosts = {line.split()[1].rsplit(":", 1)[0] for line in proxy.lines if line.startswith("CONNECT ")}
    assert hosts & {"github.com", "api.github.com", "chatgpt.com", "ab.chatgpt.com"}, proxy.lines


@requires_codex
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_ends_codex_at_once_and_orphans_the_tools_children(
    codex: str, repo: Path, tmp_path: Path, sig: signal.Signals
) -> None:
    """SIGTERM to codex's process group, or SIGINT to codex: codex exits within
    milliseconds with no closing event and the tool's shell dies with it. After SIGINT
    codex has killed the tool's whole process group; after SIGTERM the shell's children
    live on, reparented, in the tool's own session (their environment names the thread)."""
    marker = tmp_path / "late.txt"
    with MockResponsesAPI([sh(f"sleep 15; touch {marker}")]) as api:
        env = codex_env(api.base_url, tmp_path)
        proc = subprocess.Popen(
            exec_args(codex, "go", cwd=repo, sandbox=None),
            cwd=repo,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            start_new_session=True,
        )
        shells: list[int] = []
        leftovers: list[int] = []
        leftover_commands: list[str] = []
        try:

            def session_leader(pid: int) -> bool:
                try:
                    return os.getsid(pid) == pid
                except OSError:
                    return False

            def shell_started() -> bool:
                # The shell leads its own session; a child it forked for `sleep` shows the same
                # command line until it execs, so only the leader counts.
                shells[:] = [
                    int(e.name)
                    for e in Path("/proc").iterdir()
                    if e.name.isdigit() and cmdline(e).startswith("/bin/bash -c") and str(marker) in cmdline(e)
                    and session_leader(int(e.name))
                ]
                return bool(shells)

            assert wait_until(shell_started), "the tool command never started"
            (shell,) = shells
            assert os.getsid(shell) == shell != os.getsid(proc.pid)  # its own session

            def sleep_started() -> bool:
                for e in Path("/proc").iterdir():
                    try:
                        if e.name.isdigit() and cmdline(e) == "sleep 15 " and os.getsid(int(e.name)) == shell:
                            return True
                    except OSError:
                        continue
                return False

            # bash forks `sleep` a moment after it starts; a signal sent before that leaves
            # nothing to orphan (seen once on a loaded machine).
            assert wait_until(sleep_started), "the tool's sleep never started"
            if sig == signal.SIGTERM:
                os.killpg(proc.pid, signal.SIGTERM)
            else:
                proc.send_signal(signal.SIGINT)
            proc.wait(timeout=10)
            assert proc.stdout is not None
            events = parse_jsonl(proc.stdout.read())
            proc.stdout.close()
            assert wait_until(lambda: not pid_alive(shell), timeout=5)
            thread = thread_id(events)
            if sig == signal.SIGINT:  # codex's kill of the tool's group may land a moment later
                wait_until(lambda: not processes_of_thread(thread), timeout=5)
            leftovers = processes_of_thread(thread)
            leftover_commands = [cmdline(Path(f"/proc/{pid}")) for pid in leftovers]
            assert all(os.getsid(pid) == shell for pid in leftovers)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            for pid in leftovers + [p for p in shells if pid_alive(p)]:
                os.kill(pid, signal.SIGKILL)
    assert proc.returncode == (-signal.SIGTERM if sig == signal.SIGTERM else 1)
    assert of_type(events, "turn.started") and not of_type(events, "turn.completed")
    assert not of_type(events, "turn.failed")
    assert leftover_commands == (["sleep 15 "] if sig == signal.SIGTERM else [])
    assert not marker.exists()
