"""Mixed teams: a Claude Code coordinator with builders and reviewers on other runtimes.

Every CLI is the REAL one from npm (.ci/node); each talks to a mock of its own model API on
127.0.0.1 (tests/mockapi.py, tests/mock_openai_responses.py, tests/mock_gemini_api.py,
tests/mock_openai_chat.py), because no model can be called offline. Only the models are
mocked: `ov`, the agent loops, the CLIs and their tools, hooks and plugins, git, SQLite and
bubblewrap are real. Config routes each agent to its runtime and its provider (`runtimes`,
`providers`/`models`, or the coordinator's own `ov sling --runtime/--model`), as a user would.

- Codex builder and Gemini CLI reviewer: the coordinator slings the builder, then the reviewer
  once the builder is done; the reviewer's verdict (`result` mail) reaches the coordinator, which
  then merges the builder's branch.
- Kilo and Qwen Code builders: the coordinator slings one of each (`ov sling --runtime kilo` and
  `--runtime qwen`, run by its Bash tool), merges both when they report worker_done, checks the run
  is complete and reports; the operator answers each builder's question and, at the end, stops the
  coordinator, and the run is completed. CI time is tight (a kilo turn costs a minute of wall time, a qwen turn half of
  one), so these two builders' runs are also the runs that prove, per runtime, what
  tests/e2e/test_kilo_agent.py and tests/e2e/test_qwen_agent.py proved with a builder of their
  own: a 5xx retried by the CLI, a second turn resuming the same session (the operator's
  answer), writes outside the worktree refused (guard and sandbox), receipts from exit codes,
  the provider's key and instructions, the commit and the worker_done report. Those files keep
  the failure runs (401 parks for auth, a stalled model dies once).

The models are small state machines over the conversation, not fixed lists: mail can
arrive one message per turn or several at once.
"""

from __future__ import annotations

import json
import re
import typing as t
from pathlib import Path

import pytest

import mock_openai_chat as chat
from agent_helpers import mail_rows, wait_for, wait_terminal
from claude_cli import CLAUDE_BIN, claude_env, requires_claude
from codex_cli import CODEX_BIN, MOCK_MODEL, requires_codex
from conftest import run_git, run_ov
from gemini_cli import DEFAULT_MODEL, GEMINI_BIN, requires_gemini
from kilo_cli import KILO_BIN, requires_kilo
from mock_gemini_api import MockGeminiAPI, call_reply, function_responses
from mock_gemini_api import text_reply as gemini_text
from mock_openai_responses import MockResponsesAPI, shell_reply
from mock_openai_responses import text_reply as codex_text
from mockapi import MockMessagesAPI, Reply, text_reply, tool_reply
from overstory.paths import ProjectPaths
from qwen_cli import QWEN_BIN, requires_qwen
from runtime_agents import MOCK_PRICE, OFFLINE_ENV, configure, events, ledger_rows, ran_in_bubblewrap, turn_rows

OBJECTIVE = "add a greet() function"


def _blocks(message: dict[str, t.Any]) -> list[dict[str, t.Any]]:
    content = message.get("content")
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return [b for b in content or [] if isinstance(b, dict)]


def _text(message: dict[str, t.Any]) -> str:
    return "\n".join(str(b.get("text", "")) for b in _blocks(message) if b.get("type") == "text")


def _commands(body: dict[str, t.Any]) -> list[str]:
    return [str(b.get("input", {}).get("command", "")) for m in body.get("messages", []) if m.get("role") == "assistant"
            for b in _blocks(m) if b.get("type") == "tool_use"]


def _bash(command: str) -> Reply:
    return tool_reply("Bash", {"command": command, "description": "ov"})


def coordinator_model(body: dict[str, t.Any]) -> Reply:
    last = body["messages"][-1]
    ran = _commands(body)
    if any(b.get("type") == "tool_result" for b in _blocks(last)):
        if "ov merge" in ran[-1]:
            return _bash("ov mail send --to operator --type result --subject 'greet() is merged' "
                         "--body 'built by codex, reviewed by gemini, merged into main'")
        return text_reply("Waiting for the team.")
    prompt = _text(last)
    if OBJECTIVE in prompt and not any("ov sling builder" in c for c in ran):
        return _bash(f"ov sling builder greet --prompt '{OBJECTIVE}: greet(name) in greet.py' --files greet.py")
    if re.search(r"From: builder-greet\n[^\n]*\nType: worker_done", prompt) and not any("ov sling reviewer" in c
                                                                                       for c in ran):
        return _bash("ov sling reviewer greet-review --prompt 'review branch ov/builder-greet against main'")
    if re.search(r"From: reviewer-greet-review\n[^\n]*\nType: result", prompt) and not any("ov merge" in c
                                                                                          for c in ran):
        return _bash("ov merge builder-greet")
    return text_reply("Nothing to act on.")


def codex_builder() -> list[t.Any]:
    patch = ("apply_patch <<'EOF'\n*** Begin Patch\n*** Add File: greet.py\n+def greet(name):\n"
             "+    return f'Hello, {name}!'\n*** End Patch\nEOF\n")
    return [
        shell_reply(patch, yield_time_ms=30000),
        shell_reply("git add greet.py && git commit -q -m 'greet: add greet()'", yield_time_ms=30000),
        shell_reply("ov mail send --type worker_done --subject 'greet: done' --body 'greet() on ov/builder-greet' "
                    "--payload '{\"files_modified\": [\"greet.py\"]}'", yield_time_ms=30000),
        codex_text("Done."),
    ]


def gemini_reviewer() -> list[t.Any]:
    return [
        call_reply("run_shell_command", {"command": "git diff main...ov/builder-greet"}),
        call_reply("write_file", {"file_path": "review-notes.md", "content": "reviewers do not write"}),
        call_reply("run_shell_command", {"command": "ov mail send --to coordinator --type result --subject 'PASS' "
                                                    "--body 'PASS: greet() returns the greeting'"}),
        call_reply("run_shell_command", {"command": "ov mail send --type worker_done --subject 'review done' "
                                                    "--body 'PASS'"}),
        gemini_text("Verdict sent."),
    ]


def _operator_results(project: ProjectPaths) -> list[dict[str, t.Any]]:
    return [m for m in mail_rows(project, recipient="operator", type="result") if m["sender"] == "coordinator"]


@requires_claude
@requires_codex
@requires_gemini
def test_claude_coordinator_codex_builder_gemini_reviewer(project: ProjectPaths, tmp_path: Path) -> None:
    with MockMessagesAPI(coordinator_model) as coordinator_api, MockResponsesAPI(codex_builder()) as codex_api, \
            MockGeminiAPI(gemini_reviewer()) as gemini_api:
        configure(project, runtimes={"builder": "codex", "reviewer": "gemini"},
                  providers={"mockc": {"base_url": coordinator_api.base_url, "api_key_env": "MOCKC_KEY",
                                       "protocol": "anthropic"},
                             "mockoai": {"base_url": codex_api.base_url, "api_key_env": "MOCKOAI_KEY",
                                         "protocol": "openai-responses"},
                             "mockgem": {"base_url": gemini_api.base_url, "api_key_env": "MOCKGEM_KEY",
                                         "protocol": "gemini"}},
                  models={"coordinator": "mockc/claude-sonnet-4-5", "builder": f"mockoai/{MOCK_MODEL}",
                          "reviewer": f"mockgem/{DEFAULT_MODEL}"},
                  prices={MOCK_MODEL: MOCK_PRICE},
                  runtime={"default": "claude", "claude_bin": CLAUDE_BIN or "claude", "codex_bin": CODEX_BIN or "codex",
                           "gemini_bin": GEMINI_BIN or "gemini"},
                  turns={"stall_timeout": 120})
        env = claude_env("http://127.0.0.1:9", tmp_path, extra={
            **OFFLINE_ENV, "MOCKC_KEY": "sk-mock-coordinator", "MOCKOAI_KEY": "sk-mock-codex",
            "MOCKGEM_KEY": "mock-gemini-key"})
        try:
            started = run_ov("coordinator", "start", "--json", cwd=project.root, env=env)
            assert started.returncode == 0, started.stderr
            sent = run_ov("coordinator", "send", OBJECTIVE, cwd=project.root, env=env)
            assert sent.returncode == 0, sent.stderr

            builder = wait_terminal(project, "builder-greet", timeout=180)
            assert builder.state == "completed" and builder.runtime == "codex", builder.state_reason
            reviewer = wait_terminal(project, "reviewer-greet-review", timeout=180)
            assert reviewer.state == "completed" and reviewer.runtime == "gemini", reviewer.state_reason
            wait_for(lambda: _operator_results(project), 180, message="the coordinator's report")

            # The reviewer's verdict reached the coordinator, as mail and in its model's conversation.
            verdicts = mail_rows(project, type="result", sender="reviewer-greet-review")
            assert len(verdicts) == 1 and verdicts[0]["recipient"] == "coordinator"
            assert any("PASS: greet() returns the greeting" in json.dumps(r["messages"])
                       for r in coordinator_api.main_requests)
            # The builder's branch is merged; the read-only reviewer's write was refused by its hook.
            assert "return f'Hello, {name}!'" in run_git(project.root, "show", "main:greet.py")
            assert not (project.worktree("reviewer-greet-review") / "review-notes.md").exists()
            refused = [r for req in gemini_api.main_requests for r in function_responses(req)
                       if "read-only" in json.dumps(r)]
            assert refused, "the guard's refusal must reach the gemini model"
            # Each agent talked to its own mock only.
            assert all(r["_headers"]["authorization"] == "Bearer sk-mock-codex" for r in codex_api.requests)
            assert all(r["_headers"]["x-goog-api-key"] == "mock-gemini-key" for r in gemini_api.main_requests)
            assert all(r["_headers"].get("x-api-key") == "sk-mock-coordinator" for r in coordinator_api.main_requests)
        finally:
            run_ov("coordinator", "stop", "--all", "--force", cwd=project.root, env=env)


# ---- a Claude coordinator with a Kilo builder and a Qwen Code builder --------------------------------

TEAM_OBJECTIVE = "add greet() and farewell()"
CHAT_MODEL = "mock-model"  # what both openai-chat mocks serve
KILO_AGENT, QWEN_AGENT = "builder-greet", "builder-farewell"
ANSWERS = {KILO_AGENT: "call it greet", QWEN_AGENT: "call it farewell"}
KILO_SLING = (f"ov sling builder greet --runtime kilo --model mockkilo/{CHAT_MODEL} --files greet.py "
              "--prompt 'greet(name) in greet.py; ask the operator for its name first'")
QWEN_SLING = (f"ov sling builder farewell --runtime qwen --provider mockqwen --model {CHAT_MODEL} --files farewell.py "
              "--prompt 'farewell(name) in farewell.py; ask the operator for its name first'")
TEAM_REPORT = "ov mail send --to operator --type result --subject 'greet() and farewell() are merged'"


def _user_text(body: dict[str, t.Any]) -> str:
    """The text of every user message so far (the objective and the mail, as turn prompts), tool results left out."""
    return "\n".join(_text(m) for m in body.get("messages", []) if m.get("role") == "user")


def team_coordinator_model(body: dict[str, t.Any]) -> Reply:
    """Sling both builders, merge each builder that reported, then check and report.

    It reads the whole conversation (the CLI resends it on each resumed turn), so mail arriving in
    any grouping, one turn per message or several at once, leads to the same steps."""
    seen, ran = _user_text(body), _commands(body)

    def done(needle: str) -> bool:
        return any(needle in command for command in ran)

    if TEAM_OBJECTIVE not in seen:
        return text_reply("Ready for an objective.")
    for sling in (KILO_SLING, QWEN_SLING):
        if not done(sling):
            return _bash(sling)
    for agent in (KILO_AGENT, QWEN_AGENT):
        if re.search(rf"From: {agent}\n[^\n]*\nType: worker_done", seen) and not done(f"ov merge {agent}"):
            return _bash(f"ov merge {agent}")
    merged = done(f"ov merge {KILO_AGENT}") and done(f"ov merge {QWEN_AGENT}")
    if merged and "all 2 agent(s) finished" in seen:  # the run summary: both builders have ended
        if not done("ov coordinator check-complete"):
            return _bash("ov coordinator check-complete")
        if not done(TEAM_REPORT):
            return _bash(f"{TEAM_REPORT} --body 'greet() by kilo, farewell() by qwen, both merged into main'")
    return text_reply("Waiting for the team.")


def kilo_builder(root: Path) -> list[chat.Reply | list[chat.Reply]]:
    """Asks the operator (turn 1 ends), then, resumed: three writes out of the worktree, the work, the report."""
    def bash(command: str) -> chat.Reply:
        return chat.tool_call_reply("bash", {"command": command, "description": "step"})

    return [
        # The first request gets a 503: kilo retries it itself, inside the turn.
        [chat.with_headers(chat.error_reply(503, "mock overloaded"), retry_after_ms="50"),
         bash("ov mail send --to operator --subject 'which name?' --type question --body 'greet or hello?'")],
        chat.text_reply("Waiting for the operator's answer about the name."),
        bash(f"echo leak > {root}/by-bash.txt"),
        chat.tool_call_reply("write", {"filePath": str(root / "by-write.txt"), "content": "leak"}),
        bash(f"python3 -c \"open('{root}/by-python.txt', 'w').write('leak')\""),
        chat.tool_call_reply("write", {"filePath": "greet.py", "content": "def greet(name):\n    return f'hello {name}'\n"}),
        bash("git add greet.py && git commit -q -m 'add greet'"),
        bash("ov mail send --type worker_done --subject 'greet added' --body 'greet.py committed'"),
        chat.text_reply("Done: greet() is committed and reported."),
    ]


def qwen_builder(root: Path, worktree: Path) -> list[chat.Reply | list[chat.Reply]]:
    """As ``kilo_builder``, in Qwen Code's tool names (its write_file takes absolute paths only)."""
    def shell(command: str) -> chat.Reply:
        return chat.tool_call_reply("run_shell_command", {"command": command})

    return [
        [chat.error_reply(503, "mock overloaded"),
         shell("ov mail send --to operator --subject 'which name?' --type question --body 'farewell or bye?'")],
        chat.text_reply("Waiting for the operator's answer about the name."),
        shell(f"echo leak > {root}/by-shell.txt"),
        chat.tool_call_reply("write_file", {"file_path": str(root / "by-write-file.txt"), "content": "leak"}),
        shell(f"python3 -c \"open('{root}/by-python3.txt', 'w').write('leak')\""),
        chat.tool_call_reply("write_file", {"file_path": str(worktree / "farewell.py"),
                                            "content": "def farewell(name):\n    return f'bye {name}'\n"}),
        shell("git add farewell.py && git commit -q -m 'add farewell'"),
        shell("ov mail send --type worker_done --subject 'farewell added' --body 'farewell.py committed'"),
        chat.text_reply("Done: farewell() is committed and reported."),
    ]


@pytest.fixture
def _kilo_qwen_user_config_untouched() -> t.Iterator[None]:
    """kilo and qwen never touch the developer's own config (ov gives each agent its own HOME and XDG dirs)."""
    home = Path.home()
    watched = [home / ".kilo", home / ".kilocode", home / ".config" / "kilo", home / ".local" / "share" / "kilo",
               home / ".qwen"]

    def listing() -> dict[str, list[str] | None]:
        return {str(p): sorted(x.name for x in p.iterdir()) if p.is_dir() else None for p in watched}

    before = listing()
    yield
    assert listing() == before


def _assert_builder_run(project: ProjectPaths, api: chat.MockChatAPI, name: str, runtime: str, key: str,
                        shell_tool: str, leaks: tuple[str, ...], file: str) -> None:
    """What tests/e2e/test_kilo_agent.py and test_qwen_agent.py asserted of their builder, for ``name``."""
    root = project.root
    agent = wait_terminal(project, name, timeout=30)
    assert agent.state == "completed" and agent.runtime == runtime, agent.state_reason
    requests = api.main_requests
    # The 503 was retried by the CLI itself, inside the first turn; both turns ended well.
    turns = turn_rows(project, name)
    assert len([r for r in requests if chat.assistant_turns(r) == 0]) == 2
    assert [row["status"] for row in turns] == ["ok", "ok"]
    # The second turn resumed the first one's session: the model saw the whole history and the answer.
    assert turns[1]["resumed"] == 1 and turns[0]["session_id"] == turns[1]["session_id"]
    resumed = [r for r in requests if ANSWERS[name] in chat.conversation_text(r)]
    assert resumed and "Waiting for the operator's answer" in chat.conversation_text(resumed[0])
    # Its own instructions (ov-owned config dir), its provider's key, its own sub-agents off.
    first = requests[0]
    assert all(r["_headers"]["authorization"] == f"Bearer {key}" for r in requests) and first["model"] == CHAT_MODEL
    assert name in json.dumps(first["messages"][0]) and "# Role: coordinator" not in json.dumps(first["messages"][0])
    offered = {tool["function"]["name"] for tool in first["tools"]}
    assert shell_tool in offered and not {"task", "board_post", "schedule_wakeup", "agent", "send_message"} & offered
    # Nothing got out of the worktree: the guard refused two writes, the sandbox the third.
    for leaked in leaks:
        assert not (root / leaked).exists(), leaked
    assert ran_in_bubblewrap(project, name)
    told = chat.conversation_text(requests[-1])
    assert told.count("project checkout") >= 2 and "Read-only file system" in told
    # Committed, reported to the coordinator, tokens priced from ov's table (neither CLI reports dollars).
    assert file in run_git(root, "show", "--name-only", f"ov/{name}")
    done = mail_rows(project, type="worker_done", sender=name)
    assert len(done) == 1 and done[0]["recipient"] == "coordinator"
    assert json.loads(done[0]["payload"])["branch"] == f"ov/{name}"
    result = events(project, name, "turn_result")[-1][1]
    assert result is not None and result["input_tokens"] > 0 and result["cost_source"] == "price_table"
    assert agent.cost_usd > 0
    assert run_git(project.worktree(name), "status", "--porcelain", "--ignored") == ""
    # Receipts from exit codes: kilo calls a bash tool that exited 1 "completed"; the sandboxed python write
    # failed (exit 1) and is recorded failed, the refused calls denied.
    rows = [(r["tool"], r["status"], r["exit_code"]) for r in ledger_rows(project, name)]
    assert rows == [("Bash", "succeeded", 0), ("Bash", "denied", None), ("Write", "denied", None),
                    ("Bash", "failed", 1), ("Write", "succeeded", None), ("Bash", "succeeded", 0),
                    ("Bash", "succeeded", 0)], rows
    trace = run_ov("trace", name, cwd=root)
    assert trace.returncode == 0 and "failed" in trace.stdout and "succeeded" in trace.stdout, trace.stdout


@requires_claude
@requires_kilo
@requires_qwen
@pytest.mark.usefixtures("_kilo_qwen_user_config_untouched")
def test_claude_coordinator_kilo_and_qwen_builders(project: ProjectPaths, tmp_path: Path) -> None:
    root = project.root
    with MockMessagesAPI(team_coordinator_model) as coordinator_api, \
            chat.MockChatAPI(kilo_builder(root)) as kilo_api, \
            chat.MockChatAPI(qwen_builder(root, project.worktree(QWEN_AGENT))) as qwen_api:
        # No runtime or model for builders in config, and a default runtime no agent here should get: the
        # coordinator's runtime comes from `ov coordinator start --runtime`, each builder's from its `ov sling`.
        configure(project, runtimes={},
                  providers={"mockc": {"base_url": coordinator_api.base_url, "api_key_env": "MOCKC_KEY",
                                       "protocol": "anthropic"},
                             "mockkilo": {"base_url": kilo_api.base_url, "api_key_env": "MOCKKILO_KEY",
                                          "protocol": "openai-chat"},
                             "mockqwen": {"base_url": qwen_api.base_url, "api_key_env": "MOCKQWEN_KEY",
                                          "protocol": "openai-chat"}},
                  models={"coordinator": "mockc/claude-sonnet-4-5"}, prices={CHAT_MODEL: MOCK_PRICE},
                  runtime={"default": "scripted", "claude_bin": CLAUDE_BIN or "claude", "kilo_bin": KILO_BIN or "kilo",
                           "qwen_bin": QWEN_BIN or "qwen"})
        env = claude_env("http://127.0.0.1:9", tmp_path, extra={
            **OFFLINE_ENV, "MOCKC_KEY": "sk-mock-coordinator", "MOCKKILO_KEY": "sk-mock-kilo-builder",
            "MOCKQWEN_KEY": "sk-mock-qwen-builder"})
        try:
            started = run_ov("coordinator", "start", "--runtime", "claude", "--json", cwd=root, env=env)
            assert started.returncode == 0, started.stderr
            run_id = json.loads(started.stdout)["run_id"]
            sent = run_ov("coordinator", "send", TEAM_OBJECTIVE, cwd=root, env=env)
            assert sent.returncode == 0, sent.stderr
            # Each builder asks the operator in its first turn; the answer (mail arriving after that turn claimed
            # its mail) starts its second, resumed turn. The operator answers rather than the coordinator: each
            # coordinator turn is one more Claude Code start, and CI time is tight.
            wait_for(lambda: _answer_questions(project, env), 300, message="both builders' questions")
            reported = wait_for(lambda: mail_rows(project, sender="coordinator", recipient="operator", type="result"),
                                480, message="the coordinator's report")
            wait_for(lambda: _coordinator_idle(project), 120, message="the coordinator to settle")

            _assert_builder_run(project, kilo_api, KILO_AGENT, "kilo", "sk-mock-kilo-builder", "bash",
                                ("by-bash.txt", "by-write.txt", "by-python.txt"), "greet.py")
            _assert_builder_run(project, qwen_api, QWEN_AGENT, "qwen", "sk-mock-qwen-builder", "run_shell_command",
                                ("by-shell.txt", "by-write-file.txt", "by-python3.txt"), "farewell.py")
            # Both branches are merged into main, and the coordinator found the run complete before reporting.
            assert "return f'hello {name}'" in run_git(root, "show", "main:greet.py")
            assert "return f'bye {name}'" in run_git(root, "show", "main:farewell.py")
            checked = [m for r in coordinator_api.main_requests for m in r["messages"]
                       if _is_tool_result(m) and "complete (2 agent(s) ended, their work merged)" in json.dumps(m)]
            assert checked, "`ov coordinator check-complete` must have found the run complete"
            assert reported[0]["subject"] == "greet() and farewell() are merged"
            assert all(r["_headers"].get("x-api-key") == "sk-mock-coordinator" for r in coordinator_api.main_requests)

            stopped = run_ov("coordinator", "stop", cwd=root, env=env)
            assert stopped.returncode == 0 and f"run {run_id} completed" in stopped.stdout, stopped.stdout
            status = run_ov("status", "--all", "--json", cwd=root, env=env)
            assert status.returncode == 0, status.stderr
            document = json.loads(status.stdout)
        finally:
            run_ov("coordinator", "stop", "--all", "--force", cwd=root, env=env)
    agents = {a["name"]: a for a in document["agents"]}
    assert {n: (a["runtime"], a["state"]) for n, a in agents.items()} == {
        "coordinator": ("claude", "completed"), KILO_AGENT: ("kilo", "completed"), QWEN_AGENT: ("qwen", "completed")}
    assert agents[KILO_AGENT]["parent"] == agents[QWEN_AGENT]["parent"] == "coordinator"
    assert all(a["cost_usd"] > 0 and a["run_id"] == run_id for a in agents.values())
    [run] = document["runs"]
    assert run["id"] == run_id and run["status"] == "completed" and run["agents"] == 3


def _answer_questions(project: ProjectPaths, env: dict[str, str]) -> bool:
    """Reply, as the operator, to each builder's question that has no reply yet; True once both have one."""
    questions = {m["sender"]: m for m in mail_rows(project, type="question", recipient="operator")}
    replied = {m["reply_to"] for m in mail_rows(project, sender="operator") if m["reply_to"]}
    for name, question in questions.items():
        if question["id"] not in replied:
            sent = run_ov("mail", "reply", str(question["id"]), "--body", ANSWERS[name], cwd=project.root, env=env)
            assert sent.returncode == 0, sent.stderr
            replied.add(question["id"])
    return set(questions) == {KILO_AGENT, QWEN_AGENT} and all(q["id"] in replied for q in questions.values())


def _is_tool_result(message: dict[str, t.Any]) -> bool:
    return any(b.get("type") == "tool_result" for b in _blocks(message))


def _coordinator_idle(project: ProjectPaths) -> bool:
    """Between turns with no mail left to read: the run summary and every report have had their turn."""
    from overstory.store import mail, sessions
    from overstory.store.db import open_state

    conn = open_state(project.state_db)
    try:
        agent = sessions.get(conn, "coordinator")
        return agent is not None and agent.state == "between_turns" and mail.pending_count(conn, "coordinator") == 0
    finally:
        conn.close()
