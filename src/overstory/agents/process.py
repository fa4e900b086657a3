"""What every per-agent background process shares: locks, the launch environment, signals.

The headless loop (``agents.loop``) and the tmux driver (``agents.tmux_driver``) are
both an ``AgentProcess``: one generation of one agent, served by at most one process
at a time because each holds the agent's OS lock (released by the kernel if it dies).
"""

from __future__ import annotations

import fcntl
import os
import signal
import time
import typing as t
from pathlib import Path

from overstory import jsontext, procs
from overstory.paths import ProjectPaths
from overstory.store import sessions
from overstory.store.db import open_state
from overstory.store.sessions import Session

POLL_SECONDS = 0.4
LOCK_WAIT_SECONDS = 10.0


def env_file(project: ProjectPaths, agent: str) -> Path:
    return project.run_dir / agent / "env.json"


def save_launch_env(project: ProjectPaths, agent: str, environ: t.Mapping[str, str]) -> Path:
    """Keep the environment `ov sling` ran in, so a re-adopted loop gives turns the same one."""
    path = env_file(project, agent)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(jsontext.dumps(dict(environ)))
    return path


def load_launch_env(project: ProjectPaths, agent: str) -> dict[str, str]:
    try:
        return dict(jsontext.loads(env_file(project, agent).read_text(encoding="utf-8")))
    except (OSError, ValueError):
        return dict(os.environ)


class _Lock:
    """A non-blocking flock on a file; released by the kernel if we die."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)

    def try_acquire(self, note: str = "") -> bool:
        """Take the lock and write our pid in the file (and ``note`` after it)."""
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        os.ftruncate(self.fd, 0)
        os.write(self.fd, f"{os.getpid()} {note}".strip().encode())
        return True

    def release(self) -> None:
        fcntl.flock(self.fd, fcntl.LOCK_UN)


def agent_lock_path(project: ProjectPaths, agent: str) -> Path:
    return project.locks_dir / f"agent-{agent}.lock"


def acquire_turn_slot(project: ProjectPaths, slots: int, should_stop: t.Callable[[], bool]) -> _Lock | None:
    """Wait for one of ``slots`` project-wide turn slots (the global concurrency limit)."""
    locks = [_Lock(project.locks_dir / f"turn-slot-{i}.lock") for i in range(slots)]
    while not should_stop():
        for lock in locks:
            if lock.try_acquire():
                for other in locks:
                    if other is not lock:
                        os.close(other.fd)
                return lock
        time.sleep(POLL_SECONDS)
    for lock in locks:
        os.close(lock.fd)
    return None


class AgentProcess:
    """What every per-agent background process shares (the headless loop, the tmux driver).

    It serves one generation of one agent, stops on SIGTERM/SIGINT, ignores the
    terminal hanging up, and holds the agent's OS lock for its whole life, so that
    at most one of them serves an agent at a time.
    """

    def __init__(self, project: ProjectPaths, name: str, generation: int) -> None:
        self.project = project
        self.name = name
        self.generation = generation
        self.state = open_state(project.state_db)
        self.stopping = False
        self.signalled: int | None = None  # the signal that stopped it (SIGTERM, SIGINT), if one did
        self._lock: _Lock | None = None
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)

    def _on_signal(self, signum: int, frame: object) -> None:
        self.stopping = True
        self.signalled = signum

    def current(self) -> Session | None:
        """The agent's row while it is still ours to serve (same generation, not terminal)."""
        agent = sessions.get(self.state, self.name)
        if agent is None or agent.generation != self.generation or agent.is_terminal:
            return None
        return agent

    def should_stop(self) -> bool:
        return self.stopping or self.current() is None

    def take_agent(self) -> bool:
        """Take the agent's lock and record our pid; False if another process serves it.

        The lock may still be held by one on its way out (the previous generation
        noticing it was replaced), so wait a little before giving up.
        """
        lock = _Lock(agent_lock_path(self.project, self.name))
        deadline = time.monotonic() + LOCK_WAIT_SECONDS
        while not lock.try_acquire(note=str(self.generation)):  # `ov doctor` reads whom it serves there
            if time.monotonic() > deadline or self.should_stop():
                os.close(lock.fd)
                return False
            time.sleep(POLL_SECONDS)
        self._lock = lock
        return sessions.update_fields(self.state, self.name, self.generation, loop_pid=os.getpid(),
                                      loop_start_ticks=procs.start_ticks(os.getpid()))


MALLOC_ARENAS_ENV = "MALLOC_ARENA_MAX"


def _loop_env(environ: t.Mapping[str, str]) -> dict[str, str]:
    env = dict(environ)
    # glibc gives every thread that allocates an arena of its own: the endpoint's threads would keep about 0.3 MiB
    # of each idle loop that way, in a process that mostly waits. (Only the loop's own variable: a turn's
    # command gets the launch environment. Other C libraries ignore it.)
    env.setdefault(MALLOC_ARENAS_ENV, "1")
    return env


def loop_log_path(project: ProjectPaths, agent: str) -> Path:
    return project.run_dir / agent / "loop.log"


def spawn_loop(project: ProjectPaths, agent: str, generation: int, environ: t.Mapping[str, str]) -> tuple[int, int | None]:
    """Start the detached loop for ``agent``; returns (pid, start ticks)."""
    import subprocess
    import sys

    log_path = loop_log_path(project, agent)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "overstory.agents.loop", "--project", str(project.root), "--agent", agent,
             "--generation", str(generation)],
            stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True, close_fds=True,
            env=_loop_env(environ), cwd=str(project.root),
        )
    return proc.pid, procs.start_ticks(proc.pid)


class WarmLoop:
    """An agent loop started before its spawn is done, waiting for the word to go (``ov sling``).

    Python's start-up and the loop's imports take tens of milliseconds: this way they overlap the
    spawn's git and database work instead of following it. Until told its generation on ``--go-fd``
    the process touches nothing (no lock, no row, no file; its output goes nowhere), and the end of
    that pipe without a word (the spawn failed, or `ov sling` died anywhere before the word) makes it
    exit. So a killed spawn leaves nothing of it to undo.
    """

    def __init__(self, project: ProjectPaths, agent: str, environ: t.Mapping[str, str]) -> None:
        import subprocess
        import sys

        self.env = dict(environ)
        read_end, self._go = os.pipe()
        try:  # what it prints before the word (Python's warnings, -X importtime) goes to its log then
            early: int = os.open(project.root, os.O_TMPFILE | os.O_RDWR, 0o600)
        except OSError:
            early = subprocess.DEVNULL
        try:
            self.proc: subprocess.Popen[bytes] | None = subprocess.Popen(
                [sys.executable, "-m", "overstory.agents.loop", "--project", str(project.root), "--agent", agent,
                 "--go-fd", str(read_end)],
                stdin=subprocess.DEVNULL, stdout=early, stderr=early,
                start_new_session=True, pass_fds=(read_end,), env=_loop_env(environ), cwd=str(project.root))
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
    import sys

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
