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
from overstory.errors import OrchestratorError
from overstory.paths import ProjectPaths
from overstory.store import sessions
from overstory.store.db import open_events, open_state
from overstory.store.sessions import Session
from overstory.store.sqlite_module import sqlite3

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


def loop_env(environ: t.Mapping[str, str]) -> dict[str, str]:
    env = dict(environ)
    # glibc gives every thread that allocates an arena of its own: the endpoint's threads would keep about 0.3 MiB
    # of each idle loop that way, in a process that mostly waits. (Only the loop's own variable: a turn's
    # command gets the launch environment. Other C libraries ignore it.)
    env.setdefault(MALLOC_ARENAS_ENV, "1")
    return env


_malloc_trim: int | bool | None = None  # its address once looked up; False where there is none


def give_back_memory() -> bool:
    """glibc's ``malloc_trim(0)``: the free pages of the heap go back to the kernel. False where it cannot be done.

    ``free`` keeps what it frees for the process to reuse and returns only the top of the heap. A loop frees a
    turn's garbage and the endpoint's pooled SQLite connections when the turn is over, in holes between what
    stays; until its next turn it only waits, and what it keeps counts for every idle agent (issue 34). Called
    through ``_ctypes`` alone (0.1 MiB, the ``ctypes`` package 0.4), loaded on the first call; another C
    library without ``malloc_trim``: nothing is done.
    """
    global _malloc_trim
    if _malloc_trim is False:
        return False
    try:
        import _ctypes

        if _malloc_trim is None:
            _malloc_trim = _ctypes.dlsym(_ctypes.dlopen(None), "malloc_trim")  # type: ignore[arg-type]  # the program
        _ctypes.call_function(_malloc_trim, (0,))
    except (ImportError, OSError, AttributeError, TypeError):
        _malloc_trim = False
        return False
    return True


def reopen_databases(project: ProjectPaths, state: sqlite3.Connection,
                     events: sqlite3.Connection) -> tuple[sqlite3.Connection, sqlite3.Connection]:
    """A loop's state.db and events.db connections opened anew after a turn, the old ones closed: the turn's
    statements (a connection keeps the last 128 it ran) and pages go with them. Where one cannot be opened now,
    the old ones are given back as they are."""
    try:
        fresh = open_state(project.state_db)
        try:
            fresh_events = open_events(project.events_db)
        except BaseException:
            fresh.close()
            raise
    except (OrchestratorError, sqlite3.Error):
        return state, events
    state.close()
    events.close()
    return fresh, fresh_events


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
            env=loop_env(environ), cwd=str(project.root),
        )
    return proc.pid, procs.start_ticks(proc.pid)
