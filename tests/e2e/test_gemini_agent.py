"""Gemini CLI agents driven by the real `ov sling`, `ov mail` and agent loop, with the REAL Gemini CLI.

Only the model is mocked (tests/mock_gemini_api.py on 127.0.0.1): there is no model to call
offline. The CLI, its tools, its BeforeTool hook (our `ov guard`), its chat files and
`--resume`, git, SQLite and every process are real. The project reaches the mock the way a
user reaches a Gemini-compatible endpoint: a `providers` entry in config.
"""

from __future__ import annotations

import json
import typing as t

from agent_helpers import agent_state, mail_rows, wait_for, wait_terminal
from conftest import run_git, run_ov
from gemini_cli import DEFAULT_MODEL, GEMINI_BIN, requires_gemini
from mock_gemini_api import (
    MockGeminiAPI,
    Reply,
    call_reply,
    conversation_text,
    error_reply,
    model_turns,
    stalled_reply,
    text_reply,
)
from overstory import procs
from overstory.paths import ProjectPaths
from overstory.runtimes.prices import cost_usd
from runtime_agents import (
    FAILED_RELEASE,
    GOOD_RELEASE,
    OFFLINE_ENV,
    RELEASE_LEDGER,
    check_release_receipts,
    commit_release_script,
    configure,
    events,
    ledger_rows,
    ran_in_bubblewrap,
    sling,
    turn_rows,
)

PROMPT = "Add a greet() function in greet.py and commit it."
KEY = "mock-gemini-key-builder"


def shell(command: str) -> Reply:
    return call_reply("run_shell_command", {"command": command})


def builder_script(*, first: t.Sequence[Reply | t.Sequence[Reply]] = ()) -> list[Reply | t.Sequence[Reply]]:
    return [
        *first,
        call_reply("write_file", {"file_path": "greet.py", "content": "def greet(name):\n    return f'hello {name}'\n"}),
        shell("git add greet.py && git commit -q -m 'add greet'"),
        shell("ov mail send --type worker_done --subject 'greet added' --body 'greet.py committed'"),
        text_reply("Done: greet() is committed and reported."),
    ]


def setup(project: ProjectPaths, api: MockGeminiAPI, *, by_flag: bool = False, **turns: t.Any) -> dict[str, str]:
    """``by_flag``: no ``runtimes:`` entry in the config: the test names the runtime with ``ov sling --runtime``."""
    configure(project, runtimes={} if by_flag else {"builder": "gemini", "reviewer": "gemini"},
              providers={"mockgem": {"base_url": api.base_url, "api_key_env": "MOCK_GEM_KEY", "protocol": "gemini"}},
              models={"builder": f"mockgem/{DEFAULT_MODEL}", "reviewer": f"mockgem/{DEFAULT_MODEL}"},
              runtime={"gemini_bin": GEMINI_BIN or "gemini"}, turns=turns, ledger=RELEASE_LEDGER)
    return {**OFFLINE_ENV, "MOCK_GEM_KEY": KEY}


def tool_results(api: MockGeminiAPI) -> str:
    return "\n".join(conversation_text(r) for r in api.main_requests)


@requires_gemini
def test_gemini_builder_writes_commits_reports_and_completes(project: ProjectPaths) -> None:
    commit_release_script(project)
    with MockGeminiAPI(builder_script(first=[shell(FAILED_RELEASE), shell(GOOD_RELEASE)])) as api:
        name = sling(project, "builder", "task-42", PROMPT, setup(project, api, by_flag=True), "--runtime", "gemini")
        agent = wait_terminal(project, name, timeout=120)
        first = api.main_requests[0]
    assert agent.state == "completed", agent.state_reason
    assert agent.runtime == "gemini"
    assert "greet.py" in run_git(project.root, "show", "--name-only", "ov/builder-task-42")
    assert [tool for tool, _ in events(project, name, "tool_start")] == [
        "run_shell_command", "run_shell_command", "write_file", "run_shell_command", "run_shell_command"]
    # gemini reports tokens, not dollars: ov's built-in price list knows gemini-2.5-flash.
    result = events(project, name, "turn_result")[-1][1]
    assert result["input_tokens"] > 0 and result["cost_source"] == "price_table"
    assert abs(result["total_cost_usd"] - cost_usd(DEFAULT_MODEL, result["input_tokens"], result["output_tokens"])) < 1e-12
    assert agent.input_tokens == result["input_tokens"] and agent.cost_usd > 0
    done = mail_rows(project, type="worker_done")
    assert len(done) == 1 and json.loads(done[0]["payload"])["branch"] == "ov/builder-task-42"
    # Instructions from the ov-owned GEMINI_CLI_HOME (system instruction), the provider's key,
    # and nothing of ov's in the worktree.
    assert first["_headers"]["x-goog-api-key"] == KEY and first["_model"] == DEFAULT_MODEL
    assert "builder-task-42" in json.dumps(first["systemInstruction"])
    assert run_git(project.worktree(name), "status", "--porcelain", "--ignored") == ""
    # Gemini's hooks have no call id: each receipt finds its row by the call itself. A shell call's comes from
    # the AfterTool hook (its exit code; the stream says "success" for any command that ran), the others' from
    # the stream.
    rows = [(r["tool"], r["status"]) for r in ledger_rows(project, name)]
    assert rows == [("Bash", "failed"), ("Bash", "succeeded"), ("Write", "succeeded"), ("Bash", "succeeded"),
                    ("Bash", "succeeded")]
    check_release_receipts(project, name)


@requires_gemini
def test_mail_between_turns_resumes_the_same_gemini_session(project: ProjectPaths) -> None:
    script = [
        shell("ov mail send --to operator --subject 'which name?' --type question"),
        text_reply("Waiting for the operator's answer about the name."),
        *builder_script(),
    ]
    with MockGeminiAPI(script) as api:
        name = sling(project, "builder", "task-42", PROMPT, setup(project, api))
        wait_for(lambda: (a := agent_state(project, name)) and a.state == "between_turns" and a.turns == 1, 60,
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


@requires_gemini
def test_a_5xx_is_retried(project: ProjectPaths) -> None:
    with MockGeminiAPI(builder_script(first=[[error_reply(503, "mock unavailable"), text_reply("Starting.")]])) as api:
        # The first reply ends the turn with text only: the agent has not reported yet, and
        # the dispatch stays read; nudge it with mail so the script goes on.
        name = sling(project, "builder", "task-42", PROMPT, setup(project, api))
        wait_for(lambda: (a := agent_state(project, name)) and a.turns == 1, 90, message="first turn")
        run_ov("mail", "send", "--to", name, "--subject", "go on", "--body", "continue", cwd=project.root)
        agent = wait_terminal(project, name, timeout=120)
        at_start = [r for r in api.main_requests if model_turns(r) == 0]
    assert agent.state == "completed", agent.state_reason
    assert len(at_start) == 2  # the 503, then gemini's own retry
    assert turn_rows(project, name)[0]["status"] == "ok"


@requires_gemini
def test_401_is_classified_auth(project: ProjectPaths) -> None:
    """A bad key is not retried by gemini; the turn is classified `auth` and the agent parks until a
    person fixes the key and runs `ov resume` (issue 14)."""
    with MockGeminiAPI([error_reply(401, "API key not valid. Please pass a valid API key.")]) as api:
        name = sling(project, "builder", "task-42", PROMPT, setup(project, api))
        agent = wait_for(lambda: (a := agent_state(project, name)) and a.state == "parked" and a, 90, message="parked")
    ended = events(project, name, "turn_end")
    assert ended and ended[-1][1]["failure"] == "auth" and "401" in ended[-1][1]["reason"]
    assert agent.park_kind == "auth" and agent.state_reason.startswith("auth: ")
    assert len(mail_rows(project, type="escalation")) == 1 and mail_rows(project, type="worker_died") == []


@requires_gemini
def test_stalled_model_makes_a_zombie_with_one_worker_died(project: ProjectPaths) -> None:
    with MockGeminiAPI([stalled_reply(None)]) as api:
        name = sling(project, "builder", "task-42", PROMPT, setup(project, api, stall_timeout=4, kill_grace=1))
        agent = wait_terminal(project, name, timeout=90)
        turn = turn_rows(project, name)[0]
        assert agent.state == "zombie" and "stall" in agent.state_reason
        assert not procs.group_members(turn["pgid"]) and not procs.tagged_processes(turn["id"])
    died = mail_rows(project, type="worker_died")
    assert len(died) == 1 and died[0]["recipient"] == "operator"


@requires_gemini
def test_writes_outside_the_worktree_are_stopped(project: ProjectPaths) -> None:
    """The hook (ov guard) refuses the shell redirect, gemini's workspace check its write_file, and a
    write neither can see (inline Python, allowed for writers by design) is stopped by ov's sandbox."""
    root = project.root
    script = [
        shell(f"echo leak > {root}/by-shell.txt"),
        call_reply("write_file", {"file_path": str(root / "by-write.txt"), "content": "leak"}),
        shell(f"python3 -c \"open('{root}/by-python.txt', 'w').write('leak')\""),
        shell("ov mail send --type worker_done --subject 'tried' --body 'tried to write outside'"),
        text_reply("Done."),
    ]
    with MockGeminiAPI(script) as api:
        name = sling(project, "builder", "task-42", PROMPT, setup(project, api))
        agent = wait_terminal(project, name, timeout=120)
        seen = tool_results(api)
    assert agent.state == "completed", agent.state_reason
    for leaked in ("by-shell.txt", "by-write.txt", "by-python.txt"):
        assert not (root / leaked).exists(), leaked
    assert ran_in_bubblewrap(project, name)
    ends = [e for _, e in events(project, name, "tool_end")]
    assert "Read-only file system" in ends[2]["output"]  # allowed by the guard, refused by the kernel
    # The shell command was stopped by the hook (ov guard); write_file by gemini's own workspace check,
    # which runs before hooks do.
    assert ends[0]["error_type"] == "policy_violation" and "project checkout" in ends[0]["output"]
    assert ends[1]["error_type"] == "invalid_tool_params" and "Path not in workspace" in ends[1]["output"]
    assert "Tool execution blocked" in seen
