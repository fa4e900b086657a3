"""Finding the real Claude Code CLI and running it offline against ``tests/mockapi.py``.

    @requires_claude
    def test_something(tmp_path):
        with MockMessagesAPI([text_reply("hi")]) as api:
            env = claude_env(api.base_url, tmp_path)
            ...

When the binary is missing the test is skipped, except on CI (``CI=true``) where it
fails: end-to-end tests must never disappear silently.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import typing as t
from pathlib import Path

import pytest

from requires import requires

REPO_ROOT = Path(__file__).resolve().parent.parent


def pinned_version(name: str = "CLAUDE_CODE_VERSION") -> str:
    """A CLI version pinned in ``.ci/versions`` (the one place versions are pinned)."""
    for line in (REPO_ROOT / ".ci" / "versions").read_text().splitlines():
        key, _, value = line.partition("=")
        if key.strip() == name:
            return value.strip()
    raise KeyError(f"{name} is not pinned in .ci/versions")


CLAUDE_CODE_VERSION = pinned_version()

MISSING_MESSAGE = (
    f"real Claude Code CLI not found: run `bash .ci/test` (it installs the pinned {CLAUDE_CODE_VERSION}), or"
    f" `npm install --prefix .ci/node @anthropic-ai/claude-code@{CLAUDE_CODE_VERSION}`, or set OV_CLAUDE_BIN"
)

# Variables a parent Claude Code session exports; nested-session guards react to them.
_PARENT_SESSION_VARS = ("CLAUDECODE", "CLAUDE_CODE_ENTRYPOINT", "CLAUDE_CODE_SSE_PORT")

HEADLESS_ARGS = (
    "-p",
    "--output-format",
    "stream-json",
    "--input-format",
    "stream-json",
    "--verbose",
    "--permission-mode",
    "bypassPermissions",
)


def _executable(path: str | Path) -> str | None:
    candidate = Path(path)
    if candidate.is_file() and os.access(candidate, os.X_OK):
        return str(candidate)
    return None


def find_claude() -> str | None:
    """The claude binary: $OV_CLAUDE_BIN, then ``claude`` on PATH, then the repo's
    ``.ci/node`` install, then /tmp/claudeinst. None when none is executable."""
    explicit = os.environ.get("OV_CLAUDE_BIN")
    if explicit:
        return _executable(explicit) or shutil.which(explicit)
    on_path = shutil.which("claude")
    if on_path:
        return on_path
    for candidate in (
        REPO_ROOT / ".ci" / "node" / "node_modules" / ".bin" / "claude",
        Path("/tmp/claudeinst/node_modules/.bin/claude"),
    ):
        found = _executable(candidate)
        if found:
            return found
    return None


def claude_env(
    base_url: str,
    tmp_path: str | Path,
    *,
    api_key: str = "sk-ant-mock-0123456789abcdefghij",
    extra: t.Mapping[str, str] | None = None,
) -> dict[str, str]:
    """An environment that runs the CLI fully offline against ``base_url``.

    Sessions, settings and temp files go under ``tmp_path`` (``claude-config`` and
    ``claude-tmp``), never into the user's home; variables of an enclosing Claude
    session are removed.
    """
    root = Path(tmp_path)
    config_dir = root / "claude-config"
    tmp_dir = root / "claude-tmp"
    config_dir.mkdir(parents=True, exist_ok=True)
    tmp_dir.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k not in _PARENT_SESSION_VARS}
    for key in list(env):
        # Credentials or endpoints of the surrounding machine must not leak in.
        if key.startswith("ANTHROPIC_") or key in ("CLAUDE_CODE_USE_BEDROCK", "CLAUDE_CODE_USE_VERTEX"):
            del env[key]
    env.update(
        {
            "ANTHROPIC_BASE_URL": base_url,
            "ANTHROPIC_API_KEY": api_key,
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "CLAUDE_CODE_DISABLE_OFFICIAL_MARKETPLACE_AUTOINSTALL": "1",
            "CLAUDE_CONFIG_DIR": str(config_dir),
            "CLAUDE_CODE_TMPDIR": str(tmp_dir),
            "DISABLE_AUTOUPDATER": "1",
        }
    )
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        env["IS_SANDBOX"] = "1"
    if extra:
        env.update(extra)
    return env


def seed_interactive_config(env: t.Mapping[str, str], worktree: str | Path) -> Path:
    """Pre-seed ``$CLAUDE_CONFIG_DIR`` so the interactive TUI starts offline and idle.

    ``.claude.json``: onboarding done, the API key approved, ``worktree`` trusted.
    ``settings.json``: ``skipDangerousModePermissionPrompt`` so that
    ``--permission-mode bypassPermissions`` does not stop at its warning dialog (the
    same key also works in the worktree's ``.claude/settings.local.json``).
    """
    config_dir = Path(env["CLAUDE_CONFIG_DIR"])
    settings_file = config_dir / "settings.json"
    settings: dict[str, t.Any] = json.loads(settings_file.read_text()) if settings_file.exists() else {}
    settings["skipDangerousModePermissionPrompt"] = True
    settings_file.write_text(json.dumps(settings, indent=2))
    config_file = config_dir / ".claude.json"
    data: dict[str, t.Any] = {}
    if config_file.exists():
        data = json.loads(config_file.read_text())
    data["hasCompletedOnboarding"] = True
    key = env.get("ANTHROPIC_API_KEY", "")
    approved = data.setdefault("customApiKeyResponses", {"approved": [], "rejected": []})
    if key[-20:] not in approved.setdefault("approved", []):
        approved["approved"].append(key[-20:])
    approved.setdefault("rejected", [])
    projects = data.setdefault("projects", {})
    project = projects.setdefault(str(Path(worktree).resolve()), {})
    project["hasTrustDialogAccepted"] = True
    project.setdefault("allowedTools", [])
    config_file.write_text(json.dumps(data, indent=2))
    return config_file


def user_message_line(text: str) -> str:
    """One stream-json user turn as the CLI reads it on stdin (newline included)."""
    return json.dumps({"type": "user", "message": {"role": "user", "content": text}}) + "\n"


def parse_stream(stdout: str) -> list[dict[str, t.Any]]:
    """The JSON events of a stream-json stdout; non-JSON lines are kept as ``{"type": "_raw"}``."""
    events: list[dict[str, t.Any]] = []
    for line in stdout.splitlines():
        if not line.strip():
            continue
        try:
            events.append(json.loads(line))
        except json.JSONDecodeError:
            events.append({"type": "_raw", "line": line})
    return events


def run_headless_turn(
    claude: str,
    prompt: str,
    *,
    cwd: str | Path,
    env: t.Mapping[str, str],
    resume: str | None = None,
    extra_args: t.Sequence[str] = (),
    timeout: float = 60.0,
) -> subprocess.CompletedProcess[str]:
    """One headless turn: the prompt through a pipe, stdin closed, wait (bounded)."""
    args = [claude, *HEADLESS_ARGS, *extra_args]
    if resume:
        args += ["--resume", resume]
    return subprocess.run(
        args,
        input=user_message_line(prompt),
        cwd=str(cwd),
        env=dict(env),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


# Resolved once at import: tests/conftest.py removes OV_* variables (OV_CLAUDE_BIN too)
# from the environment of each test, so a later lookup could miss an explicit binary.
CLAUDE_BIN = find_claude()

def requires_claude(test: t.Callable[..., t.Any]) -> t.Any:
    """Mark a test as e2e; skip it when the real CLI is not installed (fail it under CI=true)."""
    return requires(CLAUDE_BIN is not None, MISSING_MESSAGE, e2e=True)(test)


@pytest.fixture
def claude_bin() -> str:
    """The claude binary path; skips (or fails on CI) when it is missing."""
    found = CLAUDE_BIN
    if found is None:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(MISSING_MESSAGE + " (CI=true: e2e tests must not be skipped)", pytrace=False)
        pytest.skip(MISSING_MESSAGE)
    return found
