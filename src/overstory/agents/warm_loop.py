"""A loop `ov sling` starts before the spawn is done (``WarmLoop``), and what such a loop does while it waits.

Python's start-up and the loop's imports take tens of milliseconds: started first, the loop spends them while
`ov sling` plans and builds the agent (git, the databases, the run dir) instead of after. It is told the
generation to serve on a pipe once the spawn has made everything the loop needs; until then it touches
nothing, so a spawn that fails (or an `ov sling` killed anywhere) leaves nothing of it to undo: the end of
the pipe without a word makes it exit.
"""

from __future__ import annotations

import os
import subprocess
import sys
import typing as t

from overstory import procs
from overstory.agents.process import loop_env, loop_log_path
from overstory.paths import ProjectPaths


class WarmLoop:
    """An agent loop started before its spawn is done, waiting on ``--go-fd`` to be told its generation.

    Until then it holds no lock, writes no row and no file; what it prints goes to an unnamed file of its
    own and into its log once it is told."""

    def __init__(self, project: ProjectPaths, agent: str, environ: t.Mapping[str, str],
                 runtime: str | None = None) -> None:
        """``runtime``: the runtime the agent will most likely have, whose modules it imports while it waits."""
        self.env = dict(environ)
        read_end, self._go = os.pipe()
        try:  # what it prints before the word (Python's warnings, -X importtime) goes to its log then
            early: int = os.open(project.root, os.O_TMPFILE | os.O_RDWR, 0o600)
        except OSError:
            early = subprocess.DEVNULL
        try:
            self.proc: subprocess.Popen[bytes] | None = subprocess.Popen(
                [sys.executable, "-m", "overstory.agents.loop", "--project", str(project.root), "--agent", agent,
                 "--go-fd", str(read_end), *(["--runtime", runtime] if runtime else [])],
                stdin=subprocess.DEVNULL, stdout=early, stderr=early,
                start_new_session=True, pass_fds=(read_end,), env=loop_env(environ), cwd=str(project.root))
        except OSError:
            self.proc = None
        finally:
            os.close(read_end)
            if early >= 0:
                os.close(early)

    def go(self, generation: int, environ: t.Mapping[str, str]) -> tuple[int, int | None] | None:
        """Tell the loop to serve ``generation``; its (pid, start ticks), or None when it cannot (it is gone,
        or was started with another environment than the spawn settled on): then start one as usual."""
        if self.proc is None or dict(environ) != self.env or self.proc.poll() is not None:
            self.discard()
            return None
        ticks = procs.start_ticks(self.proc.pid)
        try:
            os.write(self._go, f"{generation}\n".encode())
        except OSError:  # it died this instant (EPIPE)
            self.discard()
            return None
        os.close(self._go)
        self._go = -1
        return self.proc.pid, ticks

    def discard(self) -> None:
        """Not needed after all (the spawn failed, or it is a tmux one): it is ended now, having touched nothing,
        so that a failed spawn leaves no process behind. (Were we killed instead, the end of its pipe ends it.)"""
        if self._go < 0:
            return
        os.close(self._go)
        self._go = -1
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()  # our own child, in a group of its own, that has not been told to start
            self.proc.wait()


def wait_for_go(fd: int, project: ProjectPaths, agent: str) -> int | None:
    """A warm loop's wait (``WarmLoop``): the generation it is told to serve, or None when its spawn did not
    happen. On the word, the loop's output goes to its log, as a loop started the usual way."""
    with os.fdopen(fd, "rb") as pipe:
        word = pipe.readline().strip()
    if not word.isdigit():
        return None
    sys.stdout.flush()
    sys.stderr.flush()
    log = os.open(loop_log_path(project, agent), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.lseek(2, 0, os.SEEK_SET)  # an unnamed file of its own (WarmLoop); /dev/null reads nothing
        while chunk := os.read(2, 65536):
            os.write(log, chunk)
    except OSError:
        pass
    for target in (1, 2):
        os.dup2(log, target)
    os.close(log)
    return int(word)
