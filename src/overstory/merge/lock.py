"""One merge at a time per target branch.

``fcntl.flock`` on ``<lock_dir>/merge-<target>.lock``: the kernel drops the lock when the
holder dies, so a crashed merge never leaves a stale lock behind, and no pid is ever
guessed at. The holder writes its pid into the file only so that a waiter can say who
it is waiting for. The file itself is never deleted (deleting a flock'ed file lets two
processes hold "the" lock on different inodes).
"""

from __future__ import annotations

import errno
import fcntl
import os
import time
import typing as t
from pathlib import Path
from urllib.parse import quote

from overstory.errors import LockHeld

_POLL_FIRST = 0.02
_POLL_MAX = 0.25


def lock_path(lock_dir: Path, target: str) -> Path:
    """Branch names contain '/', so the target is percent-encoded into one file name."""
    return Path(lock_dir) / f"merge-{quote(target, safe='')}.lock"


class TargetLock:
    """``with TargetLock(lock_dir, "main", wait=30):`` holds the merge lock of branch main.

    A live holder makes this wait up to ``wait`` seconds (0: do not wait), then raise
    ``LockHeld`` naming the holder's pid. ``on_wait(holder_pid)`` is called once, when
    waiting starts (``None`` if the holder has not written its pid yet). Not reentrant:
    a second TargetLock on the same target in the same process waits like anyone else.
    """

    def __init__(
        self,
        lock_dir: Path,
        target: str,
        wait: float,
        *,
        on_wait: t.Callable[[int | None], None] | None = None,
    ) -> None:
        self.path = lock_path(lock_dir, target)
        self.target = target
        self.wait = max(0.0, float(wait))
        self.on_wait = on_wait
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> None:
        if self._fd is not None:
            raise RuntimeError("TargetLock is already held by this object")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            self._wait_for(fd)
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd

    def _wait_for(self, fd: int) -> None:
        deadline = time.monotonic() + self.wait
        delay = _POLL_FIRST
        told = False
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return
            except OSError as exc:
                if exc.errno not in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                    raise
            now = time.monotonic()
            if now >= deadline:
                holder = self.holder_pid()
                who = f"pid {holder}" if holder is not None else "another process (pid not yet written)"
                raise LockHeld(
                    f"the merge lock for target branch {self.target!r} is held by {who}; "
                    f"waited {self.wait:g}s ({self.path})"
                )
            if not told and self.on_wait is not None:
                told = True
                self.on_wait(self.holder_pid())
            time.sleep(min(delay, max(0.0, deadline - now)))
            delay = min(delay * 2, _POLL_MAX)

    def fds(self) -> tuple[int, ...]:
        """The lock's descriptor, for a child that must keep the lock held even if we die (``pass_fds``)."""
        return (self._fd,) if self._fd is not None else ()

    def holder_pid(self) -> int | None:
        """The pid the current holder wrote, if any (read without taking the lock)."""
        try:
            text = self.path.read_text().strip()
        except OSError:
            return None
        return int(text) if text.isdigit() else None

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is None:
            return
        try:
            os.ftruncate(fd, 0)
            fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)

    def __enter__(self) -> TargetLock:
        self.acquire()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.release()
