"""Helpers for the durability tests: a bare remote that counts pushes, killing a whole project, invariants."""

from __future__ import annotations

import os
import signal
import subprocess
import time
import typing as t
from collections import Counter
from pathlib import Path

from overstory import procs
from overstory.paths import ProjectPaths
from overstory.store import sessions


def shared(tmp_path: Path) -> Path:
    """A directory for the remote and markers, to bind writable into agents' sandboxes (config
    ``sandbox.writable``): a sandboxed turn sees the rest of the host read-only and has its own /tmp."""
    path = tmp_path / "shared"
    path.mkdir(exist_ok=True)
    return path


def make_remote(project: ProjectPaths, where: Path) -> Path:
    """A bare repository as the project's ``origin``; its post-receive hook logs every ref a push changed."""
    bare = where / "remote.git"
    subprocess.run(["git", "init", "-q", "--bare", str(bare)], check=True)
    log = where / "pushes.log"
    hook = bare / "hooks" / "post-receive"
    hook.write_text(f"#!/bin/sh\nwhile read old new ref; do echo \"$ref $new\" >> {log}; done\n")
    hook.chmod(0o755)
    subprocess.run(["git", "remote", "add", "origin", str(bare)], cwd=project.root, check=True)
    return log


def pushes(log: Path) -> Counter[str]:
    """How many pushes changed each ref of the remote."""
    if not log.exists():
        return Counter()
    return Counter(line.split()[0] for line in log.read_text().splitlines() if line.strip())


def remote_refs(bare: Path) -> set[str]:
    """The refs a bare repository holds."""
    done = subprocess.run(["git", "for-each-ref", "--format=%(refname)"], cwd=bare, capture_output=True, text=True,
                          check=True)
    return set(done.stdout.split())


def project_processes(project: ProjectPaths) -> list[int]:
    """Live processes of this project: loops and drivers (by command line), turns, tools, hooks and ov
    commands inside them (by OVERSTORY_PROJECT_ROOT), and ov commands run in the project (by cwd)."""
    root = str(project.root)
    me = {os.getpid(), os.getppid()}
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) in me:
            continue
        pid = int(entry.name)
        if not procs.is_alive(pid):
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            environ = (entry / "environ").read_bytes().split(b"\0")
            cwd = os.readlink(entry / "cwd")
        except OSError:
            continue
        if root.encode() in argv or f"OVERSTORY_PROJECT_ROOT={root}".encode() in environ or \
                cwd == root or cwd.startswith(root + os.sep):
            found.append(pid)
    return found


def kill_everything(project: ProjectPaths) -> int:
    """Every process of the project dies at once: all are stopped first (none sees another die), then SIGKILLed."""
    stopped: set[int] = set()
    for _ in range(20):  # a process may fork between a scan and its SIGSTOP: scan until nothing new shows up
        fresh = [pid for pid in project_processes(project) if pid not in stopped]
        if not fresh:
            break
        for pid in fresh:
            try:
                os.kill(pid, signal.SIGSTOP)
                stopped.add(pid)
            except ProcessLookupError:
                pass
    for pid in stopped:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(procs.is_alive(pid) for pid in stopped):
        time.sleep(0.05)
    return len(stopped)


def wait_for(predicate: t.Callable[[], t.Any], timeout: float = 60, what: str = "condition",
             interval: float = 0.1) -> t.Any:
    """agent_helpers.wait_for with a longer default and a name for what is awaited."""
    from agent_helpers import wait_for as wait

    return wait(predicate, timeout, interval, message=what)


def row(conn: t.Any, name: str) -> sessions.Session:
    found = sessions.get(conn, name)
    assert found is not None
    return found


def git_lines(cwd: Path, *args: str) -> list[str]:
    done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=True)
    return [line for line in done.stdout.splitlines() if line.strip()]


def assert_invariants(project: ProjectPaths, conn: t.Any, *, completed: set[str] | None = None) -> None:
    """Everything settled exactly once after any crash: the checks shared by the whole-project tests.

    - every agent is terminal; the ones in ``completed`` completed;
    - every zombie's parent got exactly one ``worker_died``, nobody else any;
    - no mail is lost (every message to an agent was delivered: read, never left claimed);
    - no mail is duplicated (no two messages with the same sender, recipient, type, subject and body);
    - no process of the project is left; no worktree or ``ov/*`` branch without its agent.
    """
    agents = {a.name: a for a in sessions.list_sessions(conn)}
    assert all(a.is_terminal for a in agents.values()), {n: a.state for n, a in agents.items()}
    if completed is not None:
        assert {n for n, a in agents.items() if a.state == "completed"} >= completed, \
            {n: (a.state, a.state_reason) for n, a in agents.items()}
    died = Counter(r["sender"] for r in conn.execute("SELECT sender FROM mail WHERE type = 'worker_died'"))
    assert died == Counter({n: 1 for n, a in agents.items() if a.state == "zombie"}), died
    last_ok = {(r[0], r[1]): r[2] for r in conn.execute(
        "SELECT agent, generation, MAX(started_at) FROM turns WHERE status = 'ok' GROUP BY agent, generation")}
    for row in conn.execute("SELECT id, recipient, type, read_at, claimed_by, created_at FROM mail "
                            "WHERE recipient != 'operator'"):
        assert row["claimed_by"] is None or row["read_at"] is not None, f"mail #{row['id']} left claimed"
        agent = agents.get(row["recipient"])
        if agent is not None and agent.state == "completed":
            # Mail that arrived during (or after) the turn in which the agent reported done is kept unread for the
            # record: a finished agent is not woken again (e.g. a lead's `merged` mail while it reports last).
            finished_from = last_ok.get((agent.name, agent.generation)) or 0
            assert row["read_at"] is not None or row["created_at"] > finished_from, \
                f"mail #{row['id']} ({row['type']}) to {row['recipient']} never delivered"
    copies = Counter(tuple(r) for r in conn.execute("SELECT sender, recipient, type, subject, body FROM mail"))
    assert [k for k, n in copies.items() if n > 1] == [], "duplicated mail"
    wait_for(lambda: not project_processes(project), 30, "every process of the project to exit")
    names = set(agents)
    if project.worktrees_dir.is_dir():
        assert {p.name for p in project.worktrees_dir.iterdir() if p.is_dir()} <= names, "orphan worktree"
    branches = {b.strip().lstrip("*+ ").strip() for b in git_lines(project.root, "branch", "--list", "ov/*")}
    assert branches <= {a.branch for a in agents.values() if a.branch}, f"orphan branches {branches}"
    for line in git_lines(project.root, "worktree", "list", "--porcelain"):
        if line.startswith("worktree "):
            assert Path(line.split(" ", 1)[1]).is_dir(), f"git knows a worktree that is gone: {line}"
