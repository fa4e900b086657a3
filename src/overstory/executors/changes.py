"""A file descriptor that becomes readable when something in a folder changes (Linux inotify).

A local turn's runtime writes its lines to a file in the turn's folder, and the shim renames ``exit.json``
into it when the turn ends. The loop reads that file between waits that double while nothing comes
(``agents.turn_exec.ExecutorLines``): a line or the end can sit there for up to a wait. Watching the folder,
the reader sleeps in ``select`` on this descriptor instead and wakes when a file in it is written, closed or
renamed into it; the doubling waits stay as the longest it sleeps.

Called through ``_ctypes`` alone (the loop already loads it to give memory back; the ``ctypes`` package
would cost every loop 0.4 MiB more). Where inotify cannot be had (another kernel, no libc symbol, the
per-user limit of instances reached: 128 by default) ``FolderWatch.open`` gives None and the reader waits
as before: nothing depends on a wake-up, it only comes sooner.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    import typing as t

IN_MODIFY, IN_CLOSE_WRITE, IN_MOVED_TO, IN_CREATE = 0x2, 0x8, 0x80, 0x100
IN_NONBLOCK, IN_CLOEXEC = 0o4000, 0o2000000
_WATCHED = IN_MODIFY | IN_CLOSE_WRITE | IN_MOVED_TO | IN_CREATE

_calls: list[tuple[t.Any, t.Any, t.Any]] = []  # (_ctypes, init1, add_watch) once looked up ...
_looked_up = False  # ... or nothing, when there is no inotify here


def _inotify() -> tuple[t.Any, t.Any, t.Any] | None:
    global _looked_up
    if not _looked_up:
        _looked_up = True
        try:
            import _ctypes

            program = _ctypes.dlopen(None)  # type: ignore[arg-type]  # the program (libc is linked in)
            _calls.append((_ctypes, _ctypes.dlsym(program, "inotify_init1"),
                           _ctypes.dlsym(program, "inotify_add_watch")))
        except (ImportError, OSError, AttributeError):
            pass
    return _calls[0] if _calls else None


class FolderWatch:
    """An inotify instance watching one folder's files; ``fileno`` for ``select``, ``drain`` after a wake."""

    def __init__(self, fd: int, wd: int) -> None:
        self.fd, self.wd = fd, wd

    @classmethod
    def open(cls, folder: str | os.PathLike[str]) -> FolderWatch | None:
        calls = _inotify()
        if calls is None:
            return None
        ctypes_, init1, add_watch = calls
        fd = int(ctypes_.call_function(init1, (IN_NONBLOCK | IN_CLOEXEC,)))
        if fd < 0:
            return None
        wd = int(ctypes_.call_function(add_watch, (fd, os.fsencode(folder), _WATCHED)))
        if wd < 0:
            os.close(fd)
            return None
        return cls(fd, wd)

    def fileno(self) -> int:
        return self.fd

    def drain(self) -> None:
        """Read the queued events (which file changed does not matter: the reader looks at all it needs)."""
        try:
            while os.read(self.fd, 4096):
                pass
        except (BlockingIOError, OSError):
            pass

    def close(self) -> None:
        """Let go of the instance, off the caller's path: closing one that watched something waits for the kernel
        to retire its watch (an RCU grace period: 5-20 ms measured here, at the end of every turn, removing the
        watch first or not), so a thread of its own does the close."""
        fd, self.fd = self.fd, -1
        if fd < 0:
            return
        import threading

        threading.Thread(target=os.close, args=(fd,), name="ov-inotify-close", daemon=True).start()
