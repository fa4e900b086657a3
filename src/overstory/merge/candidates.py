"""What `ov merge --all` merges, in which order, and what it leaves out and why.

Candidates are branches announced with ``merge_ready`` mail (the queue) and builders that
finished with commits of their own: a builder's ``worker_done`` is its statement that the
work is done, so a separate ``merge_ready`` is not needed. They are merged in the order
they became ready (queued, or completed). Builders are left out with the reason: still
working, zombie, or nothing to merge (no commits since they were slung).
"""

from __future__ import annotations

import sqlite3
import typing as t
from dataclasses import dataclass
from pathlib import Path

from overstory.gitutil import branch_exists, git
from overstory.store import merge_queue, sessions
from overstory.store.lifecycle import promised

if t.TYPE_CHECKING:
    from overstory.config import Config


@dataclass
class Candidate:
    branch: str
    target: str | None
    agent: str | None
    queue_id: int | None
    ready_at: int


@dataclass
class Skipped:
    agent: str
    branch: str
    reason: str

    def as_dict(self) -> dict[str, str]:
        return dict(self.__dict__)


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


def gather(root: Path, config: Config, conn: sqlite3.Connection,
           into: str | None) -> tuple[list[Candidate], list[Skipped]]:
    candidates = [Candidate(branch=row["branch"], target=row["target"], agent=row["agent"], queue_id=row["id"],
                            ready_at=int(row["enqueued_at"])) for row in merge_queue.pending(conn)]
    queued = {c.branch for c in candidates}
    skipped: list[Skipped] = []
    for agent in sessions.list_sessions(conn):
        if agent.capability != "builder" or not agent.branch or agent.branch in queued:
            continue
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
        candidates.append(Candidate(branch=agent.branch, target=target, agent=agent.name, queue_id=None,
                                    ready_at=_ready_at(conn, agent)))
    candidates.sort(key=lambda c: (c.ready_at, c.queue_id or 0))
    return candidates, skipped


def _ready_at(conn: sqlite3.Connection, agent: sessions.Session) -> int:
    """When the builder finished: its move to completed, else its terminal mail."""
    row = conn.execute("SELECT max(at) FROM transitions WHERE name = ? AND generation = ? AND to_state = 'completed'",
                       (agent.name, agent.generation)).fetchone()
    if row and row[0] is not None:
        return int(row[0])
    mail = conn.execute("SELECT min(created_at) FROM mail WHERE sender = ? AND type = 'worker_done' "
                        "AND created_at >= ?", (agent.name, agent.created_at)).fetchone()
    return int(mail[0]) if mail and mail[0] is not None else agent.updated_at
