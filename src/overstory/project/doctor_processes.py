"""`ov doctor`'s `processes` and `serve` checks: what runs for this project, read from what ov recorded.

Nothing here signals, locks or writes anything: a process is named only when ov wrote it down (a
session row's loop pid or turn group with their start times, a turn's id in its processes'
environment, the pid in an agent's lock file whose command line names that agent, a watchdog's own
record, or ``run/serve.json``), never found by its program's name.
"""

from __future__ import annotations

import json
import sqlite3
import typing as t

from overstory import procs
from overstory.project.health import FAIL, OK, WARN, Check

if t.TYPE_CHECKING:
    from overstory.paths import ProjectPaths

SERVE_TIMEOUT = 3.0  # seconds `ov doctor` waits for /api/health


def _read_only(path: t.Any) -> sqlite3.Connection | None:
    try:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5)
    except sqlite3.Error:
        return None
    conn.row_factory = sqlite3.Row
    return conn


def cmdline_of(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            raw = handle.read()
    except OSError:
        return []
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def _option(argv: list[str], name: str) -> str | None:
    return argv[argv.index(name) + 1] if name in argv[:-1] else None


def _lock_holder_loop(project: ProjectPaths, agent: str) -> tuple[int, int] | None:
    """(pid, generation) of the live agent process whose pid is in ``agent``'s lock file, when its command line
    is ov's loop or tmux driver for that agent in this project (a reused pid names some other program)."""
    from overstory.agents.process import agent_lock_path

    try:
        words = agent_lock_path(project, agent).read_text().split()  # "PID GENERATION" (older loops: "PID")
    except OSError:
        return None
    if not words or not words[0].isdigit() or not procs.is_alive(int(words[0])):
        return None
    pid = int(words[0])
    argv = cmdline_of(pid)
    # A loop `ov sling` started early is told its generation later (warm_loop.WarmLoop): only the lock file has it.
    generation = _option(argv, "--generation") or (words[1] if len(words) > 1 and "--go-fd" in argv else None)
    if (_option(argv, "--agent") != agent or _option(argv, "--project") != str(project.root)
            or generation is None or not generation.isdigit()):
        return None
    return pid, int(generation)


def find_orphans(project: ProjectPaths) -> list[str]:
    """One line per process ov recorded for an agent that should have none: its session is terminal, or the
    process serves (or ran a turn for) a generation older than the agent's current one."""
    from overstory.store import sessions, turns

    conn = _read_only(project.state_db) if project.state_db.exists() else None
    if conn is None:
        return []
    try:
        rows = sessions.list_sessions(conn)
        stale_turns = turns.unfinished_of_past(conn)
    except sqlite3.Error:
        return []
    finally:
        conn.close()
    found: list[str] = []
    for row in rows:
        if row.is_terminal:
            if procs.is_alive(row.loop_pid, row.loop_start_ticks):
                found.append(f"{row.name} is {row.state}, but its loop (pid {row.loop_pid}) still runs")
            if row.turn_pgid and procs.group_alive(row.turn_pgid, row.turn_start_ticks):
                found.append(f"{row.name} is {row.state}, but its turn's process group {row.turn_pgid} still runs")
        holder = _lock_holder_loop(project, row.name)
        if holder is not None and holder[0] != row.loop_pid and (row.is_terminal or holder[1] != row.generation):
            found.append(f"{row.name}: a process of generation {holder[1]} (pid {holder[0]}) still runs; "
                         f"the agent is at generation {row.generation} ({row.state})")
    for turn in stale_turns:
        pids = procs.tagged_processes(str(turn["id"]))
        if pids:
            found.append(f"{turn['agent']}: turn {turn['id']} of generation {turn['generation']} still has "
                         f"process(es) {', '.join(map(str, pids))}; the agent is {turn['why']}")
    return found


def check_orphans(project: ProjectPaths) -> Check:
    found = find_orphans(project)
    if not found:
        return Check("orphan processes", OK, "no recorded agent process outlives its agent or its generation")
    return Check("orphan processes", WARN, f"{len(found)} leftover(s): " + "; ".join(found),
                 "the watchdog stops them when it starts (`ov watchdog --once`); or `ov stop AGENT`")


# ---- watchdogs --------------------------------------------------------------------------------


def check_watchdogs(project: ProjectPaths) -> Check:
    from overstory.watchdog.lock import running_watchdogs

    found = running_watchdogs(project)
    described = ", ".join(f"pid {pid} ({how})" for pid, how in sorted(found.items()))
    if len(found) > 1:
        return Check("watchdog", FAIL, f"{len(found)} watchdogs are running for this project: {described}; "
                                       "they would each act on the same agents",
                     "stop all but the one that holds the lock (kill PID: each is an `ov watch` or `ov watchdog`)")
    if found:
        return Check("watchdog", OK, f"one watchdog: {described}")
    return Check("watchdog", OK, "no watchdog is running (agents run without one; `ov watch` or `ov watchdog` "
                                 "re-adopts dead loops and retires silent agents)")


# ---- ov serve ---------------------------------------------------------------------------------


def check_serve(project: ProjectPaths) -> Check:
    """Whether an `ov serve` for this project runs (``run/serve.json`` names a live process) and answers."""
    from overstory.serve_token import address_file, read_token, running_address

    base = running_address(project)
    if base is None:
        if address_file(project).exists():
            return Check("ov serve", WARN, f"{address_file(project)} names an `ov serve` that is no longer running",
                         "it is removed when `ov serve` exits cleanly; delete it, or start `ov serve`")
        return Check("ov serve", OK, "no `ov serve` is running for this project")
    try:
        pid = json.loads(address_file(project).read_text(encoding="utf-8")).get("pid")
    except (OSError, ValueError, AttributeError):  # it stopped (and removed its record) just now
        return Check("ov serve", OK, "no `ov serve` is running for this project")
    import urllib.error
    import urllib.request

    try:
        token = read_token(project)
        request = urllib.request.Request(f"{base}/api/health", headers={"Authorization": f"Bearer {token}"})
        with urllib.request.urlopen(request, timeout=SERVE_TIMEOUT) as response:  # noqa: S310 (our own address)
            document = json.loads(response.read().decode("utf-8"))
    except (OSError, ValueError) as exc:  # urllib's errors are OSErrors; a garbled reply is a ValueError
        reason = getattr(exc, "reason", None) or exc
        return Check("ov serve", FAIL, f"`ov serve` (pid {pid}) runs but does not answer at {base}/api/health: "
                                       f"{reason}",
                     f"stop it (kill {pid}) and start `ov serve` again")
    if document.get("project") != str(project.root):
        return Check("ov serve", FAIL, f"the server at {base} (pid {pid}) serves {document.get('project')}, "
                                       "not this project", "start `ov serve` again for this project")
    return Check("ov serve", OK, f"`ov serve` (pid {pid}) answers at {base} (version {document.get('version')})")
