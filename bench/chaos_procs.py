"""Processes of a chaos run: finding what a kill should hit, killing it, and what is left at the end.

The harness only ever signals processes of its own project: agent loops and turn groups as the
state database records them (checked by start time, so a reused pid is never hit), schedule
runners by their command line naming the project, and the commands it started itself.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import typing as t
from dataclasses import dataclass
from pathlib import Path


def start_ticks(pid: int) -> int | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(raw[raw.rfind(")") + 2:].split()[19])


def alive(pid: int | None, ticks: int | None = None) -> bool:
    if not pid:
        return False
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    fields = raw[raw.rfind(")") + 2:].split()
    return fields[0] not in ("Z", "X") and (ticks is None or int(fields[19]) == ticks)


def group_alive(pgid: int | None, ticks: int | None) -> bool:
    """A process group that ov recorded (its leader's pid and start ticks) still has its leader."""
    return bool(pgid) and alive(pgid, ticks)


def kill_pid(pid: int, ticks: int | None) -> bool:
    if not alive(pid, ticks):
        return False
    try:
        os.kill(pid, signal.SIGKILL)
        return True
    except ProcessLookupError:
        return False


def kill_group(pgid: int, ticks: int | None) -> bool:
    if not group_alive(pgid, ticks):
        return False
    try:
        os.killpg(pgid, signal.SIGKILL)
        return True
    except ProcessLookupError:
        return False


@dataclass
class Victim:
    kind: str
    agent: str | None
    pid: int
    ticks: int | None
    group: bool = False

    def kill(self) -> bool:
        return kill_group(self.pid, self.ticks) if self.group else kill_pid(self.pid, self.ticks)

    def describe(self) -> dict[str, t.Any]:
        return {"kind": self.kind, "agent": self.agent, "pid": self.pid, "group": self.group}


def read_only(db: Path) -> sqlite3.Connection:
    """A read-only connection: the harness never writes ov's databases."""
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=10)
    conn.row_factory = sqlite3.Row
    conn.execute("PRAGMA busy_timeout = 10000")
    return conn


def loops(state_db: Path) -> list[Victim]:
    """Live agent loops, by agent name."""
    conn = read_only(state_db)
    try:
        rows = conn.execute("SELECT name, loop_pid, loop_start_ticks FROM sessions WHERE loop_pid IS NOT NULL "
                            "ORDER BY name").fetchall()
    finally:
        conn.close()
    return [Victim("loop", r["name"], r["loop_pid"], r["loop_start_ticks"]) for r in rows
            if alive(r["loop_pid"], r["loop_start_ticks"])]


def turns(state_db: Path) -> list[Victim]:
    """Live turns (runtime process groups), by agent name."""
    conn = read_only(state_db)
    try:
        rows = conn.execute("SELECT name, turn_pgid, turn_start_ticks FROM sessions WHERE turn_pgid IS NOT NULL "
                            "AND state = 'in_turn' ORDER BY name").fetchall()
    finally:
        conn.close()
    return [Victim("turn", r["name"], r["turn_pgid"], r["turn_start_ticks"], group=True) for r in rows
            if group_alive(r["turn_pgid"], r["turn_start_ticks"])]


def _cmdline(pid: int) -> list[bytes]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return []


def schedule_runners(root: Path) -> list[Victim]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        argv = _cmdline(int(entry.name))
        if b"overstory.scheduling.runner" in argv and str(root).encode() in argv:
            pid = int(entry.name)
            if alive(pid):
                found.append(Victim("scheduler", None, pid, start_ticks(pid)))
    return found


def descendants(pid: int) -> list[tuple[int, int | None, str]]:
    """Every live process below ``pid`` (pid, start ticks, command line), found through /proc's parent links,
    except other agents' loops and what runs below them."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            raw = (entry / "stat").read_text()
        except OSError:
            continue
        fields = raw[raw.rfind(")") + 2:].split()
        if fields[0] in ("Z", "X"):
            continue
        children.setdefault(int(fields[1]), []).append(int(entry.name))
    found, todo = [], list(children.get(pid, []))
    while todo:
        child = todo.pop()
        argv = _cmdline(child)
        if b"overstory.agents.loop" in argv:
            continue  # another agent's loop (a lead's loop slings its children): it lives as long as its own agent
        found.append((child, start_ticks(child), " ".join(a.decode(errors="replace") for a in argv if a)[:200]))
        todo.extend(children.get(child, []))
    return found


def project_processes(root: Path, *, exclude: t.Collection[int] = ()) -> list[dict[str, t.Any]]:
    """Live processes of the project: by command line, by OVERSTORY_PROJECT_ROOT in their environment,
    or running in the project's folder (loops, turns, tools and hooks inside them, ov commands)."""
    me = {os.getpid(), os.getppid(), *exclude}
    text = str(root)
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) in me:
            continue
        pid = int(entry.name)
        if not alive(pid):
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            environ = (entry / "environ").read_bytes().split(b"\0")
            cwd = os.readlink(entry / "cwd")
        except OSError:
            continue
        if text.encode() in b" ".join(argv) or f"OVERSTORY_PROJECT_ROOT={text}".encode() in environ or \
                cwd == text or cwd.startswith(text + os.sep):
            agent = next((e.split(b"=", 1)[1].decode(errors="replace") for e in environ
                          if e.startswith(b"OVERSTORY_AGENT_NAME=")), None)
            found.append({"pid": pid, "agent": agent, "cwd": cwd,
                          "argv": " ".join(a.decode(errors="replace") for a in argv if a)[:300]})
    return found


@dataclass
class Command:
    """A command the operator started and may have to kill and run again."""

    argv: list[str]
    popen: subprocess.Popen[str]
    ticks: int | None

    def kill(self) -> bool:
        if self.popen.poll() is not None:
            return False
        return kill_pid(self.popen.pid, self.ticks)
