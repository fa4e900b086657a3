"""The `ov watch` processes of a project: each one's record, the background one, and stopping the others.

Every `ov watch` that stays up (not ``--once``) writes ``.overstory/run/watch/<pid>.json`` while it
runs: its pid, start ticks, whether it is the background dashboard, and where that one writes its
frames. A record is believed only when the pid is alive, has the recorded start time, and its
command line is an `ov watch` (``/proc/PID/cmdline``): a pid reused by another program, or a
record left by a dashboard killed with SIGKILL, is removed and never signalled. So `ov watch
--kill-others` stops only dashboards ov started for this project, never a process it did not create.

``ov watch --background`` starts one detached dashboard per project: the daemon holds an flock on
``run/watch/background.lock`` for its life (the kernel drops it if the daemon dies), so two racing
starts leave one daemon; the one that lost the lock exits at once (``ANOTHER_DAEMON``) and its starter
reports the winner.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
import typing as t
from pathlib import Path

from overstory import procs
from overstory.clock import now_ms
from overstory.errors import OrchestratorError

if t.TYPE_CHECKING:
    from overstory.paths import ProjectPaths

ANOTHER_DAEMON = 3  # the exit code of a background dashboard that found the lock taken
START_TIMEOUT = 20.0  # seconds `ov watch --background` waits for its daemon's record


def watch_dir(project: ProjectPaths) -> Path:
    return project.run_dir / "watch"


def frames_file(project: ProjectPaths) -> Path:
    """Where the background dashboard writes its latest frame (replaced whole, each interval)."""
    return watch_dir(project) / "frame.txt"


def log_file(project: ProjectPaths) -> Path:
    return watch_dir(project) / "background.log"


def _record_path(project: ProjectPaths, pid: int) -> Path:
    return watch_dir(project) / f"{pid}.json"


def is_ov_watch(pid: int) -> bool:
    """Whether the process's command line is an `ov watch` (the `ov` script or ``python -m overstory``)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            argv = [os.fsdecode(arg) for arg in handle.read().split(b"\0") if arg]
    except OSError:
        return False
    is_ov = any(os.path.basename(arg) == "ov" or arg == "overstory" or arg.endswith("/overstory/__main__.py")
                for arg in argv[:3])
    return is_ov and "watch" in argv[1:]


def register(project: ProjectPaths, *, background: bool, frames: Path | None = None) -> Path:
    """Write this process's record (atomically); remove it with ``unregister``."""
    pid = os.getpid()
    target = _record_path(project, pid)
    target.parent.mkdir(parents=True, exist_ok=True)
    temporary = target.with_name(f".{target.name}.tmp")
    temporary.write_text(json.dumps({"pid": pid, "ticks": procs.start_ticks(pid), "background": background,
                                     "frames": str(frames) if frames else None, "started_at": now_ms()}),
                         encoding="utf-8")
    os.replace(temporary, target)
    return target


def unregister(project: ProjectPaths) -> None:
    _record_path(project, os.getpid()).unlink(missing_ok=True)


def running(project: ProjectPaths) -> list[dict[str, t.Any]]:
    """The live `ov watch` processes of this project, oldest first; records of dead (or reused) pids are removed."""
    found = []
    for path in sorted(watch_dir(project).glob("*.json")):
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        pid, ticks = record.get("pid") if isinstance(record, dict) else None, None
        if isinstance(record, dict):
            ticks = record.get("ticks")
        if not isinstance(pid, int) or path.stem != str(pid):
            continue  # not a record ov wrote: left alone
        if procs.is_alive(pid, ticks if isinstance(ticks, int) else None) and is_ov_watch(pid):
            found.append(record)
        else:
            path.unlink(missing_ok=True)
    return sorted(found, key=lambda record: (record.get("started_at") or 0, record["pid"]))


def background(project: ProjectPaths) -> dict[str, t.Any] | None:
    """The running background dashboard's record, or None."""
    return next((record for record in running(project) if record.get("background")), None)


def kill_others(project: ProjectPaths, *, grace: float = 5.0) -> list[int]:
    """SIGTERM every other live `ov watch` of this project (SIGKILL after ``grace`` seconds); the pids stopped.

    Each is checked again (start time, command line) right before each signal.
    """
    import signal

    me = os.getpid()
    others = [record for record in running(project) if record["pid"] != me]

    def still_ours(record: dict[str, t.Any]) -> bool:
        return procs.is_alive(record["pid"], record.get("ticks")) and is_ov_watch(record["pid"])

    for record in others:
        if still_ours(record):
            try:
                os.kill(record["pid"], signal.SIGTERM)
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + grace
    while any(still_ours(record) for record in others) and time.monotonic() < deadline:
        time.sleep(0.05)
    for record in others:
        if still_ours(record):
            try:
                os.kill(record["pid"], signal.SIGKILL)
            except ProcessLookupError:
                pass
        _record_path(project, record["pid"]).unlink(missing_ok=True)
    return [record["pid"] for record in others]


class BackgroundLock:
    """The background dashboard's flock, held for its life."""

    def __init__(self, project: ProjectPaths) -> None:
        self.path = watch_dir(project) / "background.lock"
        self.fd: int | None = None

    def acquire(self) -> bool:
        """True when taken; False when another background dashboard holds it."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        self.fd = fd
        return True

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def start_background(project: ProjectPaths, options: t.Sequence[str]) -> tuple[dict[str, t.Any], bool]:
    """The background dashboard's record, and whether this call started it (False: one was running).

    Starts ``ov watch --daemon OPTIONS`` detached (its own session; stdin closed; output to
    ``background.log``) and waits for its record. Killed while waiting, the daemon runs on and the
    next `ov watch` finds it. A daemon that lost the race for the lock exits; the winner is reported.
    """
    from overstory.watchdog.background import start_detached_ov

    existing = background(project)
    if existing is not None:
        return existing, False
    log = log_file(project)
    child = start_detached_ov(project, ["watch", "--daemon", *options], log)
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        code = child.poll()
        found = background(project)
        if found is not None:
            return found, found["pid"] == child.pid
        if code is not None:
            if code == ANOTHER_DAEMON:
                time.sleep(0.05)  # the winner writes its record right after taking the lock
                continue
            raise OrchestratorError(f"the background dashboard exited at once (exit {code}); see {log}")
        time.sleep(0.05)
    raise OrchestratorError(f"the background dashboard (pid {child.pid}) did not start within {START_TIMEOUT:g}s; "
                            f"see {log}")
