"""Codex agents driven by the real `ov sling`, `ov mail` and agent loop, with the REAL Codex CLI.

Only the model is mocked (tests/mock_openai_responses.py on 127.0.0.1): there is no model to
call offline. `codex exec`, its tools and sandbox, its PreToolUse hook (our `ov guard`), its
session files and `resume`, git, SQLite and every process are real. The project reaches the
mock the way a user reaches any OpenAI-compatible endpoint: a `providers` entry in config.
"""

from __future__ import annotations

import json
import typing as t
from pathlib import Path

import pytest

from agent_helpers import agent_state, mail_rows, wait_for, wait_terminal
from codex_cli import CODEX_BIN, MOCK_MODEL, requires_codex
from conftest import run_git, run_ov
from mock_openai_responses import (
    MockResponsesAPI,
    Reply,
    conversation_position,
    conversation_text,
    error_reply,
    function_outputs,
    input_messages,
    shell_reply,
    stalled_reply,
    text_reply,
    tool_names,
)
from overstory import procs
from overstory.paths import ProjectPaths
from runtime_agents import MOCK_PRICE, OFFLINE_ENV, configure, events, ledger_rows, ran_in_bubblewrap, sling, turn_rows

PROMPT = "Add a greet() function in greet.py and commit it."
KEY = "sk-mock-codex-builder"


def sh(cmd: str) -> Reply:
    return shell_reply(cmd, yield_time_ms=30000)


def patch(path: str, *lines: str) -> Reply:
    """codex edits files by running apply_patch through its shell tool (it intercepts the call)."""
    body = "\n".join(f"+{line}" for line in lines)
    return sh(f"apply_patch <<'EOF'\n*** Begin Patch\n*** Add File: {path}\n{body}\n*** End Patch\nEOF\n")


def builder_script(*, first: t.Sequence[Reply | t.Sequence[Reply]] = ()) -> list[Reply | t.Sequence[Reply]]:
    return [
        *first,
        patch("greet.py", "def greet(name):", "    return f'hello {name}'"),
        sh("git add greet.py && git commit -q -m 'add greet'"),
        sh("ov mail send --type worker_done --subject 'greet added' --body 'greet.py committed'"),
        text_reply("Done: greet() is committed and reported."),
    ]


def setup(project: ProjectPaths, api: MockResponsesAPI, *, by_flag: bool = False, **turns: t.Any) -> dict[str, str]:
    """``by_flag``: no ``runtimes:`` entry in the config: the test names the runtime with ``ov sling --runtime``."""
    configure(project, runtimes={} if by_flag else {"builder": "codex", "reviewer": "codex"},
              providers={"mockoai": {"base_url": api.base_url, "api_key_env": "MOCK_OAI_KEY",
                                     "protocol": "openai-responses"}},
              models={"builder": f"mockoai/{MOCK_MODEL}", "reviewer": f"mockoai/{MOCK_MODEL}"},
              prices={MOCK_MODEL: MOCK_PRICE}, runtime={"codex_bin": CODEX_BIN or "codex"}, turns=turns)
    return {**OFFLINE_ENV, "MOCK_OAI_KEY": KEY}


@requires_codex
def test_codex_builder_writes_commits_reports_and_completes(project: ProjectPaths) -> None:
    with MockResponsesAPI(builder_script()) as api:
        name = sling(project, "builder", "task-42", PROMPT, setup(project, api, by_flag=True), "--runtime", "codex")
        agent = wait_terminal(project, name, timeout=90)
        requests = list(api.requests)
    assert agent.state == "completed", agent.state_reason
    assert agent.runtime == "codex"
    assert "greet.py" in run_git(project.root, "show", "--name-only", "ov/builder-task-42")
    assert [tool for tool, _ in events(project, name, "tool_start")] == ["apply_patch", "shell", "shell"]
    # codex reports tokens, not dollars: the price table in config turned them into a cost.
    result = events(project, name, "turn_result")[-1][1]
    assert result["input_tokens"] > 0 and result["total_cost_usd"] > 0 and result["cost_source"] == "price_table"
    expected = (result["input_tokens"] * 2.0 + result["output_tokens"] * 8.0) / 1e6
    assert agent.input_tokens == result["input_tokens"] and abs(agent.cost_usd - expected) < 1e-9
    done = mail_rows(project, type="worker_done")
    assert len(done) == 1 and done[0]["recipient"] == "operator"
    assert json.loads(done[0]["payload"])["branch"] == "ov/builder-task-42"
    # The instructions came from the ov-owned CODEX_HOME, with the key of the configured provider;
    # nothing of ov's is left in the worktree.
    first = requests[0]
    assert first["_headers"]["authorization"] == f"Bearer {KEY}" and first["model"] == MOCK_MODEL
    offered = tool_names(first)
    assert "exec_command" in offered and not any(name.startswith("multi_agent") for name in offered)
    assert any("builder-task-42" in text and "AGENTS.md instructions" in text
               for text in input_messages(first, "user"))
    worktree = project.worktree(name)
    assert run_git(worktree, "status", "--porcelain", "--ignored") == ""
    assert (project.run_dir / name / "codex-home" / "AGENTS.md").is_file()
    # The hook's rows (call ids call_...) get their receipts from the stream (item ids item_N), matched by
    # the call itself. The apply_patch reaches the hook as a Bash heredoc but the stream as a file_change:
    # its receipt finds the row by the patch's files.
    rows = [(r["tool"], r["status"], r["exit_code"], "apply_patch" in r["input"]) for r in ledger_rows(project, name)]
    assert rows == [("Bash", "succeeded", None, True), ("Bash", "succeeded", 0, False), ("Bash", "succeeded", 0, False)]


@requires_codex
def test_mail_between_turns_resumes_the_same_codex_session(project: ProjectPaths) -> None:
    script = [
        sh("ov mail send --to operator --subject 'which name?' --type question"),
        text_reply("Waiting for the operator's answer about the name."),
        *builder_script(),
    ]
    with MockResponsesAPI(script) as api:
        name = sling(project, "builder", "task-42", PROMPT, setup(project, api))
        wait_for(lambda: (a := agent_state(project, name)) and a.state == "between_turns" and a.turns == 1, 60,
                 message="first turn")
        first_requests = len(api.requests)
        sent = run_ov("mail", "send", "--to", name, "--subject", "answer", "--body", "call it greet", cwd=project.root)
        assert sent.returncode == 0, sent.stderr
        agent = wait_terminal(project, name, timeout=90)
        later = api.requests[first_requests:]
    assert agent.state == "completed" and agent.turns == 2, agent.state_reason
    assert later and "Waiting for the operator's answer" in conversation_text(later[0])
    assert "call it greet" in conversation_text(later[0])
    turns = turn_rows(project, name)
    assert len(turns) == 2 and turns[1]["resumed"] == 1 and turns[0]["session_id"] == turns[1]["session_id"]


@requires_codex
def test_a_5xx_is_retried_and_a_429_retries_the_turn(project: ProjectPaths) -> None:
    """Two 500s are retried inside codex (silently, same turn); a 429 without retry-after ends the
    turn at once (codex does not retry it), classified rate_limit: the provider's quota window
    closes for a backoff (2 s here), the agent parks without using a retry, and goes on after it."""
    first = [[error_reply(500, "mock overloaded"), error_reply(500, "mock overloaded"),
              error_reply(429, "mock rate limit"), sh("true")]]
    with MockResponsesAPI(builder_script(first=first)) as api:
        name = sling(project, "builder", "task-42", PROMPT, {**setup(project, api), "OV_QUOTA_BACKOFF_INITIAL": "2"})
        agent = wait_terminal(project, name, timeout=120)
        at_start = [r for r in api.requests if conversation_position(r) == 0]
    assert agent.state == "completed", agent.state_reason
    assert len(at_start) == 4  # 500, 500 (retried by codex), 429 (ends the turn), the next turn's request
    assert [t["status"] for t in turn_rows(project, name)] == ["rate_limit", "ok"]
    assert events(project, name, "turn_end")[0][1]["failure"] == "rate_limit"
    assert [e[1] for e in events(project, name, "quota_parked")] and agent.retries == 0


@requires_codex
def test_401_is_classified_auth(project: ProjectPaths) -> None:
    """A bad key: codex gives up after its stream retries; the turn is classified `auth` and the
    agent parks until a person fixes the key and runs `ov resume` (issue 14)."""
    with MockResponsesAPI([error_reply(401, "Incorrect API key provided")]) as api:
        name = sling(project, "builder", "task-42", PROMPT, setup(project, api))
        agent = wait_for(lambda: (a := agent_state(project, name)) and a.state == "parked" and a, 90, message="parked")
    ended = events(project, name, "turn_end")
    assert ended and ended[-1][1]["failure"] == "auth" and "401" in ended[-1][1]["reason"]
    assert agent.park_kind == "auth" and agent.state_reason.startswith("auth: ") and "401" in agent.state_reason
    assert len(mail_rows(project, type="escalation")) == 1 and mail_rows(project, type="worker_died") == []


@requires_codex
def test_stalled_model_makes_a_zombie_with_one_worker_died(project: ProjectPaths) -> None:
    with MockResponsesAPI([stalled_reply(None)]) as api:
        name = sling(project, "builder", "task-42", PROMPT, setup(project, api, stall_timeout=4, kill_grace=1))
        agent = wait_terminal(project, name, timeout=90)
        turn = turn_rows(project, name)[0]
        assert agent.state == "zombie" and "stall" in agent.state_reason
        assert not procs.group_members(turn["pgid"]) and not procs.tagged_processes(turn["id"])
    died = mail_rows(project, type="worker_died")
    assert len(died) == 1 and died[0]["recipient"] == "operator"


@requires_codex
def test_writes_outside_the_worktree_are_stopped(project: ProjectPaths) -> None:
    """The guard hook refuses a redirect and an apply_patch into the project checkout; a write it
    cannot see (inline Python) is stopped by ov's sandbox (codex's own is off inside it)."""
    root = project.root
    script = [
        sh(f"echo leak > {root}/by-redirect.txt"),
        patch(f"{root}/by-patch.txt", "leak"),
        sh(f"python3 -c \"open('{root}/by-python.txt', 'w').write('leak')\""),
        sh("ov mail send --type worker_done --subject 'tried' --body 'tried to write outside'"),
        text_reply("Done."),
    ]
    with MockResponsesAPI(script) as api:
        name = sling(project, "builder", "task-42", PROMPT, setup(project, api))
        agent = wait_terminal(project, name, timeout=90)
        outputs = list({k: v for r in api.requests for k, v in function_outputs(r).items()}.values())
    assert agent.state == "completed", agent.state_reason
    for leaked in ("by-redirect.txt", "by-patch.txt", "by-python.txt"):
        assert not (root / leaked).exists(), leaked
    blocked = [o for o in outputs if "blocked by PreToolUse hook" in o]
    assert len(blocked) == 2 and all("project checkout" in o for o in blocked)
    assert any("Read-only file system" in o for o in outputs)
    assert ran_in_bubblewrap(project, name)


@requires_codex
def test_read_only_codex_reviewer_reports_but_cannot_write(project: ProjectPaths) -> None:
    script = [
        sh("touch notes.md"),
        sh("ov mail send --to operator --type result --subject 'PASS' --body 'looks fine'"),
        sh("ov mail send --type worker_done --subject 'review done' --body 'PASS'"),
        text_reply("Reported."),
    ]
    with MockResponsesAPI(script) as api:
        name = sling(project, "reviewer", "rev-1", "Review the repository.", setup(project, api))
        agent = wait_terminal(project, name, timeout=90)
        outputs = list({k: v for r in api.requests for k, v in function_outputs(r).items()}.values())
    assert agent.state == "completed", agent.state_reason
    assert not (project.worktree(name) / "notes.md").exists()
    assert any("read-only" in o for o in outputs)
    assert len(mail_rows(project, type="result")) == 1


@pytest.fixture(autouse=True)
def _no_stray_codex_homes() -> t.Iterator[None]:
    """codex must never touch the developer's own ~/.codex (ov gives each agent a CODEX_HOME)."""
    home = Path.home() / ".codex"
    before = sorted(p.name for p in home.iterdir()) if home.is_dir() else None
    yield
    after = sorted(p.name for p in home.iterdir()) if home.is_dir() else None
    assert after == before
