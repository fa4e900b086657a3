"""`ov coordinator check-complete` and `ov coordinator output`: is a run's objective done, and what it produced.

A run is complete when every agent of it other than the coordinator (every depth) has
ended (completed or zombie) and its work is merged: its branch is in the branch it was
slung from (``git merge-base --is-ancestor``: a branch without commits of its own counts),
or, its branch being gone, the merge queue's last row for it says merged, empty or
dismissed (the operator gave it up: settled, and said so). A run without such agents is
not complete: nothing was done yet. Reads only.
"""

from __future__ import annotations

import sqlite3
import typing as t

from overstory.gitutil import git
from overstory.paths import ProjectPaths
from overstory.store import mail, merge_queue, runs, sessions
from overstory.store.lifecycle import PERSISTENT_CAPABILITIES

SETTLED_ROWS = {"merged": "merged", "empty": "nothing to merge", "dismissed": "dismissed by the operator"}


def _merge_state(project: ProjectPaths, conn: sqlite3.Connection, agent: sessions.Session,
                 fallback: str) -> tuple[bool, str]:
    if not agent.branch:
        return True, "no branch"
    row = merge_queue.last_status(conn, agent.branch)
    if row in SETTLED_ROWS:
        return True, SETTLED_ROWS[row]
    target = agent.base_branch or fallback
    found = git(project.root, "merge-base", "--is-ancestor", f"refs/heads/{agent.branch}", f"refs/heads/{target}",
                check=False)
    if found.returncode == 0:
        return True, f"in {target}"
    if found.returncode == 1:
        return False, f"not merged into {target}" + (f" (merge queue: {row})" if row else "")
    return False, f"branch {agent.branch} or {target} is gone and no merge is recorded"


def check_complete(project: ProjectPaths, conn: sqlite3.Connection, run_ref: str | None,
                   fallback_base: str) -> dict[str, t.Any]:
    """The run (``run_ref``, else the open run, else the newest) and, per agent, what still stands open."""
    run = runs.resolve(conn, run_ref)
    agents = [a for a in sessions.list_sessions(conn)
              if a.run_id == run.id and a.capability not in PERSISTENT_CAPABILITIES]
    children = []
    for agent in agents:
        ended = agent.is_terminal
        merged, merge_note = _merge_state(project, conn, agent, fallback_base) if ended else (False, "")
        children.append({"name": agent.name, "capability": agent.capability, "state": agent.state,
                         "branch": agent.branch, "ended": ended, "merged": merged,
                         "open": None if ended and merged else (
                             f"still {agent.state}" if not ended else merge_note),
                         "note": merge_note if ended and merged else None})
    waiting = [c for c in children if c["open"] is not None]
    return {"run": run.id, "status": run.status, "complete": bool(children) and not waiting,
            "agents": len(children), "open": waiting, "children": children,
            **({"reason": "no agent has been slung in this run yet"} if not children else {})}


def output(conn: sqlite3.Connection, run_ref: str | None) -> dict[str, t.Any]:
    """The run's report: the coordinator's reports to the operator during the run, the run's summary
    mail, and its totals (as `ov run show`)."""
    run = runs.resolve(conn, run_ref)
    report = runs.report(conn, run)
    reports = []
    if run.coordinator:
        end = run.completed_at
        for message in mail.list_messages(conn, to="operator", sender=run.coordinator, since_ms=run.started_at,
                                          limit=200):
            if end is None or message.created_at <= end:
                reports.append({"id": message.id, "type": message.type, "subject": message.subject,
                                "body": message.body, "at": message.created_at})
    summary_ids = [s["id"] for s in report["summaries"]]
    summary_bodies = [found.body for i in summary_ids if (found := mail.get(conn, i)) is not None]
    return {"run": report["run"], "reports": reports, "summaries": summary_bodies, "totals": report["totals"],
            "agents": [{k: a[k] for k in ("name", "capability", "state", "state_reason", "cost_usd")}
                       for a in report["agents"]]}
