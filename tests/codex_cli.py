"""Finding the real Codex CLI and running it offline against ``tests/mock_openai_responses.py``.

    @requires_codex
    def test_something(tmp_path):
        with MockResponsesAPI([text_reply("hi")]) as api:
            env = codex_env(api.base_url, tmp_path)
            result = run_exec(CODEX_BIN, "say hi", cwd=repo, env=env)

When the binary is missing the test is skipped, except on CI (``CI=true``) where it
fails: end-to-end tests must never disappear silently. Facts behind the choices here:
tests/fixtures/CODEX_PROBE_NOTES.md (measured with @openai/codex 0.169.0).
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
import typing as t
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from claude_cli import pinned_version as pinned
from requires import requires

REPO_ROOT = Path(__file__).resolve().parent.parent

CODEX_VERSION = pinned("CODEX_VERSION")
MISSING_MESSAGE = (
    f"real Codex CLI not found: run `npm install --prefix .ci/node @openai/codex@{CODEX_VERSION}` or set OV_CODEX_BIN"
)

# The model name is deliberately not in codex's bundled catalog: unknown models get the
# plain function tools (exec_command, ...) the mock scripts. A catalog model such as
# gpt-6.1-sol gets a JavaScript "code mode" tool instead (see the probe notes).
MOCK_MODEL = "mock-model"
MOCK_KEY_ENV = "OV_TEST_CODEX_API_KEY"

# Nothing but 127.0.0.1 may be reached: a dead proxy catches anything that is not.
_DEAD_PROXY = "http://127.0.0.1:9"

# Variables a parent codex exports into its tool processes; a nested codex must not
# inherit another session's home or ids.
_PARENT_SESSION_PREFIXES = ("CODEX_", "OPENAI_")


def _executable(path: str | Path) -> str | None:
    candidate = Path(path)
    if candidate.is_file() and os.access(candidate, os.X_OK):
        return str(candidate)
    return None


def find_codex() -> str | None:
    """The codex binary: $OV_CODEX_BIN, else the repo's ``.ci/node`` install. None when
    neither is executable (a ``codex`` on PATH is ignored: it may read ~/.codex)."""
    explicit = os.environ.get("OV_CODEX_BIN")
    if explicit:
        return _executable(explicit)
    return _executable(REPO_ROOT / ".ci" / "node" / "node_modules" / ".bin" / "codex")


def codex_config(
    base_url: str,
    *,
    model: str = MOCK_MODEL,
    request_max_retries: int | None = None,
    stream_max_retries: int | None = None,
    stream_idle_timeout_ms: int | None = None,
    extra_toml: str = "",
) -> str:
    """The ``config.toml`` for an offline run: one provider pointing at ``base_url``.

    Update checks, analytics (OTLP metrics to chatgpt.com) and the curated plugin sync
    (git and HTTPS to github.com / chatgpt.com) are off; they are the only outside
    traffic 0.169 was seen to attempt. ``allow_login_shell = false`` runs tool commands
    with ``bash -c`` and ``shell_snapshot = false`` skips the login shell codex starts
    at session start to snapshot the environment, so the machine's login profile
    neither leaks into command output nor runs at all. ``extra_toml`` is appended
    (tables only: root keys must come before the first table).
    """
    provider = [
        'name = "Mock"',
        f'base_url = "{base_url}"',
        f'env_key = "{MOCK_KEY_ENV}"',
        'wire_api = "responses"',
    ]
    if request_max_retries is not None:
        provider.append(f"request_max_retries = {request_max_retries}")
    if stream_max_retries is not None:
        provider.append(f"stream_max_retries = {stream_max_retries}")
    if stream_idle_timeout_ms is not None:
        provider.append(f"stream_idle_timeout_ms = {stream_idle_timeout_ms}")
    lines = [
        f'model = "{model}"',
        'model_provider = "mock"',
        "check_for_update_on_startup = false",
        "allow_login_shell = false",
        "",
        "[analytics]",
        "enabled = false",
        "",
        "[features]",
        "plugins = false",
        "shell_snapshot = false",
        "",
        "[model_providers.mock]",
        *provider,
        "",
        extra_toml,
    ]
    return "\n".join(lines)


def codex_env(
    base_url: str,
    tmp_path: str | Path,
    *,
    api_key: str = "sk-mock-0123456789",
    config: str | None = None,
    extra: t.Mapping[str, str] | None = None,
    **config_options: t.Any,
) -> dict[str, str]:
    """An environment that runs codex fully offline against ``base_url``.

    ``CODEX_HOME`` is ``tmp_path/codex-home`` (config, sessions, sqlite state, logs all
    go there; without it codex writes ``~/.codex`` even for ``--version``). ``TMPDIR`` is
    ``tmp_path/codex-tmp``: codex refuses to install its helper binaries (the sandbox
    launcher, apply_patch) in a ``CODEX_HOME`` under the temp dir, and pytest's
    ``tmp_path`` is under /tmp; every sandboxed command would then fail. The
    ``config.toml`` is ``config`` if given, else ``codex_config(base_url, **config_options)``.
    """
    home = Path(tmp_path) / "codex-home"
    home.mkdir(parents=True, exist_ok=True)
    scratch = Path(tmp_path) / "codex-tmp"
    scratch.mkdir(parents=True, exist_ok=True)
    (home / "config.toml").write_text(config if config is not None else codex_config(base_url, **config_options))
    env = {k: v for k, v in os.environ.items() if not k.startswith(_PARENT_SESSION_PREFIXES)}
    env.update(
        {
            "CODEX_HOME": str(home),
            "TMPDIR": str(scratch),
            MOCK_KEY_ENV: api_key,
            "HTTPS_PROXY": _DEAD_PROXY,
            "HTTP_PROXY": _DEAD_PROXY,
            "https_proxy": _DEAD_PROXY,
            "http_proxy": _DEAD_PROXY,
            "NO_PROXY": "127.0.0.1,localhost",
            "no_proxy": "127.0.0.1,localhost",
        }
    )
    if extra:
        env.update(extra)
    return env


def exec_args(
    codex: str,
    prompt: str,
    *,
    cwd: str | Path,
    sandbox: str | None = "workspace-write",
    resume: str | None = None,
    extra_args: t.Sequence[str] = (),
) -> list[str]:
    """``codex exec --json [--sandbox S] -C cwd [resume ID] PROMPT``.

    The parent options go before ``resume``: ``exec resume`` itself has no ``--sandbox``
    or ``-C`` in 0.169 but accepts them there. ``sandbox=None`` means
    ``--dangerously-bypass-approvals-and-sandbox``.
    """
    args = [codex, "exec", "--json"]
    args += ["--sandbox", sandbox] if sandbox else ["--dangerously-bypass-approvals-and-sandbox"]
    args += ["-C", str(cwd), *extra_args]
    if resume:
        args += ["resume", resume]
    return [*args, prompt]


def run_exec(
    codex: str,
    prompt: str,
    *,
    cwd: str | Path,
    env: t.Mapping[str, str],
    sandbox: str | None = "workspace-write",
    resume: str | None = None,
    extra_args: t.Sequence[str] = (),
    timeout: float = 60.0,
) -> subprocess.CompletedProcess[str]:
    """One headless turn. Stdin is /dev/null: with an open stdin pipe codex waits for
    EOF before it sends anything (it appends piped stdin to the prompt)."""
    return subprocess.run(
        exec_args(codex, prompt, cwd=cwd, sandbox=sandbox, resume=resume, extra_args=extra_args),
        stdin=subprocess.DEVNULL,
        cwd=str(cwd),
        env=dict(env),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def parse_jsonl(stdout: str) -> list[dict[str, t.Any]]:
    """The events of a ``--json`` stdout; non-JSON lines are kept as ``{"type": "_raw"}``."""
    events: list[dict[str, t.Any]] = []
    for line in stdout.splitlines():
        if not line.strip():
            continue
        try:
            events.append(json.loads(line))
        except json.JSONDecodeError:
            events.append({"type": "_raw", "line": line})
    return events


def items(
    events: t.Iterable[dict[str, t.Any]], kind: str, event_type: str = "item.completed"
) -> list[dict[str, t.Any]]:
    """The ``item`` payloads of ``event_type`` events whose item has type ``kind``."""
    return [e["item"] for e in events if e.get("type") == event_type and e.get("item", {}).get("type") == kind]


# --------------------------------------------------------------------------- process and network helpers


def wait_until(predicate: t.Callable[[], bool], timeout: float = 20.0) -> bool:
    """Poll ``predicate`` every 50 ms until it holds (True) or ``timeout`` passes."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0] != "Z"
    except (FileNotFoundError, IndexError):
        return False


def processes_of_thread(thread: str) -> list[int]:
    """Pids whose environment carries ``CODEX_THREAD_ID=<thread>`` (codex puts it into
    every tool command's environment, so it marks a turn's leftovers)."""
    needle = f"CODEX_THREAD_ID={thread}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if needle in (entry / "environ").read_bytes().split(b"\0") and pid_alive(int(entry.name)):
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def cmdline(proc_dir: Path) -> str:
    """A process's command line, arguments joined by spaces ("" once it is gone)."""
    try:
        return (proc_dir / "cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


class RefusingProxy:
    """An HTTP proxy on 127.0.0.1 that records every request line and answers 403, so a
    connection codex tries to make to the internet is seen and never leaves the machine."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: t.Any) -> None:
                pass

            def _refuse(self) -> None:
                proxy.lines.append(self.requestline)
                self.send_response(403)
                self.send_header("Content-Length", "0")
                self.end_headers()

            do_CONNECT = do_GET = do_POST = do_HEAD = _refuse

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> t.Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()


def proxied(env: dict[str, str], url: str) -> dict[str, str]:
    """``env`` with every proxy variable pointing at ``url`` (NO_PROXY still exempts the mock)."""
    return {**env, "HTTPS_PROXY": url, "HTTP_PROXY": url, "https_proxy": url, "http_proxy": url}


# Resolved once at import: tests/conftest.py removes OV_* variables (OV_CODEX_BIN too)
# from the environment of each test, so a later lookup could miss an explicit binary.
CODEX_BIN = find_codex()

def requires_codex(test: t.Callable[..., t.Any]) -> t.Any:
    """Mark a test as e2e; skip it when the real CLI is not installed (fail it under CI=true)."""
    return requires(CODEX_BIN is not None, MISSING_MESSAGE, e2e=True)(test)
