"""Finding the real OpenCode CLI and running it offline against ``tests/mock_openai_chat.py``.

    @requires_opencode
    def test_something(tmp_path):
        with MockChatAPI([text_reply("hi")]) as api:
            env = opencode_env(api.base_url, tmp_path / "oc", worktree=repo)
            proc = run_turn(OPENCODE_BIN, "say hi", cwd=repo, env=env)

All of OpenCode's state (config, sessions database, logs, caches) goes under one
directory given by the caller, through HOME and the XDG_* variables, so the user's own
configuration is never read or written. The facts behind each setting are in
tests/fixtures/OPENCODE_PROBE_NOTES.md.

When the binary is missing the test is skipped, except on CI (``CI=true``) where it
fails: end-to-end tests must never disappear silently.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import threading
import typing as t
from pathlib import Path

import pytest

from claude_cli import pinned_version as pinned
from requires import requires

REPO_ROOT = Path(__file__).resolve().parent.parent

OPENCODE_VERSION = pinned("OPENCODE_VERSION")
PROVIDER_ID = "mock"
MODEL_ID = "mock-model"
MODEL = f"{PROVIDER_ID}/{MODEL_ID}"
API_KEY_VAR = "OV_MOCK_OPENAI_KEY"

MISSING_MESSAGE = (
    f"real OpenCode CLI not found: run `npm install --prefix .ci/node opencode-ai@{OPENCODE_VERSION}`"
    " or set OV_OPENCODE_BIN"
)

# The npm launcher is a shell stub until its postinstall links the native binary in.
_STUB_MAX_BYTES = 64 * 1024


def _real_binary(path: str | Path) -> str | None:
    candidate = Path(path)
    try:
        if candidate.is_file() and os.access(candidate, os.X_OK) and candidate.stat().st_size > _STUB_MAX_BYTES:
            return str(candidate)
    except OSError:
        return None
    return None


def find_opencode() -> str | None:
    """The opencode binary: $OV_OPENCODE_BIN, else the repo's ``.ci/node`` install
    (its launcher, or the platform package's binary when postinstall did not run)."""
    explicit = os.environ.get("OV_OPENCODE_BIN")
    if explicit:
        return _real_binary(explicit)
    modules = REPO_ROOT / ".ci" / "node" / "node_modules"
    for candidate in (modules / ".bin" / "opencode", modules / "opencode-linux-x64" / "bin" / "opencode"):
        found = _real_binary(candidate)
        if found:
            return found
    return None


# --------------------------------------------------------------------------- state and config


def opencode_config(
    base_url: str,
    *,
    title: bool = False,
    cost: tuple[float, float] | None = None,
    provider_options: t.Mapping[str, t.Any] | None = None,
    extra: t.Mapping[str, t.Any] | None = None,
) -> dict[str, t.Any]:
    """An ``opencode.json`` with one OpenAI-compatible provider pointing at ``base_url``.

    ``title=False`` disables the session-title side request. ``cost`` is (input, output)
    USD per million tokens. ``provider_options`` go next to ``baseURL`` (``headerTimeout``,
    ``chunkTimeout``, ``timeout`` in ms).
    """
    model: dict[str, t.Any] = {"name": "Mock Model"}
    if cost is not None:
        model["cost"] = {"input": cost[0], "output": cost[1]}
    config: dict[str, t.Any] = {
        "$schema": "https://opencode.ai/config.json",
        "provider": {
            PROVIDER_ID: {
                "npm": "@ai-sdk/openai-compatible",
                "name": "Mock",
                "options": {"baseURL": base_url, "apiKey": f"{{env:{API_KEY_VAR}}}", **(provider_options or {})},
                "models": {MODEL_ID: model},
            }
        },
        "model": MODEL,
        "autoupdate": False,
        "share": "disabled",
        "snapshot": False,
    }
    if not title:
        config["agent"] = {"title": {"disable": True}}
    config.update(extra or {})
    return config


def seed_state_dir(root: str | Path) -> dict[str, Path]:
    """Create HOME and the four XDG directories under ``root``.

    The global config directory gets an empty ``node_modules`` and a lock file that
    already list ``@opencode-ai/plugin``: otherwise every start runs a background
    ``npm install`` of that package there (a registry download).
    """
    base = Path(root)
    dirs = {name: base / name for name in ("home", "config", "data", "cache", "state")}
    for path in dirs.values():
        path.mkdir(parents=True, exist_ok=True)
    config_dir = dirs["config"] / "opencode"
    (config_dir / "node_modules").mkdir(parents=True, exist_ok=True)
    wanted = {"@opencode-ai/plugin": OPENCODE_VERSION}
    (config_dir / "package.json").write_text(json.dumps({"dependencies": wanted}, indent=2))
    lock = {"lockfileVersion": 3, "packages": {"": {"dependencies": wanted}}}
    (config_dir / "package-lock.json").write_text(json.dumps(lock, indent=2))
    dirs["config_dir"] = config_dir
    return dirs


def opencode_env(
    base_url: str,
    root: str | Path,
    *,
    worktree: str | Path,
    config: t.Mapping[str, t.Any] | None = None,
    api_key: str = "sk-mock-0123456789",
    extra: t.Mapping[str, str] | None = None,
) -> dict[str, str]:
    """An environment that runs opencode offline against ``base_url`` with all state under ``root``.

    The config is written to ``$XDG_CONFIG_HOME/opencode/opencode.json`` (``config`` or
    ``opencode_config(base_url)``). ``PWD`` is set to ``worktree``: opencode takes its
    directory from $PWD before the real cwd.
    """
    dirs = seed_state_dir(root)
    (dirs["config_dir"] / "opencode.json").write_text(json.dumps(dict(config or opencode_config(base_url)), indent=2))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENCODE", "XDG_"))}
    env.update(
        {
            "HOME": str(dirs["home"]),
            "XDG_CONFIG_HOME": str(dirs["config"]),
            "XDG_DATA_HOME": str(dirs["data"]),
            "XDG_CACHE_HOME": str(dirs["cache"]),
            "XDG_STATE_HOME": str(dirs["state"]),
            "OPENCODE_DISABLE_MODELS_FETCH": "1",
            "OPENCODE_DISABLE_AUTOUPDATE": "1",
            "PWD": str(Path(worktree).resolve()),
            API_KEY_VAR: api_key,
        }
    )
    if extra:
        env.update(extra)
    return env


def parse_events(stdout: str) -> list[dict[str, t.Any]]:
    """The JSON events of ``--format json`` stdout; non-JSON lines are kept as ``{"type": "_raw"}``."""
    events: list[dict[str, t.Any]] = []
    for line in stdout.splitlines():
        if not line.strip():
            continue
        try:
            events.append(json.loads(line))
        except json.JSONDecodeError:
            events.append({"type": "_raw", "line": line})
    return events


def run_turn(
    opencode: str,
    prompt: str | None,
    *,
    cwd: str | Path,
    env: t.Mapping[str, str],
    session: str | None = None,
    extra_args: t.Sequence[str] = (),
    timeout: float = 60.0,
) -> subprocess.CompletedProcess[str]:
    """One headless turn: ``opencode run --format json``, the prompt on stdin, then EOF.

    The prompt goes through stdin because an argument containing a space reaches the
    model wrapped in double quotes; stdin must be closed either way (opencode reads it
    to EOF whenever it is not a TTY).
    """
    args = [opencode, "run", "--format", "json", "--model", MODEL, *extra_args]
    if session:
        args += ["--session", session]
    return subprocess.run(
        args,
        input=prompt if prompt is not None else "",
        cwd=str(cwd),
        env=dict(env),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


class RefusingProxy:
    """An HTTP(S) proxy on 127.0.0.1 that answers 403 to everything and records the
    first line of each request: set it as HTTPS_PROXY to see what would leave the box."""

    def __init__(self) -> None:
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(16)
        self.lines: list[str] = []
        self._thread = threading.Thread(target=self._serve, name="refusing-proxy", daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._sock.getsockname()[1]}"

    def env(self) -> dict[str, str]:
        return {
            "HTTPS_PROXY": self.url,
            "HTTP_PROXY": self.url,
            "https_proxy": self.url,
            "http_proxy": self.url,
            "NO_PROXY": "127.0.0.1,localhost",
            "no_proxy": "127.0.0.1,localhost",
        }

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            with conn:
                try:
                    conn.settimeout(2)
                    first = conn.recv(4096).split(b"\r\n", 1)[0].decode(errors="replace")
                    self.lines.append(first)
                    conn.sendall(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                except OSError:
                    pass

    def close(self) -> None:
        self._sock.close()

    def __enter__(self) -> t.Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


# Resolved once at import: tests/conftest.py removes OV_* variables (OV_OPENCODE_BIN too)
# from the environment of each test, so a later lookup could miss an explicit binary.
OPENCODE_BIN = find_opencode()

def requires_opencode(test: t.Callable[..., t.Any]) -> t.Any:
    """Mark a test as e2e; skip it when the real CLI is not installed (fail it under CI=true)."""
    return requires(OPENCODE_BIN is not None, MISSING_MESSAGE, e2e=True)(test)


@pytest.fixture
def opencode_bin() -> str:
    """The opencode binary path; skips (or fails on CI) when it is missing."""
    found = OPENCODE_BIN
    if found is None:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(MISSING_MESSAGE + " (CI=true: e2e tests must not be skipped)", pytrace=False)
        pytest.skip(MISSING_MESSAGE)
    return found
