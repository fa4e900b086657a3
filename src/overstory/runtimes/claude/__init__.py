"""The ``claude`` runtime: Claude Code's headless stream-json mode, its hooks and its TUI.

Facts about the CLI that this adapter relies on are measured in
tests/fixtures/CLAUDE_PROBE_NOTES.md.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import typing as t
from pathlib import Path

from overstory import jsontext
from overstory.errors import RuntimeNotAvailable
from overstory.runtimes.base import Runtime, RuntimeProbe, Tui, TurnParser, TurnRequest, find_program
from overstory.runtimes.claude.tui import SETTING_SOURCES_FLAGS

if t.TYPE_CHECKING:
    from overstory.config.model import Config

STREAM_FLAGS = ["-p", "--output-format", "stream-json", "--input-format", "stream-json", "--verbose",
                "--permission-mode", "bypassPermissions"]
INSTALL_HINT = "npm install -g @anthropic-ai/claude-code (or set runtime.claude_bin, or use --runtime scripted)"
# The oldest Claude Code ov supports: HTTP hooks with "onFailure" (a guard that fails closed) came in 2.1.295.
MIN_VERSION = (2, 1, 295)


STATE_DIR_NAME = "claude"  # CLAUDE_CONFIG_DIR of one agent, under its run dir
# Keys of the user's own .claude.json an agent's config dir needs to start without questions:
# onboarding done, the API key approved, the account of a login.
SEEDED_KEYS = ("hasCompletedOnboarding", "lastOnboardingVersion", "customApiKeyResponses", "oauthAccount",
               "userID", "theme")


def agent_flags(run_dir: Path, instructions_file: str, settings_file: str | Path) -> list[str]:
    """``--settings FILE --setting-sources "" --strict-mcp-config --append-system-prompt-file FILE``.

    Both files live in the agent's run dir (ov's, read-only inside the sandbox), so nothing the
    agent writes in its worktree or config dir can replace or weaken them.
    """
    flags: list[str] = []
    settings = run_dir / settings_file
    if settings.is_file():
        flags += ["--settings", str(settings)]
    flags += SETTING_SOURCES_FLAGS
    instructions = run_dir / instructions_file
    if instructions.is_file():
        flags += ["--append-system-prompt-file", str(instructions)]
    return flags


def seed_config_dir(state_dir: Path, environ: t.Mapping[str, str], cwd: Path) -> None:
    """Give an agent's own CLAUDE_CONFIG_DIR what it needs from the user's: the login and the
    answers to first-run questions. Nothing else is copied (no settings, no MCP servers). The
    directory it works in is marked trusted: ov created it (or it is the project the user slung
    the agent in)."""
    state_dir.mkdir(parents=True, exist_ok=True)
    source_dir = Path(environ["CLAUDE_CONFIG_DIR"]) if environ.get("CLAUDE_CONFIG_DIR") else None
    home = Path(environ.get("HOME") or Path.home())
    if source_dir is not None and source_dir.resolve() == state_dir.resolve():
        return
    credentials = (source_dir or home / ".claude") / ".credentials.json"
    target = state_dir / ".credentials.json"
    try:
        if credentials.is_file() and (not target.exists() or credentials.stat().st_mtime > target.stat().st_mtime):
            data = credentials.read_bytes()
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
    except OSError:
        pass  # no login to copy: an API key in the environment still works
    source_json = source_dir / ".claude.json" if source_dir is not None else home / ".claude.json"
    try:
        source = jsontext.loads(source_json.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        source = {}
    own_json = state_dir / ".claude.json"
    try:
        own = jsontext.loads(own_json.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        own = {}
    wanted = {key: source[key] for key in SEEDED_KEYS if isinstance(source, dict) and key in source}
    projects = own.get("projects") if isinstance(own.get("projects"), dict) else {}
    project = projects.get(str(cwd)) if isinstance(projects.get(str(cwd)), dict) else {}
    if any(own.get(key) != value for key, value in wanted.items()) or not project.get("hasTrustDialogAccepted"):
        own.update(wanted)
        own["projects"] = {**projects, str(cwd): {**project, "hasTrustDialogAccepted": True}}
        own_json.write_text(jsontext.dumps(own, indent=2), encoding="utf-8")


def hook_settings(ov_command: list[str], *, tmux_mode: bool) -> dict[str, t.Any]:
    """Settings that send every tool call through ``ov guard`` (and, in tmux mode, mail into prompts).

    In tmux mode PostToolUse and PostToolUseFailure (a failed Bash gets only the latter) run
    ``ov guard --post``, which stores the call's result in the tool-call ledger. A headless
    turn needs no such hook: the turn runner reads the same result from the stream
    (``ledger.StreamLedger``), so each tool call starts one process, not two.
    """
    prefix = " ".join(shlex.quote(part) for part in ov_command)
    settings: dict[str, t.Any] = {
        "hooks": {"PreToolUse": [{"matcher": ".*", "hooks": [{"type": "command", "command": f"{prefix} guard"}]}]}
    }
    if tmux_mode:
        post = [{"matcher": ".*", "hooks": [{"type": "command", "command": f"{prefix} guard --post"}]}]
        settings["hooks"]["PostToolUse"] = settings["hooks"]["PostToolUseFailure"] = post
        inject = [{"hooks": [{"type": "command", "command": f"{prefix} mail check --inject"}]}]
        settings["hooks"]["UserPromptSubmit"] = inject
        settings["hooks"]["SessionStart"] = inject
    return settings


def project_folder(cwd: Path) -> str:
    """The folder of ``$CLAUDE_CONFIG_DIR/projects`` that holds the sessions of ``cwd``: every character that
    is not a letter or digit becomes ``-`` (CLAUDE_PROBE_NOTES.md)."""
    return re.sub(r"[^A-Za-z0-9]", "-", str(cwd))


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
    http_hooks = True  # since 2.1.63; fail-closed ("onFailure") since MIN_VERSION
    usage_during_turn = True  # each assistant event carries its API message's usage
    instructions_file = ".claude/CLAUDE.md"
    run_instructions_file = "CLAUDE.md"
    run_settings_file = "settings.json"
    tmp_env_vars = ("CLAUDE_CODE_TMPDIR",)
    protocols = ("anthropic",)
    credential_vars = ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN", "CLAUDE_CODE_OAUTH_TOKEN")
    session_fork = "claude --resume SESSION --fork-session"

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
            if request.fork_session:
                flags.append("--fork-session")
        return flags + agent_flags(request.run_dir, self.run_instructions_file,
                                   request.settings_file or self.run_settings_file)

    def stdin_message(self, prompt: str) -> bytes:
        message = {"type": "user", "message": {"role": "user", "content": prompt}}
        return (jsontext.dumps(message, ensure_ascii=False) + "\n").encode("utf-8")

    def new_parser(self) -> TurnParser:
        from overstory.runtimes.claude.stream import TurnStream

        return TurnStream()

    def provider_env(self, base_url: str, api_key: str) -> dict[str, str]:
        return {"ANTHROPIC_BASE_URL": base_url, "ANTHROPIC_API_KEY": api_key}

    def turn_env(self, run_dir: Path) -> dict[str, str]:
        env = {"CLAUDE_CONFIG_DIR": str(self.state_dir(run_dir))}
        if hasattr(os, "geteuid") and os.geteuid() == 0:
            env["IS_SANDBOX"] = "1"  # claude refuses bypassPermissions as root otherwise
        return env

    def state_dir(self, run_dir: Path) -> Path | None:
        return run_dir / STATE_DIR_NAME

    def prepare_state(self, state_dir: Path, environ: t.Mapping[str, str], cwd: Path) -> None:
        seed_config_dir(state_dir, environ, cwd)

    def hook_settings(self, ov_command: list[str], *, tmux_mode: bool) -> dict[str, t.Any] | None:
        return hook_settings(ov_command, tmux_mode=tmux_mode)

    def import_session(self, source_state_dir: Path, source_cwd: Path, state_dir: Path, cwd: Path,
                       session_id: str) -> bool:
        """``--resume`` looks only in the folder of the cwd it runs in: the session's jsonl (and its folder of
        sub-agent transcripts, when there is one) go there, under this agent's CLAUDE_CONFIG_DIR."""
        import shutil

        if not re.fullmatch(r"[0-9A-Za-z-]+", session_id):
            return False
        source = source_state_dir / "projects" / project_folder(source_cwd)
        target = state_dir / "projects" / project_folder(cwd)
        if not (source / f"{session_id}.jsonl").is_file():
            return False
        target.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source / f"{session_id}.jsonl", target / f"{session_id}.jsonl")
        if (source / session_id).is_dir():
            shutil.copytree(source / session_id, target / session_id, dirs_exist_ok=True)
        return True

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
