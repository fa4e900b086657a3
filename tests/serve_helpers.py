"""Helpers for the `ov serve` tests: a real server process and a small SSE client."""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import subprocess
import threading
import time
import typing as t
from dataclasses import dataclass, field

import httpx

from conftest import ov_command
from overstory.paths import ProjectPaths

URL_LINE = re.compile(r"^ov serve: (http://[^/]+)/[?#]token=(\S+)$")  # `?` was an older ov's form


@dataclass
class Served:
    """A running `ov serve` (its own process, started like a person would)."""

    proc: subprocess.Popen[str]
    base: str
    token: str
    output: list[str] = field(default_factory=list)
    sign_in: str = ""  # the address `ov serve` printed, as a person would open it

    @property
    def auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}

    def get(self, path: str, **kwargs: t.Any) -> httpx.Response:
        return httpx.get(self.base + path, headers={**self.auth, **kwargs.pop("headers", {})}, timeout=30, **kwargs)

    def post(self, path: str, body: t.Any = None, **kwargs: t.Any) -> httpx.Response:
        return httpx.post(self.base + path, json=body if body is not None else {},
                          headers={**self.auth, **kwargs.pop("headers", {})}, timeout=60, **kwargs)

    def stop(self, sig: int = signal.SIGINT, timeout: float = 30) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
                raise AssertionError(f"ov serve did not stop within {timeout}s of signal {sig}") from None
        return self.proc.returncode


def start_server(project: ProjectPaths, *extra: str, timeout: float = 30) -> Served:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([*ov_command(), "serve", "--port", "0", *extra], cwd=project.root, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines: queue.Queue[str | None] = queue.Queue()

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.put(line.rstrip("\n"))
        lines.put(None)

    threading.Thread(target=pump, daemon=True).start()
    deadline = time.monotonic() + timeout
    seen: list[str] = []
    while time.monotonic() < deadline:
        try:
            line = lines.get(timeout=0.2)
        except queue.Empty:
            continue
        if line is None:
            break
        seen.append(line)
        match = URL_LINE.match(line)
        if match:
            served = Served(proc, match.group(1), match.group(2), seen, sign_in=line.split(" ", 2)[2])
            _wait_ready(served)
            return served
    proc.kill()
    _, err = proc.communicate(timeout=10)
    raise AssertionError(f"ov serve did not print its address: {seen} {err}")


def _wait_ready(served: Served, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if served.get("/api/health").status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    raise AssertionError("ov serve never answered /api/health")


@dataclass
class SSEEvent:
    id: int
    data: dict[str, t.Any]


class SSEReader:
    """Reads /events/stream on a thread; events, comments and the end of the stream are recorded."""

    def __init__(self, served: Served, *, last_event_id: int | None = None, params: dict[str, t.Any] | None = None,
                 stop_after: int | None = None) -> None:
        self.served = served
        self.headers = dict(served.auth)
        if last_event_id is not None:
            self.headers["Last-Event-ID"] = str(last_event_id)
        self.params = params or {}
        self.stop_after = stop_after  # disconnect right after the event with this id
        self.events: list[SSEEvent] = []
        self.comments: list[str] = []
        self.status: int | None = None
        self.ended = threading.Event()  # the server closed the stream (or we disconnected)
        self.connected = threading.Event()
        self.error: BaseException | None = None
        self._closing = False
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            with httpx.Client(timeout=httpx.Timeout(60, read=60)) as client, client.stream(
                    "GET", self.served.base + "/events/stream", headers=self.headers, params=self.params) as response:
                self.status = response.status_code
                self.connected.set()
                event_id: int | None = None
                data: list[str] = []
                for line in response.iter_lines():
                    if self._closing:
                        break
                    if line.startswith(":"):
                        self.comments.append(line)
                    elif line.startswith("id: "):
                        event_id = int(line[4:])
                    elif line.startswith("data: "):
                        data.append(line[6:])
                    elif line == "" and data:
                        assert event_id is not None
                        self.events.append(SSEEvent(event_id, json.loads("\n".join(data))))
                        data = []
                        if self.stop_after is not None and event_id >= self.stop_after:
                            break
        except BaseException as exc:  # noqa: BLE001 - reported to the test
            if not self._closing:
                self.error = exc
        finally:
            self.connected.set()
            self.ended.set()

    @property
    def ids(self) -> list[int]:
        return [e.id for e in self.events]

    def wait_for(self, predicate: t.Callable[[SSEReader], bool], timeout: float = 30, what: str = "") -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate(self):
                return
            if self.error is not None:
                raise AssertionError(f"the SSE client failed: {self.error!r}")
            time.sleep(0.02)
        raise AssertionError(f"timed out after {timeout}s waiting for {what or predicate} "
                             f"(got {len(self.events)} events, last {self.ids[-3:]})")

    def close(self) -> None:
        self._closing = True
        self._thread.join(timeout=0.1)


def child_pids(pid: int) -> list[int]:
    """Live processes whose parent is ``pid``."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as handle:
                stat = handle.read()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2:].split()
        if int(fields[1]) == pid and fields[0] not in "ZX":
            found.append(int(entry))
    return found


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as handle:
        stat = handle.read()
    fields = stat[stat.rfind(")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
