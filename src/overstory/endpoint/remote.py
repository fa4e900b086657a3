"""The endpoint over TCP, for an agent whose turns run on other machines (the ray executor, issue 30).

A turn on a node cannot reach its loop's unix socket. The node runs a relay at the same path inside
the turn's view of the project (``executors.travel_node.Relay``) that forwards each request here, so
`ov guard`, `ov mail send/check` and the rest work in a remote turn as in a local one, with the same
per-turn secret and the same routes, plus the workspace routes that send the turn's branch out and
take its commits back (``executors.travel_control``).

The listener binds ``executor.ray.control_host`` (127.0.0.1 by default: nodes on this machine, or in
its network namespace as in the tests; a cluster of machines needs the address they reach this one
at) on a port the kernel picks. Anyone who can connect still needs the current turn's secret:
another turn's, a revoked one or none is answered 401 and reaches no route.
"""

from __future__ import annotations

import socketserver
import threading
import typing as t

from overstory.endpoint.server import _Handler
from overstory.endpoint.workspace_routes import ROUTES as WORKSPACE_ROUTES

if t.TYPE_CHECKING:
    from overstory.endpoint.server import AgentEndpoint

MAX_REMOTE_BYTES = 512 << 20  # a workspace's bundle or a runtime's state, base64 in JSON


class _TCPServer(socketserver.ThreadingMixIn, socketserver.TCPServer):
    daemon_threads = True
    allow_reuse_address = True
    endpoint: AgentEndpoint


class _RemoteHandler(_Handler):
    disable_nagle_algorithm = True
    extra_routes = WORKSPACE_ROUTES  # a turn's workspace goes out and comes back only to a node, never locally

    def max_body(self) -> int:
        return MAX_REMOTE_BYTES


def serve_remote(endpoint: AgentEndpoint, host: str) -> str:
    """Make ``endpoint`` listen on ``host`` over TCP too (closed with it); returns HOST:PORT."""
    if endpoint.remote is None:
        endpoint.remote = RemoteListener(endpoint, host).start()
    return str(endpoint.remote.address)


class RemoteListener:
    """One agent's endpoint on ``host``:(a free port)."""

    def __init__(self, endpoint: AgentEndpoint, host: str) -> None:
        self.endpoint, self.host = endpoint, host
        self._server: _TCPServer | None = None
        self.port = 0

    def start(self) -> RemoteListener:
        server = _TCPServer((self.host, 0), _RemoteHandler)
        server.endpoint = self.endpoint
        self._server, self.port = server, int(server.server_address[1])
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.2},
                         name=f"ov-remote-{self.endpoint.name}", daemon=True).start()
        return self

    @property
    def address(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    def close(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()
