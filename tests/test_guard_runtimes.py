"""`ov guard` for the other runtimes: Gemini CLI's BeforeTool input, ov's OpenCode plugin input, and
Codex's apply_patch (a shell command whose heredoc holds the files it writes).

A table of calls in each CLI's own shape (as measured: tests/fixtures/*_PROBE_NOTES.md), the
reply each CLI understands, and the hook command that turns a crashed `ov guard` into a refusal.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

import overstory
from overstory.guards import guard_reply
from overstory.guards.runtimes import as_claude_input, dialect_of, gemini_after_tool, gemini_shell_outcome, patch_paths
from overstory.runtimes.common import GUARD_FAILED, guard_hook_command

ROOT = Path("/srv/proj")
SRC_DIR = str(Path(overstory.__file__).resolve().parent.parent)


def worktree(agent: str) -> str:
    return str(ROOT / ".overstory" / "worktrees" / agent)


def env_of(agent: str, capability: str) -> dict[str, str]:
    return {"OVERSTORY_AGENT_NAME": agent, "OVERSTORY_CAPABILITY": capability, "OVERSTORY_PROJECT_ROOT": str(ROOT),
            "OVERSTORY_WORKTREE": worktree(agent), "HOME": "/nonexistent-home"}


def gemini(tool: str, tool_input: dict[str, object], agent: str = "builder-a") -> dict[str, object]:
    return {"session_id": "s", "transcript_path": "/dev/null", "cwd": worktree(agent),
            "hook_event_name": "BeforeTool", "timestamp": "2026-11-23T00:00:00Z", "tool_name": tool,
            "tool_input": tool_input}


def opencode(tool: str, args: dict[str, object], agent: str = "builder-a") -> dict[str, object]:
    return {"tool": tool, "sessionID": "ses_1", "callID": "call_1", "args": args, "cwd": worktree(agent)}


def qwen(tool: str, tool_input: dict[str, object], agent: str = "builder-a") -> dict[str, object]:
    """Qwen Code's PreToolUse input as measured with 0.24.4 (tests/fixtures/QWEN_PROBE_NOTES.md)."""
    return {"session_id": "s", "transcript_path": "/dev/null", "cwd": worktree(agent), "hook_event_name": "PreToolUse",
            "timestamp": "2026-11-29T00:00:00Z", "permission_mode": "yolo", "prompt_id": "p", "tool_name": tool,
            "tool_input": tool_input, "tool_use_id": "toolu_1_x", "tool_call_id": "call_q1"}


def codex(command: str, agent: str = "builder-a") -> dict[str, object]:
    return {"session_id": "t", "turn_id": "u", "cwd": worktree(agent), "hook_event_name": "PreToolUse",
            "model": "m", "permission_mode": "bypassPermissions", "tool_name": "Bash",
            "tool_input": {"command": command}, "tool_use_id": "call_1"}


def patch(*headers: str) -> str:
    body = "\n".join(f"*** {h}\n+x" for h in headers)
    return f"apply_patch <<'EOF'\n*** Begin Patch\n{body}\n*** End Patch\nEOF\n"


OUTSIDE = str(ROOT / "out.txt")

# (input, capability, allowed)
CASES = [
    # Gemini CLI
    (gemini("run_shell_command", {"command": "git status"}), "builder", True),
    (gemini("run_shell_command", {"command": f"echo x > {OUTSIDE}"}), "builder", False),
    (gemini("write_file", {"file_path": "greet.py", "content": "x"}), "builder", True),
    (gemini("write_file", {"file_path": OUTSIDE, "content": "x"}), "builder", False),
    (gemini("replace", {"file_path": "a.py", "old_string": "a", "new_string": "b", "instruction": "i"}), "reviewer",
     False),
    (gemini("write_file", {"file_path": "notes.md", "content": "x"}), "reviewer", False),
    (gemini("run_shell_command", {"command": "git diff main...ov/x"}), "reviewer", True),
    (gemini("read_file", {"file_path": "/etc/hostname"}), "reviewer", True),
    (gemini("invoke_agent", {"agent_name": "x", "prompt": "y"}), "builder", False),
    # OpenCode (ov's plugin)
    (opencode("bash", {"command": "ls", "description": "d"}), "builder", True),
    (opencode("bash", {"command": f"touch {OUTSIDE}", "description": "d"}), "builder", False),
    (opencode("write", {"filePath": worktree("builder-a") + "/a.py", "content": "x"}), "builder", True),
    (opencode("edit", {"filePath": OUTSIDE, "oldString": "a", "newString": "b"}), "builder", False),
    (opencode("write", {"filePath": "a.py", "content": "x"}), "scout", False),
    (opencode("task", {"description": "d", "prompt": "p", "subagent_type": "general"}), "builder", False),
    (opencode("read", {"filePath": "/etc/hostname"}), "scout", True),
    # Qwen Code (its PreToolUse hook)
    (qwen("run_shell_command", {"command": "git status"}), "builder", True),
    (qwen("run_shell_command", {"command": f"echo x > {OUTSIDE}"}), "builder", False),
    (qwen("write_file", {"file_path": worktree("builder-a") + "/a.py", "content": "x"}), "builder", True),
    (qwen("write_file", {"file_path": OUTSIDE, "content": "x"}), "builder", False),
    (qwen("edit", {"file_path": "a.py", "old_string": "a", "new_string": "b"}), "reviewer", False),
    (qwen("agent", {"description": "d", "prompt": "p"}), "builder", False),
    (qwen("read_file", {"file_path": "/etc/hostname"}), "scout", True),
    # Codex: apply_patch through its shell tool
    (codex(patch("Add File: greet.py")), "builder", True),
    (codex(patch("Update File: greet.py", "Add File: sub/dir/new.py")), "builder", True),
    (codex(patch("Add File: greet.py", f"Add File: {OUTSIDE}")), "builder", False),
    (codex(patch("Update File: greet.py") .replace("+x", "*** Move to: ../builder-b/stolen.py\n+x", 1)), "builder",
     False),
    (codex(patch("Delete File: ../../../README.md")), "builder", False),
    (codex(patch("Add File: greet.py")), "reviewer", False),
    (codex("apply_patch " + shlex.quote("*** Begin Patch\n*** Add File: " + OUTSIDE + "\n+x\n*** End Patch")),
     "builder", False),
    (codex("echo fine > out.txt"), "builder", True),
]


@pytest.mark.parametrize(("hook_input", "capability", "allowed"), CASES)
def test_decisions_in_each_dialect(hook_input: dict[str, object], capability: str, allowed: bool) -> None:
    agent = "builder-a" if capability == "builder" else f"{capability}-1"
    if hook_input.get("cwd") == worktree("builder-a"):
        hook_input = {**hook_input, "cwd": worktree(agent)}
    stdout, stderr, status = guard_reply(json.dumps(hook_input), env_of(agent, capability))
    dialect = dialect_of(hook_input)
    if allowed:
        assert (stdout, stderr, status) == ("", "", 0)
    elif dialect == "gemini":
        reply = json.loads(stdout)
        assert status == 0 and reply["decision"] == "deny" and reply["reason"]
    elif dialect in ("opencode", "qwen"):
        assert status == 2 and stdout == "" and stderr  # Qwen blocks on exit 2 (and runs the call on exit 1)
    else:
        reply = json.loads(stdout)["hookSpecificOutput"]
        assert status == 0 and reply["permissionDecision"] == "deny" and reply["permissionDecisionReason"]


def test_inputs_are_read_as_claude_calls() -> None:
    dialect, mapped = as_claude_input(gemini("write_file", {"file_path": "a.py", "content": "x"}))
    assert dialect == "gemini" and mapped["tool_name"] == "Write" and mapped["tool_input"] == {
        "file_path": "a.py", "content": "x"}
    assert mapped["cwd"] == worktree("builder-a") and mapped["hook_event_name"] == "PreToolUse"
    dialect, mapped = as_claude_input(opencode("edit", {"filePath": "a.py", "oldString": "a", "newString": "b"}))
    assert dialect == "opencode" and mapped["tool_name"] == "Edit" and mapped["tool_input"]["file_path"] == "a.py"
    assert mapped["tool_use_id"] == "call_1"  # the stream's callID: the call's receipt finds its ledger row by it
    dialect, mapped = as_claude_input(gemini("web_fetch", {"prompt": "x"}))
    assert "tool_use_id" not in mapped  # Gemini's BeforeTool input has no id
    assert mapped["tool_name"] == "web_fetch"  # a tool ov does not know keeps its name (and is allowed)
    assert as_claude_input(codex("ls"))[0] == "claude"
    dialect, mapped = as_claude_input(qwen("run_shell_command", {"command": "ls"}))
    assert dialect == "qwen" and mapped["tool_name"] == "Bash" and mapped["tool_input"] == {"command": "ls"}
    assert mapped["tool_use_id"] == "call_q1"  # its tool_call_id is the stream's id (its tool_use_id is not)


def test_reasons_reach_the_model_in_each_dialect() -> None:
    env = env_of("reviewer-1", "reviewer")
    stdout, _, _ = guard_reply(json.dumps(gemini("write_file", {"file_path": "n.md", "content": "x"}, "reviewer-1")),
                               env)
    assert "reviewer-1 (reviewer) is read-only" in json.loads(stdout)["reason"]
    _, stderr, _ = guard_reply(json.dumps(opencode("bash", {"command": "rm -rf src"}, "reviewer-1")), env)
    assert "read-only" in stderr


def test_patch_paths() -> None:
    assert patch_paths(patch("Add File: a.py", "Update File: b/c.py")) == ["a.py", "b/c.py"]
    assert patch_paths("apply_patch <<EOF\n*** Begin Patch\n*** Delete File: x\n*** End Patch\nEOF") == ["x"]
    assert patch_paths("echo apply_patch") is None
    assert patch_paths("apply_patch <<'EOF'\nnot a patch\nEOF") is None
    assert patch_paths("cat <<'EOF'\n*** Begin Patch\n*** Add File: x\n*** End Patch\nEOF") is None


def test_unreadable_input_is_refused_with_exit_2_and_a_reason() -> None:
    for text in ("", "{nope", "[1]", None):
        stdout, stderr, status = guard_reply(text, env_of("builder-a", "builder"))
        assert status == 2 and stdout == "" and "blocked" in stderr
    assert guard_reply("{nope", {"HOME": "/x"}) == ("", "", 0)  # outside an agent: nothing is checked


def _hook(command: str, payload: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["/bin/sh", "-c", command], input=payload, capture_output=True, text=True, env=env,
                          timeout=60, check=False)


def test_the_hook_command_refuses_when_ov_guard_itself_fails() -> None:
    """Gemini CLI runs a tool when its hook crashes, and also on exit 2 with nothing on stderr; so the
    hook command turns any failure of `ov guard` into exit 2 with a reason."""
    env = {**env_of("builder-a", "builder"), "PATH": os.environ.get("PATH", "")}
    payload = json.dumps(gemini("run_shell_command", {"command": "ls"}))
    missing = _hook(guard_hook_command(["/nonexistent/ov"]), payload, env)
    assert missing.returncode == 2 and GUARD_FAILED in missing.stderr
    crashing = _hook(guard_hook_command([sys.executable, "-c", "raise SystemExit(1)"]), payload, env)
    assert crashing.returncode == 2 and GUARD_FAILED in crashing.stderr


def test_the_hook_command_with_the_real_guard() -> None:
    env = {**env_of("builder-a", "builder"), "PATH": os.environ.get("PATH", ""), "PYTHONPATH": SRC_DIR}
    command = guard_hook_command([sys.executable, "-m", "overstory"])
    allowed = _hook(command, json.dumps(opencode("bash", {"command": "ls"})), env)
    assert (allowed.returncode, allowed.stdout, allowed.stderr) == (0, "", "")
    denied = _hook(command, json.dumps(opencode("bash", {"command": f"touch {OUTSIDE}"})), env)
    assert denied.returncode == 2 and "project checkout" in denied.stderr
    gem = _hook(command, json.dumps(gemini("write_file", {"file_path": OUTSIDE, "content": "x"})), env)
    assert gem.returncode == 0 and json.loads(gem.stdout)["decision"] == "deny"


# ---- Gemini's AfterTool: how a shell call ended ------------------------------------------------

def _after(content: str, display: object, **extra: object) -> dict[str, object]:
    """A ``tool_response`` as Gemini CLI 0.61.0's AfterTool hook got it (captured against the mock API)."""
    return {"llmContent": f"<untrusted_context>\n{content}\n</untrusted_context>", "returnDisplay": display, **extra}


@pytest.mark.parametrize("response, expected", [
    (_after("Output: cannot release: broken\nExit Code: 3\nProcess Group PGID: 31337", "cannot release: broken"),
     (False, 3, "cannot release: broken")),
    (_after("Output: released\nProcess Group PGID: 31353", "released"), (True, 0, "released")),
    (_after("Output: (empty)\nExit Code: 4\nProcess Group PGID: 31358", "Command exited with code: 4"),
     (False, 4, "")),
    (_after("Output: (empty)\nSignal: 15\nProcess Group PGID: 31363", "Command terminated by signal: 15"),
     (False, None, "Signal: 15")),
    # Output whose own last line looks like the CLI's: the real outcome is what follows the output.
    (_after("Output: a\nExit Code: 9\nProcess Group PGID: 5", "a\nExit Code: 9"), (True, 0, "a\nExit Code: 9")),
    (_after("Output: a\nExit Code: 0\nExit Code: 2\nProcess Group PGID: 5", "a\nExit Code: 0"),
     (False, 2, "a\nExit Code: 0")),
    # Without the display text to split on, the trailing lines decide.
    (_after("Output: oops\nExit Code: 1\nProcess Group PGID: 5", None), (False, 1, "oops\nExit Code: 1\nProcess Group PGID: 5")),
])
def test_a_gemini_shell_calls_outcome_comes_from_its_exit_code(response: dict[str, object],
                                                              expected: tuple[object, ...]) -> None:
    assert gemini_shell_outcome(response) == expected


@pytest.mark.parametrize("response", [
    _after("Command was cancelled by user before it could complete. There was no output before it was cancelled.",
           "Command cancelled by user."),
    _after("Command moved to background (PID: 7). Output hidden. Press Ctrl+B to view.", "Command moved to background"),
    _after("Output: x\nsomething new\nProcess Group PGID: 5", "x"),  # a shape this version never printed
    {"llmContent": None, "returnDisplay": ""},
    None,
])
def test_an_unknown_gemini_shell_outcome_is_never_a_success(response: object) -> None:
    ok, code, receipt = gemini_shell_outcome(response)
    assert not ok and code is None and receipt.startswith("ov: the outcome is unknown")


def test_gemini_after_tool_reads_as_claudes_post_hook() -> None:
    base = {"hook_event_name": "AfterTool", "tool_name": "run_shell_command", "tool_input": {"command": "./r.sh"}}
    failed = gemini_after_tool({**base, "tool_response": _after("Output: no\nExit Code: 3\nProcess Group PGID: 1", "no")})
    assert failed == {"hook_event_name": "PostToolUseFailure", "tool_name": "Bash", "tool_input": {"command": "./r.sh"},
                      "error": "Exit code 3\nno"}
    ok = gemini_after_tool({**base, "tool_response": _after("Output: yes\nProcess Group PGID: 1", "yes")})
    assert ok["hook_event_name"] == "PostToolUse" and ok["tool_response"] == {"stdout": "yes"}
    write = gemini_after_tool({"hook_event_name": "AfterTool", "tool_name": "write_file", "tool_input": {"file_path": "a"},
                               "tool_response": {"llmContent": "x", "returnDisplay": "", "error": {"message": "disk"}}})
    assert (write["hook_event_name"], write["tool_name"], write["error"]) == ("PostToolUseFailure", "Write", "disk")
