"""The ``qwen`` runtime: Qwen Code (a fork of Gemini CLI), headless (``--output-format stream-json``), one
process per turn.

Qwen Code speaks the OpenAI Chat Completions API (``OPENAI_BASE_URL``, ``OPENAI_API_KEY``,
``OPENAI_MODEL``) and prints Claude Code's stream-json events, so its parser is Claude's with
Qwen's error texts and shell results (``stream.py``). Each agent gets its own ``QWEN_HOME``
under ``.overstory/run/<agent>/qwen-home`` (and ``HOME`` inside it), so the user's ``~/.qwen``
is neither read nor written. ov writes there:

- ``QWEN.md``: the agent's instructions (the CLI's global context file, which goes into the
  system prompt);
- ``system-settings.json``, named by ``QWEN_CODE_SYSTEM_SETTINGS_PATH``: the settings a
  worktree's own ``.qwen/settings.json`` cannot override. OpenAI auth, telemetry, usage
  statistics and update checks off, and a Claude-shaped ``PreToolUse`` hook that runs
  ``ov guard`` before every tool call. Qwen lets a tool run when its hook exits 1 (measured),
  so the hook command turns any failure of ``ov guard`` into exit 2 with a reason.

Qwen's own sub-agent, worktree and schedule tools are excluded on the command line (ov agents
use ``ov sling``). The prompt goes on stdin, which is then closed. ``QWEN_CODE_NO_RELAUNCH`` keeps one node process.
Facts: tests/fixtures/QWEN_PROBE_NOTES.md.
"""

from __future__ import annotations

import json
import os
import tempfile
import typing as t
from pathlib import Path

from overstory.errors import RuntimeNotAvailable
from overstory.runtimes.base import AgentSetup, Runtime, RuntimeProbe, TurnParser, TurnRequest, find_program
from overstory.runtimes.common import git_identity_env, guard_hook_command, probe_program

if t.TYPE_CHECKING:
    from overstory.config.model import Config

PACKAGE = "@qwen-code/qwen-code"
HOME_DIR = "qwen-home"
SYSTEM_SETTINGS = "system-settings.json"
HOOK_TIMEOUT_MS = 60000
HEADLESS_FLAGS = ["--output-format", "stream-json", "--approval-mode", "yolo"]
DEFAULT_BASE_URL = "https://api.openai.com/v1"
# Qwen's own ways to start agents, worktrees, schedules and board posts: ov agents use ov for each.
EXCLUDED_TOOLS = ["agent", "list_agents", "send_message", "enter_worktree", "exit_worktree", "cron_create",
                  "cron_list", "cron_delete", "loop_wakeup"]
# Inherited variables that change qwen's auth, endpoint, model, home, sandbox or telemetry.
_FOREIGN_PREFIXES = ("QWEN_", "OPENAI_", "DASHSCOPE_", "OTEL_", "GEMINI_", "GOOGLE_")
_FOREIGN_NAMES = ("SANDBOX", "DEBUG", "DEBUG_MODE")


def settings(ov_command: list[str]) -> dict[str, t.Any]:
    return {
        "security": {"auth": {"selectedType": "openai"}},
        "privacy": {"usageStatisticsEnabled": False},
        "telemetry": {"enabled": False},
        "general": {"enableAutoUpdate": False},
        "ide": {"enabled": False},
        "hooks": {"PreToolUse": [{"matcher": ".*", "hooks": [
            {"type": "command", "command": guard_hook_command(ov_command), "timeout": HOOK_TIMEOUT_MS}]}]},
    }


class QwenRuntime(Runtime):
    name = "qwen"
    own_agent_tools = "Qwen Code's own sub-agents or messages (agent, send_message: both off)"
    tool_hooks = frozenset({"pre"})  # receipts come from the stream; the hook's tool_call_id is the stream's id
    usage_during_turn = True  # every assistant message carries its usage
    credential_vars = ("OPENAI_API_KEY",)
    instructions_file = "QWEN.md"  # in QWEN_HOME, not the worktree
    protocols = ("openai-chat",)

    def _bin(self, config: Config | None) -> str:
        return config.runtime.qwen_bin if config is not None else os.environ.get("OV_RUNTIME_QWEN_BIN", "qwen")

    def program(self, config: Config) -> list[str]:
        found = find_program(self._bin(config))
        if found is None:
            raise RuntimeNotAvailable(f"the qwen runtime needs `{self._bin(config)}` on PATH: npm install -g "
                                      f"{PACKAGE} (or set runtime.qwen_bin)")
        return [found]

    def headless_command(self, request: TurnRequest, config: Config) -> list[str]:
        argv = [*self.program(config), *HEADLESS_FLAGS]
        for tool in EXCLUDED_TOOLS:
            argv += ["--exclude-tools", tool]
        if request.model:
            argv += ["--model", request.model]
        if request.resume_session_id:
            argv += ["--resume", request.resume_session_id]
        return argv

    def stdin_message(self, prompt: str) -> bytes:
        return prompt.encode("utf-8")

    def new_parser(self) -> TurnParser:
        from overstory.runtimes.qwen.stream import QwenTurnStream

        return QwenTurnStream()

    def provider_env(self, base_url: str, api_key: str) -> dict[str, str]:
        return {"OPENAI_BASE_URL": base_url, "OPENAI_API_KEY": api_key}

    def inherited_env(self, environ: t.Mapping[str, str]) -> dict[str, str]:
        env = {k: v for k, v in environ.items()
               if not (k.startswith(_FOREIGN_PREFIXES) or k in _FOREIGN_NAMES) or k == "OPENAI_API_KEY"}
        env.update(git_identity_env(environ))  # read with the real HOME, before it moves
        env["OPENAI_BASE_URL"] = DEFAULT_BASE_URL  # no provider configured: OpenAI's own endpoint and key
        return env

    def state_dir(self, run_dir: Path) -> Path | None:
        return run_dir / HOME_DIR

    def turn_env(self, run_dir: Path) -> dict[str, str]:
        home = run_dir / HOME_DIR
        return {
            "HOME": str(home / "home"),
            "QWEN_HOME": str(home),
            "QWEN_CODE_SYSTEM_SETTINGS_PATH": str(home / SYSTEM_SETTINGS),
            "QWEN_CODE_SYSTEM_DEFAULTS_PATH": str(home / "no-system-defaults.json"),  # not /etc/qwen-code
            "QWEN_CODE_NO_RELAUNCH": "true",
            "QWEN_CODE_SUPPRESS_YOLO_WARNING": "1",  # ov's sandbox is the boundary; the notice is noise
            "NO_COLOR": "1",
        }

    def state_files(self, setup: AgentSetup) -> dict[str, str] | None:
        return {"home/.keep": "", "QWEN.md": setup.instructions,
                "settings.json": json.dumps({"security": {"auth": {"selectedType": "openai"}}}, indent=2),
                SYSTEM_SETTINGS: json.dumps(settings(setup.ov_command), indent=2)}

    def probe(self, config: Config | None) -> RuntimeProbe:
        if os.environ.get("OPENAI_API_KEY"):
            credentials = "OPENAI_API_KEY set"
        elif config is not None and any(p.protocol == "openai-chat" for p in config.providers.values()):
            credentials = "no OPENAI_API_KEY; an openai-chat provider is configured"
        else:
            credentials = "no OPENAI_API_KEY (and no openai-chat provider in config)"
        with tempfile.TemporaryDirectory(prefix="ov-qwen-probe-") as scratch:
            env = {**self.inherited_env(os.environ), **self.turn_env(Path(scratch))}
            found = probe_program(self.name, self._bin(config), env=env, credentials=credentials, package=PACKAGE,
                                  hint_key="qwen_bin")
        if found.installed:
            return RuntimeProbe(found.name, found.status, f"{found.detail}; guard: PreToolUse hook",
                                found.credentials, found.hint)
        return found
