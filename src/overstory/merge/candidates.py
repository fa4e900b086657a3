"""What `ov merge --all` merges, in which order, and what it leaves out and why.

The merge queue holds the reports of finished work: ``merge_ready`` mail, and a builder's
``worker_done`` (its statement that the work on its branch is done; no separate
``merge_ready`` is needed). ``gather`` reads the open queue rows (not tried yet, or failed
and not dismissed), the reports no row was made from yet (``announced``: the dashboard reads
this without writing), and builders that finished with commits but never reported (stopped
by the operator). One candidate per branch and target, however many reports name it.

They are merged in the order they became ready: the time of the branch's first report (its
first ``worker_done`` or ``merge_ready``), else of the builder's move to ``completed``. That
is also what "the earlier-ready branch" means when tier 2 keeps both sides' insertions:
the target's lines come first, and they are the earlier-ready branch's. Builders are left
out with the reason: still working, zombie, or nothing to merge (no commits since slung).
"""

from __future__ import annotations

import json
import sqlite3
import typing as t
from dataclasses import dataclass, field
from pathlib import Path

from overstory.gitutil import branch_exists, git
from overstory.store import merge_queue, sessions
from overstory.store.lifecycle import promised

if t.TYPE_CHECKING:
    from overstory.config.model import Config


@dataclass
class Candidate:
    branch: str
    target: str | None
    agent: str | None
    ready_at: int
    queue_ids: list[int] = field(default_factory=list)
    # announced (reported, no queue row yet), pending (queued, not tried) or failed (tried; ``result`` says why)
    status: str = "pending"
    result: str | None = None
    tier: int | None = None
    task_id: str | None = None
    files: list[str] = field(default_factory=list)
    mail_ids: list[int] = field(default_factory=list)

    @property
    def queue_id(self) -> int | None:
        return self.queue_ids[0] if self.queue_ids else None


@dataclass
class Skipped:
    agent: str
    branch: str
    reason: str
    queue_ids: list[int] = field(default_factory=list)  # open rows that turn out to have nothing to merge

    def as_dict(self) -> dict[str, str]:
        return {"agent": self.agent, "branch": self.branch, "reason": self.reason}


def target_for(agent: sessions.Session | None, config: Config, into: str | None) -> str:
    return into or (agent.base_branch if agent and agent.base_branch else None) or config.project.canonical_branch


def agent_commits(root: Path, agent: sessions.Session) -> list[str]:
    """The commits the agent made on its branch since it was slung, oldest first."""
    assert agent.branch is not None
    base = agent.spec.get("base_commit") or _created_at(root, agent.branch)
    if base is None and agent.base_branch and branch_exists(root, agent.base_branch):
        base = git(root, "merge-base", agent.base_branch, agent.branch, check=False).stdout.strip() or None
    spec = f"{base}..refs/heads/{agent.branch}" if base else f"refs/heads/{agent.branch}"
    return git(root, "rev-list", "--reverse", spec, check=False).stdout.split()


def _created_at(root: Path, branch: str) -> str | None:
    """Where the branch was created, from its reflog (agents slung before ov recorded base_commit)."""
    out = git(root, "reflog", "show", "--format=%H", f"refs/heads/{branch}", "--", check=False).stdout.split()
    return out[-1] if out else None


def unmerged_commits(root: Path, branch: str, target: str) -> list[str]:
    return git(root, "rev-list", "--reverse", f"refs/heads/{target}..refs/heads/{branch}", check=False).stdout.split()


_RANK = {"announced": 0, "pending": 1, "failed": 2}


def reported(conn: sqlite3.Connection, config: Config) -> list[Candidate]:
    """Open queue rows and not-yet-queued reports, one candidate per branch and target (read only)."""
    found: dict[tuple[str, str], Candidate] = {}

    def add(branch: str, target: str, agent: str | None, at: int, *, queue_id: int | None = None,
            mail_id: int | None = None, status: str, result: str | None = None, tier: int | None = None,
            task_id: str | None = None, files: t.Sequence[str] = ()) -> None:
        entry = found.get((branch, target))
        if entry is None:
            entry = found[(branch, target)] = Candidate(branch=branch, target=target, agent=agent, ready_at=at,
                                                        status=status, result=result, tier=tier, task_id=task_id)
        elif _RANK[status] >= _RANK[entry.status]:  # the latest failure is the one to show
            entry.status, entry.result, entry.tier = status, result, tier
        entry.ready_at = min(entry.ready_at, at)
        entry.queue_ids += [queue_id] if queue_id is not None else []
        entry.mail_ids += [mail_id] if mail_id is not None else []
        entry.files = sorted(set(entry.files) | set(files))

    for row in merge_queue.open_rows(conn):
        agent = sessions.get(conn, row["agent"]) if row["agent"] else None
        add(row["branch"], row["target"] or target_for(agent, config, None), row["agent"], int(row["enqueued_at"]),
            queue_id=row["id"], mail_id=row["mail_id"], status=row["status"], result=row["result"], tier=row["tier"],
            task_id=row["task_id"], files=json.loads(row["files"] or "[]"))
    for report in announced(conn, config):
        add(report["branch"], report["target"], report["agent"], report["created_at"], mail_id=report["mail_id"],
            status="announced", task_id=report["task_id"], files=report["files"])
    return sorted(found.values(), key=lambda c: (c.ready_at, c.queue_id or 0))


def announced(conn: sqlite3.Connection, config: Config) -> list[dict[str, t.Any]]:
    """Reports (merge_ready mail, builders' worker_done) no queue row was made from yet, as queue entries."""
    out = []
    for row in merge_queue.announced_not_queued(conn):
        payload = json.loads(row["payload"] or "{}")
        name = payload.get("agent") or row["sender"]
        agent = sessions.get(conn, name)
        branch = payload.get("branch") or (agent.branch if agent and row["type"] == "worker_done" else None)
        if not branch:
            continue
        out.append({"mail_id": row["id"], "agent": name, "branch": branch,
                    "target": payload.get("target_branch") or target_for(agent, config, None),
                    "task_id": payload.get("task_id"), "files": payload.get("files_modified") or [],
                    "created_at": int(row["created_at"])})
    return out


def gather(root: Path, config: Config, conn: sqlite3.Connection,
           into: str | None) -> tuple[list[Candidate], list[Skipped]]:
    """What to merge, in order, and what is left out (with why). Reads only."""
    candidates: list[Candidate] = []
    skipped: list[Skipped] = []
    for candidate in reported(conn, config):
        agent = sessions.get(conn, candidate.agent) if candidate.agent else None
        if (agent is not None and agent.capability == "builder" and agent.branch == candidate.branch
                and branch_exists(root, candidate.branch)):
            target = into or candidate.target or target_for(agent, config, None)
            if (branch_exists(root, target) and not unmerged_commits(root, candidate.branch, target)
                    and not agent_commits(root, agent)):
                skipped.append(Skipped(agent.name, agent.branch, "nothing to merge: no commits since it was slung",
                                       candidate.queue_ids))
                continue
        candidates.append(candidate)
    listed = {c.branch for c in candidates} | {s.branch for s in skipped}
    queued_at = merge_queue.branches_with_rows(conn)
    for agent in sessions.list_sessions(conn):
        if agent.capability != "builder" or not agent.branch or agent.branch in listed:
            continue
        if queued_at.get(agent.branch, -1) >= agent.created_at:
            continue  # its reports are in the queue: merged, dismissed, or nothing to merge
        if not branch_exists(root, agent.branch):
            continue
        target = target_for(agent, config, into)
        if not branch_exists(root, target):
            skipped.append(Skipped(agent.name, agent.branch, f"its target branch {target} does not exist"))
            continue
        unmerged = unmerged_commits(root, agent.branch, target)
        if agent.state == "zombie":
            if unmerged:
                skipped.append(Skipped(agent.name, agent.branch, f"zombie ({agent.state_reason or 'it died'}); if its "
                                       f"{len(unmerged)} commit(s) are wanted: `ov merge {agent.name}`"))
            continue
        done = agent.state == "completed" or promised(conn, agent)
        if not done:
            skipped.append(Skipped(agent.name, agent.branch, f"still working ({agent.state}): it has not sent "
                                   "worker_done; `--force` on `ov merge NAME` merges it anyway"))
            continue
        if not unmerged:
            if not agent_commits(root, agent):
                skipped.append(Skipped(agent.name, agent.branch, "nothing to merge: no commits since it was slung"))
            continue  # already merged: nothing to say
        candidates.append(Candidate(branch=agent.branch, target=target, agent=agent.name,
                                    ready_at=_ready_at(conn, agent), task_id=agent.task_id))
    candidates.sort(key=lambda c: (c.ready_at, c.queue_id or 0))
    return candidates, skipped


def _ready_at(conn: sqlite3.Connection, agent: sessions.Session) -> int:
    """When the builder finished: its move to completed, else its terminal mail."""
    from overstory.store.mail_queries import first_done_since

    completed = sessions.completed_at(conn, agent.name, agent.generation)
    if completed is not None:
        return completed
    done = first_done_since(conn, agent.name, agent.created_at)
    return done if done is not None else agent.updated_at
