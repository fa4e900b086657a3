"""The agent's side of its channel to ov. HOT: inside a sandboxed turn `ov guard`, `ov mail send/check` and
`ov status` import this (``cli.hot.agent_channel``); standard library only, no typing at run time.

Inside an agent's turn two variables are set: ``OVERSTORY_ENDPOINT`` (the unix socket its
own loop, or tmux driver, serves) and ``OVERSTORY_ENDPOINT_TOKEN`` (the secret of this
turn). When both are there, the commands that change or read ov's state send one HTTP
request on the socket instead of opening the databases (which are read-only inside the
sandbox). The server decides who the caller is; nothing the client sends can change that.

The HTTP is written by hand (one request, ``Connection: close``) on ``_socket``, with
``jsontext``: ``http.client`` costs about as much to import as the rest of ``ov mail send``,
and ``socket`` and ``json`` import ``enum`` and ``re`` (together about 8 ms of a hot
command whose target is 2x an empty interpreter's start).
"""

from __future__ import annotations

import os

from overstory import jsontext
from overstory.errors import EndpointError

TYPE_CHECKING = False  # typing costs milliseconds: `ov guard` imports this on every tool call of a sandboxed turn
if TYPE_CHECKING:
    import typing as t

ENDPOINT_ENV = "OVERSTORY_ENDPOINT"
TOKEN_ENV = "OVERSTORY_ENDPOINT_TOKEN"
SOCKET_NAME = "ov.sock"
TIMEOUT_SECONDS = 600.0  # a merge or a sling can take a while
MAX_UNIX_PATH = 100  # sun_path holds 108 bytes; longer paths go through /proc/self/fd (see unix_address)


def unix_address(path: str) -> tuple[str, int | None]:
    """An address for ``path`` that fits in sun_path, and the directory fd to close afterwards.

    A long path is reached through an open descriptor of its directory:
    ``/proc/self/fd/N/ov.sock`` names the same socket in a few bytes.
    """
    if len(os.fsencode(path)) <= MAX_UNIX_PATH:
        return path, None
    directory, name = os.path.split(path)
    fd = os.open(directory or ".", os.O_RDONLY | os.O_DIRECTORY)
    return f"/proc/self/fd/{fd}/{name}", fd


class Channel:
    def __init__(self, socket_path: str, token: str) -> None:
        self.socket_path = socket_path
        self.token = token

    def call(self, route: str, args: t.Mapping[str, t.Any], timeout: float = TIMEOUT_SECONDS) -> t.Any:
        """POST one request; the route's result, or EndpointError with the server's one-line reason."""
        import _socket  # only agents pay for it: the operator's commands never get here

        body = jsontext.dumps(dict(args), ensure_ascii=False).encode("utf-8")
        head = (f"POST /v1/{route} HTTP/1.1\r\nHost: ov\r\nAuthorization: Bearer {self.token}\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n")
        address, fd = unix_address(self.socket_path)
        try:
            conn = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
            try:
                conn.settimeout(timeout)
                conn.connect(address)
                conn.sendall(head.encode("latin-1") + body)
                chunks = []
                while True:
                    chunk = conn.recv(65536)
                    if not chunk:
                        break
                    chunks.append(chunk)
            finally:
                conn.close()
        except OSError as exc:
            raise EndpointError(f"cannot reach ov through {self.socket_path}: {exc.strerror or exc} (is this "
                                "agent's loop running?)") from None
        finally:
            if fd is not None:
                os.close(fd)
        return _parse(b"".join(chunks))


def _parse(raw: bytes) -> t.Any:
    head, sep, body = raw.partition(b"\r\n\r\n")
    status_line = head.split(b"\r\n", 1)[0].split()
    if not sep or len(status_line) < 2 or not status_line[1].isdigit():
        raise EndpointError("ov's endpoint sent a malformed answer")
    try:
        document = jsontext.loads(body.decode("utf-8"))
    except ValueError:
        raise EndpointError(f"ov's endpoint answered HTTP {status_line[1].decode()} without JSON") from None
    if int(status_line[1]) == 200 and isinstance(document, dict) and document.get("ok"):
        return document.get("result")
    message = document.get("error") if isinstance(document, dict) else None
    error = EndpointError(str(message or f"ov's endpoint refused the request (HTTP {status_line[1].decode()})"))
    code = document.get("exit_code") if isinstance(document, dict) else None
    if isinstance(code, int) and code > 0:
        error.exit_code = code
    raise error


def channel(env: t.Mapping[str, str] = os.environ) -> Channel | None:
    """The agent's channel to ov, or None outside an agent (the operator works on the databases)."""
    path, token = env.get(ENDPOINT_ENV), env.get(TOKEN_ENV)
    return Channel(path, token) if path and token else None
