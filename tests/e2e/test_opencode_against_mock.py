"""The real OpenCode CLI (opencode-ai 1.18.33), headless, against the scripted mock Chat Completions API.

Only the model is mocked (a real model needs the network and is not deterministic);
opencode itself, its tools, plugins, permissions and session store are the real thing.
These tests pin down the facts an `ov` opencode adapter relies on; the measurements
behind them are in tests/fixtures/OPENCODE_PROBE_NOTES.md. Set
OV_CAPTURE_STREAM_FIXTURES=1 to refresh tests/fixtures/stream/opencode-*.jsonl.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import typing as t
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from conftest import hermetic_environ, make_repo
from mock_openai_chat import (
    MockChatAPI,
    conversation_text,
    error_reply,
    stalled_reply,
    text_reply,
    tool_call_reply,
    with_headers,
)
from opencode_cli import (
    OPENCODE_BIN,
    OPENCODE_VERSION,
    RefusingProxy,
    opencode_config,
    opencode_env,
    parse_events,
    requires_opencode,
    run_turn,
)

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "stream"
# Read at import: the shared autouse fixture removes OV_* variables before each test.
CAPTURE_FIXTURES = os.environ.get("OV_CAPTURE_STREAM_FIXTURES") == "1"


# --------------------------------------------------------------------------- helpers


def capture(name: str, stdout: str) -> None:
    """Keep a real stdout as a parser fixture when OV_CAPTURE_STREAM_FIXTURES=1."""
    if CAPTURE_FIXTURES:
        FIXTURES.mkdir(parents=True, exist_ok=True)
        (FIXTURES / f"opencode-{name}.jsonl").write_text(stdout)


def of_type(events: list[dict[str, t.Any]], kind: str) -> list[dict[str, t.Any]]:
    return [e for e in events if e.get("type") == kind]


def session_of(events: list[dict[str, t.Any]]) -> str:
    ids = {e.get("sessionID") for e in events}
    assert len(ids) == 1, f"every event must carry the same sessionID: {ids!r}"
    (sid,) = ids
    assert isinstance(sid, str) and sid.startswith("ses_"), sid
    return sid


def tool_messages(body: dict[str, t.Any]) -> list[dict[str, t.Any]]:
    return [m for m in body["messages"] if m.get("role") == "tool"]


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A throw-away git repository with one commit, as an agent's worktree would be."""
    return make_repo(tmp_path / "repo")


@pytest.fixture
def opencode() -> str:
    assert OPENCODE_BIN, "requires_opencode should have skipped this test"
    return OPENCODE_BIN


# --------------------------------------------------------------------------- the mock alone


def _post(url: str, body: dict[str, t.Any]) -> tuple[int, dict[str, str], bytes]:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, dict(response.headers.items()), response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers.items()), exc.read()


def test_mock_answers_without_streaming_lists_models_and_sends_openai_errors() -> None:
    script = [
        tool_call_reply("bash", {"command": "ls"}, call_id="call_1"),
        [with_headers(error_reply(503, "busy", "server_error"), retry_after="1"), text_reply("done")],
    ]
    with MockChatAPI(script) as api:
        url = f"{api.base_url}/chat/completions"
        status, _, raw = _post(url, {"model": "m", "messages": [{"role": "user", "content": "go"}]})
        assert status == 200
        choice = json.loads(raw)["choices"][0]
        assert choice["finish_reason"] == "tool_calls"
        assert choice["message"]["tool_calls"][0]["function"] == {"name": "bash", "arguments": '{"command": "ls"}'}

        later = {"model": "m", "messages": [{"role": "user", "content": "go"}, {"role": "assistant", "content": "x"}]}
        status, headers, raw = _post(url, later)
        assert status == 503 and headers.get("retry-after") == "1"
        assert json.loads(raw)["error"]["message"] == "busy"
        status, _, raw = _post(url, later)  # the retry at the same position gets the next attempt
        assert status == 200 and json.loads(raw)["choices"][0]["message"]["content"] == "done"

        with urllib.request.urlopen(f"{api.base_url}/models", timeout=10) as response:
            assert [m["id"] for m in json.loads(response.read())["data"]] == ["mock-model"]
        assert len(api.requests) == 3


def test_mock_streams_text_and_tool_calls_as_sse_with_usage() -> None:
    reply = tool_call_reply("write", {"filePath": "/x", "content": "y" * 100}, text="Writing.", call_id="call_7")
    with MockChatAPI([reply]) as api:
        body = {"model": "m", "stream": True, "stream_options": {"include_usage": True}, "messages": []}
        status, headers, raw = _post(f"{api.base_url}/chat/completions", body)
    assert status == 200 and headers["Content-Type"] == "text/event-stream"
    lines = [line[len("data: ") :] for line in raw.decode().split("\n\n") if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    chunks = [json.loads(line) for line in lines[:-1]]
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    args = "".join(
        call["function"].get("arguments", "")
        for c in chunks
        if c["choices"]
        for call in c["choices"][0]["delta"].get("tool_calls", [])
    )
    assert text == "Writing."
    assert json.loads(args) == {"filePath": "/x", "content": "y" * 100}
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == "tool_calls"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] > 0


# --------------------------------------------------------------------------- the real CLI


class TextThenResume(t.NamedTuple):
    """A text turn (titles on, prices configured, both AGENTS.md files, a refusing proxy)
    and a second turn resuming its session, in one opencode state dir."""

    repo: Path
    env: dict[str, str]
    first: subprocess.CompletedProcess[str]
    first_requests: list[dict[str, t.Any]]  # every POST of the first turn, title call included
    second: subprocess.CompletedProcess[str] | None
    second_requests: list[dict[str, t.Any]]
    probes: list[t.Any]
    proxy_lines: list[str]


@pytest.fixture(scope="module")
def text_then_resume(tmp_path_factory: pytest.TempPathFactory, _test_home: Path) -> TextThenResume:
    """One opencode session over two runs: its first turn is the text-turn probe, the
    second resumes it (one CLI start fewer than two separate sessions)."""
    assert OPENCODE_BIN, "requires_opencode should have skipped this test"
    root = tmp_path_factory.mktemp("oc-text")
    repo = make_repo(root / "repo")
    (repo / "AGENTS.md").write_text("MARK-PROJECT-AGENTS\n")
    script = [text_reply("Hello from the mock"), text_reply("second answer")]
    with hermetic_environ(_test_home), MockChatAPI(script) as api, RefusingProxy() as proxy:
        config = opencode_config(api.base_url, title=True, cost=(5.0, 25.0))
        env = opencode_env(api.base_url, root / "oc", worktree=repo, config=config, extra=proxy.env())
        (Path(env["XDG_CONFIG_HOME"]) / "opencode" / "AGENTS.md").write_text("MARK-GLOBAL-AGENTS\n")
        first = run_turn(OPENCODE_BIN, "say hi\nin two lines", cwd=repo, env=env)
        capture("text_turn", first.stdout)
        first_requests = list(api.requests)
        sids = [e.get("sessionID") for e in parse_events(first.stdout)]
        second = None
        if first.returncode == 0 and sids and isinstance(sids[0], str):
            second = run_turn(OPENCODE_BIN, "second question", cwd=repo, env=env, session=sids[0])
        return TextThenResume(
            repo, env, first, first_requests, second, api.requests[len(first_requests) :], list(api.probes),
            proxy.lines,
        )


@requires_opencode
def test_text_turn_events_tokens_cost_and_instruction_files(text_then_resume: TextThenResume) -> None:
    """step_start, text, step_finish; usage and configured prices reach step_finish; the
    title side request is recognised; AGENTS.md files are read; nothing leaves the box."""
    run = text_then_resume
    proc, env = run.first, run.env
    assert proc.returncode == 0, proc.stderr
    events = parse_events(proc.stdout)
    assert [e["type"] for e in events] == ["step_start", "text", "step_finish"]
    sid = session_of(events)
    assert all(e["part"]["sessionID"] == sid and isinstance(e["timestamp"], int) for e in events)
    text = events[1]["part"]
    assert text["type"] == "text" and text["text"] == "Hello from the mock" and text["time"]["end"]
    finish = events[2]["part"]
    assert finish["type"] == "step-finish" and finish["reason"] == "stop"

    (main,) = [r for r in run.first_requests if not r["_side"]]
    assert main["stream"] is True and main["stream_options"] == {"include_usage": True}
    assert main["model"] == "mock-model"
    assert main["_headers"]["authorization"] == f"Bearer {env['OV_MOCK_OPENAI_KEY']}"
    assert main["_headers"]["user-agent"].startswith(f"opencode/{OPENCODE_VERSION} ")
    assert main["_headers"]["x-session-id"] == sid
    # The prompt from stdin arrives verbatim, as the only non-system message.
    assert [m["role"] for m in main["messages"]] == ["system", "user"]
    assert main["messages"][1]["content"] == "say hi\nin two lines"
    system = main["messages"][0]["content"]
    assert "MARK-GLOBAL-AGENTS" in system and "MARK-PROJECT-AGENTS" in system

    # Tokens are the mock's usage numbers; cost uses the configured USD per million.
    prompt_tokens = max(1, (len(json.dumps(main["messages"])) + len(json.dumps(main["tools"]))) // 4)
    tokens = finish["tokens"]
    assert tokens["input"] == prompt_tokens and tokens["output"] >= 1
    assert tokens["total"] == tokens["input"] + tokens["output"]
    assert tokens["cache"] == {"read": 0, "write": 0}
    assert finish["cost"] == pytest.approx((tokens["input"] * 5 + tokens["output"] * 25) / 1e6)

    (title,) = [r for r in run.first_requests if r["_side"]]
    assert "tools" not in title and "title generator" in title["messages"][0]["content"]
    assert run.probes == []  # no GET /v1/models (in either turn)
    assert run.proxy_lines == [], f"opencode tried to reach the network: {run.proxy_lines}"


@requires_opencode
def test_resume_by_session_id_resends_the_history(text_then_resume: TextThenResume) -> None:
    """The text-turn probe's session, resumed with --session: same session id, the whole
    history re-sent, and no second title request."""
    run = text_then_resume
    assert run.first.returncode == 0, run.first.stderr
    sid = session_of(parse_events(run.first.stdout))
    second = run.second
    assert second is not None and second.returncode == 0, second and second.stderr
    events = parse_events(second.stdout)
    assert session_of(events) == sid
    assert [e["part"]["text"] for e in of_type(events, "text")] == ["second answer"]

    assert [r["_side"] for r in run.second_requests] == [False]  # a resumed turn asks for no title
    (resumed,) = run.second_requests
    assert [(m["role"], m["content"]) for m in resumed["messages"][1:]] == [
        ("user", "say hi\nin two lines"),
        ("assistant", "Hello from the mock"),
        ("user", "second question"),
    ]


class ToolTurn(t.NamedTuple):
    """A write call and a bash call, run with the prompt as an argument, the real cwd
    elsewhere than $PWD, and a repo opencode.json/AGENTS.md that project config is off for."""

    repo: Path
    elsewhere: Path
    proc: subprocess.CompletedProcess[str]
    requests: list[dict[str, t.Any]]


@pytest.fixture(scope="module")
def tool_turn(tmp_path_factory: pytest.TempPathFactory, _test_home: Path) -> ToolTurn:
    """One opencode run for three probes: tool calls really run; the working directory
    comes from $PWD and an argument with a space is quoted; OPENCODE_DISABLE_PROJECT_CONFIG=1
    ignores the repo's opencode.json (bash denied there) and AGENTS.md."""
    assert OPENCODE_BIN, "requires_opencode should have skipped this test"
    root = tmp_path_factory.mktemp("oc-tools")
    repo = make_repo(root / "repo")
    (repo / "opencode.json").write_text(json.dumps({"permission": {"bash": "deny"}}))
    (repo / "AGENTS.md").write_text("MARK-PROJECT-AGENTS\n")
    elsewhere = root / "elsewhere"
    elsewhere.mkdir()
    brief = root / "brief.md"
    brief.write_text("MARK-OV-BRIEF\n")
    script = [
        tool_call_reply("write", {"filePath": str(repo / "hello.txt"), "content": "hi there\n"}, text="Writing."),
        tool_call_reply(
            "bash", {"command": "pwd && cat hello.txt > copy.txt && echo done-$((6*7))", "description": "copy"}
        ),
        text_reply("All done."),
    ]
    with hermetic_environ(_test_home), MockChatAPI(script) as api:
        config = opencode_config(api.base_url, extra={"instructions": [str(brief)]})
        env = opencode_env(
            api.base_url, root / "oc", worktree=repo, config=config, extra={"OPENCODE_DISABLE_PROJECT_CONFIG": "1"}
        )
        # $PWD names the worktree, the real cwd is another folder; the prompt is an argument.
        proc = run_turn(OPENCODE_BIN, None, cwd=elsewhere, env=env, extra_args=["copy the file"])
        capture("tool_turn", proc.stdout)
        return ToolTurn(repo, elsewhere, proc, api.main_requests)


@requires_opencode
def test_write_and_bash_tool_calls_really_run(tool_turn: ToolTurn) -> None:
    repo, proc, requests = tool_turn.repo, tool_turn.proc, tool_turn.requests
    assert proc.returncode == 0, proc.stderr
    assert (repo / "copy.txt").read_text() == "hi there\n"
    events = parse_events(proc.stdout)
    assert [e["type"] for e in events] == [
        "step_start", "text", "tool_use", "step_finish",
        "step_start", "tool_use", "step_finish",
        "step_start", "text", "step_finish",
    ]  # fmt: skip
    assert [e["part"]["reason"] for e in of_type(events, "step_finish")] == ["tool-calls", "tool-calls", "stop"]
    write, bash = (e["part"] for e in of_type(events, "tool_use"))
    assert write["type"] == "tool" and write["tool"] == "write" and write["callID"]
    assert write["state"]["status"] == "completed" and write["state"]["output"] == "Wrote file successfully."
    assert write["state"]["input"] == {"filePath": str(repo / "hello.txt"), "content": "hi there\n"}
    bash_output = f"{repo.resolve()}\ndone-42\n"  # `pwd`, then the echo
    assert bash["tool"] == "bash" and bash["state"]["status"] == "completed"
    assert bash["state"]["output"] == bash_output
    assert bash["state"]["metadata"]["exit"] == 0
    assert set(bash["state"]["time"]) == {"start", "end"}

    # The model got each tool's result as a role=tool message with its call id.
    results = {m["tool_call_id"]: m["content"] for m in tool_messages(requests[-1])}
    assert results == {write["callID"]: "Wrote file successfully.", bash["callID"]: bash_output}

    # The tools opencode offers, with the argument names the adapter's guard will see.
    params = {tool["function"]["name"]: tool["function"]["parameters"] for tool in requests[0]["tools"]}
    assert {"bash", "edit", "glob", "grep", "read", "task", "todowrite", "webfetch", "write"} <= set(params)
    assert set(params["bash"]["required"]) == {"command"}
    assert {"timeout", "workdir"} <= set(params["bash"]["properties"])
    assert set(params["write"]["required"]) == {"filePath", "content"}
    assert set(params["edit"]["required"]) == {"filePath", "oldString", "newString"}
    assert set(params["read"]["required"]) == {"filePath"}


@requires_opencode
def test_unknown_session_fails_fast_with_nothing_on_stdout(opencode: str, repo: Path, tmp_path: Path) -> None:
    with MockChatAPI([text_reply("never")]) as api:
        env = opencode_env(api.base_url, tmp_path / "oc", worktree=repo)
        proc = run_turn(opencode, "hello", cwd=repo, env=env, session="ses_doesnotexist")
        assert api.requests == []
    assert proc.returncode == 1
    assert proc.stdout == ""
    assert "Session not found" in proc.stderr


@requires_opencode
def test_working_directory_comes_from_pwd_and_arguments_get_quoted(tool_turn: ToolTurn) -> None:
    """$PWD wins over the real cwd (so it must name the worktree), and a message passed as
    an argument containing a space reaches the model wrapped in double quotes. (The tool
    probe's run: $PWD is the repo, the real cwd another folder, the prompt an argument.)"""
    assert tool_turn.proc.returncode == 0, tool_turn.proc.stderr
    assert tool_turn.requests[0]["messages"][1]["content"] == '"copy the file"'
    (_, bash) = of_type(parse_events(tool_turn.proc.stdout), "tool_use")
    assert bash["part"]["state"]["output"].splitlines()[0] == str(tool_turn.repo.resolve())
    assert str(tool_turn.elsewhere.resolve()) not in bash["part"]["state"]["output"]
    assert not (tool_turn.elsewhere / "copy.txt").exists()


class GuardedTurn(t.NamedTuple):
    """A run with the deny-plugin installed and bash commands matching "echo ran*" set to ask."""

    repo: Path
    guard_log: Path
    proc: subprocess.CompletedProcess[str]
    requests: list[dict[str, t.Any]]


@pytest.fixture(scope="module")
def guarded_turn(tmp_path_factory: pytest.TempPathFactory, _test_home: Path) -> GuardedTurn:
    """One opencode run for two probes: a bash call the plugin's guard denies, a write it
    allows, then a bash call whose permission is ``ask`` (auto-rejected, ending the turn)."""
    assert OPENCODE_BIN, "requires_opencode should have skipped this test"
    root = tmp_path_factory.mktemp("oc-guard")
    repo = make_repo(root / "repo")
    guard_log = root / "guard.jsonl"
    guard = root / "guard.py"
    guard.write_text(
        "import json, sys\n"
        "call = json.load(sys.stdin)\n"
        f"open({str(guard_log)!r}, 'a').write(json.dumps(call) + '\\n')\n"
        "if 'forbidden' in json.dumps(call['args']):\n"
        "    print('no forbidden files', file=sys.stderr)\n"
        "    sys.exit(2)\n"
    )
    plugin = (
        'import { spawnSync } from "node:child_process"\n'
        "export const OvGuard = async () => ({\n"
        '  "tool.execute.before": async (input, output) => {\n'
        "    const call = { tool: input.tool, sessionID: input.sessionID, callID: input.callID, args: output.args }\n"
        "    const r = spawnSync(process.env.OV_TEST_GUARD_PY, [process.env.OV_TEST_GUARD],\n"
        '      { input: JSON.stringify(call), encoding: "utf8" })\n'
        '    if (r.status !== 0) throw new Error(`ov guard: ${(r.stderr || "").trim()}`)\n'
        "  },\n"
        "})\n"
    )
    script = [
        tool_call_reply("bash", {"command": "echo no > forbidden.txt", "description": "x"}),
        tool_call_reply("write", {"filePath": str(repo / "fine.txt"), "content": "ok\n"}),
        tool_call_reply("bash", {"command": "echo ran > ran.txt", "description": "mark"}),
        text_reply("never"),
    ]
    with hermetic_environ(_test_home), MockChatAPI(script) as api:
        config = opencode_config(api.base_url, extra={"permission": {"bash": {"*": "allow", "echo ran*": "ask"}}})
        env = opencode_env(
            api.base_url,
            root / "oc",
            worktree=repo,
            config=config,
            extra={"OV_TEST_GUARD_PY": sys.executable, "OV_TEST_GUARD": str(guard)},
        )
        plugins = Path(env["XDG_CONFIG_HOME"]) / "opencode" / "plugins"
        plugins.mkdir(parents=True)
        (plugins / "ov-guard.js").write_text(plugin)
        proc = run_turn(OPENCODE_BIN, "make files", cwd=repo, env=env)
        capture("plugin_deny", proc.stdout)
        return GuardedTurn(repo, guard_log, proc, api.main_requests)


@requires_opencode
def test_plugin_tool_execute_before_can_deny_through_an_external_command(guarded_turn: GuardedTurn) -> None:
    """A plugin in the ov-owned config dir asks an external command about every tool call;
    a thrown error blocks the call, becomes the tool's error and is what the model reads."""
    repo, proc = guarded_turn.repo, guarded_turn.proc
    assert proc.returncode == 0, proc.stderr
    assert not (repo / "forbidden.txt").exists()
    assert (repo / "fine.txt").read_text() == "ok\n"
    denied, allowed, asked = (e["part"] for e in of_type(parse_events(proc.stdout), "tool_use"))
    assert denied["tool"] == "bash" and denied["state"]["status"] == "error"
    assert denied["state"]["error"] == "ov guard: no forbidden files"
    assert allowed["tool"] == "write" and allowed["state"]["status"] == "completed"
    results = {m["tool_call_id"]: m["content"] for m in tool_messages(guarded_turn.requests[-1])}
    assert results[denied["callID"]] == "ov guard: no forbidden files"

    calls = [json.loads(line) for line in guarded_turn.guard_log.read_text().splitlines()]
    assert [(c["tool"], c["callID"]) for c in calls] == [
        ("bash", denied["callID"]),
        ("write", allowed["callID"]),
        ("bash", asked["callID"]),  # the plugin runs before the permission check
    ]
    assert calls[0]["args"] == {"command": "echo no > forbidden.txt", "description": "x"}
    assert all(c["sessionID"].startswith("ses_") for c in calls)


@requires_opencode
def test_permission_ask_is_auto_rejected_headless_and_ends_the_turn(guarded_turn: GuardedTurn) -> None:
    """(The plugin probe's run, third call: a pattern rule ``"echo ran*": "ask"``.)"""
    proc = guarded_turn.proc
    assert len(guarded_turn.requests) == 3  # the rejection is not sent back to the model
    assert proc.returncode == 0
    assert not (guarded_turn.repo / "ran.txt").exists()
    assert "permission requested: bash (echo ran > ran.txt); auto-rejecting" in proc.stderr
    bash = of_type(parse_events(proc.stdout), "tool_use")[-1]
    assert bash["part"]["state"]["input"]["command"] == "echo ran > ran.txt"
    assert bash["part"]["state"]["status"] == "error"
    assert bash["part"]["state"]["error"] == "The user rejected permission to use this specific tool call."


@requires_opencode
def test_disabling_project_config_ignores_the_repos_opencode_json_and_agents_md(tool_turn: ToolTurn) -> None:
    """OPENCODE_DISABLE_PROJECT_CONFIG=1 keeps a repo's opencode.json (here: bash denied)
    out, and its AGENTS.md too; ``instructions`` with an absolute path still works. (The
    tool probe's run: bash is offered and really runs.)"""
    assert tool_turn.proc.returncode == 0, tool_turn.proc.stderr
    main = tool_turn.requests[0]
    assert "bash" in {tool["function"]["name"] for tool in main["tools"]}
    (_, bash) = of_type(parse_events(tool_turn.proc.stdout), "tool_use")
    assert bash["part"]["tool"] == "bash" and bash["part"]["state"]["status"] == "completed"
    system = main["messages"][0]["content"]
    assert "MARK-OV-BRIEF" in system and "MARK-PROJECT-AGENTS" not in system


@requires_opencode
def test_persistent_5xx_is_retried_five_times_then_an_error_event(opencode: str, repo: Path, tmp_path: Path) -> None:
    """opencode retries 5xx itself (6 requests in all), honouring retry-after-ms, prints
    nothing while retrying, then one `error` event and exit 1."""
    busy = with_headers(error_reply(503, "mock overloaded", "server_error"), retry_after_ms="50")
    with MockChatAPI([busy]) as api:
        env = opencode_env(api.base_url, tmp_path / "oc", worktree=repo)
        proc = run_turn(opencode, "hi", cwd=repo, env=env)
        capture("error_503", proc.stdout)
        assert len(api.main_requests) == 6
    assert proc.returncode == 1
    events = parse_events(proc.stdout)
    assert [e["type"] for e in events] == ["error"]
    session_of(events)
    error = events[0]["error"]
    assert error["name"] == "APIError"
    assert error["data"]["statusCode"] == 503 and error["data"]["isRetryable"] is True
    assert error["data"]["message"] == "mock overloaded"
    assert json.loads(error["data"]["responseBody"])["error"]["type"] == "server_error"


@requires_opencode
def test_401_is_not_retried_and_exits_1(opencode: str, repo: Path, tmp_path: Path) -> None:
    denied = error_reply(401, "Incorrect API key provided", "invalid_request_error", "invalid_api_key")
    with MockChatAPI([denied]) as api:
        env = opencode_env(api.base_url, tmp_path / "oc", worktree=repo)
        proc = run_turn(opencode, "hi", cwd=repo, env=env)
        capture("error_401", proc.stdout)
        assert len(api.main_requests) == 1
    assert proc.returncode == 1
    (event,) = parse_events(proc.stdout)
    assert event["type"] == "error"
    data = event["error"]["data"]
    assert data["statusCode"] == 401 and data["isRetryable"] is False
    assert data["message"] == "Incorrect API key provided"
    assert data["metadata"]["url"].endswith("/v1/chat/completions")


class RetriedTurn(t.NamedTuple):
    proc: subprocess.CompletedProcess[str]
    requests: list[dict[str, t.Any]]


@pytest.fixture(scope="module")
def retried_turn(tmp_path_factory: pytest.TempPathFactory, _test_home: Path) -> RetriedTurn:
    """One run for two retry probes: the first attempt gets a 500 (no retry-after), the
    second hangs without headers (headerTimeout 1500 ms), the third succeeds."""
    assert OPENCODE_BIN, "requires_opencode should have skipped this test"
    root = tmp_path_factory.mktemp("oc-retry")
    repo = make_repo(root / "repo")
    attempts = [error_reply(500, "mock internal error", "server_error"), stalled_reply(None), text_reply("recovered")]
    with hermetic_environ(_test_home), MockChatAPI([attempts]) as api:
        config = opencode_config(api.base_url, provider_options={"headerTimeout": 1500})
        env = opencode_env(api.base_url, root / "oc", worktree=repo, config=config)
        proc = run_turn(OPENCODE_BIN, "hi", cwd=repo, env=env)
        return RetriedTurn(proc, api.main_requests)


@requires_opencode
def test_one_500_then_success_is_retried_after_a_backoff(retried_turn: RetriedTurn) -> None:
    """(Shares its run with the hung-request probe: 500, then a hang, then the answer.)"""
    proc = retried_turn.proc
    first, retry, _ = retried_turn.requests
    assert proc.returncode == 0, proc.stderr
    events = parse_events(proc.stdout)
    assert [e["type"] for e in events] == ["step_start", "text", "step_finish"]
    assert events[1]["part"]["text"] == "recovered"
    # Without a retry-after header the first backoff is 2 s (plus up to 25 % jitter).
    assert retry["_time"] - first["_time"] >= 1.9


@requires_opencode
def test_hung_request_is_abandoned_after_header_timeout_and_retried(retried_turn: RetriedTurn) -> None:
    """With provider option headerTimeout a hung request is dropped and retried (the
    default wait is 300 s per attempt, so an adapter should set it). The hang is the
    second attempt here (after a 500), so the backoff before its retry is the second, 4 s."""
    proc = retried_turn.proc
    _, hung, retry = retried_turn.requests
    assert proc.returncode == 0, proc.stderr
    texts = [e["part"]["text"] for e in of_type(parse_events(proc.stdout), "text")]
    assert texts == ["recovered"]
    assert retry["_time"] - hung["_time"] >= 1.5 + 1.9  # the timeout, then a backoff
    assert "recovered" not in conversation_text(retry)
