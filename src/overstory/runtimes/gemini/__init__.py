"""The ``gemini`` runtime: Google's Gemini CLI, headless (``--output-format stream-json``), one process per turn.

Each agent gets its own ``GEMINI_CLI_HOME`` under ``.overstory/run/<agent>/gemini-home``, so
the user's ``~/.gemini`` is neither read nor written (gemini 0.61 still looks for one file
through the real home, ``~/.gemini/policies/sandbox.toml``). ov writes there:

- ``.gemini/GEMINI.md``: the agent's instructions (the CLI's global context file, which goes
  into the system instruction);
- ``system-settings.json``, named by ``GEMINI_CLI_SYSTEM_SETTINGS_PATH``: the settings a
  worktree's own ``.gemini/settings.json`` cannot override. API-key auth (required headless
  when a base URL is set), telemetry, usage statistics, update checks and ``.env`` loading
  off, chats kept (the default deletes them after 30 days: they could not be resumed), and a
  ``BeforeTool`` hook that runs ``ov guard`` before every tool call. Gemini lets a tool run
  when its hook crashes or exits 2 with nothing on stderr, so the hook command turns any
  failure of ``ov guard`` into exit 2 with a reason. An ``AfterTool`` hook on the shell tool
  only runs ``ov guard --post``: the stream says "success" for every command that ran and
  carries no exit code, which the hook is given (in the text the model gets) before the
  stream's ``tool_result`` is printed. If that hook dies, the call's ledger row stays
  ``started`` (a retry holds it back once as "may already have happened"), never "succeeded".

The prompt goes on stdin (no ``-p``), which is then closed. ``GEMINI_CLI_NO_RELAUNCH`` keeps
one node process, which ends on SIGTERM (the relaunching parent ignores it). Facts:
tests/fixtures/GEMINI_PROBE_NOTES.md.
"""

from __future__ import annotations

import json
import os
import shlex
import tempfile
import typing as t
from pathlib import Path

from overstory.errors import RuntimeNotAvailable
from overstory.runtimes.base import AgentSetup, Runtime, RuntimeProbe, TurnParser, TurnRequest, find_program
from overstory.runtimes.common import git_identity_env, guard_hook_command, probe_program

if t.TYPE_CHECKING:
    from overstory.config.model import Config

PACKAGE = "@google/gemini-cli"
HOME_DIR = "gemini-home"
SYSTEM_SETTINGS = "system-settings.json"
HOOK_TIMEOUT_MS = 60000
SHELL_TOOL = "run_shell_command"
HEADLESS_FLAGS = ["--output-format", "stream-json", "--skip-trust", "--approval-mode", "yolo"]
# Inherited variables that change gemini's auth, endpoint, system prompt, telemetry or sandbox.
_FOREIGN_PREFIXES = ("GEMINI_", "GOOGLE_", "OTEL_")
_FOREIGN_NAMES = ("SANDBOX", "CLOUD_SHELL", "SEATBELT_PROFILE", "BUILD_SANDBOX", "DEBUG", "DEBUG_MODE")


def settings(ov_command: list[str]) -> dict[str, t.Any]:
    return {
        "security": {"auth": {"selectedType": "gemini-api-key"}},
        "privacy": {"usageStatisticsEnabled": False},
        "telemetry": {"enabled": False},
        "general": {"enableAutoUpdate": False, "enableAutoUpdateNotification": False,
                    "sessionRetention": {"enabled": False}},
        "advanced": {"ignoreLocalEnv": True},
        "ide": {"enabled": False},
        "hooksConfig": {"enabled": True},
        "hooks": {
            "BeforeTool": [{"matcher": ".*", "hooks": [
                {"type": "command", "name": "ov-guard", "command": guard_hook_command(ov_command),
                 "timeout": HOOK_TIMEOUT_MS}]}],
            # The shell's receipts: the stream says "success" for any command that ran, with no exit code.
            "AfterTool": [{"matcher": f"^{SHELL_TOOL}$", "hooks": [
                {"type": "command", "name": "ov-receipt", "command": receipt_hook_command(ov_command),
                 "timeout": HOOK_TIMEOUT_MS}]}],
        },
    }


def receipt_hook_command(ov_command: list[str]) -> str:
    """``ov guard --post``, never exiting 2: an AfterTool hook that exits 2 replaces the call's result."""
    return " ".join(shlex.quote(part) for part in ov_command) + " guard --post || exit 1"


class GeminiRuntime(Runtime):
    name = "gemini"
    own_agent_tools = "Gemini CLI's own sub-agents (invoke_agent)"
    tool_hooks = frozenset({"pre"})  # receipts come from the stream, matched through hook_call,
    hook_receipts = frozenset({SHELL_TOOL})  # but a shell call's from its AfterTool hook (`ov guard --post`)
    hook_ids_match = False  # its BeforeTool hook is given no call id at all
    credential_vars = ("GEMINI_API_KEY",)  # `ov resume` after an auth park takes a fixed key from the operator
    usage_during_turn = False  # tokens only in the closing result's stats (docs/budgets.md)
    instructions_file = "GEMINI.md"  # in GEMINI_CLI_HOME/.gemini, not the worktree
    protocols = ("gemini",)

    def hook_call(self, tool: str, tool_input: dict[str, t.Any]) -> tuple[str, dict[str, t.Any]] | None:
        from overstory.guards.runtimes import gemini_call

        return gemini_call(tool, tool_input)  # the stream names tools and arguments as its hook does

    def _bin(self, config: Config | None) -> str:
        return config.runtime.gemini_bin if config is not None else os.environ.get("OV_RUNTIME_GEMINI_BIN", "gemini")

    def program(self, config: Config) -> list[str]:
        found = find_program(self._bin(config))
        if found is None:
            raise RuntimeNotAvailable(f"the gemini runtime needs `{self._bin(config)}` on PATH: npm install -g "
                                      f"{PACKAGE} (or set runtime.gemini_bin)")
        return [found]

    def headless_command(self, request: TurnRequest, config: Config) -> list[str]:
        argv = [*self.program(config), *HEADLESS_FLAGS]
        if request.model:
            argv += ["-m", request.model]
        if request.resume_session_id:
            argv += ["--resume", request.resume_session_id]
        return argv

    def stdin_message(self, prompt: str) -> bytes:
        return prompt.encode("utf-8")

    def new_parser(self) -> TurnParser:
        from overstory.runtimes.gemini.stream import GeminiTurnStream

        return GeminiTurnStream()

    def provider_env(self, base_url: str, api_key: str) -> dict[str, str]:
        return {"GOOGLE_GEMINI_BASE_URL": base_url, "GEMINI_API_KEY": api_key}

    def inherited_env(self, environ: t.Mapping[str, str]) -> dict[str, str]:
        env = {k: v for k, v in environ.items()
               if not (k.startswith(_FOREIGN_PREFIXES) or k in _FOREIGN_NAMES) or k == "GEMINI_API_KEY"}
        # Gemini's shell tool hides the user's global git config, and with it the commit identity.
        env.update(git_identity_env(environ))
        return env

    def state_dir(self, run_dir: Path) -> Path | None:
        return run_dir / HOME_DIR

    def turn_env(self, run_dir: Path) -> dict[str, str]:
        home = run_dir / HOME_DIR
        return {
            "GEMINI_CLI_HOME": str(home),
            # Absent when the settings had to go to the user level (see ``state_files``): then nothing.
            "GEMINI_CLI_SYSTEM_SETTINGS_PATH": str(home / SYSTEM_SETTINGS),
            "GEMINI_CLI_SYSTEM_DEFAULTS_PATH": str(home / "no-system-defaults.json"),  # not /etc/gemini-cli
            "GEMINI_CLI_NO_RELAUNCH": "true",
            "GEMINI_CLI_TRUST_WORKSPACE": "true",
            "NO_COLOR": "1",
        }

    def state_files(self, setup: AgentSetup) -> dict[str, str] | None:
        # System settings win over a worktree's .gemini/settings.json, but gemini skips a system settings
        # file below a directory others may write (/tmp, for one): the user level is the fallback.
        where = SYSTEM_SETTINGS if _safe_for_system_settings(self.state_dir(setup.run_dir) or setup.run_dir) \
            else ".gemini/settings.json"
        return {".gemini/GEMINI.md": setup.instructions, where: json.dumps(settings(setup.ov_command), indent=2)}

    def probe(self, config: Config | None) -> RuntimeProbe:
        if os.environ.get("GEMINI_API_KEY"):
            credentials = "GEMINI_API_KEY set"
        elif config is not None and any(p.protocol == "gemini" for p in config.providers.values()):
            credentials = "no GEMINI_API_KEY; a gemini provider is configured"
        else:
            credentials = "no GEMINI_API_KEY (and no gemini provider in config)"
        with tempfile.TemporaryDirectory(prefix="ov-gemini-probe-") as scratch:
            env = {**self.inherited_env({k: v for k, v in os.environ.items()}), **self.turn_env(Path(scratch))}
            found = probe_program(self.name, self._bin(config), env=env, credentials=credentials, package=PACKAGE,
                                  hint_key="gemini_bin")
        if found.installed:
            # 0.61 has tool hooks (BeforeTool): ov guard runs before every call, besides the sandbox.
            return RuntimeProbe(found.name, found.status,
                                f"{found.detail}; guard: BeforeTool hook; shell receipts: AfterTool hook",
                                found.credentials, found.hint)
        return found


def _safe_for_system_settings(directory: Path) -> bool:
    """No directory from ``directory`` up to / is writable by group or others (gemini's own check)."""
    for folder in (directory.resolve(), *directory.resolve().parents):
        try:
            mode = folder.stat().st_mode
        except OSError:
            continue  # not created yet: its parents decide
        if mode & 0o022:
            return False
    return True
