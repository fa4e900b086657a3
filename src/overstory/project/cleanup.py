"""`ov clean`: remove, in one go, what finished agents left behind.

What goes: the worktree and branch of every finished (completed or zombie) agent
whose work is merged into its base, turn logs older than ``logs.keep_days``, and
the project's tmux socket when no server listens on it any more. Work that is not
merged (commits not in the base, uncommitted changes) is kept unless ``force``.
Active agents are never touched (that is `ov stop`).

``plan`` only looks; ``apply`` carries a plan out item by item, each through the
same code as `ov stop --clean`, so a crash halfway leaves every agent either
untouched or cleaned, and running `ov clean` again finishes the job.
"""

from __future__ import annotations

import os
import shutil
import socket
import sqlite3
import time
import typing as t
from dataclasses import asdict, dataclass, field
from pathlib import Path

from overstory.errors import CleanRefused
from overstory.gitutil import branch_exists
from overstory.paths import ProjectPaths
from overstory.store import sessions, turns

DAY_SECONDS = 86_400


@dataclass(frozen=True)
class Item:
    kind: str          # agent | logs | socket
    target: str        # agent name, log folder or socket path
    detail: str        # what exactly goes, or why it is kept

    def as_dict(self) -> dict[str, str]:
        return asdict(self)


@dataclass
class Plan:
    remove: list[Item] = field(default_factory=list)
    kept: list[Item] = field(default_factory=list)

    def as_dict(self) -> dict[str, t.Any]:
        return {"remove": [i.as_dict() for i in self.remove], "kept": [i.as_dict() for i in self.kept]}


def plan(project: ProjectPaths, conn: sqlite3.Connection, *, merged_only: bool = False, force: bool = False,
         keep_days: float = 14, fallback_base: str | None = None, now: float | None = None) -> Plan:
    """What `ov clean` would remove (and what it keeps, with why)."""
    from overstory.agents.stop import check_clean_is_safe

    result = Plan()
    for agent in sessions.list_sessions(conn):
        if not agent.is_terminal:
            continue
        leftovers = _leftovers(project, agent)
        if not leftovers and agent.state == "completed":
            continue
        try:
            check_clean_is_safe(project, agent, fallback_base)
            unmerged = None
        except CleanRefused as exc:
            unmerged = str(exc)
        what = ", ".join(leftovers) or "nothing on disk"
        if agent.state == "zombie":
            what = f"settle the zombie to completed; {what}"
        if unmerged is None:
            result.remove.append(Item("agent", agent.name, what))
        elif merged_only:
            continue
        elif force:
            result.remove.append(Item("agent", agent.name, f"{what} (NOT merged, --force: {unmerged})"))
        else:
            result.kept.append(Item("agent", agent.name, unmerged))
    result.remove += _old_logs(project, conn, keep_days, time.time() if now is None else now)
    stale = stale_socket(project)
    if stale is not None:
        result.remove.append(Item("socket", str(stale), "tmux socket with no server behind it"))
    return result


def apply(project: ProjectPaths, conn: sqlite3.Connection, chosen: Plan, *, force: bool = False,
          kill_grace: float = 5.0, fallback_base: str | None = None) -> list[Item]:
    """Carry the plan out; returns what was removed. An agent that changed since the plan is skipped."""
    from overstory.agents.stop import stop_agent

    done: list[Item] = []
    for item in chosen.remove:
        if item.kind == "agent":
            agent = sessions.get(conn, item.target)
            if agent is None or not agent.is_terminal:
                continue
            try:
                stop_agent(project, conn, item.target, force=force, clean=True, kill_grace=kill_grace,
                           fallback_base=fallback_base)
            except CleanRefused:
                continue  # new commits or changes appeared since the plan: keep them
        elif item.kind == "logs":
            shutil.rmtree(item.target, ignore_errors=True)
            parent = Path(item.target).parent
            if parent.is_dir() and not any(parent.iterdir()):
                parent.rmdir()
        elif item.kind == "socket":
            if stale_socket(project) is None:
                continue
            Path(item.target).unlink(missing_ok=True)
        done.append(item)
    return done


def _leftovers(project: ProjectPaths, agent: sessions.Session) -> list[str]:
    found = []
    if agent.worktree and Path(agent.worktree).is_dir():
        found.append(f"worktree {_relative(project, Path(agent.worktree))}")
    if agent.branch and branch_exists(project.root, agent.branch):
        found.append(f"branch {agent.branch}")
    return found


def _relative(project: ProjectPaths, path: Path) -> str:
    try:
        return str(path.relative_to(project.root))
    except ValueError:
        return str(path)


def _old_logs(project: ProjectPaths, conn: sqlite3.Connection, keep_days: float, now: float) -> list[Item]:
    """Per-turn log folders (``logs/<agent>/<turn>/``) with nothing newer than ``keep_days``.

    The folder of a turn that is still running is never old: its files are written to.
    """
    running = turns.running_ids(conn)
    cutoff = now - keep_days * DAY_SECONDS
    found = []
    if not project.logs_dir.is_dir():
        return found
    for agent_dir in sorted(p for p in project.logs_dir.iterdir() if p.is_dir()):
        for folder in sorted(p for p in agent_dir.iterdir() if p.is_dir()):
            if folder.name in running:
                continue
            newest = _newest_mtime(folder)
            if newest < cutoff:
                age = (now - newest) / DAY_SECONDS
                found.append(Item("logs", str(folder), f"{_relative(project, folder)} ({age:.0f} days old)"))
    return found


def _newest_mtime(folder: Path) -> float:
    newest = folder.stat().st_mtime
    for dirpath, _dirs, files in os.walk(folder):
        for name in files:
            try:
                newest = max(newest, os.stat(os.path.join(dirpath, name)).st_mtime)
            except OSError:
                continue
    return newest


def socket_path(project: ProjectPaths) -> Path:
    """Where tmux keeps the project's own socket (``tmux -L ov-<hash>``)."""
    from overstory.agents.tmux.server import socket_name

    base = os.environ.get("TMUX_TMPDIR") or "/tmp"
    return Path(base) / f"tmux-{os.getuid()}" / socket_name(project)


def stale_socket(project: ProjectPaths) -> Path | None:
    """The project's tmux socket if it exists and no server answers on it."""
    path = socket_path(project)
    if not path.exists():
        return None
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.settimeout(2)
        probe.connect(str(path))
    except (ConnectionRefusedError, FileNotFoundError):
        return path
    except OSError:
        return None  # busy or not ours to judge: leave it
    finally:
        probe.close()
    return None
