"""What runs for the whole chaos run and is restarted when killed: the watchdog, `ov serve`, the
SSE clients that read its event stream (reconnecting with their last cursor), and the mock model.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import typing as t
from pathlib import Path

from chaos_procs import alive, start_ticks


def _ov() -> list[str]:
    """The `ov` script next to this Python (its fast path for hot commands, no pyenv shim), else the module."""
    script = Path(sys.executable).parent / "ov"
    return [str(script)] if script.is_file() else [sys.executable, "-m", "overstory"]


OV = _ov()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class Daemon:
    """A long-running `ov` command the operator keeps running: restarted ``restart`` seconds after it died."""

    def __init__(self, name: str, argv: list[str], *, cwd: Path, env: dict[str, str], logs: Path,
                 note: t.Callable[..., None], restart: float, ready: t.Callable[[], bool] | None = None) -> None:
        self.name, self.argv, self.cwd, self.env, self.logs = name, argv, cwd, env, logs
        self.note, self.restart, self.ready = note, restart, ready
        self.popen: subprocess.Popen[bytes] | None = None
        self.ticks: int | None = None
        self.starts = 0
        self.wanted = False
        self._lock = threading.Lock()

    def start(self) -> None:
        with self._lock:
            self.wanted = True
            self.starts += 1
            log = open(self.logs / f"{self.name}.{self.starts}.log", "wb")  # noqa: SIM115 - the child keeps it
            self.popen = subprocess.Popen(self.argv, cwd=self.cwd, env=self.env, stdin=subprocess.DEVNULL,
                                          stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
            log.close()
            self.ticks = start_ticks(self.popen.pid)
        if self.ready is not None:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and not self.ready():
                if self.popen.poll() is not None:
                    break
                time.sleep(0.05)

    @property
    def pid(self) -> int | None:
        return self.popen.pid if self.popen is not None else None

    def running(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def keep_alive(self) -> None:
        """Called often: a daemon that died is started again after the operator's reaction time."""
        if not self.wanted or self.running():
            return
        code = self.popen.returncode if self.popen is not None else None
        time.sleep(self.restart)
        if self.wanted and not self.running():
            self.note("restart", daemon=self.name, exit=code)
            self.start()

    def stop(self, sig: int = signal.SIGINT, timeout: float = 20) -> int | None:
        self.wanted = False
        popen = self.popen
        if popen is None or popen.poll() is not None:
            return popen.returncode if popen is not None else None
        popen.send_signal(sig)
        try:
            return popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(popen.pid, signal.SIGKILL)
            popen.wait(timeout=10)
            self.note("daemon_hung", daemon=self.name, signal=int(sig))
            return None

    def kill_group(self) -> None:
        """At the end (or on an error) nothing the harness started may stay behind."""
        popen = self.popen
        if popen is not None and popen.poll() is None and alive(popen.pid, self.ticks):
            try:
                os.killpg(popen.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            popen.wait(timeout=10)


class SSEClient:
    """One client of /events/stream: ids received, in order, across reconnects (Last-Event-ID)."""

    def __init__(self, name: str, base: str, token: str) -> None:
        self.name, self.base, self.token = name, base, token
        self.ids: list[int] = []
        self.connects = 0
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"sse-{name}", daemon=True)

    def start(self) -> SSEClient:
        self._thread.start()
        return self

    def _run(self) -> None:
        import httpx

        while not self._stop.is_set():
            headers = {"Authorization": f"Bearer {self.token}"}
            params = {}
            if self.ids:
                headers["Last-Event-ID"] = str(self.ids[-1])
            else:
                params["since"] = "0"  # from the first event on: the whole table must arrive
            try:
                with httpx.Client(timeout=httpx.Timeout(10, read=30)) as client, client.stream(
                        "GET", self.base + "/events/stream", headers=headers, params=params) as response:
                    if response.status_code != 200:
                        self.errors.append(f"HTTP {response.status_code}")
                        time.sleep(0.3)
                        continue
                    self.connects += 1
                    event_id: int | None = None
                    data = False
                    for line in response.iter_lines():
                        if self._stop.is_set():
                            return
                        if line.startswith("id: "):
                            event_id = int(line[4:])
                        elif line.startswith("data: "):
                            data = True
                        elif line == "" and data:
                            if event_id is not None:
                                self.ids.append(event_id)
                            event_id, data = None, False
            except (httpx.HTTPError, OSError, ValueError) as exc:
                if len(self.errors) < 50:
                    self.errors.append(type(exc).__name__)
            time.sleep(0.2)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=15)


def serve_ready(base: str, token: str) -> t.Callable[[], bool]:
    def ready() -> bool:
        import httpx

        try:
            return httpx.get(base + "/api/health", headers={"Authorization": f"Bearer {token}"},
                             timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    return ready


class Model:
    """The mock Messages API of the real-claude agent, in this process (a daemon thread)."""

    def __init__(self, responder: t.Any) -> None:
        from mockapi import MockMessagesAPI

        self.api = MockMessagesAPI(responder)

    def __enter__(self) -> Model:
        self.api.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.api.close()

    @property
    def base_url(self) -> str:
        return self.api.base_url

    def figures(self) -> dict[str, t.Any]:
        return {"main_requests": len(self.api.main_requests), "side_requests": len(self.api.side_requests)}


def read_json_lines(path: Path) -> list[dict[str, t.Any]]:
    out = []
    try:
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
    except OSError:
        pass
    return out
