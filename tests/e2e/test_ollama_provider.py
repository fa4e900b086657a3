"""An agent on a local model through an Ollama provider, with the REAL Claude Code CLI.

Ollama is the model server and cannot be installed here, so its Anthropic-compatible API (the
Messages API at the server's root) is mocked on 127.0.0.1 by tests/mockapi.py, like every other
model API in these tests. The project names it the way a user would: ``providers: {ollama: {kind:
ollama, base_url: ...}}`` and ``ov sling --provider ollama --model qwen3-coder``; no key is set.
"""

from __future__ import annotations

from agent_helpers import wait_terminal
from claude_cli import CLAUDE_BIN, claude_env, requires_claude
from conftest import run_git, run_ov
from mockapi import MockMessagesAPI, text_reply, tool_reply
from overstory.paths import ProjectPaths
from runtime_agents import configure, events, turn_rows


@requires_claude
def test_a_claude_builder_on_ollama_completes_with_tokens_kept_at_zero_cost(project: ProjectPaths, tmp_path) -> None:
    worktree = project.worktree("builder-local")
    script = [
        tool_reply("Write", {"file_path": str(worktree / "greet.py"), "content": "def greet():\n    return 'hi'\n"}),
        tool_reply("Bash", {"command": "git add greet.py && git commit -q -m 'add greet' && "
                                       "ov mail send --type worker_done --subject done --body committed",
                            "description": "commit and report"}),
        text_reply("Done."),
    ]
    with MockMessagesAPI(script) as api:
        configure(project, runtimes={}, providers={"ollama": {"base_url": api.base_url, "kind": "ollama"}}, models={})
        env = claude_env("http://127.0.0.1:9", tmp_path, extra={"OV_RUNTIME_CLAUDE_BIN": CLAUDE_BIN or "claude"})
        del env["ANTHROPIC_API_KEY"]  # Ollama needs none: ov gives the CLI a placeholder
        slung = run_ov("sling", "builder", "local", "--prompt", "add greet()", "--provider", "ollama",
                       "--model", "qwen3-coder", cwd=project.root, env=env)
        assert slung.returncode == 0, slung.stderr
        agent = wait_terminal(project, "builder-local", timeout=120)
        models = {r.get("model") for r in api.main_requests}
    assert agent.state == "completed", agent.state_reason
    assert models == {"qwen3-coder"}
    assert "greet.py" in run_git(project.root, "show", "--name-only", "ov/builder-local")
    result = events(project, "builder-local", "turn_result")[-1][1]
    assert result["input_tokens"] > 0 and agent.input_tokens > 0 and agent.output_tokens > 0
    assert agent.cost_usd == 0.0 and all(t["cost_usd"] == 0.0 for t in turn_rows(project, "builder-local"))
