"""The watchdog's single-instance lock, and the record each watchdog keeps of itself.

The lock is an flock on ``.overstory/locks/watchdog.lock``: the kernel drops it when the holder
dies, so it never goes stale. It cannot, though, stop a second watchdog when the file is deleted
or replaced while the first one runs (the second locks a new file). So each watchdog also writes
``locks/watchdog.<pid>.json`` (its pid, start ticks and the inode of the lock it holds) while it
runs, and `ov doctor` counts the live ones.
"""

from __future__ import annotations

import fcntl
import json
import os
from pathlib import Path

from overstory import procs
from overstory.errors import LockHeld, OrchestratorError
from overstory.paths import ProjectPaths


def lock_path(project: ProjectPaths) -> Path:
    return project.locks_dir / "watchdog.lock"


def lock_holder(project: ProjectPaths) -> int | None:
    """The pid written by the current (or last) holder of the watchdog lock."""
    try:
        text = lock_path(project).read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def _record_path(project: ProjectPaths, pid: int) -> Path:
    return project.locks_dir / f"watchdog.{pid}.json"


def watchdog_records(project: ProjectPaths) -> list[dict[str, object]]:
    """Every watchdog record on disk (live or left by one that was killed: check ``pid`` and ``ticks``)."""
    records = []
    for path in sorted(project.locks_dir.glob("watchdog.*.json")):
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(record, dict):
            records.append(record)
    return records


def _write_record(project: ProjectPaths, fd: int) -> None:
    pid = os.getpid()
    for leftover in project.locks_dir.glob("watchdog.*.json"):  # of watchdogs killed before they removed theirs
        number = leftover.name.split(".")[1]
        if number.isdigit() and int(number) != pid and not procs.is_alive(int(number)):
            leftover.unlink(missing_ok=True)
    target = _record_path(project, pid)
    temporary = target.with_name(f".{target.name}.tmp")
    temporary.write_text(json.dumps({"pid": pid, "ticks": procs.start_ticks(pid), "lock_inode": os.fstat(fd).st_ino}),
                         encoding="utf-8")
    os.replace(temporary, target)


def _flock_holders(inode: int) -> set[int]:
    """Pids holding an flock on the file with this inode (/proc/locks: `N: FLOCK ADVISORY WRITE PID MAJ:MIN:INODE`)."""
    holders = set()
    try:
        with open("/proc/locks", encoding="utf-8") as handle:
            for line in handle:
                fields = line.split()
                if len(fields) >= 6 and fields[1] == "FLOCK" and fields[5].rsplit(":", 1)[-1] == str(inode):
                    if fields[4].isdigit():
                        holders.add(int(fields[4]))
    except OSError:
        pass
    return holders


def running_watchdogs(project: ProjectPaths) -> dict[int, str]:
    """Live watchdogs of this project, pid -> how ov knows of it (its record, the lock): what `ov doctor` counts
    (more than one is a failure) and what `ov watchdog --background` looks for before it starts one."""
    found: dict[int, str] = {}
    try:
        inode = lock_path(project).stat().st_ino
    except OSError:
        inode = None
    for record in watchdog_records(project):
        pid, ticks = record.get("pid"), record.get("ticks")
        if isinstance(pid, int) and procs.is_alive(pid, ticks if isinstance(ticks, int) else None):
            found[pid] = ("holds the lock" if record.get("lock_inode") == inode
                          else "holds a lock file that has since been deleted or replaced")
    if inode is not None:
        for pid in _flock_holders(inode):
            found.setdefault(pid, "holds the lock")
    return found


class WatchdogLock:
    """An flock held for the watchdog's life; the kernel drops it if the holder dies."""

    def __init__(self, project: ProjectPaths) -> None:
        self.project = project
        self.fd: int | None = None

    def acquire(self) -> None:
        path = lock_path(self.project)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise OrchestratorError(f"the watchdog cannot write its lock {path} ({exc.strerror}): it needs a "
                                    "writable .overstory/; nothing was changed") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            holder = lock_holder(self.project)
            who = f"pid {holder}" if holder else "another process"
            raise LockHeld(f"a watchdog is already running for this project ({who}); "
                           "`ov watch --no-watchdog` only displays") from None
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
        self.fd = fd
        try:
            _write_record(self.project, fd)
        except OSError:
            pass  # only `ov doctor` reads it; the lock itself is what keeps a second watchdog out

    def release(self) -> None:
        if self.fd is not None:
            _record_path(self.project, os.getpid()).unlink(missing_ok=True)
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)
            self.fd = None

    def __enter__(self) -> WatchdogLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
