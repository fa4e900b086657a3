"""The real Gemini CLI (0.61.0), headless, against the scripted mock Gemini API.

Only the model is mocked (tests/mock_gemini_api.py): there is no network here, and a
real model would make the transcripts unrepeatable. Everything else is the real
program: its tools run real shell commands in a real git repository, its hooks run
real scripts, its sessions are real files. These tests pin the behaviour a gemini
runtime adapter for `ov` relies on; the facts and how they were measured are in
tests/fixtures/GEMINI_PROBE_NOTES.md. Set OV_CAPTURE_STREAM_FIXTURES=1 to refresh
tests/fixtures/stream/gemini-*.jsonl from these runs.
"""

from __future__ import annotations

import json
import os
import re
import signal
import stat
import subprocess
import sys
import time
import typing as t
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pytest

from conftest import hermetic_environ
from gemini_cli import (
    GEMINI_BIN,
    gemini_env,
    gemini_home,
    headless_command,
    parse_stream,
    requires_gemini,
    run_headless_turn,
    write_settings,
)
from mock_gemini_api import (
    MockGeminiAPI,
    Reply,
    ScriptedConversation,
    call_reply,
    calls_reply,
    conversation_text,
    default_side_reply,
    error_reply,
    function_responses,
    is_side_request,
    quota_error_reply,
    text_reply,
)

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "stream"
TURN_TIMEOUT = 60.0
# Read at import: the shared autouse fixture removes OV_* variables before each test.
CAPTURE_FIXTURES = os.environ.get("OV_CAPTURE_STREAM_FIXTURES") == "1"
UUID_RE = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


# --------------------------------------------------------------------------- helpers


def capture(name: str, stdout: str) -> None:
    """Keep a real stdout as a parser fixture when OV_CAPTURE_STREAM_FIXTURES=1."""
    if CAPTURE_FIXTURES:
        FIXTURES.mkdir(parents=True, exist_ok=True)
        (FIXTURES / f"gemini-{name}.jsonl").write_text(stdout)


def of_type(events: list[dict[str, t.Any]], kind: str) -> list[dict[str, t.Any]]:
    return [e for e in events if e.get("type") == kind]


def the_result(events: list[dict[str, t.Any]]) -> dict[str, t.Any]:
    results = of_type(events, "result")
    assert len(results) == 1, f"expected exactly one result event, got {len(results)}: {events!r}"
    assert events[-1] is results[0], "the result must be the last event"
    return results[0]


def assistant_text(events: list[dict[str, t.Any]]) -> str:
    return "".join(e["content"] for e in of_type(events, "message") if e["role"] == "assistant")


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
    try:  # a zombie still answers kill(0); it has finished for our purposes
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0] != "Z"
    except (FileNotFoundError, IndexError):
        return False


class Turn(t.NamedTuple):
    proc: subprocess.CompletedProcess[str]
    events: list[dict[str, t.Any]]


def turn(gemini: str, prompt: str, repo: Path, env: dict[str, str], **kwargs: t.Any) -> Turn:
    proc = run_headless_turn(gemini, prompt, cwd=repo, env=env, timeout=TURN_TIMEOUT, **kwargs)
    return Turn(proc, parse_stream(proc.stdout))


def start_turn(gemini: str, prompt: str, repo: Path, env: dict[str, str]) -> subprocess.Popen[str]:
    """A turn in its own process group, as ov would run it."""
    return subprocess.Popen(
        headless_command(gemini, prompt),
        cwd=repo,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def finish(proc: subprocess.Popen[str], timeout: float = 15.0) -> tuple[str, str]:
    try:
        return proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise


def hook_script(tmp_path: Path, name: str, body: str) -> Path:
    """An executable python hook that logs its stdin to ``<name>.log`` and then runs ``body``
    (with ``data`` bound to the parsed stdin)."""
    log = tmp_path / f"{name}.log"
    script = tmp_path / f"{name}.py"
    script.write_text(
        f"#!{sys.executable}\n"
        "import json, sys\n"
        "data = json.loads(sys.stdin.read())\n"
        f"with open({str(log)!r}, 'a') as f:\n"
        "    f.write(json.dumps(data) + '\\n')\n"
        f"{body}\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script


def read_log(path: Path) -> list[dict[str, t.Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def before_tool_hooks(command: str, matcher: str = "run_shell_command") -> dict[str, t.Any]:
    return {"hooks": {"BeforeTool": [{"matcher": matcher, "hooks": [{"type": "command", "command": command}]}]}}


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A throw-away git repository with one commit, as an agent's worktree would be."""
    path = tmp_path / "repo"
    path.mkdir()
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
def gemini() -> str:
    assert GEMINI_BIN, "requires_gemini should have skipped this test"
    return GEMINI_BIN


# --------------------------------------------------------------------------- the mock alone


def _post(url: str, body: dict[str, t.Any]) -> tuple[int, bytes, str]:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), method="POST", headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read(), response.headers.get("Content-Type", "")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read(), exc.headers.get("Content-Type", "")


def test_mock_speaks_the_gemini_wire_format() -> None:
    conversation = {"contents": [{"role": "user", "parts": [{"text": "go"}]}], "tools": [{"functionDeclarations": []}]}
    script: list[Reply | list[Reply]] = [
        [calls_reply([("run_shell_command", {"command": "ls"}, "c1")], text="calling"), text_reply("merged text")],
    ]
    with MockGeminiAPI(script) as api:
        models = f"{api.base_url}/v1beta/models"
        status, raw, kind = _post(f"{models}/gemini-x:streamGenerateContent?alt=sse", conversation)
        status2, raw2, _ = _post(f"{models}/gemini-x:generateContent", conversation)
        status3, raw3, _ = _post(f"{models}/gemini-x:countTokens", conversation)
        status4, raw4, _ = _post(f"{models}/gemini-x:embedContent", conversation)
        listed = json.loads(urllib.request.urlopen(models, timeout=10).read())
    assert status == 200 and kind == "text/event-stream"
    chunks = [json.loads(line[len("data: ") :]) for line in raw.decode().splitlines() if line.startswith("data: ")]
    parts = [p for c in chunks for p in c["candidates"][0]["content"]["parts"]]
    assert parts[0] == {"text": "calling"}
    assert parts[1]["functionCall"] == {"id": "c1", "name": "run_shell_command", "args": {"command": "ls"}}
    assert chunks[-1]["candidates"][0]["finishReason"] == "STOP"
    assert chunks[-1]["usageMetadata"]["promptTokenCount"] > 0
    # The non-streaming call is a side request here (generateContent): default side reply.
    assert status2 == 200 and json.loads(raw2)["candidates"][0]["content"]["parts"] == [{"text": "(mock side reply)"}]
    assert status3 == 200 and json.loads(raw3)["totalTokens"] > 0
    assert status4 == 404 and json.loads(raw4)["error"]["status"] == "NOT_FOUND"
    assert [m["name"] for m in listed["models"]][:1] == ["models/gemini-2.5-flash"]
    assert [r["_side"] for r in api.requests] == [False, True]


def test_mock_errors_use_google_error_shape_with_retry_info() -> None:
    with MockGeminiAPI([quota_error_reply("7s")]) as api:
        status, raw, _ = _post(f"{api.base_url}/v1beta/models/m:streamGenerateContent?alt=sse", {"tools": [{}]})
    error = json.loads(raw)["error"]
    assert status == 429 and error["code"] == 429 and error["status"] == "RESOURCE_EXHAUSTED"
    retry = [d for d in error["details"] if d["@type"] == "type.googleapis.com/google.rpc.RetryInfo"]
    assert retry == [{"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "7s"}]


def test_script_follows_conversation_position_not_request_count() -> None:
    script = ScriptedConversation([[error_reply(503), text_reply("first")], text_reply("second")])
    opening = {"contents": [{"role": "user", "parts": [{"text": "a"}]}]}
    later = {
        "contents": opening["contents"]
        + [{"role": "model", "parts": [{"text": "x"}]}, {"role": "user", "parts": [{"text": "b"}]}]
    }
    assert script(opening).status == 503
    assert script(opening).parts == ({"text": "first"},)
    assert script(later).parts == ({"text": "second"},)
    assert script(opening).parts == ({"text": "first"},)  # a resend of the history replays position 0
    beyond = {"contents": later["contents"] + [{"role": "model", "parts": [{"text": "y"}]}]}
    assert script(beyond).parts == ({"text": ScriptedConversation.FINISHED},)


def test_side_requests_and_their_default_answers() -> None:
    router = {
        "contents": [{"role": "user", "parts": [{"text": "hi"}]}],
        "generationConfig": {
            "responseMimeType": "application/json",
            "responseJsonSchema": {"properties": {"complexity_reasoning": {}, "complexity_score": {}}},
        },
    }
    assert is_side_request(router, streaming=False)
    assert not is_side_request(dict(router, tools=[{"functionDeclarations": []}]), streaming=True)
    assert json.loads(default_side_reply(router).parts[0]["text"])["complexity_score"] <= 20
    speaker = {"generationConfig": {"responseJsonSchema": {"properties": {"reasoning": {}, "next_speaker": {}}}}}
    assert json.loads(default_side_reply(speaker).parts[0]["text"])["next_speaker"] == "user"


# --------------------------------------------------------------------------- the real CLI


def make_git_repo(path: Path, files: dict[str, str] | None = None) -> Path:
    """A git repository with one commit holding README.md and ``files``."""
    path.mkdir(parents=True)
    for args in (
        ["init", "-q", "-b", "main"],
        ["config", "user.email", "e2e@example.invalid"],
        ["config", "user.name", "e2e"],
    ):
        subprocess.run(["git", *args], cwd=path, check=True)
    for name, text in {"README.md": "# scratch\n", **(files or {})}.items():
        (path / name).write_text(text)
    subprocess.run(["git", "add", "-A"], cwd=path, check=True)
    subprocess.run(["git", "commit", "-q", "-m", "initial"], cwd=path, check=True)
    return path


class TextSession(t.NamedTuple):
    """A text turn in a repo with committed GEMINI.md and AGENTS.md and a global GEMINI.md,
    what it left behind, then two resumes that must fail (an unknown id; the known id from
    another folder)."""

    repo: Path
    env: dict[str, str]
    turn: Turn
    requests: list[dict[str, t.Any]]  # the text turn's
    probes: list[t.Any]
    chats: list[Path]
    home_entries: list[Path]
    git_status: str
    unknown: Turn
    moved: Turn
    requests_in_all: int


@pytest.fixture(scope="module")
def text_session(tmp_path_factory: pytest.TempPathFactory, _test_home: Path) -> TextSession:
    """One gemini text turn read by four probes (event shapes and session file, tools offered
    in yolo mode, instruction files, failing resumes); the two resumes are runs of their own."""
    assert GEMINI_BIN, "requires_gemini should have skipped this test"
    root = tmp_path_factory.mktemp("gemini-text")
    repo = make_git_repo(root / "repo", {"GEMINI.md": "PROJECT_MARK\n", "AGENTS.md": "AGENTS_MARK\n"})
    with hermetic_environ(_test_home):
        with MockGeminiAPI([text_reply("Hello from the mock, long enough to arrive in two chunks.")]) as api:
            env = gemini_env(api.base_url, root)
            (gemini_home(env) / "GEMINI.md").write_text("GLOBAL_MARK: you are agent probe-1\n")
            result = turn(GEMINI_BIN, "say hello", repo, env)
            capture("text_turn", result.proc.stdout)
            requests, probes = list(api.requests), list(api.probes)
            chats = list((gemini_home(env) / "tmp" / repo.name / "chats").glob("session-*.jsonl"))
            home_entries = list(Path(env["HOME"]).iterdir())
            status = subprocess.run(
                ["git", "status", "--porcelain", "--ignored"], cwd=repo, capture_output=True, text=True, check=True
            ).stdout
            known = result.events[0].get("session_id", "") if result.events else ""
            unknown = turn(GEMINI_BIN, "again", repo, env, resume=str(uuid.uuid4()))
            other = root / "elsewhere"
            other.mkdir()
            moved = turn(GEMINI_BIN, "again", other, env, resume=known)
            in_all = len(api.requests)
    return TextSession(repo, env, result, requests, probes, chats, home_entries, status, unknown, moved, in_all)


@requires_gemini
def test_text_turn_event_shapes_and_where_the_session_is_kept(text_session: TextSession) -> None:
    result, env, repo = text_session.turn, text_session.env, text_session.repo
    assert result.proc.returncode == 0, result.proc.stderr
    assert [e["type"] for e in result.events] == ["init", "message", "message", "message", "result"]
    init = result.events[0]
    assert UUID_RE.match(init["session_id"]) and init["model"] == "gemini-2.5-flash"
    assert result.events[1] == {**result.events[1], "role": "user", "content": "say hello"}
    deltas = [e for e in of_type(result.events, "message") if e["role"] == "assistant"]
    assert all(e["delta"] is True for e in deltas)
    assert assistant_text(result.events) == "Hello from the mock, long enough to arrive in two chunks."
    final = the_result(result.events)
    assert final["status"] == "success" and "error" not in final
    stats = final["stats"]
    assert stats["input_tokens"] > 0 and stats["output_tokens"] > 0 and stats["tool_calls"] == 0
    assert stats["total_tokens"] == stats["input_tokens"] + stats["output_tokens"]
    assert set(stats["models"]) == {"gemini-2.5-flash"}
    assert all(e["timestamp"].endswith("Z") for e in result.events)

    (request,) = text_session.requests
    assert request["_path"] == "/v1beta/models/gemini-2.5-flash:streamGenerateContent?alt=sse"
    assert request["_headers"]["x-goog-api-key"] == env["GEMINI_API_KEY"]
    assert request["_headers"]["user-agent"].startswith("GeminiCLI-tui/0.61.0/gemini-2.5-flash")
    assert "x-gemini-api-privileged-user-id" not in request["_headers"]  # usage statistics are off
    assert text_session.probes == []  # no countTokens, no model list
    # The first user content: an environment preamble, then the prompt, as two parts.
    first = request["contents"][0]
    assert first["role"] == "user" and first["parts"][-1] == {"text": "say hello"}
    assert len(first["parts"]) == 2
    assert first["parts"][0]["text"].startswith("<session_context>") and str(repo) in first["parts"][0]["text"]

    # The chat lives under GEMINI_CLI_HOME, named after the worktree's folder name and the
    # first 8 characters of the session id; nothing lands in HOME or in the worktree.
    chats = text_session.chats
    assert [c.name.endswith(f"-{init['session_id'][:8]}.jsonl") for c in chats] == [True]
    header = json.loads(chats[0].read_text().splitlines()[0])
    assert header["sessionId"] == init["session_id"] and header["kind"] == "main"
    assert text_session.home_entries == []
    assert text_session.git_status == ""


class ShellThenResume(t.NamedTuple):
    """A turn whose shell call runs (under a chosen session id), the same session resumed,
    then a third run that tries to start a new session under the same id."""

    repo: Path
    session_id: str
    first: Turn
    first_requests: list[dict[str, t.Any]]
    second: Turn
    second_requests: list[dict[str, t.Any]]
    again: Turn
    again_requests: int


SHELL_COMMAND = "echo made-by-gemini > out.txt && cat out.txt"


@pytest.fixture(scope="module")
def shell_then_resume(tmp_path_factory: pytest.TempPathFactory, _test_home: Path) -> ShellThenResume:
    """The shell-tool probe's turn is the first turn of the resume probe (one run fewer)."""
    assert GEMINI_BIN, "requires_gemini should have skipped this test"
    root = tmp_path_factory.mktemp("gemini-shell")
    repo = make_git_repo(root / "repo")
    session_id = str(uuid.uuid4())
    script = [
        call_reply("run_shell_command", {"command": SHELL_COMMAND, "description": "write a file"}, call_id="c-1"),
        text_reply("the file is written"),
        text_reply("second answer"),
    ]
    with hermetic_environ(_test_home):
        with MockGeminiAPI(script) as api:
            env = gemini_env(api.base_url, root)
            first = turn(GEMINI_BIN, "write out.txt", repo, env, session_id=session_id)
            capture("tool_turn", first.proc.stdout)
            first_requests = list(api.requests)
            second = turn(GEMINI_BIN, "second prompt", repo, env, resume=session_id)
            capture("resume_turn", second.proc.stdout)
            second_requests = api.requests[len(first_requests) :]
        # An id that was already used cannot start a new session.
        with MockGeminiAPI([text_reply("x")]) as api:
            again = turn(GEMINI_BIN, "third", repo, gemini_env(api.base_url, root), session_id=session_id)
            again_requests = len(api.requests)
    return ShellThenResume(repo, session_id, first, first_requests, second, second_requests, again, again_requests)


@requires_gemini
def test_shell_command_really_runs_and_its_output_reaches_the_model(shell_then_resume: ShellThenResume) -> None:
    result, repo, command = shell_then_resume.first, shell_then_resume.repo, SHELL_COMMAND
    assert result.proc.returncode == 0, result.proc.stderr
    assert (repo / "out.txt").read_text() == "made-by-gemini\n"
    assert [e["type"] for e in result.events] == ["init", "message", "tool_use", "tool_result", "message", "result"]
    use, outcome = of_type(result.events, "tool_use")[0], of_type(result.events, "tool_result")[0]
    # tool_id is "<tool name>__<functionCall id>".
    assert use == {
        **use,
        "tool_name": "run_shell_command",
        "tool_id": "run_shell_command__c-1",
        "parameters": {"command": command, "description": "write a file"},
    }
    assert outcome == {**outcome, "tool_id": "run_shell_command__c-1", "status": "success", "output": "made-by-gemini"}
    assert the_result(result.events)["stats"]["tool_calls"] == 1

    assert len(shell_then_resume.first_requests) == 2
    second = shell_then_resume.first_requests[1]
    assert [c["role"] for c in second["contents"]] == ["user", "model", "user"]
    (response,) = function_responses(second)
    assert response["id"] == "c-1" and response["name"] == "run_shell_command"
    assert "Output: made-by-gemini" in response["response"]["output"]
    assert "<untrusted_context>" in response["response"]["output"]


class DefaultModeTurn(t.NamedTuple):
    proc: subprocess.CompletedProcess[str]
    requests: list[dict[str, t.Any]]
    repo: Path


@pytest.fixture(scope="module")
def default_mode_turn(tmp_path_factory: pytest.TempPathFactory, _test_home: Path) -> DefaultModeTurn:
    """One run for two probes: headless in the default approval mode (a shell call the
    model makes anyway), with ``context.fileName: ["AGENTS.md"]`` in a repo holding both
    GEMINI.md and AGENTS.md."""
    assert GEMINI_BIN, "requires_gemini should have skipped this test"
    root = tmp_path_factory.mktemp("gemini-default")
    repo = make_git_repo(root / "repo", {"GEMINI.md": "PROJECT_MARK\n", "AGENTS.md": "AGENTS_MARK\n"})
    script = [call_reply("run_shell_command", {"command": "touch should-not-exist"}), text_reply("done")]
    with hermetic_environ(_test_home), MockGeminiAPI(script) as api:
        env = gemini_env(api.base_url, root, settings={"context": {"fileName": ["AGENTS.md"]}})
        proc = subprocess.run(
            [GEMINI_BIN, "-p", "hi", "-m", "gemini-2.5-flash", "--output-format", "stream-json", "--skip-trust"],
            cwd=repo,
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=TURN_TIMEOUT,
            check=False,
        )
        return DefaultModeTurn(proc, list(api.requests), repo)


@requires_gemini
def test_tools_offered_depend_on_the_approval_mode(
    text_session: TextSession, default_mode_turn: DefaultModeTurn
) -> None:
    """yolo offers the editing and shell tools (read from the text-turn probe's request);
    headless default mode leaves them out, and a call to one of them is answered "not
    found" without running anything."""
    (request,) = text_session.requests
    declared = {f["name"]: f for tool in request["tools"] for f in tool["functionDeclarations"]}
    for name, required in {
        "run_shell_command": ["command"],
        "write_file": ["file_path", "content"],
        "replace": ["file_path", "instruction", "old_string", "new_string"],
        "read_file": ["file_path"],
        "list_directory": ["dir_path"],
        "grep_search": ["pattern"],
        "glob": ["pattern"],
    }.items():
        assert declared[name]["parametersJsonSchema"]["required"] == required, name
    shell_args = declared["run_shell_command"]["parametersJsonSchema"]["properties"]
    assert {"description", "dir_path", "is_background"} <= set(shell_args)

    proc, requests, repo = default_mode_turn
    default_tools = {f["name"] for tool in requests[0]["tools"] for f in tool["functionDeclarations"]}
    assert "read_file" in default_tools
    assert not default_tools & {"run_shell_command", "write_file", "replace"}
    outcome = of_type(parse_stream(proc.stdout), "tool_result")[0]
    assert outcome["status"] == "error" and outcome["error"]["type"] == "tool_not_registered"
    assert not (repo / "should-not-exist").exists()


@requires_gemini
def test_resume_by_session_id_resends_the_history(shell_then_resume: ShellThenResume) -> None:
    """(The first turn is the shell-tool probe's.)"""
    run = shell_then_resume
    first, second, session_id = run.first, run.second, run.session_id
    assert first.proc.returncode == 0 and second.proc.returncode == 0, second.proc.stderr
    assert first.events[0]["session_id"] == session_id  # --session-id picks the id up front
    assert second.events[0]["session_id"] == session_id
    assert assistant_text(second.events) == "second answer"
    (resumed,) = run.second_requests
    roles = [c["role"] for c in resumed["contents"]]
    assert roles == ["user", "model", "user", "model", "user"]
    text = conversation_text(resumed)
    for piece in ("write out.txt", SHELL_COMMAND, "the file is written"):
        assert piece in text
    assert resumed["contents"][-1]["parts"] == [{"text": "second prompt"}]
    # 0.61.0 re-sends the earlier tool result twice in the resumed history.
    assert [r["id"] for r in function_responses(resumed)] == ["c-1", "c-1"]

    # An id that was already used cannot start a new session.
    again = run.again
    assert again.proc.returncode == 42 and again.proc.stdout == "" and run.again_requests == 0
    assert "already exists" in again.proc.stderr


@requires_gemini
def test_resume_of_an_unknown_session_or_from_another_folder_fails_fast(text_session: TextSession) -> None:
    """(The known session is the text-turn probe's.)"""
    assert text_session.turn.proc.returncode == 0, text_session.turn.proc.stderr
    assert text_session.requests_in_all == 1
    unknown, moved = text_session.unknown, text_session.moved
    for outcome in (unknown, moved):
        assert outcome.proc.returncode == 42 and outcome.proc.stdout == ""
        assert outcome.proc.stderr.count("Error resuming session") == 1
    assert "Invalid session identifier" in unknown.proc.stderr
    assert "No previous sessions found for this project" in moved.proc.stderr


@requires_gemini
def test_custom_session_ids_with_the_same_first_8_characters_share_one_file(
    gemini: str, repo: Path, tmp_path: Path
) -> None:
    """The chat file is named after the minute and the id's first 8 characters: two ids
    with the same prefix in the same minute land in one file and the first is lost."""
    with MockGeminiAPI([text_reply("x")]) as api:
        env = gemini_env(api.base_url, tmp_path)
        for session_id in ("ov-agent_1", "ov-agent_2"):
            assert turn(gemini, "hi", repo, env, session_id=session_id).proc.returncode == 0
        lost = turn(gemini, "hi", repo, env, resume="ov-agent_1")
    chats = list((gemini_home(env) / "tmp" / repo.name / "chats").glob("session-*.jsonl"))
    if len(chats) == 2:  # the two runs straddled a minute boundary: nothing to show
        pytest.skip("the two sessions were created in different minutes")
    assert [c.name[-len("ov-agent.jsonl") :] for c in chats] == ["ov-agent.jsonl"]
    assert lost.proc.returncode == 42 and "Invalid session identifier" in lost.proc.stderr


@requires_gemini
def test_persistent_500_is_retried_then_ends_with_an_error_result(gemini: str, repo: Path, tmp_path: Path) -> None:
    """general.maxAttempts=2 keeps this short; the default is 10 attempts over ~3.5 min."""
    with MockGeminiAPI([error_reply(500, "Internal error encountered.")]) as api:
        env = gemini_env(api.base_url, tmp_path, settings={"general": {"maxAttempts": 2}})
        result = turn(gemini, "hi", repo, env)
    capture("error_500", result.proc.stdout)

    assert len(api.requests) == 2
    gap = api.requests[1]["_time"] - api.requests[0]["_time"]
    assert gap >= 3.0  # first backoff: 5 s +-30 %
    assert result.proc.returncode == 500 % 256  # the HTTP status is the exit status
    assert [e["type"] for e in result.events] == ["init", "message", "result"]  # retries are silent
    final = the_result(result.events)
    assert final["status"] == "error"
    assert final["error"]["type"] == "unknown"
    assert '"code":500' in final["error"]["message"] and final["error"]["message"].startswith("[API Error:")
    assert final["stats"]["total_tokens"] == 0
    assert "Attempt 1 failed with status 500" in result.proc.stderr
    reports = list(Path(env["TMPDIR"]).glob("gemini-client-error-*.json"))
    assert len(reports) == 1  # a full error report goes to TMPDIR


@requires_gemini
def test_503_then_success_recovers_without_any_event(gemini: str, repo: Path, tmp_path: Path) -> None:
    script = [[error_reply(503, "The model is overloaded. Please try again later."), text_reply("recovered")]]
    with MockGeminiAPI(script) as api:
        result = turn(gemini, "hi", repo, gemini_env(api.base_url, tmp_path))
    assert result.proc.returncode == 0, result.proc.stderr
    assert len(api.requests) == 2
    assert api.requests[1]["_time"] - api.requests[0]["_time"] >= 3.0
    assert [e["type"] for e in result.events] == ["init", "message", "message", "result"]
    assert the_result(result.events)["status"] == "success" and assistant_text(result.events) == "recovered"
    assert "Attempt 1 failed" in result.proc.stderr


@requires_gemini
def test_429_retry_info_sets_the_wait_and_a_long_one_is_final(gemini: str, repo: Path, tmp_path: Path) -> None:
    """RetryInfo.retryDelay is honoured as a lower bound (never less than the 5 s backoff);
    a delay over 300 s makes the error terminal: no retry, exit 429 % 256."""
    with MockGeminiAPI([[quota_error_reply("7s"), text_reply("after quota")]]) as api:
        waited = turn(gemini, "hi", repo, gemini_env(api.base_url, tmp_path / "short"))
    assert waited.proc.returncode == 0, waited.proc.stderr
    assert len(api.requests) == 2 and api.requests[1]["_time"] - api.requests[0]["_time"] >= 7.0
    assert "Suggested retry after 7s" in waited.proc.stderr

    with MockGeminiAPI([quota_error_reply("400s")]) as api:
        final = turn(gemini, "hi", repo, gemini_env(api.base_url, tmp_path / "long"))
    assert len(api.requests) == 1
    assert final.proc.returncode == 429 % 256
    outcome = the_result(final.events)
    assert outcome["status"] == "error" and "Suggested retry after 400s" in outcome["error"]["message"]


@requires_gemini
@pytest.mark.parametrize(
    ("status", "details"),
    [
        (401, ()),
        (403, ()),
        # What the real API answers for a wrong key: 400 with reason API_KEY_INVALID.
        (
            400,
            (
                {
                    "@type": "type.googleapis.com/google.rpc.ErrorInfo",
                    "reason": "API_KEY_INVALID",
                    "domain": "googleapis.com",
                },
            ),
        ),
    ],
)
def test_auth_errors_are_not_retried(
    gemini: str, repo: Path, tmp_path: Path, status: int, details: tuple[dict[str, t.Any], ...]
) -> None:
    with MockGeminiAPI(
        [error_reply(status, "API key not valid. Please pass a valid API key.", details=details)]
    ) as api:
        result = turn(gemini, "hi", repo, gemini_env(api.base_url, tmp_path, api_key="wrong-key"))
    assert len(api.requests) == 1
    assert api.requests[0]["_headers"]["x-goog-api-key"] == "wrong-key"
    assert result.proc.returncode == status % 256
    final = the_result(result.events)
    assert final["status"] == "error" and f'"code":{status}' in final["error"]["message"]


@requires_gemini
def test_empty_model_reply_is_retried_then_exits_0_with_an_error_result(
    gemini: str, repo: Path, tmp_path: Path
) -> None:
    """An exit status of 0 does not mean success: only result.status does."""
    with MockGeminiAPI([Reply(parts=({"text": ""},))]) as api:
        result = turn(gemini, "hi", repo, gemini_env(api.base_url, tmp_path))
    assert len(api.requests) == 4
    assert result.proc.returncode == 0
    error = of_type(result.events, "error")
    assert len(error) == 1 and error[0]["severity"] == "error" and "empty response" in error[0]["message"]
    assert the_result(result.events)["status"] == "error"


class HookedTurn(t.NamedTuple):
    """Five shell calls in one reply under two BeforeTool hooks (see ``hooked_turn``)."""

    root: Path
    repo: Path
    result: Turn
    requests: list[dict[str, t.Any]]


HOOK_CALLS = {
    "c-deny": "echo forbidden > denied.txt",  # the guard answers {"decision": "deny"}
    "c-ok": "echo fine > allowed.txt",  # the guard answers {}
    "c-exit2": "touch ran-exit2.txt",  # the guard exits 2
    "c-exit1": "touch ran-exit1.txt",  # the guard crashes: exit 1
    "c-slow": "touch ran-slow.txt",  # the slow hook outlives its 500 ms timeout
}


@pytest.fixture(scope="module")
def hooked_turn(tmp_path_factory: pytest.TempPathFactory, _test_home: Path) -> HookedTurn:
    """One run for the hook probes. The guard (python, default timeout) denies by JSON,
    blocks by exit 2 or crashes with exit 1 depending on the command; a second hook (sh,
    timeout 500 ms) sleeps 3 s and then denies, for the "slow" command only."""
    assert GEMINI_BIN, "requires_gemini should have skipped this test"
    root = tmp_path_factory.mktemp("gemini-hooks")
    repo = make_git_repo(root / "repo")
    guard = hook_script(
        root,
        "guard",
        "command = json.dumps(data.get('tool_input'))\n"
        "if 'forbidden' in command:\n"
        "    print(json.dumps({'decision': 'deny', 'reason': 'ov guard: not allowed here'}))\n"
        "elif 'exit2' in command:\n"
        "    sys.stderr.write('blocked by exit 2')\n"
        "    sys.exit(2)\n"
        "elif 'exit1' in command:\n"
        "    sys.stderr.write('guard crashed')\n"
        "    sys.exit(1)\n"
        "else:\n"
        "    print('{}')",
    )
    slow = root / "slow.sh"
    slow.write_text(
        "#!/bin/sh\n"
        'case "$(cat)" in\n'
        f"  *ran-slow*) echo asked >> {root / 'slow.log'}; sleep 3\n"
        "    echo '{\"decision\": \"deny\", \"reason\": \"too late\"}' ;;\n"
        "  *) echo '{}' ;;\n"
        "esac\n"
    )
    slow.chmod(slow.stat().st_mode | stat.S_IXUSR)
    settings = before_tool_hooks(str(guard))
    settings["hooks"]["BeforeTool"][0]["hooks"].append({"type": "command", "command": str(slow), "timeout": 500})
    calls = [("run_shell_command", {"command": command}, call_id) for call_id, command in HOOK_CALLS.items()]
    with hermetic_environ(_test_home), MockGeminiAPI([calls_reply(calls), text_reply("done")]) as api:
        env = gemini_env(api.base_url, root, settings=settings, extra={"OVERSTORY_AGENT_NAME": "probe-agent"})
        result = turn(GEMINI_BIN, "try them all", repo, env)
        # A refreshed gemini-hook_deny.jsonl holds all five calls (tests/test_runtime_streams.py reads it).
        capture("hook_deny", result.proc.stdout)
        return HookedTurn(root, repo, result, list(api.requests))


@requires_gemini
def test_before_tool_hook_deny_blocks_the_command(hooked_turn: HookedTurn) -> None:
    result, repo = hooked_turn.result, hooked_turn.repo
    assert result.proc.returncode == 0, result.proc.stderr
    assert not (repo / "denied.txt").exists()
    assert (repo / "allowed.txt").read_text() == "fine\n"
    outcomes = {e["tool_id"]: e for e in of_type(result.events, "tool_result")}
    denied = outcomes["run_shell_command__c-deny"]
    assert denied["status"] == "error" and denied["error"]["type"] == "policy_violation"
    assert denied["output"] == "Tool execution blocked: ov guard: not allowed here"
    assert outcomes["run_shell_command__c-ok"]["status"] == "success"
    assert the_result(result.events)["status"] == "success"  # a denial does not fail the turn
    responses = {r["id"]: r["response"] for r in function_responses(hooked_turn.requests[-1])}
    assert responses["c-deny"] == {"error": "Tool execution blocked: ov guard: not allowed here"}

    calls = sorted(read_log(hooked_turn.root / "guard.log"), key=lambda d: d["tool_input"]["command"])
    assert [c["tool_input"] for c in calls] == [{"command": command} for command in sorted(HOOK_CALLS.values())]
    session_id = result.events[0]["session_id"]
    for call in calls:
        assert set(call) == {
            "session_id",
            "transcript_path",
            "cwd",
            "hook_event_name",
            "timestamp",
            "tool_name",
            "tool_input",
        }
        assert call["session_id"] == session_id and call["hook_event_name"] == "BeforeTool"
        assert call["cwd"] == str(repo) and call["tool_name"] == "run_shell_command"
        assert call["transcript_path"].endswith(f"-{session_id[:8]}.jsonl")
    assert calls[0]["tool_input"] == {"command": "echo fine > allowed.txt"}


@requires_gemini
def test_hook_exit_2_blocks_but_a_crashing_or_slow_hook_lets_the_tool_run(hooked_turn: HookedTurn) -> None:
    """Exit 2 blocks (stderr is the reason). Any other failure is only a warning: exit 1
    and a timeout both let the tool run, so a guard must fail closed by itself. (The
    deny probe's run: calls c-exit2, c-exit1 and c-slow.)"""
    result, repo = hooked_turn.result, hooked_turn.repo
    assert result.proc.returncode == 0, result.proc.stderr
    outcomes = {e["tool_id"]: e for e in of_type(result.events, "tool_result")}
    blocked = outcomes["run_shell_command__c-exit2"]
    assert not (repo / "ran-exit2.txt").exists()
    assert blocked["status"] == "error" and blocked["output"] == "Tool execution blocked: blocked by exit 2"
    assert (repo / "ran-exit1.txt").exists() and outcomes["run_shell_command__c-exit1"]["status"] == "success"
    assert (hooked_turn.root / "slow.log").read_text() == "asked\n"  # the slow hook was asked, once
    assert (repo / "ran-slow.txt").exists() and outcomes["run_shell_command__c-slow"]["status"] == "success"


@requires_gemini
def test_instruction_files_global_and_project(text_session: TextSession, default_mode_turn: DefaultModeTurn) -> None:
    """GEMINI_CLI_HOME/.gemini/GEMINI.md goes into systemInstruction; the worktree's
    GEMINI.md into the first user message. context.fileName adds names, GEMINI.md stays.
    (The plain case is the text-turn probe's request, the renamed one the default-mode probe's.)"""
    (plain,) = text_session.requests
    renamed = default_mode_turn.requests[0]
    system = plain["systemInstruction"]["parts"][0]["text"]
    assert "GLOBAL_MARK: you are agent probe-1" in system and "PROJECT_MARK" not in system
    assert f"--- Context from: {gemini_home(text_session.env) / 'GEMINI.md'} ---" in system
    first_user = plain["contents"][0]["parts"][0]["text"]
    assert "PROJECT_MARK" in first_user and "AGENTS_MARK" not in first_user
    renamed_user = renamed["contents"][0]["parts"][0]["text"]
    assert "AGENTS_MARK" in renamed_user and "PROJECT_MARK" in renamed_user


@requires_gemini
def test_headless_needs_the_auth_setting_and_a_trusted_folder(gemini: str, repo: Path, tmp_path: Path) -> None:
    with MockGeminiAPI([text_reply("never")]) as api:
        env = gemini_env(api.base_url, tmp_path)
        (gemini_home(env) / "settings.json").unlink()
        no_auth = run_headless_turn(gemini, "hi", cwd=repo, env=env)
        write_settings(env)
        untrusted = subprocess.run(
            [gemini, "-p", "hi", "-m", "gemini-2.5-flash", "--output-format", "stream-json"],
            cwd=repo,
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=TURN_TIMEOUT,
            check=False,
        )
    assert api.requests == []
    assert no_auth.returncode == 41 and "Invalid auth method selected." in no_auth.stderr
    assert untrusted.returncode == 55 and "not running in a trusted directory" in untrusted.stderr
    assert no_auth.stdout == untrusted.stdout == ""


@requires_gemini
def test_sigterm_to_the_launcher_is_ignored_the_group_ends_the_turn_and_the_tool_shell_lives_on(
    gemini: str, repo: Path, tmp_path: Path
) -> None:
    """Two probes in one run, stopped while its shell tool runs. By default `gemini` is a
    launcher that re-spawns node and ignores SIGTERM/SIGINT; signalling the process group
    stops the turn: exit 0 and no result event. Shell tool commands run in a new session;
    killing the CLI's group does not reach them. They carry GEMINI_CLI=1 in their environment."""
    command = "echo $$ > started.pid; exec sleep 30"
    script = [call_reply("run_shell_command", {"command": command}), text_reply("x")]
    with MockGeminiAPI(script) as api:
        proc = start_turn(gemini, "wait a bit", repo, gemini_env(api.base_url, tmp_path, relaunch=True))
        tool_pid = None
        try:
            pid_file = repo / "started.pid"
            assert wait_until(lambda: pid_file.exists() and pid_file.read_text().strip() != "")
            tool_pid = int(pid_file.read_text())
            os.kill(proc.pid, signal.SIGTERM)
            time.sleep(2)
            assert proc.poll() is None, "the launcher should have ignored SIGTERM"
            os.killpg(proc.pid, signal.SIGTERM)
            stdout, _ = finish(proc)
            assert proc.returncode == 0
            assert [e["type"] for e in parse_stream(stdout)] == ["init", "message", "tool_use"]
            assert pid_alive(tool_pid)
            assert os.getsid(tool_pid) != proc.pid and os.getpgid(tool_pid) == tool_pid
            environ = Path(f"/proc/{tool_pid}/environ").read_bytes().split(b"\0")
            assert b"GEMINI_CLI=1" in environ
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            if tool_pid is not None and pid_alive(tool_pid):
                os.killpg(tool_pid, signal.SIGKILL)
