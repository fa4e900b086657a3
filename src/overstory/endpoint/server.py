"""An agent's endpoint: a small HTTP server on a unix socket in the agent's run dir.

Served by the agent's own loop (headless) or its tmux driver, outside the sandbox, so it
works on the databases with ov's full rights on the agent's behalf. The socket's
directory is bound read-only into the agent's sandbox (connect() needs no write access);
the other agents' sockets are hidden there.

Who is calling is decided here, never by the request: the endpoint serves exactly one
agent (name and generation), and a request must carry the secret of that agent's
current turn (``Authorization: Bearer``). A new secret is made for every turn and
revoked when it ends. Each route then checks what the agent may do (``routes``).

Requests: ``POST /v1/<route>`` with a JSON object; answers ``{"ok": true, "result": ...}``
or ``{"ok": false, "error": "<one line>", "exit_code": N}``. A route is one function
``(Caller, args) -> JSON value`` in a table, so new ones (issue 20: the tool-call hooks)
are one entry each.
"""

from __future__ import annotations

import os
import socket
import socketserver
import sys
import threading
import typing as t
from _operator import _compare_digest as compare_digest  # hmac's, without hashlib and OpenSSL
from _queue import Empty, SimpleQueue  # the queue module's own classes, without its heapq
from dataclasses import dataclass, field
from pathlib import Path

from overstory import jsontext
from overstory.endpoint import http1
from overstory.endpoint.client import ENDPOINT_ENV, SOCKET_NAME, TOKEN_ENV, unix_address
from overstory.errors import NotPermitted, OrchestratorError
from overstory.paths import ProjectPaths
from overstory.store import sessions
from overstory.store.db import open_events, open_state
from overstory.store.sessions import Session
from overstory.store.sqlite_module import sqlite3

if t.TYPE_CHECKING:
    from overstory.config.model import Config

MAX_REQUEST_BYTES = 4 << 20  # a mail body is at most 1 MiB
SWITCH_INTERVAL_S = 0.0005  # how long a thread may hold the GIL while another waits (see AgentEndpoint.start)


@dataclass
class Caller:
    """The agent a request comes from (its row as it is now) and connections for the request."""

    project: ProjectPaths
    agent: Session
    conn: sqlite3.Connection
    launch_env: t.Mapping[str, str] = field(default_factory=dict)
    events: sqlite3.Connection | None = None
    turn_env: t.Mapping[str, str] = field(default_factory=dict)  # the current turn's own variables (dispatch, ...)
    config: Config | None = None  # the configuration the agent's loop runs with (None: load it)
    # Asked before a tool call is counted: the reason to refuse it (its turn crossed a budget), else None.
    # The loop's ``agents.spending.ToolCallGate.ask``: it waits until the turn's stream is priced.
    before_tool_call: t.Callable[..., str | None] | None = None

    def tool_call_refused(self, reports: int = 0) -> str | None:
        """``reports``: the bills the runtime said it had made when it asked (``ToolCallGate.ask``)."""
        return self.before_tool_call(reports=reports) if self.before_tool_call is not None else None

    @property
    def name(self) -> str:
        return self.agent.name

    def environ(self) -> dict[str, str]:
        """The environment core functions see for this agent: its launch environment and its own identity
        (from its row, not from anything the agent sent)."""
        env = dict(self.launch_env)
        env.update(self.turn_env)
        env.update({
            "OVERSTORY_AGENT_NAME": self.agent.name, "OVERSTORY_CAPABILITY": self.agent.capability,
            "OVERSTORY_TASK_ID": self.agent.task_id, "OVERSTORY_BRANCH": self.agent.branch or "",
            "OVERSTORY_PARENT": self.agent.parent, "OVERSTORY_PROJECT_ROOT": str(self.project.root),
            "OVERSTORY_GENERATION": str(self.agent.generation),
            "OVERSTORY_WORKTREE": self.agent.worktree or str(self.project.root),  # as turns.turn_environment
            "OVERSTORY_WRITE_SCOPE": "\n".join(self.agent.spec.get("write_scope") or ()),
        })
        env.pop(TOKEN_ENV, None)
        env.pop(ENDPOINT_ENV, None)
        return env


if t.TYPE_CHECKING:
    Route = t.Callable[[Caller, dict[str, t.Any]], t.Any]


def socket_path(project: ProjectPaths, agent: str) -> Path:
    return project.run_dir / agent / SOCKET_NAME


class _Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True
    endpoint: AgentEndpoint


class _Handler(http1.Handler):
    """One request per connection (the client sends ``Connection: close``)."""

    server: _Server
    extra_routes: t.ClassVar[t.Mapping[str, Route]] = {}  # routes only this listener serves (endpoint.remote)

    def max_body(self) -> int:
        return MAX_REQUEST_BYTES

    def answer(self, request: http1.Request, body: bytes) -> tuple[int, bytes]:
        status, document = self._route(request, body)
        return status, jsontext.dumps(document, ensure_ascii=False, default=str).encode("utf-8")

    def _route(self, request: http1.Request, body: bytes) -> tuple[int, dict[str, t.Any]]:
        endpoint = self.server.endpoint
        if request.method != "POST":
            return _failure(405, "use POST /v1/<route>")
        if not request.path.startswith("/v1/"):
            return _failure(404, f"no such endpoint path {request.path!r}")
        if not endpoint.authorized(request.headers.get("authorization", "")):
            return _failure(401, "not authorized: the endpoint accepts only the secret of this agent's current turn")
        try:
            args = jsontext.loads(body.decode("utf-8") or "{}")
        except (ValueError, UnicodeDecodeError):
            return _failure(400, "the request body is not JSON")
        if not isinstance(args, dict):
            return _failure(400, "the request body must be a JSON object")
        return endpoint.dispatch(request.path[len("/v1/"):], args, self.extra_routes)


def _failure(status: int, message: str, exit_code: int = 1) -> tuple[int, dict[str, t.Any]]:
    return status, {"ok": False, "error": message, "exit_code": exit_code}


class AgentEndpoint:
    """One agent's endpoint: start it once, open a turn (a fresh secret) per turn, close it at the end."""

    def __init__(self, project: ProjectPaths, name: str, generation: int, routes: t.Mapping[str, Route],
                 launch_env: t.Mapping[str, str] | None = None, *, config: Config | None = None,
                 before_tool_call: t.Callable[..., str | None] | None = None) -> None:
        self.project = project
        self.name = name
        self.generation = generation
        self.routes = dict(routes)
        self.launch_env = dict(launch_env or {})
        self.config = config
        self.before_tool_call = before_tool_call
        self.path = socket_path(project, name)
        self._token: str | None = None
        self._turn_env: dict[str, str] = {}
        self._lock = threading.Lock()
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        self._pool: SimpleQueue[tuple[sqlite3.Connection, sqlite3.Connection]] = SimpleQueue()
        self.hooks: t.Any = None  # the HTTP hooks' TCP listener (endpoint.hooks), when the loop serves them
        self.remote: t.Any = None  # the TCP listener for turns on other machines (endpoint.remote)

    # -- lifecycle ------------------------------------------------------------------
    def start(self) -> AgentEndpoint:
        """Bind the socket (the caller holds the agent's lock, so a stale socket file is ours to replace)."""
        # A request's thread waits for the GIL up to the switch interval (5 ms by default) whenever another
        # thread of the loop is running Python (reading the turn's stream, say): about 2 ms of every HTTP hook
        # on average in bench figure 10. The loop's threads are I/O-bound, so switching more often costs nothing.
        sys.setswitchinterval(min(sys.getswitchinterval(), SWITCH_INTERVAL_S))
        self.path.parent.mkdir(parents=True, exist_ok=True)
        address, fd = unix_address(str(self.path))
        try:
            try:
                os.unlink(address)
            except FileNotFoundError:
                pass
            server = _Server(address, _Handler, bind_and_activate=False)
            server.endpoint = self
            try:
                server.server_bind()
                server.server_activate()
            except OSError:
                server.server_close()
                raise
        finally:
            if fd is not None:
                os.close(fd)
        os.chmod(self.path, 0o600)
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.2},
                                        name=f"ov-endpoint-{self.name}", daemon=True)
        self._thread.start()
        return self

    def serve_hooks(self) -> int:
        """Also listen on 127.0.0.1 for Claude's HTTP tool-call hooks (``endpoint.hooks``), in place of a
        listener that stopped; returns the port."""
        from overstory.endpoint.hooks import HookListener

        if self.hooks is not None:
            self.hooks.close()
        self.hooks = HookListener(self).start()
        return int(self.hooks.port)

    @property
    def hooks_alive(self) -> bool:
        return self.hooks is not None and bool(self.hooks.alive)

    def close(self) -> None:
        self.revoke()
        for listener in (self.hooks, self.remote):
            if listener is not None:
                listener.close()
        self.hooks = self.remote = None
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        while not self._pool.empty():
            for conn in self._pool.get():
                conn.close()
        try:
            self.path.unlink()
        except OSError:
            pass

    # -- the per-turn secret ------------------------------------------------------------
    def open_turn(self, token: str | None = None, *, turn_env: t.Mapping[str, str] | None = None) -> dict[str, str]:
        """A fresh secret for the next turn; returns the variables that go into the turn's environment.

        ``turn_env``: the turn's own variables as ov set them (its dispatch, attempt, ledger policy),
        which the core functions read from the environment outside a sandbox.
        """
        with self._lock:
            self._token = token or os.urandom(24).hex()
            self._turn_env = {k: v for k, v in (turn_env or {}).items() if k not in (ENDPOINT_ENV, TOKEN_ENV)}
            return {ENDPOINT_ENV: str(self.path), TOKEN_ENV: self._token}

    def set_turn_env(self, env: t.Mapping[str, str]) -> None:
        """The whole environment of the current turn, once built: the HTTP hooks decide with what
        `ov guard` would see (its temp dirs, phase, push remotes ...)."""
        with self._lock:
            if self._token is not None:
                self._turn_env = {k: v for k, v in env.items() if k not in (ENDPOINT_ENV, TOKEN_ENV)}

    def revoke(self) -> None:
        with self._lock:
            self._token = None
            self._turn_env = {}

    def authorized(self, header: str) -> bool:
        with self._lock:
            token = self._token
        return token is not None and compare_digest(header.encode(), f"Bearer {token}".encode())

    # -- requests ---------------------------------------------------------------------
    def dispatch(self, route: str, args: dict[str, t.Any],
                 extra_routes: t.Mapping[str, Route] | None = None) -> tuple[int, dict[str, t.Any]]:
        handler = self.routes.get(route) or (extra_routes or {}).get(route)
        if handler is None:
            return 404, {"ok": False, "error": f"ov has no endpoint route {route!r}", "exit_code": 2}
        try:
            conn, events = self._connections()
        except OrchestratorError as exc:
            return 503, {"ok": False, "error": str(exc), "exit_code": 1}
        try:
            agent = sessions.get(conn, self.name)
            if agent is None or agent.generation != self.generation or agent.is_terminal:
                return 403, {"ok": False, "error": f"{self.name} (generation {self.generation}) is no longer active",
                             "exit_code": 1}
            if getattr(handler, "takes_back", True):
                self._take_back(agent, events)
            with self._lock:
                turn_env = dict(self._turn_env)
            result = handler(Caller(self.project, agent, conn, self.launch_env, events, turn_env, self.config,
                                    self.before_tool_call), args)
            return 200, {"ok": True, "result": result}
        except OrchestratorError as exc:
            if isinstance(exc, NotPermitted):  # a refusal is recorded, whatever it is answered with
                self._record_refusal(route, str(exc))
            return exc.endpoint_status, {"ok": False, "error": str(exc), "exit_code": exc.exit_code}
        except (KeyError, TypeError, ValueError) as exc:
            return 400, {"ok": False, "error": f"bad request for {route}: {type(exc).__name__}: {exc}", "exit_code": 2}
        except Exception as exc:  # noqa: BLE001 - a bug in ov: the loop must keep serving
            return 500, {"ok": False, "error": f"internal error in {route}: {type(exc).__name__}: {exc}",
                         "exit_code": 1}
        finally:
            self._release(conn, events)

    def _take_back(self, agent: Session, events: sqlite3.Connection) -> None:
        """Whatever the agent asks, ov first brings its commits so far out of its sandbox, so that what it
        reports (worker_done, merge_ready) and what others then merge is its branch as it is now."""
        from overstory import sandbox
        from overstory.store import events as event_store

        took = sandbox.take_back(self.project, agent)
        if took.status not in ("none", "unchanged"):
            event_store.record(events, "branch_take_back" if took.status == "moved" else "branch_refused",
                               agent=agent.name, generation=agent.generation,
                               summary=f"branch {agent.branch}: {took.status} (on a request)"
                                       + (f": {took.detail}" if took.detail else ""))

    def _connections(self) -> tuple[sqlite3.Connection, sqlite3.Connection]:
        """A state.db and an events.db connection for one request, from the pool (opening costs milliseconds)."""
        try:
            return self._pool.get_nowait()
        except Empty:
            state = open_state(self.project.state_db, shared=True)
            try:
                return state, open_events(self.project.events_db, shared=True)
            except BaseException:
                state.close()
                raise

    def close_idle_connections(self) -> None:
        """Close the pooled connections no request holds (between turns none is asked for): their statement
        caches and pages, about 0.4 MiB of an idle loop (issue 34). The next request opens a pair again."""
        while True:
            try:
                pair = self._pool.get_nowait()
            except Empty:
                return
            for conn in pair:
                conn.close()

    def _release(self, conn: sqlite3.Connection, events: sqlite3.Connection) -> None:
        if conn.in_transaction:  # a route that failed mid-transaction: never hand that to the next request
            conn.close()
            events.close()
            return
        self._pool.put((conn, events))

    def _record_refusal(self, route: str, reason: str) -> None:
        from overstory.store import events as event_store

        try:
            conn = open_events(self.project.events_db)
        except OrchestratorError:
            return
        try:
            event_store.record(conn, "endpoint_refused", agent=self.name, generation=self.generation,
                               summary=f"{route}: {reason}"[:300], data={"route": route, "reason": reason})
        except sqlite3.Error:
            pass
        finally:
            conn.close()


def is_listening(path: Path) -> bool:
    """Whether something accepts connections on ``path`` (for tests and ``ov doctor``)."""
    address, fd = unix_address(str(path))
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
            probe.settimeout(2)
            probe.connect(address)
        return True
    except OSError:
        return False
    finally:
        if fd is not None:
            os.close(fd)
