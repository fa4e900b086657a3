"""Helpers for tests that run real agents (scripted runtime, real loops and processes)."""

from __future__ import annotations

import json
import os
import time
import typing as t
from pathlib import Path

from overstory.paths import ProjectPaths
from overstory.store import sessions
from overstory.store.db import open_state


def loop_processes(agent: str, project_root: Path | None = None, *, unstarted_grace: float = 60.0) -> list[int]:
    """Pids of live agent-loop processes serving ``agent`` (of ``project_root``), by command line.

    A loop `ov sling` started early and never told to go (agents.warm_loop.WarmLoop: its spawn failed, or its
    `ov sling` was killed) ends by itself, having touched nothing, once its imports are done and it reads the end
    of its pipe: such a loop is given ``unstarted_grace`` seconds to do so, and counted only if it is still there.
    The grace is long: a fresh clone's first imports write their bytecode, and while the disk is busy (the npm
    install beside CI's first tests writes 1.5 GB) the kernel may hold such writes for seconds. One CI run on a
    fresh machine still found a killed sling's warm loop after 10 s (not reproduced in 50 tries since).
    """
    deadline = time.monotonic() + unstarted_grace
    found = _loop_pids(agent, project_root)
    while any(_unstarted(pid) for pid in found) and time.monotonic() < deadline:
        time.sleep(0.05)
        found = _loop_pids(agent, project_root)
    return found


def _unstarted(pid: int) -> bool:
    """A warm loop still waiting for its word: its output goes to an unnamed file until then, to its log after.

    A process whose files cannot be read any more is exiting (the kernel closes them before it becomes a zombie),
    or is gone: it is looked at again rather than counted as a loop that started."""
    try:
        return os.readlink(f"/proc/{pid}/fd/2").endswith("(deleted)") and b"--go-fd" in \
            Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return True


def _loop_pids(agent: str, project_root: Path | None) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
            status = (entry / "stat").read_text()
        except OSError:
            continue
        if status[status.rfind(")") + 2] in "ZX":
            continue
        if project_root is not None and str(project_root).encode() not in cmdline:
            continue
        if b"overstory.agents.loop" in cmdline and agent.encode() in cmdline:
            found.append(int(entry.name))
    return found


def wait_for(predicate: t.Callable[[], t.Any], timeout: float = 30, interval: float = 0.1, message: str = "") -> t.Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {message or predicate}")


def agent_state(project: ProjectPaths, name: str) -> sessions.Session | None:
    conn = open_state(project.state_db)
    try:
        return sessions.get(conn, name)
    finally:
        conn.close()


def wait_terminal(project: ProjectPaths, name: str, timeout: float = 120) -> sessions.Session:
    """Until ``name`` is completed or zombie (a ceiling for a loaded machine: it returns as soon as it is)."""
    def done() -> sessions.Session | None:
        agent = agent_state(project, name)
        return agent if agent is not None and agent.is_terminal else None

    try:
        return wait_for(done, timeout, message=f"{name} to settle")
    except AssertionError as exc:
        agent = agent_state(project, name)
        seen = f"{agent.state} ({agent.state_reason})" if agent is not None else "no such agent"
        raise AssertionError(f"{exc}; it is {seen}") from None


def write_scenario(path: Path, turns: list[dict[str, t.Any]]) -> Path:
    path.write_text(json.dumps({"turns": turns}))
    return path


def mail_rows(project: ProjectPaths, **where: str) -> list[dict[str, t.Any]]:
    conn = open_state(project.state_db)
    try:
        clauses = " AND ".join(f"{k} = ?" for k in where) or "1"
        return [dict(r) for r in conn.execute(f"SELECT * FROM mail WHERE {clauses} ORDER BY id", tuple(where.values()))]
    finally:
        conn.close()


def agent_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(extra)
    return env


def shared_dir(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A directory the test and its agents share (markers, release files), and the environment that binds it
    writable into every agent's sandbox (``sandbox.writable``); nothing else outside the worktree is."""
    path = tmp_path / "shared"
    path.mkdir(exist_ok=True)
    return path, {"OV_SANDBOX_WRITABLE": json.dumps([str(path)])}
