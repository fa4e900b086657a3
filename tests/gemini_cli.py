"""Finding the real Gemini CLI and running it offline against ``tests/mock_gemini_api.py``.

    @requires_gemini
    def test_something(gemini, repo, tmp_path):
        with MockGeminiAPI([text_reply("hi")]) as api:
            env = gemini_env(api.base_url, tmp_path)
            proc = run_headless_turn(gemini, "say hi", cwd=repo, env=env)

When the binary is missing the test is skipped, except on CI (``CI=true``) where it
fails: end-to-end tests must never disappear silently. The facts behind the
environment and settings below are in tests/fixtures/GEMINI_PROBE_NOTES.md.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import typing as t
from pathlib import Path

import pytest

from claude_cli import pinned_version as pinned
from requires import requires

REPO_ROOT = Path(__file__).resolve().parent.parent

GEMINI_VERSION = pinned("GEMINI_CLI_VERSION")
MISSING_MESSAGE = (
    f"real Gemini CLI not found: run `npm install --prefix .ci/node @google/gemini-cli@{GEMINI_VERSION}`"
    " or set OV_GEMINI_BIN"
)

# A concrete model: the default "auto" first asks a router model (a side request).
DEFAULT_MODEL = "gemini-2.5-flash"

# Variables of the surrounding machine that would change auth, endpoint or sandboxing.
_FOREIGN_PREFIXES = ("GEMINI_", "GOOGLE_", "OTEL_")
_FOREIGN_NAMES = ("SANDBOX", "CLOUD_SHELL", "SEATBELT_PROFILE", "BUILD_SANDBOX", "DEBUG", "DEBUG_MODE")

# settings.json that keeps the CLI offline and non-interactive (measured with 0.61.0).
OFFLINE_SETTINGS: dict[str, t.Any] = {
    # Without it GOOGLE_GEMINI_BASE_URL selects the "gateway" auth type, which -p rejects
    # ("Invalid auth method selected.", exit 41).
    "security": {"auth": {"selectedType": "gemini-api-key"}},
    # The usage-statistics logger resolves play.googleapis.com otherwise.
    "privacy": {"usageStatisticsEnabled": False},
    "telemetry": {"enabled": False},
    "general": {
        "enableAutoUpdate": False,
        "enableAutoUpdateNotification": False,
        # Default: chats older than 30 days are deleted, and could no longer be resumed.
        "sessionRetention": {"enabled": False},
    },
    # Do not pick up a .env file from the worktree or its parents.
    "advanced": {"ignoreLocalEnv": True},
    "ide": {"enabled": False},
}

HEADLESS_ARGS = ("--output-format", "stream-json", "--skip-trust", "--approval-mode", "yolo")


def _executable(path: str | Path) -> str | None:
    candidate = Path(path)
    if candidate.is_file() and os.access(candidate, os.X_OK):
        return str(candidate)
    return None


def find_gemini() -> str | None:
    """The gemini binary: $OV_GEMINI_BIN, then the repo's ``.ci/node`` install.
    None when neither is executable. (``gemini`` on PATH is not used: the tests pin
    the behaviour of one version.)"""
    explicit = os.environ.get("OV_GEMINI_BIN")
    if explicit:
        return _executable(explicit) or shutil.which(explicit)
    return _executable(REPO_ROOT / ".ci" / "node" / "node_modules" / ".bin" / "gemini")


def deep_merge(base: dict[str, t.Any], extra: t.Mapping[str, t.Any]) -> dict[str, t.Any]:
    """``base`` updated by ``extra``, nested objects merged key by key."""
    merged = dict(base)
    for key, value in extra.items():
        if isinstance(value, t.Mapping) and isinstance(merged.get(key), dict):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def gemini_home(env: t.Mapping[str, str]) -> Path:
    """The ``.gemini`` folder the CLI uses for this environment (settings, chats, GEMINI.md)."""
    return Path(env["GEMINI_CLI_HOME"]) / ".gemini"


def write_settings(env: t.Mapping[str, str], settings: t.Mapping[str, t.Any] | None = None) -> Path:
    """Write ``OFFLINE_SETTINGS`` merged with ``settings`` as the user settings file."""
    path = gemini_home(env) / "settings.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(deep_merge(OFFLINE_SETTINGS, settings or {}), indent=2))
    return path


def gemini_env(
    base_url: str,
    tmp_path: str | Path,
    *,
    api_key: str = "mock-gemini-key-0123456789",
    settings: t.Mapping[str, t.Any] | None = None,
    relaunch: bool = False,
    extra: t.Mapping[str, str] | None = None,
) -> dict[str, str]:
    """An environment that runs the CLI fully offline against ``base_url``.

    Everything the CLI keeps (settings, chats, project registry) goes under
    ``tmp_path/gemini-home`` through GEMINI_CLI_HOME; HOME points to an empty
    ``tmp_path/home`` too, because one file (``~/.gemini/policies/sandbox.toml``) is read
    from the real home even with GEMINI_CLI_HOME set. TMPDIR holds the CLI's error
    reports and shell scratch files. The system settings paths point at files that do
    not exist, so /etc/gemini-cli is not read. ``relaunch=False`` sets
    GEMINI_CLI_NO_RELAUNCH: one node process instead of a launcher that ignores
    SIGTERM plus a child.
    """
    root = Path(tmp_path)
    home = root / "home"
    cli_home = root / "gemini-home"
    tmp_dir = root / "gemini-tmp"
    for folder in (home, cli_home, tmp_dir):
        folder.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(_FOREIGN_PREFIXES) and k not in _FOREIGN_NAMES}
    env.update(
        {
            "HOME": str(home),
            "GEMINI_CLI_HOME": str(cli_home),
            "TMPDIR": str(tmp_dir),
            "GEMINI_API_KEY": api_key,
            "GOOGLE_GEMINI_BASE_URL": base_url,
            "GEMINI_CLI_SYSTEM_SETTINGS_PATH": str(root / "no-system-settings.json"),
            "GEMINI_CLI_SYSTEM_DEFAULTS_PATH": str(root / "no-system-defaults.json"),
            "NO_COLOR": "1",
        }
    )
    if not relaunch:
        env["GEMINI_CLI_NO_RELAUNCH"] = "true"
    if extra:
        env.update(extra)
    write_settings(env, settings)
    return env


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


def headless_command(
    gemini: str,
    prompt: str,
    *,
    model: str = DEFAULT_MODEL,
    resume: str | None = None,
    session_id: str | None = None,
    extra_args: t.Sequence[str] = (),
) -> list[str]:
    args = [gemini, "-p", prompt, "-m", model, *HEADLESS_ARGS, *extra_args]
    if resume:
        args += ["--resume", resume]
    if session_id:
        args += ["--session-id", session_id]
    return args


def run_headless_turn(
    gemini: str,
    prompt: str,
    *,
    cwd: str | Path,
    env: t.Mapping[str, str],
    model: str = DEFAULT_MODEL,
    resume: str | None = None,
    session_id: str | None = None,
    extra_args: t.Sequence[str] = (),
    timeout: float = 60.0,
) -> subprocess.CompletedProcess[str]:
    """One headless turn: the prompt in ``-p``, stdin at EOF, wait (bounded).

    Stdin must not be left open: without ``-p`` content the CLI reads stdin, and a pipe
    that delivers data but never closes keeps it waiting.
    """
    return subprocess.run(
        headless_command(gemini, prompt, model=model, resume=resume, session_id=session_id, extra_args=extra_args),
        stdin=subprocess.DEVNULL,
        cwd=str(cwd),
        env=dict(env),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


# Resolved once at import: tests/conftest.py removes OV_* variables (OV_GEMINI_BIN too)
# from the environment of each test, so a later lookup could miss an explicit binary.
GEMINI_BIN = find_gemini()

def requires_gemini(test: t.Callable[..., t.Any]) -> t.Any:
    """Mark a test as e2e; skip it when the real CLI is not installed (fail it under CI=true)."""
    return requires(GEMINI_BIN is not None, MISSING_MESSAGE, e2e=True)(test)


@pytest.fixture
def gemini_bin() -> str:
    """The gemini binary path; skips (or fails on CI) when it is missing."""
    found = GEMINI_BIN
    if found is None:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(MISSING_MESSAGE + " (CI=true: e2e tests must not be skipped)", pytrace=False)
        pytest.skip(MISSING_MESSAGE)
    return found
