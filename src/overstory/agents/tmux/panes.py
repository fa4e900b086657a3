"""A tmux agent's pane seen from outside: its files, its liveness, why it died, and ending it.

Used by ``agents.tmux`` (starting), the driver, ``ov stop`` and the watchdog. The
liveness checks read ``/proc`` only, cheap enough for every watchdog tick; libtmux
is imported only by the functions that talk to tmux.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import time
import typing as t
from dataclasses import dataclass, field
from pathlib import Path

from overstory import procs
from overstory.agents.tmux.server import capture_pane, find_pane, list_sessions, server, tmux_available
from overstory.errors import TmuxError
from overstory.paths import ProjectPaths
from overstory.runtimes import get_runtime

if t.TYPE_CHECKING:
    from libtmux.pane import Pane

    from overstory.runtimes.base import Tui
    from overstory.store.sessions import Session


def tui_of(agent: Session) -> Tui:
    """The TUI of ``agent``'s runtime; TmuxError when the runtime has none."""
    tui = get_runtime(agent.runtime).tui
    if tui is None:
        raise TmuxError(f"the {agent.runtime} runtime has no interactive TUI for tmux mode")
    return tui


def launch_tag(generation: int) -> str:
    """``OVERSTORY_TURN_ID`` of a tmux agent's TUI: with the agent name and project root
    in the same environment, it marks every process the TUI started (even tool shells
    that left its process group), so ``kill_session`` can find them."""
    return f"tmux-g{generation}"


def logs_dir(project: ProjectPaths, agent_name: str) -> Path:
    return project.logs_dir / agent_name / "tmux"


def launch_file(project: ProjectPaths, agent_name: str) -> Path:
    return project.run_dir / agent_name / "tmux-launch.json"


EXIT_FILE_NAME = "tmux-exit.json"  # written by the launcher, next to the launch file


def exit_file(project: ProjectPaths, agent_name: str) -> Path:
    return project.run_dir / agent_name / EXIT_FILE_NAME


def save_screen(project: ProjectPaths, agent_name: str, label: str, text: str | None) -> Path | None:
    if text is None:
        return None
    folder = logs_dir(project, agent_name)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}-{label}.txt"
    path.write_text(text + "\n", encoding="utf-8")
    return path



def exit_description(project: ProjectPaths, name: str, pane: Pane | None) -> str:
    """How the TUI ended: from the launcher's exit file, else from tmux."""
    from libtmux import exc as tmux_exc

    deadline = time.monotonic() + 1.0
    while True:  # the launcher writes the file just before it exits
        try:
            ended = json.loads(exit_file(project, name).read_text(encoding="utf-8"))
            break
        except (OSError, ValueError):
            if time.monotonic() > deadline:
                ended = None
                break
            time.sleep(0.05)
    if ended is not None:
        return str(ended.get("description") or "exited")
    if pane is None:
        return "exited, and its tmux pane is gone"
    try:
        pane.refresh()
        while pane.pane_dead != "1" and time.monotonic() < deadline:  # tmux notices the exit a moment later
            time.sleep(0.05)
            pane.refresh()
    except tmux_exc.LibTmuxException:
        return "exited, and its tmux pane is gone"
    if pane.pane_dead_signal:
        return f"was killed by signal {pane.pane_dead_signal}"
    if pane.pane_dead_status:
        return f"exited with status {pane.pane_dead_status}"
    return "exited"



# ---- liveness and stopping (for the watchdog and `ov stop`) ----------------------------


def pane_status(agent: Session) -> str:
    """``alive``, ``gone`` (the recorded pane process no longer runs) or ``not_started``.

    Reads ``/proc`` only (no tmux call), cheap enough for every watchdog tick.
    """
    if agent.turn_pgid is None:
        return "not_started"
    return "alive" if procs.is_alive(agent.turn_pgid, agent.turn_start_ticks) else "gone"


def pane_alive(agent: Session) -> bool:
    """False only when a pane was recorded and its process is gone (the agent is then a zombie)."""
    return pane_status(agent) != "gone"


def pane_exit_reason(project: ProjectPaths, agent: Session) -> str:
    """Why a tmux agent's pane is gone, for the ``worker_died`` mail (calls tmux)."""
    from libtmux.exc import LibTmuxException as LibTmuxError

    if not agent.tmux_session:
        return "its tmux pane was never recorded"
    pane = find_pane(server(project), agent.tmux_session) if tmux_available() else None
    ended = exit_file(project, agent.name).exists()
    if pane is None:
        if ended:
            return f"its TUI {exit_description(project, agent.name, None)}; its tmux session is gone"
        return f"its tmux session {agent.tmux_session} is gone (the tmux server was killed?)"
    text = capture_pane(pane, history=True) or ""
    last_lines = tui_of(agent).last_lines
    try:
        pane.refresh()
        dead = pane.pane_dead == "1"
    except LibTmuxError:
        dead = True
    if ended or dead:
        return f"its TUI {exit_description(project, agent.name, pane)}; last lines: {last_lines(text, 3)}"
    return (f"its pane process {agent.turn_pgid} (ov's launcher) is gone, though the pane is still open; "
            f"last lines: {last_lines(text, 3)}")


@dataclass
class KillReport:
    session_killed: bool = False
    pane_group_killed: bool = False
    leftovers: list[int] = field(default_factory=list)
    screen_saved: str | None = None

    def as_dict(self) -> dict[str, t.Any]:
        return dict(self.__dict__)


def kill_session(project: ProjectPaths, agent: Session, *, grace: float = 5.0, force: bool = False) -> KillReport:
    """End a tmux agent's TUI: save its last screen, kill its session, its process group
    and the tool shells it left behind. Does not touch the state or the driver.

    For ``ov stop`` and for the watchdog after it declared a tmux agent zombie.
    """
    if not agent.tmux_session:
        return KillReport()
    return end_pane(project, agent.name, agent.generation, agent.tmux_session, agent.turn_pgid, agent.turn_start_ticks,
                 grace=grace, force=force)


def end_pane(project: ProjectPaths, name: str, generation: int, tmux_session: str, pane_pid: int | None,
          pane_ticks: int | None, *, grace: float, force: bool) -> KillReport:
    report = KillReport()
    if tmux_available():
        tmux = server(project)
        pane = find_pane(tmux, tmux_session)
        if pane is not None:
            saved = save_screen(project, name, "final", capture_pane(pane, history=True))
            report.screen_saved = str(saved) if saved else None
            done = tmux.cmd("kill-session", "-t", f"={tmux_session}")
            report.session_killed = done.returncode == 0
    if pane_pid is not None and procs.group_alive(pane_pid, pane_ticks):
        # kill-session hung up the pane; a TUI that ignores SIGHUP gets the usual TERM, then KILL.
        deadline = time.monotonic() + min(grace, 2.0)
        while time.monotonic() < deadline and procs.group_alive(pane_pid, pane_ticks):
            time.sleep(0.05)
        if procs.group_alive(pane_pid, pane_ticks):
            procs.kill_group(pane_pid, pane_ticks, grace=grace, force=force)
            report.pane_group_killed = True
    report.leftovers = _kill_tagged(project, name, generation)
    return report


def _ancestors() -> set[int]:
    chain = {os.getpid()}
    pid = os.getppid()
    while pid > 1 and pid not in chain:
        chain.add(pid)
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            pid = int(stat[stat.rfind(")") + 2:].split()[1])
        except (OSError, ValueError, IndexError):
            break
    return chain


def _kill_tagged(project: ProjectPaths, name: str, generation: int) -> list[int]:
    """Kill processes whose environment carries this agent's TUI tag (tool shells in their own sessions)."""
    wanted = {
        f"OVERSTORY_AGENT_NAME={name}".encode(), f"OVERSTORY_PROJECT_ROOT={project.root}".encode(),
        f"OVERSTORY_TURN_ID={launch_tag(generation)}".encode(),
    }
    spared = _ancestors()
    found: list[tuple[int, int | None]] = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) in spared:
            continue
        try:
            environ = set((entry / "environ").read_bytes().split(b"\0"))
            if wanted <= environ and (entry / "comm").read_text().startswith("tmux"):
                continue  # never a tmux server or client: other agents' panes live there
        except OSError:
            continue
        if wanted <= environ:
            found.append((int(entry.name), procs.start_ticks(int(entry.name))))
    for pid, ticks in found:
        if procs.is_alive(pid, ticks):
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + 2.0
    while time.monotonic() < deadline and any(procs.is_alive(p, k) for p, k in found):
        time.sleep(0.05)
    for pid, ticks in found:
        if procs.is_alive(pid, ticks):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    return [pid for pid, _ in found]


def orphan_sessions(project: ProjectPaths, conn: sqlite3.Connection) -> list[str]:
    """Sessions on the project's socket that no active tmux agent owns (for the watchdog's reconcile)."""
    from overstory.store.sessions import owned_tmux_sessions

    owned = owned_tmux_sessions(conn)
    return [name for name in list_sessions(project) if name not in owned]


def record_event(project: ProjectPaths, name: str, generation: int | None, kind: str, summary: str) -> None:
    """An event about a tmux agent, written on a connection of its own (never fails the caller)."""
    from overstory.store import events as event_store
    from overstory.store.db import open_events

    try:
        conn = open_events(project.events_db)
    except Exception:  # an event is a courtesy; never fail the real work for it
        return
    try:
        event_store.record(conn, kind, agent=name, generation=generation, summary=summary[:300])
    except sqlite3.Error:
        pass
    finally:
        conn.close()

