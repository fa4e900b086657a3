"""Qwen Code agents driven by the real `ov sling`, `ov mail` and agent loop, with the REAL Qwen Code CLI.

Only the model is mocked (tests/mock_openai_chat.py on 127.0.0.1): there is no model to call offline.
Qwen Code, its tools, its PreToolUse hook (our `ov guard`), its chat files and `--resume`, git, SQLite,
bubblewrap and every process are real. The project reaches the mock the way a user reaches any
OpenAI-compatible endpoint: a `providers` entry in config. CI time is tight, so one agent run checks
several behaviours (a 5xx retried, a resumed second turn, writes outside refused, receipts, the commit
and the report), and the two failure runs (401, stall) share one test.
"""

from __future__ import annotations

import json
import typing as t
from pathlib import Path

import pytest

from agent_helpers import agent_state, mail_rows, wait_for, wait_terminal
from conftest import run_git, run_ov
from mock_openai_chat import (
    MockChatAPI,
    Reply,
    assistant_turns,
    conversation_text,
    error_reply,
    stalled_reply,
    text_reply,
    tool_call_reply,
)
from overstory import procs
from overstory.paths import ProjectPaths
from qwen_cli import MODEL_ID, QWEN_BIN, requires_qwen
from runtime_agents import (
    MOCK_PRICE,
    OFFLINE_ENV,
    configure,
    events,
    ledger_rows,
    ran_in_bubblewrap,
    sling,
    turn_rows,
)

PROMPT = "Add a greet() function in greet.py and commit it."
KEY = "sk-mock-qwen-builder"


def shell(command: str) -> Reply:
    return tool_call_reply("run_shell_command", {"command": command})


def setup(project: ProjectPaths, apis: dict[str, MockChatAPI], **turns: t.Any) -> dict[str, str]:
    """One provider per mock (``{provider: api}``); every builder runs on qwen."""
    configure(project, runtimes={"builder": "qwen"},
              providers={name: {"base_url": api.base_url, "api_key_env": "MOCK_CHAT_KEY", "protocol": "openai-chat"}
                         for name, api in apis.items()},
              models={"builder": f"{next(iter(apis))}/{MODEL_ID}"}, prices={MODEL_ID: MOCK_PRICE},
              runtime={"qwen_bin": QWEN_BIN or "qwen"}, turns=turns)
    return {**OFFLINE_ENV, "MOCK_CHAT_KEY": KEY}


@requires_qwen
def test_qwen_builder_retries_resumes_is_refused_outside_commits_and_reports(project: ProjectPaths) -> None:
    root = project.root
    script: list[Reply | t.Sequence[Reply]] = [
        [error_reply(503, "mock overloaded"), shell("ov mail send --to operator --subject 'which name?' --type question")],
        text_reply("Waiting for the operator's answer about the name."),
        shell(f"echo leak > {root}/by-shell.txt"),
        tool_call_reply("write_file", {"file_path": str(root / "by-write.txt"), "content": "leak"}),
        shell(f"python3 -c \"open('{root}/by-python.txt', 'w').write('leak')\""),
        # qwen's write_file takes absolute paths only.
        tool_call_reply("write_file", {"file_path": str(project.worktree("builder-task-42") / "greet.py"),
                                       "content": "def greet(name):\n    return f'hello {name}'\n"}),
        shell("git add greet.py && git commit -q -m 'add greet'"),
        shell("ov mail send --type worker_done --subject 'greet added' --body 'greet.py committed'"),
        text_reply("Done: greet() is committed and reported."),
    ]
    with MockChatAPI(script) as api:
        name = sling(project, "builder", "task-42", PROMPT, setup(project, {"mockchat": api}))
        wait_for(lambda: (a := agent_state(project, name)) and a.state == "between_turns" and a.turns == 1, 120,
                 message="first turn")
        first_requests = len(api.main_requests)
        sent = run_ov("mail", "send", "--to", name, "--subject", "answer", "--body", "call it greet", cwd=root)
        assert sent.returncode == 0, sent.stderr
        agent = wait_terminal(project, name, timeout=180)
        first, later = api.main_requests[0], api.main_requests[first_requests:]
        at_start = [r for r in api.main_requests if assistant_turns(r) == 0]
    assert agent.state == "completed" and agent.runtime == "qwen", agent.state_reason
    # The 503 was retried by qwen itself, inside the first turn.
    assert len(at_start) == 2 and [t["status"] for t in turn_rows(project, name)] == ["ok", "ok"]
    # The second turn resumed the first one's session: the model saw the whole history and the mail.
    turns = turn_rows(project, name)
    assert turns[1]["resumed"] == 1 and turns[0]["session_id"] == turns[1]["session_id"]
    assert "Waiting for the operator's answer" in conversation_text(later[0]) and "call it greet" in conversation_text(later[0])
    # Instructions from the ov-owned QWEN_HOME, the provider's key, qwen's own sub-agents off.
    assert first["_headers"]["authorization"] == f"Bearer {KEY}" and first["model"] == MODEL_ID
    assert "builder-task-42" in json.dumps(first["messages"][0])
    offered = [tool["function"]["name"] for tool in first["tools"]]
    assert "run_shell_command" in offered and "agent" not in offered and "send_message" not in offered
    # Nothing got out of the worktree: the guard (hook) refused two, the sandbox the third.
    for leaked in ("by-shell.txt", "by-write.txt", "by-python.txt"):
        assert not (root / leaked).exists(), leaked
    assert ran_in_bubblewrap(project, name)
    told = conversation_text(api.main_requests[-1])
    assert told.count("project checkout") >= 2 and "Read-only file system" in told
    # Committed, reported, tokens priced from ov's table (qwen reports no dollars).
    assert "greet.py" in run_git(root, "show", "--name-only", "ov/builder-task-42")
    done = mail_rows(project, type="worker_done")
    assert len(done) == 1 and json.loads(done[0]["payload"])["branch"] == "ov/builder-task-42"
    result = events(project, name, "turn_result")[-1][1]
    assert result["input_tokens"] > 0 and result["cost_source"] == "price_table" and agent.cost_usd > 0
    assert run_git(project.worktree(name), "status", "--porcelain", "--ignored") == ""
    # Receipts from exit codes: the hook's tool_call_id is the stream's id, so each row gets its receipt;
    # the sandboxed python write failed (exit 1) and is recorded failed, the refused calls denied.
    rows = [(r["tool"], r["status"], r["exit_code"]) for r in ledger_rows(project, name)]
    assert rows == [("Bash", "succeeded", 0), ("Bash", "denied", None), ("Write", "denied", None),
                    ("Bash", "failed", 1), ("Write", "succeeded", None), ("Bash", "succeeded", 0),
                    ("Bash", "succeeded", 0)], rows
    trace = run_ov("trace", name, cwd=root)
    assert trace.returncode == 0 and "failed" in trace.stdout and "succeeded" in trace.stdout, trace.stdout


@requires_qwen
def test_qwen_401_parks_for_auth_and_a_stalled_model_dies_once(project: ProjectPaths) -> None:
    with MockChatAPI([error_reply(401, "Incorrect API key provided", "invalid_request_error")]) as bad, \
            MockChatAPI([stalled_reply(None)]) as stalled:
        # Each agent's config is snapshotted at its sling: the 401 one keeps the default stall timeout (a
        # start can take a minute on a loaded machine), the stalled one gets a short one.
        parked = sling(project, "builder", "task-1", PROMPT, setup(project, {"badkey": bad, "stuck": stalled}))
        zombie = sling(project, "builder", "task-2", PROMPT,
                       setup(project, {"badkey": bad, "stuck": stalled}, stall_timeout=45, kill_grace=1),
                       "--model", f"stuck/{MODEL_ID}")
        agent = wait_for(lambda: (a := agent_state(project, parked)) and a.state == "parked" and a, 120,
                         message="parked")
        dead = wait_terminal(project, zombie, timeout=180)
        turn = turn_rows(project, zombie)[0]
        assert dead.state == "zombie" and "stall" in dead.state_reason
        assert not procs.group_members(turn["pgid"]) and not procs.tagged_processes(turn["id"])
    ended = events(project, parked, "turn_end")
    assert ended and ended[-1][1]["failure"] == "auth" and "401" in ended[-1][1]["reason"]
    assert agent.park_kind == "auth" and agent.state_reason.startswith("auth: ")
    died = mail_rows(project, type="worker_died")
    assert len(died) == 1 and died[0]["recipient"] == "operator"
    assert len(mail_rows(project, type="escalation")) == 1


@pytest.fixture(autouse=True)
def _user_config_untouched() -> t.Iterator[None]:
    """qwen must never touch the developer's own ~/.qwen (ov gives each agent its own QWEN_HOME and HOME)."""
    watched = Path.home() / ".qwen"
    before = sorted(x.name for x in watched.iterdir()) if watched.is_dir() else None
    yield
    assert (sorted(x.name for x in watched.iterdir()) if watched.is_dir() else None) == before
