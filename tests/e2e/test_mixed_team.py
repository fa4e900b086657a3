"""A mixed team: a Claude Code coordinator slings a Codex builder and a Gemini CLI reviewer.

All three CLIs are the REAL ones from npm; each talks to a mock of its own model API on
127.0.0.1 (tests/mockapi.py, tests/mock_openai_responses.py, tests/mock_gemini_api.py),
because no model can be called offline. Config routes each capability to its runtime
(`runtimes`) and its provider (`providers`/`models`), as a user would. The coordinator
slings the builder, then the reviewer once the builder is done; the reviewer's verdict
(`result` mail) reaches the coordinator, which then merges the builder's branch.

The models are small state machines over the conversation, not fixed lists: mail can
arrive one message per turn or several at once.
"""

from __future__ import annotations

import json
import re
import typing as t
from pathlib import Path

from agent_helpers import mail_rows, wait_for, wait_terminal
from claude_cli import CLAUDE_BIN, claude_env, requires_claude
from codex_cli import CODEX_BIN, MOCK_MODEL, requires_codex
from conftest import run_git, run_ov
from gemini_cli import DEFAULT_MODEL, GEMINI_BIN, requires_gemini
from mock_gemini_api import MockGeminiAPI, call_reply, function_responses
from mock_gemini_api import text_reply as gemini_text
from mock_openai_responses import MockResponsesAPI, shell_reply
from mock_openai_responses import text_reply as codex_text
from mockapi import MockMessagesAPI, Reply, text_reply, tool_reply
from overstory.paths import ProjectPaths
from runtime_agents import MOCK_PRICE, OFFLINE_ENV, configure

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
