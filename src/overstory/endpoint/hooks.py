"""Claude's tool-call hooks over HTTP, served by the agent's endpoint (issue 20).

A command hook starts `ov guard` as a new Python process for every tool call (tens of
milliseconds each). Claude Code can instead POST the same JSON to a URL
(CLAUDE_PROBE_NOTES.md, "HTTP hooks"), so during a headless turn the agent's loop answers
PreToolUse here, in its own long-lived process, outside the sandbox: the route ``hook.pre``
calls the same functions as `ov guard`.

Only PreToolUse: the call's receipt comes from the turn's stream, which the same loop reads
(``ledger.StreamLedger``). Each hook costs the CLI 3-9 ms of its own, by machine, even when
the server does nothing (bench figure 10), so a PostToolUse hook would double the price of every call.
``hook.post`` still answers a settings file that asks for it.

Why TCP and not the endpoint's unix socket: the CLI's HTTP hooks take a URL, and it only
speaks TCP. The listener binds 127.0.0.1 on a port the kernel picks; the turn reaches it
because a sandbox with ``network: on`` shares the host's network namespace. A turn with
its own network namespace (``sandbox.network: off``) cannot, so it keeps the command hook.

Fail closed: the settings say ``onFailure: "block"`` for PreToolUse, so a listener that is
gone, a wrong or revoked secret (401), or any error (5xx) blocks the call. Anyone on the
machine can connect to the port; only the current turn's secret is accepted, and it is
checked as for every other route (``AgentEndpoint.authorized``).

Latency: each answer leaves in one write with TCP_NODELAY (headers and body in two writes
cost +25 ms per call through Nagle and delayed ACKs, measured), and the connection is
kept alive, as the CLI asks.
"""

from __future__ import annotations

import os
import socket
import socketserver
import threading
import typing as t

from overstory import jsontext
from overstory.endpoint import http1
from overstory.endpoint.client import TOKEN_ENV

if t.TYPE_CHECKING:
    from overstory.endpoint.server import AgentEndpoint

HOST = "127.0.0.1"
# Test hook: the first listener closes itself after this many PreToolUse answers (fail-closed tests).
FAULT_ENV = "OV_TEST_HOOKS_CLOSE_AFTER"
PRE_TIMEOUT_SECONDS = 30  # the guard and the ledger take milliseconds; an approval gate writes one transaction
RECEIPT_EVENTS = ("PostToolUse", "PostToolUseFailure")
MAX_HOOK_BYTES = 8 << 20  # a PostToolUse carries the tool's output
ROUTES = {"/v1/hook.pre": "hook.pre", "/v1/hook.post": "hook.post"}
SETTINGS_FILE = "settings.http.json"  # beside the command hooks' settings.json, in the agent's run dir
TRANSPORT_FILE = "hook_transport"  # "http PORT" or "command": what `ov doctor` reports


def transport_for(config: t.Any, runtime_name: str, capability: str) -> str:
    """``"http"`` where this agent's turns can call the loop's listener, else ``"command"`` (`ov guard`).

    HTTP needs a runtime with HTTP hooks (Claude Code >= its ``MIN_VERSION``, which ov already
    requires), ``guards.hook_transport: auto``, and the host's network inside the sandbox.
    """
    from overstory import sandbox
    from overstory.config.snapshot import network_for
    from overstory.runtimes import get_runtime

    if getattr(config.guards, "hook_transport", "auto") != "auto" or not get_runtime(runtime_name).http_hooks:
        return "command"
    if sandbox.effective_mode(config).name == "bwrap" and not network_for(config.sandbox, capability):
        return "command"  # its own network namespace: 127.0.0.1 there is not ov's
    return "http"


def write_settings(run_dir: t.Any, command_settings_file: str, port: int) -> t.Any:
    """The HTTP hooks' settings file: the command hooks' settings with the tool-call hooks replaced (and
    any PostToolUse hook an older ov wrote there dropped: the receipts come from the stream)."""
    try:
        settings = jsontext.loads((run_dir / command_settings_file).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        settings = {}
    hooks = dict(settings.get("hooks") or {}) if isinstance(settings, dict) else {}
    for event in RECEIPT_EVENTS:
        hooks.pop(event, None)
    hooks.update(claude_settings(port)["hooks"])
    settings = {**(settings if isinstance(settings, dict) else {}), "hooks": hooks}
    path = run_dir / SETTINGS_FILE
    partial = path.with_name(path.name + ".tmp")
    partial.write_text(jsontext.dumps(settings, indent=2), encoding="utf-8")
    os.replace(partial, path)
    return path


def claude_settings(port: int) -> dict[str, t.Any]:
    """Claude settings whose PreToolUse hook POSTs to this agent's listener.

    The secret goes in a header from the turn's environment (``allowedEnvVars``: the CLI
    expands only the variables listed there), so one settings file serves every turn of the loop.
    """
    auth = {"headers": {"Authorization": f"Bearer ${{{TOKEN_ENV}}}"}, "allowedEnvVars": [TOKEN_ENV]}
    pre = {"type": "http", "url": f"http://{HOST}:{port}/v1/hook.pre", "timeout": PRE_TIMEOUT_SECONDS,
           "onFailure": "block", **auth}
    return {"hooks": {"PreToolUse": [{"matcher": ".*", "hooks": [pre]}]}}


class _Server(socketserver.ThreadingMixIn, socketserver.TCPServer):
    daemon_threads = True
    allow_reuse_address = True
    endpoint: AgentEndpoint
    connections: set[socket.socket]
    lock: threading.Lock
    listener: HookListener
    answered: int


class _Handler(http1.Handler):
    keep_alive_allowed = True  # the CLI reuses its connection
    disable_nagle_algorithm = True
    timeout = 600  # an idle kept-alive connection (the model thinking) is dropped after this
    server: _Server

    def setup(self) -> None:
        super().setup()
        with self.server.lock:
            self.server.connections.add(self.connection)

    def finish(self) -> None:
        with self.server.lock:
            self.server.connections.discard(self.connection)
        super().finish()

    def max_body(self) -> int:
        return MAX_HOOK_BYTES

    def answer(self, request: http1.Request, body: bytes) -> tuple[int, bytes]:
        status, document = self._route(request, body)
        return status, jsontext.dumps(document, ensure_ascii=False, separators=(",", ":")).encode("utf-8")

    def _route(self, request: http1.Request, body: bytes) -> tuple[int, t.Any]:
        endpoint = self.server.endpoint
        if request.method != "POST":
            return 405, {"error": "use POST"}
        route = ROUTES.get(request.path)
        if route is None:
            return 404, {"error": f"no hook at {request.path}"}
        if not endpoint.authorized(request.headers.get("authorization", "")):
            return 401, {"error": "not authorized: only the current turn's secret is accepted"}
        try:
            args = jsontext.loads(body.decode("utf-8") or "{}")
        except (ValueError, UnicodeDecodeError):
            return 400, {"error": "the hook input is not JSON"}
        if not isinstance(args, dict):
            return 400, {"error": "the hook input must be a JSON object"}
        status, document = endpoint.dispatch(route, args)
        if route == "hook.pre" and self._fault_due():  # gone before this answer leaves, so the next call fails
            self.server.listener.close(keep=self.connection)
            self.close_after = True
        if status == 200:
            return 200, document.get("result") or {}
        return (status if status in http1.REASONS else 500), {"error": document.get("error")}

    def _fault_due(self) -> bool:
        global _fault_fired
        limit = os.environ.get(FAULT_ENV, "")
        if not limit.isdigit():
            return False
        with self.server.lock:
            self.server.answered += 1
            due = self.server.answered == int(limit) and not _fault_fired
            _fault_fired = _fault_fired or due
        return due


_fault_fired = False


class HookListener:
    """The TCP listener of one agent's endpoint; ``port`` is known once it started."""

    def __init__(self, endpoint: AgentEndpoint) -> None:
        self.endpoint = endpoint
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        self.port = 0

    def start(self) -> HookListener:
        server = _Server((HOST, 0), _Handler)
        server.endpoint = self.endpoint
        server.connections, server.lock, server.listener, server.answered = set(), threading.Lock(), self, 0
        self._server = server
        self.port = server.server_address[1]
        self._thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.2},
                                        name=f"ov-hooks-{self.endpoint.name}", daemon=True)
        self._thread.start()
        return self

    def close(self, keep: socket.socket | None = None) -> None:
        """Stop listening and drop the kept-alive connections (but ``keep``): later hook calls fail, so Claude
        blocks them."""
        server, self._server = self._server, None
        if server is None:
            return
        server.shutdown()
        server.server_close()
        with server.lock:
            open_connections = list(server.connections)
        for conn in open_connections:
            if conn is keep:
                continue
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    @property
    def alive(self) -> bool:
        return self._server is not None

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"
