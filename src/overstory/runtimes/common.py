"""Small pieces the adapters of the codex, gemini and opencode CLIs share.

Standard library only: parsers run inside the per-agent loop.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import tempfile
import time
import typing as t
from pathlib import Path

from overstory.runtimes.base import AUTH, PERMANENT, RATE_LIMIT, TRANSIENT, ParsedEvent, RuntimeProbe, find_program

ARG_LIMIT = 300
TEXT_LIMIT = 2000
GUARD_FAILED = "ov guard failed, so the call was blocked to be safe"


def trim(text: t.Any, limit: int) -> str | None:
    if text is None:
        return None
    text = str(text)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def parse_json_line(line: str) -> dict[str, t.Any] | ParsedEvent | None:
    """A stdout line as a JSON object; a ``malformed_line`` event when it is not one; None when blank."""
    line = line.strip()
    if not line:
        return None
    try:
        event = json.loads(line)
    except ValueError:
        event = None
    if not isinstance(event, dict):
        return ParsedEvent("malformed_line", summary=line[:200], data={"line": line[:TEXT_LIMIT]})
    return event


def describe_args(args: t.Any, keys: t.Sequence[str] = ("command", "cmd", "file_path", "filePath", "path",
                                                         "pattern", "url", "query", "prompt")) -> str:
    """A short rendering of a tool call's arguments."""
    if isinstance(args, dict):
        for key in keys:
            if key in args:
                return trim(args[key], ARG_LIMIT) or ""
        return trim(json.dumps(args, ensure_ascii=False), ARG_LIMIT) or ""
    return trim(args, ARG_LIMIT) or ""


def kind_of_status(code: int | None) -> str:
    """The failure kind of an HTTP status a provider answered with."""
    if code is None:
        return TRANSIENT
    if code == 429:
        return RATE_LIMIT
    if code in (401, 403):
        return AUTH
    if code in (408, 409, 425) or code >= 500:
        return TRANSIENT
    return PERMANENT


def reset_after(seconds: float | None, now: float | None = None) -> int | None:
    """Epoch milliseconds ``seconds`` from now (None when the wait is unknown)."""
    if seconds is None:
        return None
    return int(((time.time() if now is None else now) + seconds) * 1000)


_DELAY = re.compile(r"(?:retry[-_ ]?(?:after|delay)(-ms)?|try again in)[\"':= ]*\"?(\d+(?:\.\d+)?)\s*(ms|s)?",
                    re.IGNORECASE)


def retry_seconds(text: str) -> float | None:
    """A retry delay a provider put into an error text ("retryDelay": "12s", "try again in 3s",
    retry-after: 3, retry-after-ms: 500)."""
    match = _DELAY.search(text or "")
    if not match:
        return None
    value = float(match.group(2))
    return value / 1000 if match.group(1) or match.group(3) == "ms" else value


def guard_hook_command(ov_command: list[str]) -> str:
    """The shell command a runtime's pre-tool hook runs: ``ov guard``, and a refusal (exit 2 with a reason
    on stderr) if ov guard itself fails, because some CLIs let a call through when a hook crashes."""
    prefix = " ".join(shlex.quote(part) for part in ov_command)
    return f"{prefix} guard || {{ echo {shlex.quote(GUARD_FAILED)} >&2; exit 2; }}"


def git_identity_env(environ: t.Mapping[str, str]) -> dict[str, str]:
    """GIT_AUTHOR_*/GIT_COMMITTER_* from git's own config, for CLIs whose shell tool hides the user's
    global git config (a commit would fail without an identity). Variables already set are kept."""
    env: dict[str, str] = {}
    for key, names in (("user.name", ("GIT_AUTHOR_NAME", "GIT_COMMITTER_NAME")),
                       ("user.email", ("GIT_AUTHOR_EMAIL", "GIT_COMMITTER_EMAIL"))):
        if all(environ.get(name) for name in names):
            continue
        try:
            found = subprocess.run(["git", "config", "--get", key], capture_output=True, text=True, timeout=10,
                                   env=dict(environ), check=False).stdout.strip()
        except (OSError, subprocess.TimeoutExpired):
            found = ""
        for name in names:
            if found and not environ.get(name):
                env[name] = found
    return env


def under_temp_dir(path: Path) -> bool:
    """Whether ``path`` lies in the system temp dir (some CLIs refuse to keep helper files there)."""
    resolved = os.path.realpath(path)
    for temp in {tempfile.gettempdir(), "/tmp"}:
        root = os.path.realpath(temp)
        if resolved == root or resolved.startswith(root.rstrip(os.sep) + os.sep):
            return True
    return False


def probe_program(name: str, configured: str, *, env: t.Mapping[str, str], credentials: str, package: str,
                  hint_key: str, version_args: t.Sequence[str] = ("--version",)) -> RuntimeProbe:
    """``ov doctor``'s look at one CLI: found? answers ``--version``? (run with ``env``, in a scratch home)."""
    path = find_program(configured)
    if path is None:
        return RuntimeProbe(name, "missing", f"{configured} not found on PATH", credentials,
                            f"npm install -g {package}, or set runtime.{hint_key}")
    try:
        result = subprocess.run([path, *version_args], capture_output=True, text=True, timeout=30, env=dict(env),
                                stdin=subprocess.DEVNULL, check=False)
    except (OSError, subprocess.TimeoutExpired):
        result = None
    lines = ((result.stdout or result.stderr).strip().splitlines() if result is not None else [])
    if result is None or result.returncode != 0 or not lines:
        return RuntimeProbe(name, "broken", f"{path} did not report a version", credentials, f"reinstall {package}")
    return RuntimeProbe(name, "ok", f"{lines[-1].strip()} at {path}", credentials)
