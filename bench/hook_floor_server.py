"""Figure 10's floor: an HTTP hook server that does nothing, in a process of its own.

Each kept-alive request is read and answered ``{}`` in one write. In the benchmark's process
the same server waits for the GIL while that process reads the turn's stream (as ov's endpoint
does in an agent's loop); here nothing else runs, so what is left is Claude Code's own cost of
one HTTP hook.

    python bench/hook_floor_server.py

Prints its port on stdout and serves until stdin closes.
"""

from __future__ import annotations

import socket
import socketserver
import sys
import threading


class NothingHandler(socketserver.StreamRequestHandler):
    """Reads each kept-alive request and answers ``{}`` in one write: a hook server with no work at all."""

    def setup(self) -> None:
        super().setup()
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def handle(self) -> None:
        while self.rfile.readline():
            length = 0
            while (header := self.rfile.readline()) not in (b"\r\n", b""):
                name, _, value = header.decode("latin-1").partition(":")
                if name.strip().lower() == "content-length":
                    length = int(value)
            self.rfile.read(length)
            self.wfile.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}")


class NothingServer(socketserver.ThreadingMixIn, socketserver.TCPServer):
    daemon_threads = True


def main() -> int:
    server = NothingServer(("127.0.0.1", 0), NothingHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    print(server.server_address[1], flush=True)
    sys.stdin.read()
    server.shutdown()
    server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
