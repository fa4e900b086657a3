"""Running the application on uvicorn: bind, print the sign-in address, stop cleanly on Ctrl-C.

The socket is bound before uvicorn starts, so ``--port 0`` can print the port it
got and a port in use is a one-line error. On SIGINT or SIGTERM every event stream
is told to end at once (uvicorn would otherwise wait for those endless responses),
requests in flight get a few seconds, and the process exits: it starts no process
of its own, so nothing is left behind. Agents slung through the API are agents, not
children of the server: they run on, like agents slung from a terminal.
"""

from __future__ import annotations

import errno
import ipaddress
import signal
import socket
import threading
import typing as t
import webbrowser
from dataclasses import dataclass

import uvicorn

from overstory.errors import OrchestratorError, UsageError
from overstory.paths import ProjectPaths
from overstory.serve_token import ensure_token, forget_address, record_address
from overstory.store.db import open_events, open_state
from overstory.ui.serve.app import DEFAULT_HEARTBEAT, create_app
from overstory.ui.serve.security import LOOPBACK_NAMES

GRACEFUL_SECONDS = 3


@dataclass(frozen=True)
class Listening:
    url: str  # the sign-in address, the token in its fragment (never sent to the server)
    base: str
    loopback: bool


def is_loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _bind(host: str, port: int) -> socket.socket:
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise UsageError(f"cannot listen on {host!r}: {exc.strerror}") from None
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(128)
    except OSError as exc:
        sock.close()
        hint = "; choose another with --port (0 picks a free one)" if exc.errno == errno.EADDRINUSE else ""
        raise OrchestratorError(f"cannot listen on {host}:{port}: {exc.strerror}{hint}") from None
    sock.set_inheritable(True)
    return sock


def _url_host(host: str) -> str:
    if host in ("0.0.0.0", "::", ""):
        return socket.gethostname()
    return f"[{host}]" if ":" in host else host


class _Server(uvicorn.Server):
    """uvicorn's server, which also tells the event streams to end when a signal arrives."""

    def __init__(self, config: uvicorn.Config, on_exit: t.Callable[[], None]) -> None:
        super().__init__(config)
        self._on_exit = on_exit

    def handle_exit(self, sig: int, frame: t.Any) -> None:
        super().handle_exit(sig, frame)
        self._on_exit()


def serve(project: ProjectPaths, *, host: str = "127.0.0.1", port: int = 7321, open_browser: bool = False,
          heartbeat: float = DEFAULT_HEARTBEAT, on_listening: t.Callable[[Listening], None] | None = None) -> None:
    """Serve until SIGINT/SIGTERM. ``on_listening`` is told the address once the socket is bound."""
    token = ensure_token(project).value
    for opener, path in ((open_state, project.state_db), (open_events, project.events_db)):
        opener(path).close()  # an unusable database is a one-line error now, not a failed start-up later
    sock = _bind(host, port)
    actual_port = sock.getsockname()[1]
    loopback = is_loopback(host)
    allowed = {*LOOPBACK_NAMES, host.strip("[]").lower()} if loopback else None
    app = create_app(project, token=token, cookie_name=f"ov_serve_{actual_port}", allowed_hosts=allowed,
                     heartbeat=heartbeat)
    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on", ws="none", http="h11",
                            loop="asyncio", timeout_graceful_shutdown=GRACEFUL_SECONDS, server_header=False)
    server = _Server(config, on_exit=app.state.hub.stop_soon)
    base = f"http://{_url_host(host)}:{actual_port}"
    listening = Listening(url=f"{base}/#token={token}", base=base, loopback=loopback)
    if on_listening is not None:
        on_listening(listening)
    if open_browser:
        threading.Timer(0.5, webbrowser.open, [listening.url]).start()
    record_address(project, base)  # notifications link here while this process runs
    # uvicorn re-raises the signal it handled once it has shut down: SIGINT arrives as KeyboardInterrupt, but
    # SIGTERM's default action would end the process before `forget_address` (leaving run/serve.json behind).
    previous = signal.signal(signal.SIGTERM, _interrupt) if threading.current_thread() is threading.main_thread() \
        else None
    try:
        server.run(sockets=[sock])
    except KeyboardInterrupt:
        pass
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
        forget_address(project)
        sock.close()


def _interrupt(signum: int, frame: t.Any) -> None:
    raise KeyboardInterrupt
