"""The built-in scripted runtime, driven as a real subprocess in a real git repository."""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import typing as t
from pathlib import Path

import pytest

from overstory.config.model import Config
from overstory.runtimes import get_runtime
from overstory.runtimes.base import TurnRequest

HEADLESS_ARGS = ["-p", "--output-format", "stream-json", "--input-format", "stream-json", "--verbose",
                 "--permission-mode", "bypassPermissions"]
RUNTIME = [sys.executable, "-m", "overstory.runtimes.scripted", *HEADLESS_ARGS]

Event = dict[str, t.Any]


# --------------------------------------------------------------------------- helpers


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, check=True).stdout


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    path = tmp_path / "repo"
    path.mkdir()
    git(path, "init", "-q", "-b", "main")
    git(path, "config", "user.email", "test@example.com")
    git(path, "config", "user.name", "Test")
    (path / "README.md").write_text("hello\n")
    git(path, "add", "README.md")
    git(path, "commit", "-q", "-m", "initial")
    return path.resolve()


@pytest.fixture
def clean_env(tmp_path: Path) -> dict[str, str]:
    """The environment minus anything of an enclosing ov or Claude session."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OV_SCRIPTED_", "OVERSTORY_", "CLAUDE"))}
    env["HOME"] = str(tmp_path / "home")
    return env


class Turn(t.NamedTuple):
    code: int
    events: list[Event]
    stderr: str

    @property
    def result(self) -> Event:
        assert self.events and self.events[-1]["type"] == "result", self.events
        return self.events[-1]

    def of_type(self, kind: str, subtype: str | None = None) -> list[Event]:
        return [e for e in self.events if e["type"] == kind and (subtype is None or e.get("subtype") == subtype)]

    def texts(self) -> list[str]:
        return [block["text"] for e in self.of_type("assistant") for block in e["message"]["content"]
                if block["type"] == "text"]


class Runner:
    """Writes a scenario and runs turns of the scripted runtime in ``repo``."""

    def __init__(self, repo: Path, tmp_path: Path, env: dict[str, str]) -> None:
        self.repo = repo
        self.tmp = tmp_path
        self.state_dir = tmp_path / "scripted"  # where the adapter puts it: <run dir>/scripted
        self.scenario = tmp_path / "scenario.json"
        self.env = env

    def script(self, *turns: dict[str, t.Any], **extra: t.Any) -> None:
        self.scenario.write_text(json.dumps({"turns": list(turns), **extra}))

    def argv(self, resume: str | None = None) -> list[str]:
        argv = [*RUNTIME, "--scenario", str(self.scenario), "--state-dir", str(self.state_dir)]
        return argv + (["--resume", resume] if resume else [])

    def run(self, *prompts: t.Any, resume: str | None = None, env: dict[str, str] | None = None) -> Turn:
        stdin = "".join(user_line(p) for p in prompts or ("go",))
        done = subprocess.run(self.argv(resume), input=stdin, cwd=self.repo, env=env or self.env,
                              capture_output=True, text=True, timeout=60)
        events = [json.loads(line) for line in done.stdout.splitlines() if line.strip()]
        for event in events:
            check_shape(event)
        return Turn(done.returncode, events, done.stderr)


def user_line(content: t.Any) -> str:
    return json.dumps({"type": "user", "message": {"role": "user", "content": content}}) + "\n"


@pytest.fixture
def runner(repo: Path, tmp_path: Path, clean_env: dict[str, str]) -> Runner:
    return Runner(repo, tmp_path, clean_env)


def check_shape(event: Event) -> None:
    """The fields CLAUDE_CLI_FACTS.md lists for each event type of the real CLI."""
    kind = event["type"]
    assert isinstance(event.get("session_id"), str) and event["session_id"]
    if kind == "system" and event["subtype"] == "init":
        assert {"cwd", "model", "tools", "permissionMode", "claude_code_version"} <= event.keys()
        assert "Bash" in event["tools"] and "Write" in event["tools"]
    elif kind == "system" and event["subtype"] == "api_retry":
        assert {"attempt", "max_retries", "retry_delay_ms", "error_status"} <= event.keys()
    elif kind == "assistant":
        content = event["message"]["content"]
        assert len(content) == 1
        assert {"input_tokens", "output_tokens"} <= event["message"]["usage"].keys()
        block = content[0]
        if block["type"] == "tool_use":
            assert {"id", "name", "input"} <= block.keys()
        else:
            assert block["type"] == "text" and isinstance(block["text"], str)
    elif kind == "user":
        (block,) = event["message"]["content"]
        assert block["type"] == "tool_result"
        assert {"tool_use_id", "content"} <= block.keys()
        assert "tool_use_result" in event
    elif kind == "result":
        assert {"subtype", "is_error", "num_turns", "duration_ms", "total_cost_usd", "usage",
                "permission_denials"} <= event.keys()
        assert {"input_tokens", "output_tokens"} <= event["usage"].keys()
    else:
        pytest.fail(f"unexpected event type {kind!r}: {event}")


def tool_results(turn: Turn) -> dict[str, dict[str, t.Any]]:
    """tool name -> its tool_result block (by matching tool_use ids)."""
    names = {block["id"]: block["name"] for e in turn.of_type("assistant") for block in e["message"]["content"]
             if block["type"] == "tool_use"}
    return {names[e["message"]["content"][0]["tool_use_id"]]: e["message"]["content"][0]
            for e in turn.of_type("user")}


# --------------------------------------------------------------------------- turns


def test_text_turn_has_the_real_cli_event_sequence(runner: Runner) -> None:
    runner.script({"actions": [{"text": "looking around"}], "result": "all good"})
    turn = runner.run("hello")

    assert turn.code == 0, turn.stderr
    init = turn.events[0]
    assert (init["type"], init["subtype"]) == ("system", "init")
    assert init["cwd"] == str(runner.repo.resolve())
    assert turn.texts() == ["looking around", "all good"]
    result = turn.result
    assert (result["subtype"], result["is_error"], result["result"]) == ("success", False, "all good")
    assert result["num_turns"] == 2
    assert result["total_cost_usd"] == pytest.approx(0.002)
    assert result["permission_denials"] == []
    assert {e["session_id"] for e in turn.events} == {init["session_id"]}


def test_turn_command_of_the_runner_starts_this_runtime(runner: Runner) -> None:
    runner.script({"actions": [], "result": "hi"})
    request = TurnRequest(model=None, resume_session_id=None, run_dir=runner.tmp, at_project_root=False,
                          scenario=runner.scenario)
    argv = get_runtime("scripted").headless_command(request, Config())
    done = subprocess.run(argv, input=user_line("go"), cwd=runner.repo, env=runner.env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[-1])["result"] == "hi"


def test_write_and_commit_really_happen_in_the_worktree(runner: Runner) -> None:
    runner.script({"actions": [
        {"write": {"path": "src/feature.py", "content": "VALUE = 1\n"}},
        {"edit": {"path": "src/feature.py", "old": "VALUE = 1", "new": "VALUE = 2"}},
        {"read": "src/feature.py"},
        {"bash": "git add src/feature.py && git commit -q -m 'task-1: add feature'"},
    ], "result": "committed"})
    turn = runner.run()

    assert turn.code == 0, turn.stderr
    results = tool_results(turn)
    assert set(results) == {"Write", "Edit", "Read", "Bash"}
    assert not any(r.get("is_error") for r in results.values()), results
    assert "VALUE = 2" in results["Read"]["content"]
    write_call = next(b for e in turn.of_type("assistant") for b in e["message"]["content"]
                      if b["type"] == "tool_use" and b["name"] == "Write")
    assert write_call["input"]["file_path"] == str(runner.repo / "src" / "feature.py")
    assert git(runner.repo, "log", "-1", "--format=%s").strip() == "task-1: add feature"
    assert git(runner.repo, "show", "HEAD:src/feature.py") == "VALUE = 2\n"
    assert git(runner.repo, "status", "--porcelain") == ""


def test_failing_bash_reports_exit_code_and_output(runner: Runner) -> None:
    runner.script({"actions": [{"bash": "echo out; echo err >&2; exit 3"}], "result": "saw it"})
    turn = runner.run()
    bash = tool_results(turn)["Bash"]
    assert bash["is_error"] is True
    assert bash["content"].startswith("Exit code 3")
    assert "out" in bash["content"] and "err" in bash["content"]
    assert turn.result["is_error"] is False


def test_resume_plays_the_next_turn_and_keeps_the_session(runner: Runner) -> None:
    runner.script({"actions": [{"text": "first"}]}, {"actions": [{"text": "second"}]})
    first = runner.run("one")
    session_id = first.result["session_id"]
    second = runner.run("two", resume=session_id)
    third = runner.run("three", resume=session_id)

    assert first.result["result"] == "first"
    assert second.code == 0 and second.result["result"] == "second"
    assert second.events[0]["session_id"] == session_id == second.result["session_id"]
    assert third.result["result"] == "nothing more to do"
    transcripts = list((runner.state_dir / "projects").glob(f"*/{session_id}.jsonl"))
    assert len(transcripts) == 1


def test_a_fresh_session_starts_the_scenario_again(runner: Runner) -> None:
    runner.script({"actions": [{"text": "first"}]}, {"actions": [{"text": "second"}]})
    first = runner.run()
    again = runner.run()
    assert again.result["result"] == "first"
    assert again.result["session_id"] != first.result["session_id"]


def test_several_stdin_lines_are_several_turns_in_one_process(runner: Runner) -> None:
    runner.script({"actions": [{"text": "first"}]}, {"actions": [{"text": "second"}]})
    turn = runner.run("one", [{"type": "text", "text": "two"}])
    assert [e["result"] for e in turn.of_type("result")] == ["first", "second"]
    assert len(turn.of_type("system", "init")) == 2


def test_unknown_resume_id_fails_like_claude(runner: Runner) -> None:
    runner.script({"actions": [{"text": "never"}]})
    missing = "00000000-0000-0000-0000-000000000000"
    turn = runner.run(resume=missing)

    assert turn.code == 1
    assert [e["type"] for e in turn.events] == ["result"]
    result = turn.result
    assert (result["subtype"], result["is_error"], result["session_id"]) == (
        "error_during_execution", True, missing)
    assert missing in result["errors"][0]
    assert "No conversation found" in turn.stderr


# --------------------------------------------------------------------------- hooks


def _install_hooks(repo: Path, hooks: dict[str, t.Any]) -> None:
    (repo / ".claude").mkdir(exist_ok=True)
    (repo / ".claude" / "settings.local.json").write_text(json.dumps({"hooks": hooks}))


def test_deny_hook_blocks_the_write_and_is_reported(runner: Runner, tmp_path: Path) -> None:
    seen = tmp_path / "hook-input.json"
    hook = tmp_path / "deny.sh"
    hook.write_text(
        "#!/bin/bash\n"
        f"cat > {seen}\n"
        "echo '{\"hookSpecificOutput\": {\"hookEventName\": \"PreToolUse\", "
        "\"permissionDecision\": \"deny\", \"permissionDecisionReason\": \"builders may not write there\"}}'\n"
    )
    hook.chmod(0o755)
    _install_hooks(runner.repo, {"PreToolUse": [{"matcher": "Write|Edit", "hooks": [
        {"type": "command", "command": str(hook)}]}]})
    runner.script({"actions": [{"write": {"path": "blocked.txt", "content": "x"}},
                               {"bash": "echo allowed > allowed.txt"}], "result": "tried"})
    turn = runner.run()

    assert not (runner.repo / "blocked.txt").exists()
    assert (runner.repo / "allowed.txt").read_text() == "allowed\n"
    results = tool_results(turn)
    assert results["Write"]["is_error"] is True
    assert results["Write"]["content"] == "builders may not write there"
    assert not results["Bash"].get("is_error")
    (denial,) = turn.result["permission_denials"]
    assert denial["tool_name"] == "Write"
    assert denial["tool_use_id"] == results["Write"]["tool_use_id"]
    assert denial["tool_input"]["file_path"] == str(runner.repo / "blocked.txt")

    payload = json.loads(seen.read_text())
    assert payload["hook_event_name"] == "PreToolUse"
    assert payload["tool_name"] == "Write"
    assert payload["tool_use_id"] == denial["tool_use_id"]
    assert payload["session_id"] == turn.result["session_id"]
    assert payload["cwd"] == str(runner.repo.resolve())
    assert Path(payload["transcript_path"]).is_file()


def test_hook_exit_code_2_denies_with_its_stderr(runner: Runner) -> None:
    _install_hooks(runner.repo, {"PreToolUse": [{"matcher": "Bash", "hooks": [
        {"type": "command", "command": "echo \"no shell for $OVERSTORY_AGENT_NAME\" >&2; exit 2"}]}]})
    runner.script({"actions": [{"bash": "touch ran.txt"}], "result": "done"})
    turn = runner.run(env={**runner.env, "OVERSTORY_AGENT_NAME": "scout-7"})

    assert not (runner.repo / "ran.txt").exists()
    assert tool_results(turn)["Bash"]["content"] == "no shell for scout-7"
    assert [d["tool_name"] for d in turn.result["permission_denials"]] == ["Bash"]


def test_tool_action_only_passes_the_guard(runner: Runner) -> None:
    _install_hooks(runner.repo, {"PreToolUse": [{"matcher": "Task|Agent", "hooks": [
        {"type": "command", "command": "echo 'use ov sling' >&2; exit 2"}]}]})
    runner.script({"actions": [{"tool": {"name": "Task", "input": {"prompt": "x"}}},
                               {"tool": {"name": "TodoWrite", "input": {"todos": []}}}]})
    turn = runner.run()
    results = tool_results(turn)
    assert results["Task"]["is_error"] is True and results["Task"]["content"] == "use ov sling"
    assert not results["TodoWrite"].get("is_error")
    assert [d["tool_name"] for d in turn.result["permission_denials"]] == ["Task"]


def test_prompt_hook_context_is_seen_by_expect_in_prompt(runner: Runner) -> None:
    _install_hooks(runner.repo, {"UserPromptSubmit": [{"hooks": [
        {"type": "command", "command": "echo 'You have 2 unread messages'"}]}]})
    runner.script({"actions": [{"expect_in_prompt": "fix the bug"},
                               {"expect_in_prompt": "2 unread messages"}], "result": "seen"})
    turn = runner.run("please fix the bug")
    assert turn.code == 0 and turn.result["is_error"] is False
    assert turn.result["result"] == "seen"


def test_expect_in_prompt_fails_the_turn_when_missing(runner: Runner) -> None:
    runner.script({"actions": [{"expect_in_prompt": "task-42"}, {"write": {"path": "late.txt", "content": ""}}]})
    turn = runner.run("something else")
    assert turn.code == 1
    assert turn.result["is_error"] is True
    assert "task-42" in turn.result["result"]
    assert not (runner.repo / "late.txt").exists()


# --------------------------------------------------------------------------- failures


def test_crash_exits_without_a_result(runner: Runner) -> None:
    runner.script({"actions": [{"text": "about to die"}, {"crash": 7}, {"text": "never"}]})
    turn = runner.run()
    assert turn.code == 7
    assert turn.texts() == ["about to die"]
    assert turn.of_type("result") == []


def test_sleep_emits_nothing_meanwhile(runner: Runner) -> None:
    runner.script({"actions": [{"text": "before"}, {"sleep": 30}, {"text": "after"}]})
    process = subprocess.Popen(runner.argv(), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               cwd=runner.repo, env=runner.env)
    try:
        assert process.stdin and process.stdout
        process.stdin.write(user_line("go").encode())
        process.stdin.close()
        fd = process.stdout.fileno()
        received = b""
        while b'"before"' not in received:
            chunk = os.read(fd, 65536)
            assert chunk, "runtime exited before its first text"
            received += chunk
        # The sleep lasts 30 s; for this short window nothing at all may arrive.
        readable, _, _ = select.select([fd], [], [], 1.0)
        assert readable == []
        assert process.poll() is None
    finally:
        process.kill()
        process.wait()


@pytest.mark.parametrize(("kind", "status", "retries"), [
    ("overloaded", 529, 2), ("rate_limit", 429, 2), ("invalid_request", 400, 0), ("authentication", 401, 0)])
def test_api_errors(runner: Runner, kind: str, status: int, retries: int) -> None:
    runner.script({"actions": [{"api_error": kind}, {"write": {"path": "late.txt", "content": ""}}]})
    turn = runner.run()
    assert turn.code == 1
    assert len(turn.of_type("system", "api_retry")) == retries
    assert all(e["error_status"] == status for e in turn.of_type("system", "api_retry"))
    result = turn.result
    assert result["is_error"] is True and result["api_error_status"] == status
    assert result["result"]
    assert not (runner.repo / "late.txt").exists()


# --------------------------------------------------------------------------- scenarios


def test_placeholders_come_from_the_environment(runner: Runner) -> None:
    runner.script({"actions": [{"write": {"path": "${OVERSTORY_TASK_ID}.txt",
                                          "content": "by ${OVERSTORY_AGENT_NAME} ${NOT_SET_ANYWHERE}"}}],
                   "result": "wrote ${OVERSTORY_TASK_ID}"})
    turn = runner.run(env={**runner.env, "OVERSTORY_AGENT_NAME": "builder-a", "OVERSTORY_TASK_ID": "t9"})
    assert (runner.repo / "t9.txt").read_text() == "by builder-a ${NOT_SET_ANYWHERE}"
    assert turn.result["result"] == "wrote t9"


def test_agents_section_picks_the_script_by_agent_name(runner: Runner) -> None:
    runner.script({"actions": [{"text": "default"}]},
                  agents={"lead-*": {"turns": [{"actions": [{"text": "lead script"}]}]}})
    as_lead = runner.run(env={**runner.env, "OVERSTORY_AGENT_NAME": "lead-x"})
    as_builder = runner.run(env={**runner.env, "OVERSTORY_AGENT_NAME": "builder-x"})
    assert as_lead.result["result"] == "lead script"
    assert as_builder.result["result"] == "default"


def test_scenario_from_env_and_yaml(runner: Runner, tmp_path: Path) -> None:
    scenario = tmp_path / "scenario.yaml"
    scenario.write_text("turns:\n  - actions:\n      - text: from yaml\n")
    argv = [*RUNTIME, "--state-dir", str(runner.state_dir)]
    done = subprocess.run(argv, input=user_line("go"), cwd=runner.repo, capture_output=True, text=True,
                          env={**runner.env, "OV_SCRIPTED_SCENARIO": str(scenario)}, timeout=60)
    assert json.loads(done.stdout.splitlines()[-1])["result"] == "from yaml"


def test_missing_scenario_is_a_usage_error(runner: Runner) -> None:
    done = subprocess.run(RUNTIME, input=user_line("go"), cwd=runner.repo, capture_output=True, text=True,
                          env=runner.env, timeout=60)
    assert done.returncode == 2
    assert "scenario" in done.stderr


def test_the_player_does_not_load_the_adapter() -> None:
    """Every scripted turn starts the player as a new process: it must not pay for the runtime adapters
    (the claude adapter behind the scripted one costs about as much again as the player itself)."""
    code = ("import sys; import overstory.runtimes.scripted.player; "
            "print(sorted(m for m in sys.modules if m.startswith('overstory.runtimes.') and 'scripted' not in m))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
    from overstory.runtimes.scripted import ScriptedRuntime  # the package still names the adapter, on demand

    assert get_runtime("scripted").__class__ is ScriptedRuntime
