"""The project's watchdog as a detached daemon (`ov watchdog --background`, `ov coordinator start --watchdog`).

One watchdog per project: before starting one, this looks for any that runs already the way
`ov doctor` counts them (``lock.running_watchdogs``: live records and the lock's flock holders,
so an `ov watch` or a foreground `ov watchdog` counts too) and starts nothing if one does. Two
starts that race both find none and both start a daemon; the flock lets one of them run and the
other exits at once (``LockHeld``, exit 1), and its starter reports the winner.

The daemon is `ov watchdog` itself, started in its own session (it outlives the terminal) with
stdin closed and its output appended to ``.overstory/run/watchdog.log``; SIGTERM stops it (`kill PID`).
If the starter dies after starting it and before seeing its lock, the daemon runs on and the next
start (or `ov doctor`) finds it: the starter owns nothing that needs undoing.
"""

from __future__ import annotations

import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from overstory.errors import OrchestratorError
from overstory.paths import ProjectPaths
from overstory.watchdog.lock import lock_holder, running_watchdogs

START_TIMEOUT = 20.0  # seconds to wait for the daemon to hold the lock
FAULT_ENV = "OV_TEST_DIE_AT"  # test hook: "watchdog_started" kills the starter right after the daemon starts


@dataclass(frozen=True)
class WatchdogStart:
    pid: int
    started: bool  # False: one was running already (or won a race), and this call started none
    log: Path

    def as_dict(self) -> dict[str, object]:
        return {"pid": self.pid, "started": self.started, "log": str(self.log)}


def log_file(project: ProjectPaths) -> Path:
    return project.run_dir / "watchdog.log"


def _running(project: ProjectPaths) -> int | None:
    """The pid of the watchdog that runs for this project (the lock's holder first), or None."""
    found = running_watchdogs(project)
    if not found:
        return None
    holder = lock_holder(project)
    return holder if holder in found else min(found)


def start_detached_ov(project: ProjectPaths, args: list[str], log: Path) -> subprocess.Popen[bytes]:
    """``ov --project ROOT ARGS...`` as a daemon of its own: its own session (it outlives the terminal), stdin
    closed, output appended to ``log``. The background watchdog and the background dashboard start this way."""
    import sys

    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as output:
        return subprocess.Popen([sys.executable, "-m", "overstory", "--project", str(project.root), *args],
                                stdin=subprocess.DEVNULL, stdout=output, stderr=subprocess.STDOUT,
                                start_new_session=True, close_fds=True)


def ensure_watchdog(project: ProjectPaths, *, interval: float | None = None) -> WatchdogStart:
    """The project's running watchdog, started here as a detached `ov watchdog` when none runs."""
    import os

    log = log_file(project)
    pid = _running(project)
    if pid is not None:
        return WatchdogStart(pid, False, log)
    options = ["--interval", f"{interval:g}"] if interval is not None else []
    child = start_detached_ov(project, ["watchdog", *options], log)
    if os.environ.get(FAULT_ENV) == "watchdog_started":
        os._exit(137)
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        code = child.poll()
        pid = _running(project)
        if pid is not None:
            return WatchdogStart(pid, pid == child.pid, log)
        if code is not None:
            raise OrchestratorError(f"the watchdog exited at once (exit {code}) and none runs; see {log}")
        time.sleep(0.05)
    raise OrchestratorError(f"the watchdog (pid {child.pid}) did not take its lock within {START_TIMEOUT:g}s; "
                            f"see {log}")
