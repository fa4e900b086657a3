"""The ``claude`` runtime: Claude Code's headless stream-json mode, its hooks and its TUI.

Facts about the CLI that this adapter relies on are measured in
tests/fixtures/CLAUDE_PROBE_NOTES.md.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import typing as t
from pathlib import Path

from overstory.errors import RuntimeNotAvailable
from overstory.runtimes.base import Runtime, RuntimeProbe, Tui, TurnParser, TurnRequest, find_program

if t.TYPE_CHECKING:
    from overstory.config import Config

STREAM_FLAGS = ["-p", "--output-format", "stream-json", "--input-format", "stream-json", "--verbose",
                "--permission-mode", "bypassPermissions"]
INSTALL_HINT = "npm install -g @anthropic-ai/claude-code (or set runtime.claude_bin, or use --runtime scripted)"
# The oldest Claude Code ov supports: HTTP hooks with "onFailure" (a guard that fails closed) came in 2.1.295.
MIN_VERSION = (2, 1, 295)


def root_agent_flags(run_dir: Path, instructions_file: str, settings_file: str) -> list[str]:
    """``--append-system-prompt TEXT --settings FILE`` for an agent working at the project root,
    whose instructions and hooks live in its run dir instead of the user's own ``.claude/``."""
    flags: list[str] = []
    instructions = run_dir / instructions_file
    if instructions.is_file():
        flags += ["--append-system-prompt", instructions.read_text(encoding="utf-8")]
    settings = run_dir / settings_file
    if settings.is_file():
        flags += ["--settings", str(settings)]
    return flags


def hook_settings(ov_command: list[str], *, tmux_mode: bool) -> dict[str, t.Any]:
    """Settings that send every tool call through ``ov guard`` (and, in tmux mode, mail into prompts).

    PostToolUse and PostToolUseFailure (a failed Bash gets only the latter) run ``ov guard
    --post``, which stores the call's result in the tool-call ledger.
    """
    prefix = " ".join(shlex.quote(part) for part in ov_command)
    post = [{"matcher": ".*", "hooks": [{"type": "command", "command": f"{prefix} guard --post"}]}]
    settings: dict[str, t.Any] = {
        "hooks": {"PreToolUse": [{"matcher": ".*", "hooks": [{"type": "command", "command": f"{prefix} guard"}]}],
                  "PostToolUse": post, "PostToolUseFailure": post}
    }
    if tmux_mode:
        inject = [{"hooks": [{"type": "command", "command": f"{prefix} mail check --inject"}]}]
        settings["hooks"]["UserPromptSubmit"] = inject
        settings["hooks"]["SessionStart"] = inject
    return settings


def parse_version(text: str) -> tuple[int, ...] | None:
    """``(2, 1, 330)`` from ``claude --version`` output such as "2.1.330 (Claude Code)"; None if unreadable."""
    match = re.match(r"\s*v?(\d+)\.(\d+)\.(\d+)", text)
    return tuple(int(part) for part in match.groups()) if match else None


def _version_of(argv: list[str]) -> str | None:
    try:
        result = subprocess.run(argv, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    text = (result.stdout or result.stderr).strip().splitlines()
    return text[0] if result.returncode == 0 and text else None


class ClaudeRuntime(Runtime):
    name = "claude"
    tool_hooks = frozenset({"pre", "post"})
    instructions_file = ".claude/CLAUDE.md"
    hook_settings_file = ".claude/settings.local.json"
    root_instructions_file = "CLAUDE.md"
    root_settings_file = "settings.json"
    protocols = ("anthropic",)
    credential_vars = ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN", "CLAUDE_CODE_OAUTH_TOKEN")

    def program(self, config: Config) -> list[str]:
        claude_bin = config.runtime.claude_bin
        found = find_program(claude_bin)
        if found is None:
            raise RuntimeNotAvailable(f"the claude runtime needs `{claude_bin}` on PATH: {INSTALL_HINT}")
        return [found]

    def headless_command(self, request: TurnRequest, config: Config) -> list[str]:
        return [*self.program(config), *self._flags(request)]

    def _flags(self, request: TurnRequest) -> list[str]:
        flags = list(STREAM_FLAGS)
        if request.model:
            flags += ["--model", request.model]
        if request.resume_session_id:
            flags += ["--resume", request.resume_session_id]
        if request.at_project_root:
            flags += root_agent_flags(request.run_dir, self.root_instructions_file, self.root_settings_file)
        return flags

    def stdin_message(self, prompt: str) -> bytes:
        message = {"type": "user", "message": {"role": "user", "content": prompt}}
        return (json.dumps(message, ensure_ascii=False) + "\n").encode("utf-8")

    def new_parser(self) -> TurnParser:
        from overstory.runtimes.claude.stream import TurnStream

        return TurnStream()

    def provider_env(self, base_url: str, api_key: str) -> dict[str, str]:
        return {"ANTHROPIC_BASE_URL": base_url, "ANTHROPIC_API_KEY": api_key}

    def turn_env(self, run_dir: Path) -> dict[str, str]:
        if hasattr(os, "geteuid") and os.geteuid() == 0:
            return {"IS_SANDBOX": "1"}  # claude refuses bypassPermissions as root otherwise
        return {}

    def hook_settings(self, ov_command: list[str], *, tmux_mode: bool) -> dict[str, t.Any] | None:
        return hook_settings(ov_command, tmux_mode=tmux_mode)

    @property
    def tui(self) -> Tui | None:
        from overstory.runtimes.claude.tui import ClaudeTui

        return ClaudeTui()

    def probe(self, config: Config | None) -> RuntimeProbe:
        claude_bin = config.runtime.claude_bin if config is not None else os.environ.get(
            "OV_RUNTIME_CLAUDE_BIN", "claude")
        path = find_program(claude_bin)
        credentials, found = _credentials()
        if path is None:
            return RuntimeProbe(self.name, "missing", f"{claude_bin} not found on PATH (the scripted runtime still works)",
                                credentials, "npm install -g @anthropic-ai/claude-code, or set runtime.claude_bin",
                                has_credentials=found)
        version = _version_of([path, "--version"])
        if version is None:
            return RuntimeProbe(self.name, "broken", f"{path} did not report a version", credentials,
                                "reinstall @anthropic-ai/claude-code", has_credentials=found)
        parsed = parse_version(version)
        if parsed is not None and parsed < MIN_VERSION:
            minimum = ".".join(map(str, MIN_VERSION))
            return RuntimeProbe(self.name, "outdated", f"{version} at {path} is older than {minimum}, which HTTP "
                                f"hooks with onFailure need", credentials,
                                f"npm install -g @anthropic-ai/claude-code (>= {minimum})", has_credentials=found)
        hint = "" if found else "export ANTHROPIC_API_KEY=... (or CLAUDE_CODE_OAUTH_TOKEN), or log in with `claude`"
        return RuntimeProbe(self.name, "ok", f"{version} at {path}", credentials, hint, has_credentials=found)


def _credentials() -> tuple[str, bool]:
    """Which key or login the CLI would use (it is not checked against the API: that would cost a request)."""
    for name in ClaudeRuntime.credential_vars:
        if os.environ.get(name):
            return f"{name} set", True
    config_dir = Path(os.environ.get("CLAUDE_CONFIG_DIR") or Path.home() / ".claude")
    if (config_dir / ".credentials.json").is_file():
        return f"logged in ({config_dir / '.credentials.json'})", True
    return "no ANTHROPIC_API_KEY, no OAuth token and no login found", False
