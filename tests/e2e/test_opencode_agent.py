"""OpenCode agents driven by the real `ov sling`, `ov mail` and agent loop, with the REAL OpenCode CLI.

Only the model is mocked (tests/mock_openai_chat.py on 127.0.0.1): there is no model to call
offline. `opencode run`, its tools, ov's guard plugin (`tool.execute.before` calling `ov
guard`), its session store and `--session`, git, SQLite and every process are real. The
project reaches the mock the way a user reaches any OpenAI-compatible Chat Completions
endpoint: a `providers` entry in config.
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
    with_headers,
)
from opencode_cli import MODEL_ID, OPENCODE_BIN, requires_opencode
from overstory import procs
from overstory.paths import ProjectPaths
from overstory.store import ledger
from overstory.store.db import open_state
from runtime_agents import (
    FAILED_RELEASE,
    GOOD_RELEASE,
    MOCK_PRICE,
    OFFLINE_ENV,
    RELEASE_LEDGER,
    check_release_receipts,
    commit_release_script,
    configure,
    events,
    ran_in_bubblewrap,
    sling,
    turn_rows,
)

PROMPT = "Add a greet() function in greet.py and commit it."
KEY = "sk-mock-opencode-builder"


def bash(command: str) -> Reply:
    return tool_call_reply("bash", {"command": command, "description": "step"})


def builder_script(*, first: t.Sequence[Reply | t.Sequence[Reply]] = ()) -> list[Reply | t.Sequence[Reply]]:
    return [
        *first,
        tool_call_reply("write", {"filePath": "greet.py", "content": "def greet(name):\n    return f'hello {name}'\n"}),
        bash("git add greet.py && git commit -q -m 'add greet'"),
        bash("ov mail send --type worker_done --subject 'greet added' --body 'greet.py committed'"),
        text_reply("Done: greet() is committed and reported."),
    ]


def setup(project: ProjectPaths, api: MockChatAPI, *, by_flag: bool = False, **turns: t.Any) -> dict[str, str]:
    """``by_flag``: no ``runtimes:`` entry in the config: the test names the runtime with ``ov sling --runtime``."""
    configure(project, runtimes={} if by_flag else {"builder": "opencode"},
              providers={"mockchat": {"base_url": api.base_url, "api_key_env": "MOCK_CHAT_KEY",
                                      "protocol": "openai-chat"}},
              models={"builder": f"mockchat/{MODEL_ID}"}, prices={MODEL_ID: MOCK_PRICE},
              runtime={"opencode_bin": OPENCODE_BIN or "opencode"}, turns=turns, ledger=RELEASE_LEDGER)
    return {**OFFLINE_ENV, "MOCK_CHAT_KEY": KEY}


def tool_messages(api: MockChatAPI) -> dict[str, str]:
    """tool_call_id -> what the model was told about that call."""
    return {m["tool_call_id"]: str(m.get("content")) for r in api.main_requests for m in r.get("messages", [])
            if m.get("role") == "tool"}


@requires_opencode
def test_opencode_builder_writes_commits_reports_and_completes(project: ProjectPaths) -> None:
    commit_release_script(project)
    with MockChatAPI(builder_script(first=[bash(FAILED_RELEASE), bash(GOOD_RELEASE)])) as api:
        name = sling(project, "builder", "task-42", PROMPT, setup(project, api, by_flag=True), "--runtime", "opencode")
        agent = wait_terminal(project, name, timeout=120)
        first = api.main_requests[0]
    assert agent.state == "completed", agent.state_reason
    assert agent.runtime == "opencode"
    assert "greet.py" in run_git(project.root, "show", "--name-only", "ov/builder-task-42")
    assert [tool for tool, _ in events(project, name, "tool_start")] == ["bash", "bash", "write", "bash", "bash"]
    result = events(project, name, "turn_result")[-1][1]
    assert result["input_tokens"] > 0 and result["cost_source"] == "price_table"
    expected = (result["input_tokens"] * 2.0 + result["output_tokens"] * 8.0) / 1e6
    assert abs(result["total_cost_usd"] - expected) < 1e-12 and abs(agent.cost_usd - expected) < 1e-12
    done = mail_rows(project, type="worker_done")
    assert len(done) == 1 and json.loads(done[0]["payload"])["branch"] == "ov/builder-task-42"
    assert first["_headers"]["authorization"] == f"Bearer {KEY}" and first["model"] == MODEL_ID
    assert "builder-task-42" in json.dumps(first["messages"][0])  # AGENTS.md from the ov-owned config dir
    offered = [tool["function"]["name"] for tool in first["tools"]]
    assert "bash" in offered and "task" not in offered  # opencode's sub-agents are off: ov slings
    assert run_git(project.worktree(name), "status", "--porcelain", "--ignored") == ""
    # The plugin's callID names the ledger row, so each call's receipt, read from the stream, finds it.
    conn = open_state(project.state_db)
    try:
        rows = [(r["tool"], r["status"], r["exit_code"]) for r in ledger.calls(conn, agent=name)]
    finally:
        conn.close()
    assert rows == [("Bash", "failed", 3), ("Bash", "succeeded", 0), ("Write", "succeeded", None),
                    ("Bash", "succeeded", 0), ("Bash", "succeeded", 0)]
    check_release_receipts(project, name)


@requires_opencode
def test_mail_between_turns_resumes_the_same_opencode_session(project: ProjectPaths) -> None:
    script = [
        bash("ov mail send --to operator --subject 'which name?' --type question"),
        text_reply("Waiting for the operator's answer about the name."),
        *builder_script(),
    ]
    with MockChatAPI(script) as api:
        name = sling(project, "builder", "task-42", PROMPT, setup(project, api))
        wait_for(lambda: (a := agent_state(project, name)) and a.state == "between_turns" and a.turns == 1, 90,
                 message="first turn")
        first_requests = len(api.main_requests)
        sent = run_ov("mail", "send", "--to", name, "--subject", "answer", "--body", "call it greet", cwd=project.root)
        assert sent.returncode == 0, sent.stderr
        agent = wait_terminal(project, name, timeout=120)
        later = api.main_requests[first_requests:]
    assert agent.state == "completed" and agent.turns == 2, agent.state_reason
    assert later and "Waiting for the operator's answer" in conversation_text(later[0])
    assert "call it greet" in conversation_text(later[0])
    turns = turn_rows(project, name)
    assert len(turns) == 2 and turns[1]["resumed"] == 1 and turns[0]["session_id"] == turns[1]["session_id"]


@requires_opencode
def test_a_5xx_is_retried(project: ProjectPaths) -> None:
    """opencode retries a 503 itself (here after the 50 ms its retry-after-ms asks for)."""
    first = [[with_headers(error_reply(503, "mock overloaded"), retry_after_ms="50"), bash("true")]]
    with MockChatAPI(builder_script(first=first)) as api:
        name = sling(project, "builder", "task-42", PROMPT, setup(project, api))
        agent = wait_terminal(project, name, timeout=120)
        at_start = [r for r in api.main_requests if assistant_turns(r) == 0]
    assert agent.state == "completed", agent.state_reason
    assert len(at_start) == 2
    assert [t["status"] for t in turn_rows(project, name)] == ["ok"]


@requires_opencode
def test_401_is_classified_auth(project: ProjectPaths) -> None:
    """A bad key is not retried by opencode; the turn is classified `auth` and the agent parks until a
    person fixes the key and runs `ov resume` (issue 14)."""
    with MockChatAPI([error_reply(401, "Incorrect API key provided", "invalid_request_error")]) as api:
        name = sling(project, "builder", "task-42", PROMPT, setup(project, api))
        agent = wait_for(lambda: (a := agent_state(project, name)) and a.state == "parked" and a, 90, message="parked")
    ended = events(project, name, "turn_end")
    assert ended and ended[-1][1]["failure"] == "auth" and "Incorrect API key" in ended[-1][1]["reason"]
    assert agent.park_kind == "auth" and agent.state_reason.startswith("auth: ")
    assert len(mail_rows(project, type="escalation")) == 1 and mail_rows(project, type="worker_died") == []


@requires_opencode
def test_stalled_model_makes_a_zombie_with_one_worker_died(project: ProjectPaths) -> None:
    with MockChatAPI([stalled_reply(None)]) as api:
        name = sling(project, "builder", "task-42", PROMPT, setup(project, api, stall_timeout=6, kill_grace=1))
        agent = wait_terminal(project, name, timeout=90)
        turn = turn_rows(project, name)[0]
        assert agent.state == "zombie" and "stall" in agent.state_reason
        assert not procs.group_members(turn["pgid"]) and not procs.tagged_processes(turn["id"])
    died = mail_rows(project, type="worker_died")
    assert len(died) == 1 and died[0]["recipient"] == "operator"


@requires_opencode
def test_writes_outside_the_worktree_are_stopped_by_the_guard_plugin_and_the_sandbox(project: ProjectPaths) -> None:
    """The guard plugin refuses the redirect and the write tool; a write it cannot see (inline Python,
    allowed for writers by design) is stopped by ov's sandbox."""
    root = project.root
    script = [
        bash(f"echo leak > {root}/by-bash.txt"),
        tool_call_reply("write", {"filePath": str(root / "by-write.txt"), "content": "leak"}),
        bash(f"python3 -c \"open('{root}/by-python.txt', 'w').write('leak')\""),
        bash("ov mail send --type worker_done --subject 'tried' --body 'tried to write outside'"),
        text_reply("Done."),
    ]
    with MockChatAPI(script) as api:
        name = sling(project, "builder", "task-42", PROMPT, setup(project, api))
        agent = wait_terminal(project, name, timeout=120)
        told = list(tool_messages(api).values())
    assert agent.state == "completed", agent.state_reason
    for leaked in ("by-bash.txt", "by-write.txt", "by-python.txt"):
        assert not (root / leaked).exists(), leaked
    assert ran_in_bubblewrap(project, name)
    ends = [e for _, e in events(project, name, "tool_end")]
    assert ends[0]["is_error"] and ends[1]["is_error"]
    assert sum("project checkout" in text for text in told) == 2
    assert any("Read-only file system" in text for text in told)  # allowed by the guard, refused by the kernel


@pytest.fixture(autouse=True)
def _user_config_untouched() -> t.Iterator[None]:
    """opencode must never touch the developer's own config (ov gives each agent its own HOME and XDG dirs)."""
    watched = [Path.home() / ".opencode", Path.home() / ".config" / "opencode", Path.home() / ".local" / "share" / "opencode"]
    before = {str(p): sorted(x.name for x in p.iterdir()) if p.is_dir() else None for p in watched}
    yield
    assert {str(p): sorted(x.name for x in p.iterdir()) if p.is_dir() else None for p in watched} == before
